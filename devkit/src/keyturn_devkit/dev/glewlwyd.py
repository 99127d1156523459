"""Glewlwyd (Debian's `glewlwyd` package, an OAuth 2 / OpenID Connect server in C by Nicolas
Mora) on loopback: a second identity server that nobody here wrote, for client credentials
with `private_key_jwt`.

    with GlewlwydServer(tmp) as idp:
        idp.add_private_key_jwt_client("reporting", jwks, scope="read")
        idp.token_url, idp.jwks_url, idp.issuer

With `registration=True`, the plugin also takes open dynamic client registration (RFC 7591,
`idp.register_url`) and lets each client manage its registration (RFC 7592) with the
registration access token it got.

It starts from the package's own SQLite schema (`init.sqlite3.sql.gz`, with its `admin` /
`password` administrator), logs in through the admin API, and adds an `oidc` plugin instance
(a throwaway RSA signing key, client credentials and JWT client authentication enabled), a
scope, and clients, all through that API, as an operator would in its web console.
"""

from __future__ import annotations

import gzip
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.ports import free_port_pair
from keyturn_devkit.dev.process import ManagedServer, spawn_logged, terminate, wait_answering

SCHEMA = Path("/usr/share/doc/glewlwyd/database/init.sqlite3.sql.gz")
PACKAGE_CONFIG = Path("/etc/glewlwyd/glewlwyd.conf")
ADMIN = {"username": "admin", "password": "password"}  # the schema's own, a throwaway server


class GlewlwydError(RuntimeError):
    """Glewlwyd is not installed, did not start, or refused a set-up call."""


class GlewlwydServer(ManagedServer):
    """One glewlwyd process with its own SQLite database in `workdir`."""

    def __init__(
        self, workdir: Path, *, access_token_ttl: int = 60, registration: bool = False
    ) -> None:
        self.workdir = workdir
        self.access_token_ttl = access_token_ttl
        self.registration = registration
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._admin: httpx.Client | None = None

    def __repr__(self) -> str:
        return f"GlewlwydServer({self.base_url!r})"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def issuer(self) -> str:
        return f"{self.base_url}/api/oidc"

    @property
    def token_url(self) -> str:
        return f"{self.issuer}/token"

    @property
    def jwks_url(self) -> str:
        return f"{self.issuer}/jwks"

    @property
    def register_url(self) -> str:
        return f"{self.issuer}/register"

    @property
    def log_path(self) -> Path:
        return self.workdir / "glewlwyd.log"

    def start(self, timeout: float = 30.0) -> GlewlwydServer:
        binary = shutil.which("glewlwyd")
        if binary is None or not SCHEMA.exists() or not PACKAGE_CONFIG.exists():
            raise GlewlwydError("glewlwyd is not installed (Debian: apt-get install glewlwyd)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        database = self.workdir / "glewlwyd.db"
        database.unlink(missing_ok=True)
        with sqlite3.connect(database) as db:
            db.executescript(gzip.decompress(SCHEMA.read_bytes()).decode())
        self.port = free_port_pair()
        config = self.workdir / "glewlwyd.conf"
        config.write_text(self._config(database))
        self._process = spawn_logged(
            [binary, "-c", str(config), "-m", "console"], self.log_path, cwd=self.workdir
        )
        deadline = time.monotonic() + timeout
        if not wait_answering(self._process, f"{self.base_url}/config/", deadline=deadline):
            self.stop()
            raise GlewlwydError(f"glewlwyd did not start; see {self.log_path}")
        self._admin = loopback.client(base_url=f"{self.base_url}/api", timeout=10.0)
        self._call("POST", "/auth/", ADMIN)
        self._add_oidc_plugin()
        return self

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        terminate(self._process)
        self._process = None

    def add_scope(self, name: str) -> None:
        body = {"name": name, "display_name": name, "description": name, "password_required": False}
        self._call("POST", "/scope/", {**body, "scheme": {}})

    def add_private_key_jwt_client(
        self, client_id: str, jwks: dict[str, Any], *, scope: str = "read"
    ) -> None:
        """A confidential client that may use only client credentials, authenticated only by
        an assertion signed with a key of `jwks`."""
        body = {
            "client_id": client_id,
            "name": client_id,
            "confidential": True,
            "enabled": True,
            "authorization_type": ["client_credentials"],
            "token_endpoint_auth_method": ["private_key_jwt"],
            "jwks": jwks,
            "scope": [scope],
            "redirect_uri": [],
        }
        self._call("POST", "/client/", body)

    def _call(self, method: str, path: str, body: dict[str, Any]) -> None:
        assert self._admin is not None
        answer = self._admin.request(method, path, json=body)
        if answer.status_code != 200:
            raise GlewlwydError(f"{method} {path}: HTTP {answer.status_code} {answer.text[:300]}")

    def _add_oidc_plugin(self) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ).decode()
        public = (
            key.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )
        no_claim: dict[str, str | bool] = {"type": "no", "mandatory": False}
        for field in ("formatted", "street_address", "locality", "region", "postal_code"):
            no_claim[field] = ""
        no_claim["country"] = ""
        parameters = {
            "iss": self.issuer,
            "jwt-type": "rsa",
            "jwt-key-size": "256",
            "key": private,
            "cert": public,
            "jwks-show": True,
            "access-token-duration": self.access_token_ttl,
            "refresh-token-duration": 3600,
            "code-duration": 600,
            "refresh-token-rolling": True,
            "allow-non-oidc": True,
            "auth-type-code-enabled": False,
            "auth-type-token-enabled": False,
            "auth-type-id-token-enabled": True,
            "auth-type-none-enabled": False,
            "auth-type-password-enabled": False,
            "auth-type-client-enabled": True,
            "auth-type-refresh-enabled": True,
            # JWT requests and client assertions (private_key_jwt) need this.
            "request-parameter-allow": True,
            "request-maximum-exp": 3600,
            "client-pubkey-parameter": "pubkey",
            "client-jwks-parameter": "jwks",
            "client-jwks_uri-parameter": "jwks_uri",
            "introspection-revocation-allowed": True,
            "introspection-revocation-auth-scope": [],
            "introspection-revocation-allow-target-client": True,
            "allowed-scope": ["openid", "read"],
            "scope": [],
            "claims": [],
            "additional-parameters": [],
            "secret-type": "pairwise",
            "name-claim": "no",
            "email-claim": "no",
            "scope-claim": "no",
            "address-claim": no_claim,
            # Open registration (no initial access token) with RFC 7592 management; the new
            # clients get the scope `read`.
            "register-client-allowed": self.registration,
            "register-client-auth-scope": [],
            "register-client-credentials-scope": ["read"],
            "register-client-management-allowed": self.registration,
        }
        body = {"module": "oidc", "name": "oidc", "display_name": "OIDC", "enabled": True}
        self._call("POST", "/mod/plugin/", {**body, "parameters": parameters})
        self.add_scope("read")

    def _config(self, database: Path) -> str:
        """The package's configuration with this server's port, URL, log and database."""
        replaced = {
            "port=": f"port={self.port}",
            "external_url=": f'external_url="{self.base_url}"',
            "log_mode=": None,
            "log_file=": None,
            "bind_address": None,
            '@include "/etc/glewlwyd/glewlwyd-db.conf"': (
                f'database = {{ type = "sqlite3"\n path = "{database}" }};'
            ),
        }
        lines = []
        for line in PACKAGE_CONFIG.read_text().splitlines():
            start = next((key for key in replaced if line.startswith(key)), None)
            new = line if start is None else replaced[start]
            if new is not None:
                lines.append(new)
        lines.append('bind_address="127.0.0.1"')
        return "\n".join(lines) + "\n"
