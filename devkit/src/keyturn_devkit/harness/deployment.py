"""A ready-to-run keyturn deployment on a dev OpenBao and the sandbox.

Registers OAuth clients in the sandbox, stores their inputs in Vault, and writes a
keyturn.toml. The demo, the benchmarks and the integration tests all start from here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hvac

from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.process import ManagedServer, terminate
from keyturn_devkit.dev.sandbox import SandboxProcess


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _table(header: str, values: Mapping[str, Any]) -> str:
    lines = [header] + [f"{key} = {_toml(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


@dataclass
class Deployment:
    """Where everything is: the config file, the apps, and where each credential publishes."""

    config_path: Path
    vault: OpenBaoDevServer
    sandbox: SandboxProcess
    clients: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> client_id/secret
    publish_to: dict[str, str] = field(default_factory=dict)
    input_paths: dict[str, str] = field(default_factory=dict)
    state_prefix: str = "keyturn/state"

    def vault_client(self) -> hvac.Client:
        return hvac.Client(url=self.vault.address, token=self.vault.root_token)


def prepare_deployment(
    vault: OpenBaoDevServer,
    sandbox: SandboxProcess,
    workdir: Path,
    names: Iterable[str],
    *,
    namespace: str = "",
    keyturn: Mapping[str, Any] | None = None,
    provider: Mapping[str, Any] | None = None,
    credential: Mapping[str, Any] | None = None,
    use_bootstrap_client: bool = False,
    publish_folder: str | None = None,
) -> Deployment:
    """Register one OAuth app per name, store its inputs in Vault, write keyturn.toml.

    `namespace` prefixes every Vault path so several deployments share one OpenBao.
    `keyturn`, `provider` and `credential` add or override keys of those sections. Each
    credential publishes to `apps/<name>/sandbox`, or with `publish_folder` to
    `<publish_folder>/<name>` (one folder for all, which the watcher lists).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    root = hvac.Client(url=vault.address, token=vault.root_token)
    token_file = workdir / "vault-token"
    token_file.write_text(vault.root_token)
    token_file.chmod(0o600)
    base = f"{namespace.strip('/')}/" if namespace else ""
    state_prefix = f"{base}keyturn/state"
    deployment = Deployment(workdir / "keyturn.toml", vault, sandbox, state_prefix=state_prefix)
    sections = [
        _table(
            "[keyturn]",
            {"instance_id": "test", "state_prefix": state_prefix, **(keyturn or {})},
        ),
        _table(
            "[vault]",
            {"address": vault.address, "auth": {"method": "token_file", "path": str(token_file)}},
        ),
        _table("[metrics]", {"listen": "127.0.0.1:0"}),
        _table(
            "[[providers]]",
            {
                "name": "sandbox",
                "base_url": sandbox.base_url,
                "allow_insecure_http": True,
                "timeout": "3s",
                **(provider or {}),
            },
        ),
    ]
    for i, name in enumerate(names):
        if use_bootstrap_client and i == 0:
            client = dict(sandbox.bootstrap["oauth_client"])
        else:
            client = sandbox.admin.create_oauth_app(f"{namespace or 'keyturn'}-{name}")
        input_path = f"{base}keyturn/inputs/{name}"
        root.secrets.kv.v2.create_or_update_secret(
            path=input_path,
            secret={"client_id": client["client_id"], "client_secret": client["client_secret"]},
        )
        publish_to = (
            f"{base}{publish_folder}/{name}" if publish_folder else f"{base}apps/{name}/sandbox"
        )
        deployment.clients[name] = {
            "client_id": client["client_id"],
            "client_secret": client["client_secret"],
        }
        deployment.publish_to[name] = publish_to
        deployment.input_paths[name] = input_path
        sections.append(
            _table(
                "[[credentials]]",
                {
                    "name": name,
                    "provider": "sandbox",
                    "kind": "oauth_client",
                    "client_id": f"vault:secret/{input_path}#client_id",
                    "client_secret": f"vault:secret/{input_path}#client_secret",
                    "publish_to": publish_to,
                    "probe": "/v1/projects",
                    **(credential or {}),
                },
            )
        )
    deployment.config_path.write_text("\n".join(sections))
    return deployment


class DaemonProcess(ManagedServer):
    """`keyturn run -c FILE` as a subprocess, its output in `<workdir>/keyturn-N.log`.
    `entry` replaces `keyturn run` (e.g. `keyturn_devkit.harness.paused_daemon POINT`)."""

    def __init__(
        self,
        config_path: Path,
        workdir: Path,
        env: Mapping[str, str] | None = None,
        *,
        entry: Sequence[str] = ("keyturn", "run"),
    ):
        self.config_path = config_path
        self.workdir = workdir
        self._env = {**os.environ, **(env or {})}
        self._entry = list(entry)
        self._process: subprocess.Popen[bytes] | None = None
        self._runs = 0
        self.log_paths: list[Path] = []

    def start(self) -> DaemonProcess:
        self._runs += 1
        log_path = self.workdir / f"keyturn-{self._runs}.log"
        self.log_paths.append(log_path)
        with log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", *self._entry, "-c", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
            )
        self.wait_for_log("daemon.started", timeout=20)
        return self

    def wait_for_log(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log_paths[-1].read_text():
                return
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"keyturn exited:\n{self.log_paths[-1].read_text()}")
            time.sleep(0.05)
        raise TimeoutError(f"{needle!r} not logged within {timeout}s")

    def send(self, signum: int) -> None:
        """Send a signal (e.g. SIGHUP) without waiting for anything."""
        if self._process is not None:
            self._process.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send `signum` and wait (SIGKILL after `timeout`); returns the exit code."""
        process, self._process = self._process, None
        code = terminate(process, timeout=timeout, signum=signum)
        return 0 if code is None else code

    def log_text(self) -> str:
        return "".join(path.read_text() for path in self.log_paths if path.exists())
