"""The blocking edge: one hvac client on a bounded thread pool, and error translation.

hvac (and requests under it) block, so every call runs on a dedicated `ThreadPoolExecutor`
whose size is the Vault concurrency; the requests pool holds as many connections, so no call
waits for a socket and no more than `max_workers` requests are ever in flight. Everything hvac
or requests raises is translated here, once, into keyturn's `VaultError` tree with
`raise ... from exc`; messages name the operation and path, never a value.

Every call also reports itself to an optional `on_operation(operation, result, seconds)`
callback (metrics): `operation` is one of `VAULT_OPERATIONS`, `result` one of `VAULT_RESULTS`
(see `operation_result`). A read of a missing path counts as `not_found`, not as an error:
it is how keyturn learns that a record does not exist yet, so dashboards should not treat it
as a failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args
from urllib.parse import quote

import hvac  # no stubs: hvac stays behind this module
import hvac.adapters
import hvac.exceptions as hvac_errors
import requests
from requests.adapters import HTTPAdapter

from keyturn.clock import Clock, SystemClock
from keyturn.errors import (
    VaultAuthError,
    VaultCasConflict,
    VaultDataError,
    VaultError,
    VaultPermissionDenied,
    VaultUnavailable,
)
from keyturn.logs import get_logger
from keyturn.secret import Secret
from keyturn.vault.store import validate_path

T = TypeVar("T")

VaultOperation = Literal[
    "read",
    "write",
    "read_metadata",
    "delete",
    "read_field",
    "capabilities",
    "login",
    "renew",
    "lookup",
]
VaultResult = Literal[
    "success",
    "cas_conflict",
    "permission_denied",
    "unavailable",
    "auth_error",
    "not_found",
    "error",
]
VAULT_OPERATIONS: tuple[str, ...] = get_args(VaultOperation)
VAULT_RESULTS: tuple[str, ...] = get_args(VaultResult)

# Called after every Vault call with (operation, result, seconds); must not raise.
OnOperation = Callable[[str, str, float], None]


def _ignore(operation: str, result: str, seconds: float) -> None:
    """The default `on_operation`: nothing is measured."""


_MISSING = object()  # a 404 the caller said was fine (`missing_ok`)
log = get_logger("keyturn.vault")

_STATUS: dict[type[Exception], int] = {
    hvac_errors.InvalidRequest: 400,
    hvac_errors.Unauthorized: 401,
    hvac_errors.Forbidden: 403,
    hvac_errors.InvalidPath: 404,
    hvac_errors.RateLimitExceeded: 429,
    hvac_errors.InternalServerError: 500,
    hvac_errors.VaultNotInitialized: 501,
    hvac_errors.BadGateway: 502,
    hvac_errors.VaultDown: 503,
}
_UNAVAILABLE = (
    hvac_errors.RateLimitExceeded,
    hvac_errors.InternalServerError,
    hvac_errors.VaultNotInitialized,
    hvac_errors.BadGateway,
    hvac_errors.VaultDown,
    hvac_errors.UnexpectedError,  # any other status (412 from a standby, 504, ...)
)


@dataclass(frozen=True, slots=True)
class VaultConnection:
    """Where Vault is and how hard keyturn may lean on it (mapped from the `[vault]` table)."""

    address: str
    mount: str = "secret"
    namespace: str | None = None
    ca_cert: Path | None = None
    timeout: float = 10.0
    max_workers: int = 8
    renew_margin: float = 60.0  # keyturn's own token is renewed at least this long before expiry

    def __post_init__(self) -> None:
        if not self.address.startswith(("http://", "https://")):
            raise ValueError(f"vault address {self.address!r} must start with http:// or https://")
        validate_path(self.mount, what="mount")
        if self.max_workers < 1:
            raise ValueError("vault max_workers must be at least 1")
        if self.timeout <= 0 or self.renew_margin < 0:
            raise ValueError("vault timeout must be positive and renew_margin not negative")


def api_url(*parts: str) -> str:
    """`v1/<parts>` with every part percent-quoted (slashes kept): paths are data, not syntax."""
    return "v1/" + "/".join(quote(part, safe="/") for part in parts)


def translate(
    exc: BaseException, *, operation: str, path: str | None, auth: bool = False
) -> VaultError | None:
    """keyturn's error for something hvac or requests raised; None if it is not theirs (a bug).

    `auth=True` is for login calls, where 400/401/403/404 all mean the credentials or the
    auth mount are wrong (`VaultAuthError`) rather than a data or policy problem.
    """
    if isinstance(exc, requests.exceptions.InvalidJSONError):
        return VaultDataError(f"vault {operation}: response is not valid JSON", path=path)
    if isinstance(exc, requests.Timeout):
        return VaultUnavailable(f"vault {operation}: timed out", path=path)
    if isinstance(exc, requests.RequestException):
        return VaultUnavailable(
            f"vault {operation}: cannot reach vault ({type(exc).__name__})", path=path
        )
    if not isinstance(exc, hvac_errors.VaultError):
        return None
    status = _STATUS.get(type(exc))
    where = f"vault {operation}: " + (f"HTTP {status}" if status else type(exc).__name__)
    if isinstance(exc, _UNAVAILABLE):
        return VaultUnavailable(f"{where}, vault unavailable", path=path)
    if auth and status in (400, 401, 403, 404):
        return VaultAuthError(f"{where}, login rejected", path=path)
    if isinstance(exc, hvac_errors.InvalidRequest) and "check-and-set" in str(exc.args[0] or ""):
        return VaultCasConflict(f"vault {operation}: check-and-set conflict", path=path)
    if isinstance(exc, hvac_errors.Unauthorized):
        return VaultAuthError(f"{where}, token rejected", path=path)
    if isinstance(exc, hvac_errors.Forbidden):
        return VaultPermissionDenied(f"{where}, permission denied", path=path)
    if isinstance(exc, hvac_errors.InvalidPath):
        return VaultDataError(f"{where}, not found", path=path)
    return VaultDataError(f"{where}, request rejected", path=path)


def operation_result(error: BaseException) -> VaultResult:
    """The `result` word for a failed Vault call (`error` as raised by `VaultClient.run`)."""
    if isinstance(error, VaultCasConflict):
        return "cas_conflict"
    if isinstance(error, VaultPermissionDenied):
        return "permission_denied"
    if isinstance(error, VaultUnavailable):
        return "unavailable"
    if isinstance(error, VaultAuthError):
        return "auth_error"
    if isinstance(error, VaultDataError) and isinstance(error.__cause__, hvac_errors.InvalidPath):
        return "not_found"
    return "error"


class VaultClient:
    """hvac behind a bounded thread pool; the token is held by `TokenKeeper`, not here.

    `adapter` replaces the HTTP transport (a `requests` adapter), for tests that must not open
    sockets; `clock` times each call for `on_operation`.
    """

    def __init__(
        self,
        connection: VaultConnection,
        *,
        clock: Clock | None = None,
        on_operation: OnOperation | None = None,
        adapter: requests.adapters.BaseAdapter | None = None,
    ) -> None:
        self.connection = connection
        self.on_operation: OnOperation = on_operation or _ignore
        self._clock: Clock = clock or SystemClock()
        self._session = requests.Session()
        pool = adapter or HTTPAdapter(
            pool_connections=2, pool_maxsize=connection.max_workers, max_retries=0
        )
        self._session.mount("http://", pool)
        self._session.mount("https://", pool)
        verify: bool | str = str(connection.ca_cert) if connection.ca_cert else True
        self._session.verify = verify
        options: dict[str, Any] = {
            "timeout": connection.timeout,
            "session": self._session,
            "namespace": connection.namespace,
            "verify": verify,
        }
        # token="" (not None): hvac must not pick up VAULT_TOKEN or ~/.vault-token by itself.
        self._hvac: Any = hvac.Client(url=connection.address, token="", **options)
        # Logins and token look-ups go through a token-less adapter sharing the same pool.
        self._plain: Any = hvac.adapters.JSONAdapter(
            base_uri=connection.address, token=None, **options
        )
        self._executor = ThreadPoolExecutor(
            max_workers=connection.max_workers, thread_name_prefix="keyturn-vault"
        )
        self._closed = False

    def set_token(self, token: Secret) -> None:
        """Use `token` for every later data call (a plain attribute: safe across threads)."""
        self._hvac.token = token.reveal()

    async def request(
        self,
        method: str,
        url: str,
        *,
        kind: VaultOperation,
        operation: str,
        path: str | None,
        json: Mapping[str, Any] | None = None,
        missing_ok: bool = False,
        auth: bool = False,
        token: Secret | None = None,
    ) -> dict[str, Any] | None:
        """One HTTP call; the JSON body, or None for 204 (or for 404 when `missing_ok`).

        `kind` is the call's word for metrics (`on_operation`); `operation` describes it in
        error messages. `auth` and `token` route the call through the token-less adapter:
        logins send no token, look-ups of a candidate token send that one instead of the
        current one.
        """
        adapter = self._plain if (auth or token is not None) else self._hvac.adapter
        headers = {"X-Vault-Token": token.reveal()} if token is not None else None
        body = dict(json) if json is not None else None

        def call() -> object:
            try:
                response = adapter.request(method, url, headers=headers, json=body)
            except hvac_errors.InvalidPath:
                if missing_ok:
                    return _MISSING
                raise
            return response if isinstance(response, dict) else None

        started = self._clock.monotonic()
        try:
            answer = await self.run(call, operation=operation, path=path, auth=auth)
        except Exception as exc:
            self._report(kind, operation_result(exc), started)
            raise
        self._report(kind, "not_found" if answer is _MISSING else "success", started)
        return answer if isinstance(answer, dict) else None

    def _report(self, kind: VaultOperation, result: VaultResult, started: float) -> None:
        try:
            self.on_operation(kind, result, self._clock.monotonic() - started)
        except Exception as exc:  # a metrics bug must never fail a Vault call
            log.error("vault.on_operation_failed", error=repr(exc))

    async def run(
        self, fn: Callable[[], T], *, operation: str, path: str | None, auth: bool = False
    ) -> T:
        """Run blocking `fn` on the pool and translate what it raises."""
        if self._closed:
            raise RuntimeError("the vault client is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn)
        except Exception as exc:
            translated = translate(exc, operation=operation, path=path, auth=auth)
            if translated is None:
                raise
            raise translated from exc

    async def close(self) -> None:
        """Stop the pool (running calls finish) and close the connections."""
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._session.close()
