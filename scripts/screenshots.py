"""Screenshots of the Prefect UI for a moai run, taken by headless Chromium against a local server.

    apt-get install chromium chromium-driver      # Debian's packages; selenium is in the dev extra
    .venv/bin/python scripts/screenshots.py OUT_DIR [--steps 300] [--log-every 5] [--only PARTS]

Starts `prefect server start` on a free port of 127.0.0.1 (a temporary PREFECT_HOME, telemetry
off) and, one part after the other (`--only train,form` picks some):

- `train`: runs the `pretrain` flow on the tiny preset (its own cache and output_dir under
  OUT_DIR) and, while it trains and after it ends, saves PNGs of the flow run page, its Artifacts
  tab, the training card and each of the run's cards;
- `rerun`: the same config again (the cached rerun: reused stages, training not relaunched);
- `data-only`: the same config with `train.enabled: false` (data preparation only);
- `form`: deploys `deployments/prefect.yaml` (its paths moved under OUT_DIR) and opens the
  deployment's run form: its height and how many `Property is type` lines it shows;
- `submit`: in that form, changes `train.model_config` to 3 hidden layers, submits it, and with a
  process worker running checks through the API that the flow run got the changed model and
  completed.

`report.json` in OUT_DIR says what was seen: cards per run, the chart image's size, the form's
height, the submitted parameters, the browser console's errors. Every process it starts is
stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
PREFECT = str(Path(PY).parent / "prefect")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(arg)
    # the flow-run graph is WebGL: SwiftShader draws it without a GPU (docs/FIELD-NOTES.md)
    opts.add_argument("--use-angle=swiftshader")
    opts.add_argument("--enable-unsafe-swiftshader")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service("/usr/bin/chromedriver"))


def shot(driver, url: str, path: Path, wait_s: float = 6, full: bool = False, tab: str | None = None) -> dict:
    """Open `url` (and click the page's `tab`), save a PNG; return what was seen."""
    driver.get(url)
    time.sleep(wait_s)
    if tab is not None:
        # the innermost visible element whose text is the tab's name (the UI's tabs are nested spans)
        driver.execute_script(
            "const hits = Array.from(document.querySelectorAll('*')).filter(e => e.offsetParent !== null"
            " && e.innerText && e.innerText.trim() === arguments[0]); hits[hits.length - 1].click();",
            tab,
        )
        time.sleep(3)
    # the UI scrolls an inner element, not the document: the tallest scroll height is the page's
    height = driver.execute_script(
        "return Math.max(...Array.from(document.querySelectorAll('*')).map(e => e.scrollHeight))"
    )
    if full:
        driver.set_window_size(1400, min(int(height) + 100, 12000))
        time.sleep(1)
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)
    console = [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    print(f"saved {path.name} ({height} px tall)", flush=True)
    return {"url": url, "png": path.name, "height_px": height, "console": console[:20]}


def artifacts_of(api: str, run_id: str) -> list[dict]:
    r = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}, timeout=30)
    r.raise_for_status()
    return r.json()


def flow_run_id(api: str, name_hint: float) -> str | None:
    r = httpx.post(f"{api}/flow_runs/filter", json={"sort": "EXPECTED_START_TIME_DESC", "limit": 1}, timeout=30)
    runs = r.json()
    return runs[0]["id"] if runs else None


def run_flow(env: dict, config: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(
            [PY, "flows/pretrain.py", str(config)],
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def watch_run(
    driver, env, api, ui, out: Path, config: Path, tag: str, report: dict, during: int, interval: float = 25
) -> str:
    """Run the flow; take up to `during` rounds of screenshots while it runs (`interval` s apart), then after."""
    before = flow_run_id(api, 0)
    proc = run_flow(env, config, out / f"{tag}-flow.log")
    run_id = None
    while run_id is None or run_id == before:
        time.sleep(1)
        run_id = flow_run_id(api, 0)
        assert proc.poll() is None or run_id != before, (out / f"{tag}-flow.log").read_text()[-3000:]
    seen = report.setdefault(tag, {"run_id": run_id, "shots": []})
    for i in range(during):
        if proc.poll() is not None:
            break
        time.sleep(interval)
        seen["shots"].append(shot(driver, f"{ui}/runs/flow-run/{run_id}", out / f"{tag}-during-{i}-run.png"))
        seen["shots"].append(
            shot(driver, f"{ui}/runs/flow-run/{run_id}", out / f"{tag}-during-{i}-artifacts.png", tab="Artifacts")
        )
        found = {a.get("key"): a for a in artifacts_of(api, run_id)}
        if (card := found.get("training")) is not None:  # the live training card, and what it said then
            s = shot(driver, f"{ui}/artifacts/artifact/{card['id']}", out / f"{tag}-during-{i}-training.png", full=True)
            s["card_head"] = card["data"].split("\n\n")[1][:200] if "\n\n" in card["data"] else ""
            if (bar := found.get("train-progress")) is not None:
                s["progress"] = f"{bar['data']:.1f}% {bar.get('description') or ''}"
            seen["shots"].append(s)
    proc.wait(timeout=1800)
    assert proc.returncode == 0, (out / f"{tag}-flow.log").read_text()[-3000:]
    seen["shots"].append(shot(driver, f"{ui}/runs/flow-run/{run_id}", out / f"{tag}-after-run.png", full=True))
    seen["shots"].append(
        shot(driver, f"{ui}/runs/flow-run/{run_id}", out / f"{tag}-after-artifacts.png", full=True, tab="Artifacts")
    )
    seen["shots"].append(shot(driver, f"{ui}/runs/flow-run/{run_id}", out / f"{tag}-after-logs.png", full=True))
    cards = artifacts_of(api, run_id)
    seen["cards"] = sorted(f"{a['type']}:{a.get('key')}" for a in cards)
    for a in cards:
        if a["type"] == "markdown" and a.get("key"):
            seen.setdefault("markdown_bytes", {})[a["key"]] = len(a["data"])
            seen["shots"].append(
                shot(driver, f"{ui}/artifacts/artifact/{a['id']}", out / f"{tag}-card-{a['key']}.png", full=True)
            )
    return run_id


PARTS = ("train", "rerun", "data-only", "form", "submit")


def deploy(env: dict, api: str, out: Path) -> str:
    """`prefect deploy` of deployments/prefect.yaml with its cache_dir and output_dir under `out`
    (and the source as an absolute path), so a submitted run writes nothing into the checkout."""
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    spec["deployments"] = spec["deployments"][:1]  # pretrain/default (pretrain/docker needs a docker pool)
    params = spec["deployments"][0]["parameters"]["config"]
    params["cache_dir"] = str(out / "cache")
    params["source"]["path"] = str(ROOT / params["source"]["path"])
    params["train"]["output_dir"] = str(out / "deployed-run")
    (out / "prefect.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    subprocess.run([PREFECT, "work-pool", "create", "moai", "--type", "process"], env=env, cwd=ROOT, check=True)
    subprocess.run(
        [PREFECT, "deploy", "--prefect-file", str(out / "prefect.yaml"), "--all"], env=env, cwd=ROOT, check=True
    )
    return httpx.post(f"{api}/deployments/filter", json={}, timeout=30).json()[0]["id"]


def open_form(driver, ui: str, dep_id: str, out: Path) -> dict:
    """The deployment's custom run form: its height, `Property is type` lines, console errors."""
    form = shot(driver, f"{ui}/deployments/deployment/{dep_id}/run", out / "form.png", wait_s=8, full=True)
    body = driver.find_element("tag name", "body").text
    form["property_is_type_none"] = body.count("Property is type")
    form["anyof_error"] = any("could not determine the initial index" in m for m in form["console"])
    model = driver.find_element("xpath", "//*[normalize-space()='Model Config (Optional)']")
    driver.execute_script("arguments[0].scrollIntoView()", model)
    time.sleep(1)
    driver.save_screenshot(str(out / "form-model-config.png"))
    return form


# The model_config JSON box is a <textarea> (prefect-ui-library's p-code-input) in the property's
# p-label; the form's Vue model takes its text from the textarea's `input` event, as typing would.
SET_JSON_BOX = """
const box = arguments[0].closest('.schema-form-property').querySelector('textarea.p-code-input__textarea');
box.value = arguments[1];
box.dispatchEvent(new Event('input', {bubbles: true}));
return box.value;
"""


def submit_form(driver, api: str, ui: str, dep_id: str, out: Path) -> dict:
    """Change train.model_config in the open run form to 3 hidden layers, submit, and follow the
    flow run it creates (a worker must be running) to its end."""
    dep = httpx.get(f"{api}/deployments/{dep_id}", timeout=30).json()
    model = dict(dep["parameters"]["config"]["train"]["model_config"], num_hidden_layers=3)
    label = driver.find_element("xpath", "//*[normalize-space()='Model Config (Optional)']")
    text = driver.execute_script(SET_JSON_BOX, label, json.dumps(model, indent=2))
    time.sleep(1)
    driver.save_screenshot(str(out / "form-model-config-changed.png"))
    before = {r["id"] for r in httpx.post(f"{api}/flow_runs/filter", json={}, timeout=30).json()}
    button = driver.find_element("xpath", "//button[normalize-space()='Submit']")
    driver.execute_script("arguments[0].scrollIntoView()", button)
    button.click()
    deadline = time.monotonic() + 60
    while not (runs := [r for r in httpx.post(f"{api}/flow_runs/filter", json={}, timeout=30).json()
                        if r["id"] not in before]):  # fmt: skip
        assert time.monotonic() < deadline, "the form created no flow run"
        time.sleep(1)
    (run,) = runs
    sent = run["parameters"]["config"]
    deadline = time.monotonic() + 900
    while (state := httpx.get(f"{api}/flow_runs/{run['id']}", timeout=30).json()["state"])["type"] not in (
        "COMPLETED", "FAILED", "CRASHED", "CANCELLED"
    ):  # fmt: skip
        assert time.monotonic() < deadline, f"flow run still {state['type']}"
        time.sleep(2)
    shot(driver, f"{ui}/runs/flow-run/{run['id']}", out / "submitted-run.png", full=True)
    trained = Path(sent["train"]["output_dir"]) / "final" / "config.json"
    seen = {
        "editor_text": text,
        "run_id": run["id"],
        "sent_model_config": sent["train"]["model_config"],
        "sent_keys": sorted(sent),
        "sent_train_keys": sorted(sent["train"]),
        "state": state["type"],
        "trained_config": json.loads(trained.read_text()) if trained.is_file() else None,
    }
    print(json.dumps(seen, indent=1), flush=True)
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--eval-every", type=int, default=None, help="default: a sixth of --steps")
    ap.add_argument("--during", type=int, default=2, help="rounds of screenshots while the first run trains")
    ap.add_argument("--interval", type=float, default=25, help="seconds between those rounds")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {','.join(PARTS)}")
    args = ap.parse_args()
    parts = args.only.split(",")
    assert set(parts) <= set(PARTS), f"--only: parts are {PARTS}"
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    from moai.presets import tiny

    cfg = tiny(cache_dir=str(out / "cache")).model_dump(mode="json", by_alias=True)
    cfg["train"].update(
        {
            "output_dir": str(out / "run"),
            "max_steps": args.steps,
            "log_every": args.log_every,
            "eval_every": args.eval_every or max(args.log_every, args.steps // 6),
            "save_every": args.steps,
        }
    )
    config = out / "config.json"
    config.write_text(json.dumps(cfg))

    port = free_port()
    ui, api = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PREFECT_HOME": str(out / "prefect-home"),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_LOCAL_STORAGE_PATH": str(out / "prefect-storage"),
    }
    report: dict = {}
    with open(out / "server.log", "w") as log:
        server = subprocess.Popen(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = None
    driver = None
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (out / "server.log").read_text()[-2000:]
            time.sleep(0.5)
        driver = browser()
        if "train" in parts:
            watch_run(driver, env, api, ui, out, config, "first", report, args.during, args.interval)
        if "rerun" in parts:
            watch_run(driver, env, api, ui, out, config, "rerun", report, 0)
        if "data-only" in parts:
            # its own cache: the data stages are built while it is watched, not reused from `train`
            cfg = {**cfg, "cache_dir": str(out / "cache-data-only"), "train": {**cfg["train"], "enabled": False}}
            data_only = out / "config-data-only.json"
            data_only.write_text(json.dumps(cfg))
            watch_run(driver, env, api, ui, out, data_only, "data-only", report, 0)
        if "form" in parts or "submit" in parts:
            dep_id = deploy(env, api, out)
            report["form"] = open_form(driver, ui, dep_id, out)
        if "submit" in parts:
            with open(out / "worker.log", "w") as wlog:
                worker = subprocess.Popen(
                    [PREFECT, "worker", "start", "--pool", "moai", "--limit", "1"],
                    env=env,
                    cwd=out,
                    stdout=wlog,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            report["submit"] = submit_form(driver, api, ui, dep_id, out)
    finally:
        if driver is not None:
            driver.quit()
        if worker is not None:
            stop(worker)
        stop(server)
        (out / "report.json").write_text(json.dumps(report, indent=1))
        print(f"report: {out / 'report.json'}")


if __name__ == "__main__":
    main()
