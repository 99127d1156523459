"""Vault audit logs for tests and the benchmark: synthetic entries in OpenBao's real shape,
and an OpenBao dev server with audit devices of one's choosing.

OpenBao 2 refuses `bao audit enable` through the API unless the server's configuration sets
`unsafe_allow_api_audit_creation`; its documented way is an `audit` block in the
configuration. `OpenBaoAuditServer` does both: the devices given are declared in its
configuration, and the API is allowed, so a test can also enable one as an operator would.
A `socket` device must have its listener up before the server starts (OpenBao sends a test
message when it creates the device and refuses to start if that fails).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from keyturn_devkit.dev.openbao import bao_binary
from keyturn_devkit.dev.ports import free_port_pair
from keyturn_devkit.dev.process import ManagedServer, spawn_logged, terminate, wait_answering

VERSION = "v2.7.2+builtin.bao"


def _hmac(text: str) -> str:
    return "hmac-sha256:" + hashlib.sha256(text.encode()).hexdigest()


def rfc3339_nano(epoch: float) -> str:
    """A time as OpenBao writes it in audit entries (`2026-11-24T01:27:08.54566651Z`)."""
    seconds, nanos = divmod(round(epoch * 1e9), 1_000_000_000)
    whole = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{nanos:09d}".rstrip("0").rstrip(".") + "Z"


@dataclass(frozen=True, slots=True)
class Reader:
    """A Vault identity as the audit log shows it: an AppRole login by default (`role` is its
    `metadata.role_name`); a token has `display_name="token-<name>"` and no role."""

    display_name: str = "approle"
    role: str | None = None
    entity_id: str = ""
    policies: tuple[str, ...] = ("default",)
    remote_address: str = "127.0.0.1"

    def auth(self, *, allowed: bool = True) -> dict[str, Any]:
        token = _hmac(f"token:{self.display_name}:{self.role}:{self.entity_id}")
        results: dict[str, Any] = {"allowed": allowed}
        if allowed:
            results["granting_policies"] = [
                {"name": self.policies[0], "namespace_id": "root", "type": "acl"}
            ]
        auth: dict[str, Any] = {
            "client_token": token,
            "accessor": _hmac(token),
            "display_name": self.display_name,
            "policies": list(self.policies),
            "token_policies": list(self.policies),
            "policy_results": results,
        }
        if self.role is not None:
            auth["metadata"] = {"role_name": self.role}
        if self.entity_id:
            auth["entity_id"] = self.entity_id
        auth.update(
            token_type="service", token_ttl=2764800, token_issue_time="2026-11-24T01:27:08Z"
        )
        return auth


def _request(
    reader: Reader, operation: str, mount: str, path: str, data: dict[str, Any] | None
) -> dict[str, Any]:
    token = _hmac(f"token:{reader.display_name}:{reader.role}:{reader.entity_id}")
    request: dict[str, Any] = {
        "id": secrets.token_hex(16),
        "client_id": reader.entity_id or _hmac(token)[12:56],
        "operation": operation,
        "mount_point": f"{mount}/",
        "mount_type": "kv",
        "mount_accessor": "kv_d057b241",
        "mount_running_version": VERSION,
        "mount_class": "secret",
        "client_token": token,
        "client_token_accessor": _hmac(token),
        "namespace": {"id": "root"},
        "path": f"{mount}/{path}",
    }
    if data is not None:
        request["data"] = data
    request.update(remote_address=reader.remote_address, remote_port=50200)
    return request


def _response(mount: str, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "mount_point": f"{mount}/",
        "mount_type": "kv",
        "mount_accessor": "kv_d057b241",
        "mount_running_plugin_version": VERSION,
        "mount_class": "secret",
        "data": data,
    }


def read_entries(
    reader: Reader,
    path: str,
    *,
    at: float,
    version: int = 1,
    mount: str = "secret",
    fields: tuple[str, ...] = ("api_key", "authorization"),
    allowed: bool = True,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request and response entries of a KV v2 read of `path` (relative to the mount),
    as OpenBao writes them: the response carries the version read; values are HMAC'd."""
    stamp = rfc3339_nano(at)
    auth = reader.auth(allowed=allowed)
    request = _request(reader, "read", mount, f"data/{path}", None)
    first = {"time": stamp, "type": "request", "auth": auth, "request": request}
    second: dict[str, Any] = {"time": stamp, "type": "response", "auth": auth, "request": request}
    if allowed:
        second["response"] = _response(
            mount,
            {
                "data": {f: _hmac(f"{path}:{version}:{f}") for f in fields},
                "metadata": {
                    "created_time": "2026-11-24T01:27:08.52653752Z",
                    "custom_metadata": None,
                    "deletion_time": _hmac(""),
                    "destroyed": False,
                    "version": version,
                },
            },
        )
    else:
        error = "1 error occurred:\n\t* permission denied\n\n"
        first["error"] = error
        second["response"] = _response(mount, {"error": _hmac("permission denied")})
        second["error"] = error
    return first, second


def write_entries(
    reader: Reader, path: str, *, at: float, version: int, mount: str = "secret"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request and response entries of a KV v2 write creating `version` of `path`."""
    stamp = rfc3339_nano(at)
    auth = reader.auth()
    data = {"data": {"api_key": _hmac(f"{path}:{version}")}, "options": {}}
    request = _request(reader, "update", mount, f"data/{path}", data)
    first = {"time": stamp, "type": "request", "auth": auth, "request": request}
    written = {
        "created_time": "2026-11-24T01:27:08.557211618Z",
        "custom_metadata": None,
        "deletion_time": _hmac(""),
        "destroyed": False,
        "version": version,
    }
    second = {
        "time": stamp,
        "type": "response",
        "auth": auth,
        "request": request,
        "response": _response(mount, written),
    }
    return first, second


def line(entry: dict[str, Any]) -> bytes:
    """One entry as a line of the log (compact JSON, as OpenBao's encoder writes it)."""
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


class OpenBaoAuditServer(ManagedServer):
    """`bao server -dev` on 127.0.0.1 with a `file` audit device at `file_path` (mode
    `file_mode`) and/or a `socket` device sending to `socket_address` (`host:port`)."""

    def __init__(
        self,
        *,
        file_path: Path | None = None,
        file_mode: str = "0640",
        socket_address: str | None = None,
    ) -> None:
        self.root_token = "root-" + secrets.token_hex(12)
        self.port = 0
        self.file_path = file_path
        self.file_mode = file_mode
        self.socket_address = socket_address
        self.workdir = Path(tempfile.mkdtemp(prefix="keyturn-openbao-audit-"))
        self.log_path = self.workdir / "bao.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config(self) -> str:
        blocks = ["unsafe_allow_api_audit_creation = true"]
        if self.file_path is not None:
            blocks.append(
                'audit "file" "file" {\n  options {\n'
                f'    file_path = "{self.file_path}"\n    mode = "{self.file_mode}"\n  }}\n}}'
            )
        if self.socket_address is not None:
            blocks.append(
                'audit "socket" "socket" {\n  options {\n'
                f'    address = "{self.socket_address}"\n    socket_type = "tcp"\n  }}\n}}'
            )
        return "\n".join(blocks) + "\n"

    def start(self, timeout: float = 20.0) -> OpenBaoAuditServer:
        config = self.workdir / "audit.hcl"
        config.write_text(self._config())
        for _attempt in range(5):
            self.port = free_port_pair()
            env = {
                **os.environ,
                "BAO_DEV_ROOT_TOKEN_ID": self.root_token,
                "HOME": str(self.workdir),
            }
            self._process = spawn_logged(
                [
                    bao_binary(),
                    "server",
                    "-dev",
                    "-dev-no-store-token",
                    f"-dev-listen-address=127.0.0.1:{self.port}",
                    f"-config={config}",
                ],
                self.log_path,
                env=env,
                cwd=self.workdir,
            )
            if wait_answering(  # the KV mount is up once its tuning can be read
                self._process,
                f"{self.address}/v1/sys/mounts/secret/tune",
                deadline=time.monotonic() + timeout,
                headers={"X-Vault-Token": self.root_token},
            ):
                return self
            terminate(self._process)
        raise RuntimeError(f"OpenBao did not start; see {self.log_path}")

    def bao(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        """Runs the `bao` CLI against this server (the root token unless `token`)."""
        env = {
            **os.environ,
            "BAO_ADDR": self.address,
            "BAO_TOKEN": token or self.root_token,
            "HOME": str(self.workdir),
        }
        return subprocess.run(
            [bao_binary(), *args], env=env, capture_output=True, text=True, check=False
        )

    def reopen_audit_files(self) -> None:
        """SIGHUP: OpenBao reopens its audit files (what logrotate's postrotate sends)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        terminate(self._process)
        self._process = None
        shutil.rmtree(self.workdir, ignore_errors=True)
