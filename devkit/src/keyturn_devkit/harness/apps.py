"""What apps see: a thread that reads every published path from Vault, as an app does, and
calls the service with each value it read.

    sampler = AppSampler(vault_address, root_token, sandbox_url, {"alpha": "apps/alpha/x"})
    sampler.start(limit=60)          # reads every `interval` s until stop() or `limit` s
    ...
    sampler.stop()
    sampler.expired(), sampler.refused(), sampler.vault_errors()

Every read is kept (`reads`): when it was made, the KV version and `expires_at` read, and the
service's answer to the value (status and `error_description`). An *expired* read is one whose
published `expires_at` had passed when it was read; a *refused* read is one the service did
not accept (401/403, or no answer). Reads that Vault itself could not answer (down, sealed)
are neither: an app then keeps what it had, and keyturn cannot help it.

Used by the fault-injection tests (tests/integration/test_faults.py); the simpler foreground
`Sampler` of tests/integration/test_daemon.py predates it.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
import hvac
import hvac.exceptions
import requests

from keyturn.clock import parse_rfc3339

NOTHING_PUBLISHED = "nothing published"


@dataclass(frozen=True, slots=True)
class AppRead:
    """One read of one published path, and what the service said about the value."""

    name: str
    at: float  # wall clock (time.time()) when the value was read from Vault
    version: int | None  # KV version read; None when nothing could be read
    expires_at: float | None  # the published `expires_at`
    status: int | None  # the service's answer to the value; None when it was not called
    detail: str = ""  # the service's error_description, or what failed

    @property
    def vault_failed(self) -> bool:
        """Vault did not answer with a value (down, sealed, refused), other than "nothing is
        published yet"."""
        return self.version is None and self.detail != NOTHING_PUBLISHED

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= self.at

    @property
    def refused(self) -> bool:
        return self.version is not None and self.status != 200

    def __str__(self) -> str:
        left = "?" if self.expires_at is None else f"{self.expires_at - self.at:+.2f}s"
        return (
            f"{self.name} v{self.version} at {self.at:.2f} (expires {left}): "
            f"{self.status} {self.detail}".rstrip()
        )


@dataclass
class AppSampler:
    """Reads `paths` (credential name -> KV path under `mount`) every `interval` seconds."""

    vault_address: str
    vault_token: str
    service_url: str
    paths: Mapping[str, str]
    mount: str = "secret"
    interval: float = 0.2
    probe: str = "/v1/projects"
    verify: str | bool = True  # the service's CA (a path) where it is not publicly trusted
    cert: tuple[str, str] | None = None  # a client certificate and key (bound tokens, RFC 8705)
    reads: list[AppRead] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- one read --------------------------------------------------------------------------------

    def read(self, name: str, vault: hvac.Client, http: httpx.Client) -> AppRead:
        """Read one path as an app does and call the service with the value; keep the read."""
        at = time.time()
        try:
            entry = vault.secrets.kv.v2.read_secret_version(
                path=self.paths[name], mount_point=self.mount, raise_on_deleted_version=True
            )
        except hvac.exceptions.InvalidPath:
            read = AppRead(name, at, None, None, None, NOTHING_PUBLISHED)
        except (hvac.exceptions.VaultError, requests.RequestException) as error:
            read = AppRead(name, at, None, None, None, f"vault: {type(error).__name__}")
        else:
            data = entry["data"]["data"]
            version = int(entry["data"]["metadata"]["version"])
            expires_at = parse_rfc3339(data["expires_at"]) if "expires_at" in data else None
            status: int | None
            try:
                answer = http.get(self.probe, headers={"Authorization": data["authorization"]})
                status = answer.status_code
                detail = "" if status == 200 else _description(answer)
            except httpx.HTTPError as error:
                status, detail = None, f"service: {type(error).__name__}"
            read = AppRead(name, at, version, expires_at, status, detail)
        with self._lock:
            self.reads.append(read)
        return read

    def read_all(self) -> list[AppRead]:
        with self._clients() as (vault, http):
            return [self.read(name, vault, http) for name in self.paths]

    def _clients(self) -> _Clients:
        return _Clients(self)

    # -- in a thread -----------------------------------------------------------------------------

    def start(self, limit: float = 120.0) -> AppSampler:
        """Read every path every `interval` s in a thread, for at most `limit` seconds."""
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, args=(time.monotonic() + limit,), daemon=True, name="app-sampler"
        )
        self._thread.start()
        return self

    def _loop(self, deadline: float) -> None:
        with self._clients() as (vault, http):
            while not self._stop.is_set() and time.monotonic() < deadline:
                for name in self.paths:
                    self.read(name, vault, http)
                self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None

    # -- what was seen ---------------------------------------------------------------------------

    def snapshot(self, name: str | None = None, since: float = 0.0) -> list[AppRead]:
        with self._lock:
            return [r for r in self.reads if (name is None or r.name == name) and r.at >= since]

    def expired(self, name: str | None = None, since: float = 0.0) -> list[AppRead]:
        return [r for r in self.snapshot(name, since) if r.expired]

    def refused(self, name: str | None = None, since: float = 0.0) -> list[AppRead]:
        return [r for r in self.snapshot(name, since) if r.refused]

    def vault_errors(self, name: str | None = None, since: float = 0.0) -> list[AppRead]:
        return [r for r in self.snapshot(name, since) if r.vault_failed]

    def latest(self, name: str) -> AppRead | None:
        found = [r for r in self.snapshot(name) if r.version is not None]
        return found[-1] if found else None

    def wait_version(self, name: str, min_version: int = 1, timeout: float = 30.0) -> AppRead:
        """Wait (the thread must be running) until `name` is read at `min_version` or later."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            latest = self.latest(name)
            if latest is not None and latest.version is not None and latest.version >= min_version:
                return latest
            time.sleep(0.05)
        raise TimeoutError(f"{name} not read at version {min_version} within {timeout}s")

    def summary(self, name: str | None = None) -> str:
        reads = self.snapshot(name)
        versions = sorted({r.version for r in reads if r.version is not None})
        return (
            f"{len(reads)} reads, versions {versions[:1]}..{versions[-1:]}, "
            f"{sum(r.expired for r in reads)} expired, {sum(r.refused for r in reads)} refused, "
            f"{sum(r.vault_failed for r in reads)} Vault failures"
        )


class _Clients:
    """A root hvac client and an httpx client to the service, closed together."""

    def __init__(self, sampler: AppSampler) -> None:
        self._sampler = sampler
        self._vault: hvac.Client | None = None
        self._http: httpx.Client | None = None

    def __enter__(self) -> tuple[hvac.Client, httpx.Client]:
        s = self._sampler
        self._vault = hvac.Client(url=s.vault_address, token=s.vault_token, timeout=2)
        tls = (
            ssl.create_default_context(cafile=s.verify)
            if isinstance(s.verify, str)
            else httpx.create_ssl_context(verify=s.verify)
        )
        if s.cert is not None:
            tls.load_cert_chain(*s.cert)
        self._http = httpx.Client(base_url=s.service_url, timeout=3.0, verify=tls)
        return self._vault, self._http

    def __exit__(self, *exc: object) -> None:
        if self._http is not None:
            self._http.close()
        if self._vault is not None:
            self._vault.adapter.close()


def _description(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("error_description", "")) if isinstance(body, dict) else ""
