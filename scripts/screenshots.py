"""Screenshots of the Prefect UI for a moai run, taken by headless Chromium against a local server.

    apt-get install chromium chromium-driver      # Debian's packages; selenium is in the dev extra
    .venv/bin/python scripts/screenshots.py OUT_DIR [--steps 300] [--log-every 5]

Starts `prefect server start` on a free port of 127.0.0.1 (a temporary PREFECT_HOME, telemetry
off), runs the `pretrain` flow on the tiny preset (its own cache and output_dir under OUT_DIR),
and while it trains and after it ends saves PNGs of the flow run page, its Artifacts tab and each
of the run's cards; then runs it again (the cached rerun: reused stages, training not relaunched),
deploys `deployments/prefect.yaml` and opens the deployment's run form. `report.json` in OUT_DIR
says what was seen: cards per run, the chart image's size, the form's height, the browser
console's errors. Every process it starts is stopped at the end.
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


def watch_run(driver, env, api, ui, out: Path, config: Path, tag: str, report: dict, during: int) -> str:
    """Run the flow; take `during` rounds of screenshots while it runs (30 s apart), then after."""
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
        time.sleep(25)
        seen["shots"].append(shot(driver, f"{ui}/runs/flow-run/{run_id}", out / f"{tag}-during-{i}-run.png"))
        seen["shots"].append(
            shot(driver, f"{ui}/runs/flow-run/{run_id}", out / f"{tag}-during-{i}-artifacts.png", tab="Artifacts")
        )
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--during", type=int, default=2, help="rounds of screenshots while the first run trains")
    args = ap.parse_args()
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
            "eval_every": max(args.log_every, args.steps // 6),
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
        watch_run(driver, env, api, ui, out, config, "first", report, args.during)
        watch_run(driver, env, api, ui, out, config, "rerun", report, 0)

        subprocess.run([PREFECT, "work-pool", "create", "moai", "--type", "process"], env=env, cwd=ROOT, check=True)
        subprocess.run(
            [PREFECT, "deploy", "--prefect-file", "deployments/prefect.yaml", "--all"], env=env, cwd=ROOT, check=True
        )
        dep = httpx.post(f"{api}/deployments/filter", json={}, timeout=30).json()[0]
        form = shot(driver, f"{ui}/deployments/deployment/{dep['id']}/run", out / "form.png", wait_s=8, full=True)
        body = driver.find_element("tag name", "body").text
        form["property_is_type_none"] = body.count("Property is type")
        form["anyof_error"] = any("could not determine the initial index" in m for m in form["console"])
        model = driver.find_element("xpath", "//*[normalize-space()='Model Config (Optional)']")
        driver.execute_script("arguments[0].scrollIntoView()", model)
        time.sleep(1)
        driver.save_screenshot(str(out / "form-model-config.png"))
        report["form"] = form
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
