"""panva/oidc-provider (npm, pinned by devkit/oidc/package-lock.json) on loopback, with a
resource server that verifies each token's signature, issuer and `aud` (and, for a
certificate-bound token, the client certificate it is bound to).

    with OidcProvider(tmp, clients=[private_key_jwt_client("c1", jwks)], tls=True) as op:
        op.issuer, op.token_url, op.resource_url, op.ca_cert
        op.seed_refresh_token("c1")          # as if a person had consented

`npm ci` runs on first use (node 20 or later and the npm registry are needed). Every client is
configured per test (RFC 7591 metadata); the provider's signing key and TLS certificates are
throwaway. devkit/oidc/server.mjs is the server; this module starts and stops it.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import ssl
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from keyturn_devkit.dev.ports import free_port_pair
from keyturn_devkit.dev.process import ManagedServer, spawn_logged, terminate
from keyturn_devkit.dev.tls import ThrowawayPKI, make_throwaway_pki

OIDC_DIR = Path(__file__).resolve().parents[3] / "oidc"
DEFAULT_RESOURCE = "https://api.keyturn.test/"


class OidcProviderError(RuntimeError):
    """The server could not be installed or started (the message says where its log is)."""


def ensure_installed(directory: Path = OIDC_DIR) -> None:
    """`npm ci` in `directory` unless oidc-provider is there already (one installer at a time:
    test workers start together)."""
    if (directory / "node_modules" / "oidc-provider").is_dir():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise OidcProviderError("npm is not installed (Debian: apt-get install nodejs npm)")
    with (directory / ".npm-ci.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (directory / "node_modules" / "oidc-provider").is_dir():
            return
        result = subprocess.run(  # fixed argv
            [npm, "ci", "--no-audit", "--no-fund", "--silent"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode != 0:
            raise OidcProviderError(f"npm ci failed in {directory}: {result.stderr[-500:]}")


def private_key_jwt_client(
    client_id: str, jwks: Mapping[str, Any], *, alg: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A confidential client that authenticates only with a signed assertion."""
    client = {
        "client_id": client_id,
        "token_endpoint_auth_method": "private_key_jwt",
        "jwks": dict(jwks),
        "grant_types": ["client_credentials", "refresh_token"],
        "response_types": [],
        "redirect_uris": [],
        **extra,
    }
    if alg is not None:
        client["token_endpoint_auth_signing_alg"] = alg
    return client


def self_signed_tls_client(client_id: str, jwks: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """A client that authenticates only with its self-signed certificate (RFC 8705 §2.2), whose
    tokens are bound to it (`tls_client_certificate_bound_access_tokens`)."""
    return {
        "client_id": client_id,
        "token_endpoint_auth_method": "self_signed_tls_client_auth",
        "tls_client_certificate_bound_access_tokens": True,
        "jwks": dict(jwks),
        "grant_types": ["client_credentials", "refresh_token"],
        "response_types": [],
        "redirect_uris": [],
        **extra,
    }


def jwks_uri_client(client_id: str, jwks_uri: str, **extra: Any) -> dict[str, Any]:
    """A private_key_jwt client whose keys the provider fetches from `jwks_uri`."""
    return {
        "client_id": client_id,
        "token_endpoint_auth_method": "private_key_jwt",
        "jwks_uri": jwks_uri,
        "grant_types": ["client_credentials"],
        "response_types": [],
        "redirect_uris": [],
        **extra,
    }


class OidcProvider(ManagedServer):
    """oidc-provider and its resource server, on two loopback ports. `tls`: both serve HTTPS
    with a throwaway CA (`ca_cert`) and ask every client for a certificate (mTLS clients).
    `resources`: RFC 8707 resource indicators the provider knows (indicator -> {scope, ttl});
    every access token is a JWT for `default_resource` unless a request names another.
    `service_accounts`: email -> JWKS, the keys `google_token_url` accepts assertions from.
    `registration`: RFC 7591/7592 dynamic registration (True: open; a string: the initial
    access token it needs), with registration access tokens rotated on each use."""

    def __init__(
        self,
        workdir: Path,
        *,
        clients: Sequence[Mapping[str, Any]] = (),
        tls: bool = False,
        access_token_ttl: int = 60,
        refresh_token_ttl: int = 86400,
        resources: Mapping[str, Mapping[str, Any]] | None = None,
        default_resource: str = DEFAULT_RESOURCE,
        registration: bool | str = False,
        clock_tolerance: int = 5,
        service_accounts: Mapping[str, Mapping[str, Any]] | None = None,
        pki: ThrowawayPKI | None = None,
    ) -> None:
        self.workdir = workdir
        self.clients = [dict(c) for c in clients]
        self.tls = tls
        self.access_token_ttl = access_token_ttl
        self.refresh_token_ttl = refresh_token_ttl
        self.resources = dict(resources or {default_resource: {"scope": "read write"}})
        self.default_resource = default_resource
        self.registration = registration
        self.clock_tolerance = clock_tolerance
        self.service_accounts = dict(service_accounts or {})
        self.pki = pki  # with tls: made at start unless given (a test signs client certificates)
        self.issuer = ""
        self.resource_url = ""
        self._process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"OidcProvider({self.issuer or 'not started'!r})"

    @property
    def log_path(self) -> Path:
        return self.workdir / "oidc-provider.log"

    @property
    def token_url(self) -> str:
        return self.issuer + "/token"

    @property
    def google_token_url(self) -> str:
        """The harness's Google-style JWT bearer endpoint (`service_accounts` sign for it)."""
        return self.issuer + "/__google/token"

    @property
    def ca_cert(self) -> Path | None:
        return self.pki.ca_cert if self.pki else None

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """What an httpx client's `verify` should be to trust this server."""
        return ssl.create_default_context(cafile=str(self.pki.ca_cert)) if self.pki else True

    def start(self, timeout: float = 60.0) -> OidcProvider:
        ensure_installed()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.tls and self.pki is None:
            self.pki = make_throwaway_pki(self.workdir / "oidc-pki")
        ready = self.workdir / "oidc-ready.json"
        ready.unlink(missing_ok=True)
        port = free_port_pair()
        config = {
            "port": port,
            "resource_port": port + 1,
            "clients": self.clients,
            "access_token_ttl": self.access_token_ttl,
            "refresh_token_ttl": self.refresh_token_ttl,
            "resources": self.resources,
            "default_resource": self.default_resource,
            "clock_tolerance": self.clock_tolerance,
            "ready_file": str(ready),
            "service_accounts": self.service_accounts,
            "tls": None
            if self.pki is None
            else {
                "cert": str(self.pki.cert),
                "key": str(self.pki.key),
                "ca": str(self.pki.ca_cert),
            },
            "registration": None
            if not self.registration
            else {
                "initial_access_token": self.registration
                if isinstance(self.registration, str)
                else None
            },
        }
        config_path = self.workdir / "oidc-provider.json"
        config_path.write_text(json.dumps(config))
        node = shutil.which("node")
        if node is None:
            raise OidcProviderError("node is not installed (Debian: apt-get install nodejs)")
        self._process = spawn_logged(
            [node, str(OIDC_DIR / "server.mjs"), str(config_path)], self.log_path, cwd=OIDC_DIR
        )
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise OidcProviderError(f"oidc-provider did not start; see {self.log_path}")
            time.sleep(0.05)
        answer = json.loads(ready.read_text())
        self.issuer, self.resource_url = answer["issuer"], answer["resource_url"]
        return self

    def stop(self) -> None:
        terminate(self._process)
        self._process = None

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.issuer, verify=self.verify, timeout=10.0, **kwargs)

    def metadata(self) -> dict[str, Any]:
        with self.client() as http:
            answer = http.get("/.well-known/openid-configuration")
            answer.raise_for_status()
            return dict(answer.json())

    def registration_presentations(self, client_id: str) -> list[tuple[str, str]]:
        """Each request to `client_id`'s registration URI (RFC 7592) so far, in order: its
        method and the sha256 of the registration access token it presented."""
        with self.client() as http:
            answer = http.get("/__dev/registration-presentations")
            answer.raise_for_status()
        path = f"/reg/{client_id}"
        return [(seen["method"], seen["sha256"]) for seen in answer.json() if seen["path"] == path]

    def client_assertions(self) -> list[dict[str, Any]]:
        """Every client assertion the token endpoint judged, in order, as the server logged it:
        {"outcome": "accepted" | "refused", "client", "kid", "at" (ms since the epoch)}. Read
        once, after the fact (the log is not polled)."""
        prefix = "client_assertion: "
        return [
            json.loads(line[len(prefix) :])
            for line in self.log_path.read_text().splitlines()
            if line.startswith(prefix)
        ]

    def seed_refresh_token(self, client_id: str, resource: str | None = None) -> str:
        """A refresh token for `client_id`, as an authorization-code flow with a consenting
        person would have given one."""
        body = {"client_id": client_id, "resource": resource or self.default_resource}
        with self.client() as http:
            answer = http.post("/__dev/refresh-token", json=body)
            answer.raise_for_status()
            return str(answer.json()["refresh_token"])
