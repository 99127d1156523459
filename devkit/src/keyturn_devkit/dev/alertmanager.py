"""A real Prometheus Alertmanager on loopback, for the alert-hook integration tests.

Debian's `prometheus-alertmanager` package (scripts/system-deps.sh installs it) provides the
binary. It runs without clustering, with its storage and a minimal configuration (one
receiver that notifies nobody) in a temporary directory:

    with AlertmanagerServer() as am:
        am.url                   # http://127.0.0.1:PORT, the `url` of an alertmanager hook
        am.alerts()              # GET /api/v2/alerts: what it holds now
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.process import ManagedServer, spawn_logged, terminate, wait_answering

BINARIES = ("prometheus-alertmanager", "alertmanager")
CONFIG = """\
route:
  receiver: nobody
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: nobody
"""


def alertmanager_binary() -> str | None:
    """Path of the Alertmanager executable, None if it is not installed."""
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class AlertmanagerServer(ManagedServer):
    """Alertmanager on 127.0.0.1; stop() or the context manager ends it and removes its files."""

    def __init__(self) -> None:
        self.port = 0
        self._workdir = Path(tempfile.mkdtemp(prefix="keyturn-alertmanager-"))
        self._log_path = self._workdir / "alertmanager.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> AlertmanagerServer:
        binary = alertmanager_binary()
        if binary is None:
            raise RuntimeError(
                "Alertmanager is not installed: apt-get install prometheus-alertmanager "
                "(scripts/system-deps.sh)"
            )
        config = self._workdir / "alertmanager.yml"
        config.write_text(CONFIG)
        storage = self._workdir / "data"
        storage.mkdir(exist_ok=True)
        for _attempt in range(5):
            self.port = _free_port()
            args = [
                binary,
                f"--config.file={config}",
                f"--storage.path={storage}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ]
            self._process = spawn_logged(args, self._log_path, cwd=self._workdir)
            if wait_answering(
                self._process, f"{self.url}/-/ready", deadline=time.monotonic() + timeout
            ):
                return self
            self.stop(cleanup=False)
        raise RuntimeError(f"Alertmanager did not start; see {self._log_path}")

    def alerts(self, **params: str) -> list[dict[str, Any]]:
        """`GET /api/v2/alerts` (active alerts by default, as Alertmanager answers)."""
        response = HTTP.get(f"{self.url}/api/v2/alerts", params=params or None, timeout=5.0)
        response.raise_for_status()
        return list(response.json())

    def stop(self, *, cleanup: bool = True) -> None:
        terminate(self._process)
        self._process = None
        if cleanup:
            shutil.rmtree(self._workdir, ignore_errors=True)
