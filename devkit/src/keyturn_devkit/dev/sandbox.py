"""A real sandbox service in a subprocess, for `keyturn demo`, the benchmarks and the tests.

    with SandboxProcess(config={"access_token_lifetime": 5}, workdir=tmp) as sandbox:
        sandbox.base_url, sandbox.bootstrap["oauth_client"]["client_id"]
        sandbox.admin.create_api_key("ci")

It runs `python -m keyturn_devkit.sandbox --port 0 --bootstrap-out …` (the `keyturn sandbox` command
without the rest of the CLI), with stdout and stderr in `<workdir>/sandbox.log`, and is ready
once the bootstrap file appears.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.process import ManagedServer, spawn_logged, terminate


def _toml_value(value: Any, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{key}: TOML cannot hold {value}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v, key) for v in value) + "]"
    if isinstance(value, Mapping):
        items = (f"{k} = {_toml_value(v, f'{key}.{k}')}" for k, v in value.items() if v is not None)
        return "{" + ", ".join(items) + "}"
    raise ValueError(f"{key}: cannot write a {type(value).__name__} to TOML")


def to_toml(config: Mapping[str, Any]) -> str:
    """TOML for flat scalars, lists and tables (nested tables become inline); None is omitted."""
    lines: list[str] = []
    tables: list[str] = []
    for key, value in config.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            tables.append(f"\n[{key}]")
            tables.extend(
                f"{k} = {_toml_value(v, f'{key}.{k}')}" for k, v in value.items() if v is not None
            )
        else:
            lines.append(f"{key} = {_toml_value(value, key)}")
    return "\n".join([*lines, *tables]) + "\n"


class SandboxAdmin:
    """A small synchronous client for the sandbox's admin API; every method returns its JSON.

    Errors raise `httpx.HTTPStatusError` (whose message holds the URL, never a secret).
    """

    def __init__(self, base_url: str, admin_token: str, timeout: float = 10.0) -> None:
        self._client = loopback.client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=timeout,
        )

    def __repr__(self) -> str:
        return f"SandboxAdmin({str(self._client.base_url)!r})"

    def request(self, method: str, path: str, body: Any = None, **params: str) -> Any:
        response = self._client.request(method, path, json=body, params=params or None)
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        self._client.close()

    # API keys
    def create_api_key(self, name: str, description: str = "", scope: str | None = None) -> Any:
        body = {"name": name, "description": description, "scope": scope}
        return self.request("POST", "/admin/api-keys", body)

    def list_api_keys(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/admin/api-keys")["api_keys"])

    def get_api_key(self, key_id: str) -> Any:
        return self.request("GET", f"/admin/api-keys/{key_id}")

    def revoke_api_key(self, key_id: str) -> Any:
        return self.request("DELETE", f"/admin/api-keys/{key_id}")

    # OAuth applications
    def create_oauth_app(
        self,
        name: str,
        redirect_uri: str = "http://127.0.0.1/callback",
        scope: str | None = None,
    ) -> Any:
        body = {"name": name, "redirect_uri": redirect_uri, "scope": scope}
        return self.request("POST", "/admin/oauth-apps", body)

    def list_oauth_apps(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/admin/oauth-apps")["oauth_apps"])

    def get_oauth_app(self, client_id: str) -> Any:
        return self.request("GET", f"/admin/oauth-apps/{client_id}")

    def delete_oauth_app(self, client_id: str) -> Any:
        return self.request("DELETE", f"/admin/oauth-apps/{client_id}")

    def rotate_client_secret(self, client_id: str, overlap_seconds: int | None = None) -> Any:
        body = {} if overlap_seconds is None else {"overlap_seconds": overlap_seconds}
        return self.request("POST", f"/admin/oauth-apps/{client_id}/rotate-secret", body)

    def revoke_client_secret(self, client_id: str, secret_id: str) -> Any:
        return self.request("DELETE", f"/admin/oauth-apps/{client_id}/secrets/{secret_id}")

    # tokens, usage, settings, faults
    def list_tokens(self, client_id: str | None = None) -> list[dict[str, Any]]:
        params = {"client_id": client_id} if client_id else {}
        return list(self.request("GET", "/admin/tokens", **params)["tokens"])

    def revoke_token(self, token: str) -> Any:
        return self.request("POST", "/admin/tokens/revoke", {"token": token})

    def introspect_token(self, token: str) -> Any:
        return self.request("POST", "/admin/tokens/introspect", {"token": token})

    def revoke_client_tokens(self, client_id: str) -> Any:
        return self.request("POST", "/admin/tokens/revoke", {"client_id": client_id})

    def usage(self) -> Any:
        return self.request("GET", "/admin/usage")

    def settings(self) -> Any:
        return self.request("GET", "/admin/settings")

    def update_settings(self, **changes: Any) -> Any:
        return self.request("PUT", "/admin/settings", changes)

    def faults(self) -> Any:
        return self.request("GET", "/admin/faults")

    def set_faults(self, rules: Mapping[str, Any]) -> Any:
        return self.request("PUT", "/admin/faults", dict(rules))

    def clear_faults(self) -> Any:
        return self.request("DELETE", "/admin/faults")


class SandboxProcess(ManagedServer):
    """`keyturn sandbox` as a subprocess on a free loopback port; stop() or `with` ends it."""

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        workdir: Path | None = None,
        *,
        log_level: str = "info",
    ) -> None:
        if workdir is None:
            import tempfile  # noqa: PLC0415 - only when the caller gives no directory

            workdir = Path(tempfile.mkdtemp(prefix="keyturn-sandbox-"))
        self.workdir = Path(workdir)
        self.config = dict(config or {})
        self.log_level = log_level
        self.bootstrap_path = self.workdir / "bootstrap.json"
        self.log_path = self.workdir / "sandbox.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._bootstrap: dict[str, Any] | None = None
        self._admin: SandboxAdmin | None = None

    def __repr__(self) -> str:
        url = self._bootstrap["base_url"] if self._bootstrap else "not started"
        return f"SandboxProcess({url})"

    def start(self, timeout: float = 15.0) -> SandboxProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bootstrap_path.unlink(missing_ok=True)
        args = [sys.executable, "-m", "keyturn_devkit.sandbox", "--port", "0"]
        args += ["--bootstrap-out", str(self.bootstrap_path), "--log-level", self.log_level]
        if self.config:
            config_path = self.workdir / "sandbox.toml"
            config_path.write_text(to_toml(self.config), encoding="utf-8")
            args += ["--config", str(config_path)]
        self._process = spawn_logged(
            args, self.log_path, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        deadline = time.monotonic() + timeout
        while not self.bootstrap_path.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                code = self._process.poll()
                self.stop()
                raise RuntimeError(
                    f"sandbox did not start (exit code {code}); see {self.log_path}:\n"
                    + self.log_text()[-2000:]
                )
            time.sleep(0.02)
        self._bootstrap = json.loads(self.bootstrap_path.read_text(encoding="utf-8"))
        return self

    @property
    def bootstrap(self) -> dict[str, Any]:
        """The parsed bootstrap file: base_url, admin_token, api_key, oauth_client."""
        if self._bootstrap is None:
            raise RuntimeError("the sandbox is not started")
        return self._bootstrap

    @property
    def base_url(self) -> str:
        return str(self.bootstrap["base_url"])

    @property
    def admin_token(self) -> str:
        return str(self.bootstrap["admin_token"])

    @property
    def admin(self) -> SandboxAdmin:
        if self._admin is None:
            self._admin = SandboxAdmin(self.base_url, self.admin_token)
        return self._admin

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_text(self) -> str:
        """Everything the server wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, SIGKILL if it will not go; returns the exit code."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        process, self._process = self._process, None
        return terminate(process, timeout=timeout)
