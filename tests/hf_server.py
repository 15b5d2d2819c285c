"""A real Hugging Face Hub API for tests: olah (a self-hosted Hub mirror, a dev dependency) on a free
loopback port, offline, serving local git repositories as `datasets/moai/<name>` (its `mirrors-path`).

huggingface_hub's `HfFileSystem` reads it as it reads the Hub (`/api/datasets/{repo}/revision`, `/tree`,
`/paths-info`, `/resolve`), given `endpoint`. Its upstream is a closed loopback port: olah offline never
asks it, and were it to, the request would fail at once rather than reach the internet.

Two limits of olah 0.5.4's mirrors, which the tests work within:
- a repository is found only at a named revision (`hf://datasets/moai/c@main/...`): `GET /api/datasets/{repo}`
  without one looks in olah's upstream cache, never in the mirrors (401, repository not found);
- a file is served whole whatever the `Range` header asks, so only sequential reads from the start are
  right (moai streams hf:// objects; see moai.remote), not ranged ones (parquet's footer).

Started in about a second; stopped by its pid (s3_server.ServerProcess).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from s3_server import OnePortServer, _free_ports, started

ORG = "moai"


@dataclass
class HFServer(OnePortServer):
    log_name: ClassVar[str] = "olah.log"

    @property
    def options(self) -> dict:
        """moai's storage_options for this server: its endpoint, no token."""
        return {"endpoint": self.endpoint}

    def fs(self):
        from huggingface_hub import HfFileSystem

        return HfFileSystem(skip_instance_cache=True, **self.options)

    def repo(self, name: str) -> Path:
        """The git repository served as `datasets/moai/<name>` (made empty, on branch main, if new)."""
        path = self.folder / "mirrors" / "datasets" / ORG / name
        if not path.exists():
            path.mkdir(parents=True)
            subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
        return path

    def commit(self, name: str, files: dict[str, bytes]) -> str:
        """Write `files` into the repository `name` and commit them; the `hf://` URL of its root at main."""
        path = self.repo(name)
        for rel, data in files.items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).write_bytes(data)
        git = ["git", "-C", str(path), "-c", "user.name=moai", "-c", "user.email=moai@localhost"]
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "files"], check=True)
        return f"hf://datasets/{ORG}/{name}@main"

    def start(self, timeout_s: float = 30.0) -> None:
        (self.folder / "mirrors").mkdir(exist_ok=True)
        (closed,) = _free_ports(1)
        config = self.folder / "olah.toml"
        config.write_text(
            "[basic]\n"
            f'host = "127.0.0.1"\nport = {self.port}\n'
            f'repos-path = "{self.folder / "cache"}"\n'
            f'mirrors-path = ["{self.folder / "mirrors"}"]\n'
            f'hf-scheme = "http"\nhf-netloc = "127.0.0.1:{closed}"\nhf-lfs-netloc = "127.0.0.1:{closed}"\n'
            "[accessibility]\noffline = true\n"
        )
        self._spawn([str(OLAH_PYTHON), "-c", "from olah.server import cli; cli()", "-c", str(config),
                     "--log-path", str(self.folder / "logs")])  # fmt: skip
        # it answers "no such repository" once it serves
        self._wait_answering("olah", f"{self.endpoint}/api/datasets/{ORG}/none/refs", timeout_s, error_answers=True)


# olah runs from a virtual environment of its own (`scripts/setup.sh dev` makes it): its needs pin
# psutil below 6, which moai's environment must not take
OLAH_PYTHON = Path(__file__).resolve().parent.parent / ".venv-olah" / "bin" / "python"


def olah_installed() -> None:
    if not OLAH_PYTHON.exists():
        pytest.fail(f"the hf:// tests need olah in {OLAH_PYTHON.parent.parent}: run bash scripts/setup.sh dev")


def started_server() -> HFServer:
    olah_installed()
    return started(HFServer, "moai-hf-")
