"""The blocking edge: hvac on a bounded thread pool, active-node routing, error translation.

Every Vault call goes through hvac over one `requests.Session`; nothing here frames HTTP.
Calls run on a dedicated thread pool (hvac blocks), are translated into the `VaultError` tree
once, and report themselves to `on_operation` for metrics. `consistent=True` sends a call to
the active node of a cluster with the index of keyturn's last write. docs/architecture.md
("The Vault edge") tells why each of these is so.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json as jsonlib
import os
import re
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args
from urllib.parse import quote, urlsplit

import hvac  # no stubs: hvac stays behind this module
import hvac.adapters
import hvac.api
import hvac.exceptions as hvac_errors
import requests
import urllib3.exceptions
from requests.adapters import BaseAdapter, HTTPAdapter

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
    "list",
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

INDEX_HEADER = "X-Vault-Index"
INCONSISTENT_HEADER = "X-Vault-Inconsistent"
# Seconds for which the active node found with sys/leader is trusted before it is asked again.
ACTIVE_RECHECK = 10.0
# During a leader election a standby answers 500 "local node not active but active cluster
# node not found" (it forwarded nothing, so even a write may be sent again): the call waits
# ELECTION_PAUSE and asks again, up to ELECTION_RETRIES times (an election takes 1-3 s).
ELECTION_PAUSE = 0.5
ELECTION_RETRIES = 12

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
    # More nodes of the same cluster: tried in order when `address` cannot be reached, and
    # asked where the active node is.
    nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for address in (self.address, *self.nodes):
            if not isinstance(address, str) or not address.startswith(("http://", "https://")):
                raise ValueError(f"vault address {address!r} must start with http:// or https://")
        validate_path(self.mount, what="mount")
        if self.max_workers < 1:
            raise ValueError("vault max_workers must be at least 1")
        if self.timeout <= 0 or self.renew_margin < 0:
            raise ValueError("vault timeout must be positive and renew_margin not negative")

    @property
    def addresses(self) -> tuple[str, ...]:
        """`address`, then `nodes`, without trailing slashes or repeats."""
        seen: dict[str, None] = {}
        for address in (self.address, *self.nodes):
            seen.setdefault(address.rstrip("/"), None)
        return tuple(seen)


def session_verify(ca_cert: Path | None, environ: Mapping[str, str]) -> bool | str:
    """What requests verifies Vault's certificate against: the configured `ca_cert`, else the
    bundle named by `REQUESTS_CA_BUNDLE`/`CURL_CA_BUNDLE` (as requests itself would pick with
    `trust_env`), else requests' own bundle (certifi's)."""
    if ca_cert is not None:
        return str(ca_cert)
    return environ.get("REQUESTS_CA_BUNDLE") or environ.get("CURL_CA_BUNDLE") or True


def environment_proxies(address: str) -> dict[str, str]:
    """The proxies the environment names for `address` (`HTTPS_PROXY`, `NO_PROXY`, ...), read
    once at start instead of by requests on every call."""
    return dict(requests.utils.get_environ_proxies(address))


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


# Go's multierror header ("1 error occurred:") and a formatting slip OpenBao leaves in some
# answers (": %!w(<nil>)"): neither says anything.
_MULTIERROR = re.compile(r"^\d+ errors? occurred:$")
_GO_DEBRIS = re.compile(r":?\s*%!\w\([^)]*\)")
REASON_LIMIT = 300


def http_status(exc: BaseException | None) -> int | None:
    """The HTTP status behind an hvac exception (None for anything else)."""
    return _STATUS.get(type(exc)) if isinstance(exc, Exception) else None


def vault_reason(exc: BaseException | None) -> str:
    """Vault's own words for a refusal (the `errors` list of its answer) on one printable line,
    at most `REASON_LIMIT` characters; "" when it gave none.

    Only for answers that quote nothing the caller sent (logins: "invalid role or secret ID",
    "source address ... unauthorized by CIDR restrictions"); data calls keep Vault's text out
    of keyturn's messages, and callers still blot out any secret they sent (see `auth`).
    """
    errors = exc.errors if isinstance(exc, hvac_errors.VaultError) else None
    items = [errors] if isinstance(errors, str) else errors if isinstance(errors, list) else []
    parts: list[str] = []
    for item in items:
        if not isinstance(item, str):
            continue
        for raw in item.splitlines():
            line = _GO_DEBRIS.sub("", raw.strip().removeprefix("* ").strip())
            line = "".join(char for char in line if char.isprintable())
            if line and not _MULTIERROR.match(line):
                parts.append(line)
    text = "; ".join(parts)
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 1] + "…"


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


def not_sent(exc: BaseException | None) -> bool:
    """Whether a failed call surely never reached Vault (no connection was made), so it may be
    sent to another node even if it was a write."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    if not isinstance(exc, requests.ConnectionError):
        return False
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, urllib3.exceptions.NewConnectionError):
            return True
        reason = getattr(current, "reason", None)
        pending.extend(
            [reason if isinstance(reason, BaseException) else None, current.__cause__]
            + [arg for arg in current.args if isinstance(arg, BaseException)]
        )
    return False


def _no_active_node(exc: BaseException | None) -> bool:
    """A standby's 500 during an election: it knows no active node and forwarded nothing."""
    return isinstance(exc, hvac_errors.InternalServerError) and (
        "active cluster node not found" in str(exc)
    )


def _sealed(exc: BaseException | None) -> bool:
    """A 503 (sealed, or a standby that knows no active node): the call was not carried out."""
    return isinstance(exc, hvac_errors.VaultDown)


@dataclass(slots=True)
class StorageIndex:
    """The newest `X-Vault-Index` seen: OpenBao's form (base64 JSON `{cluster, value}`) is
    compared by value; an opaque one (Vault Enterprise) is kept as last given by a write."""

    header: str | None = None
    cluster: str | None = None
    value: int | None = None

    def update(self, header: str | None, *, write: bool) -> None:
        if not header or len(header) > 4096:
            return
        parsed = _parse_index(header)
        if parsed is None:
            if write:
                self.header, self.cluster, self.value = header, None, None
            return
        cluster, value = parsed
        if self.header is None or self.cluster != cluster or (self.value or 0) < value:
            self.header, self.cluster, self.value = header, cluster, value

    def forget(self) -> None:
        self.header, self.cluster, self.value = None, None, None


def _parse_index(header: str) -> tuple[str, int] | None:
    try:
        decoded = jsonlib.loads(base64.b64decode(header, validate=True))
    except (ValueError, binascii.Error):
        return None
    if not isinstance(decoded, dict):
        return None
    cluster, value = decoded.get("cluster"), decoded.get("value")
    if not isinstance(cluster, str) or not isinstance(value, str) or not value.isdigit():
        return None
    return cluster, int(value)


@dataclass(slots=True)
class _Reply:
    """What a call brought back, for the event loop: the JSON body (or `_MISSING`) and the
    storage index header."""

    body: object
    index: str | None


class _CallState(threading.local):
    """What the call running on this thread sends beyond hvac's own headers, and the
    `X-Vault-Index` its answer carried (see `NodeAdapter`)."""

    headers: Mapping[str, str] | None = None
    index: str | None = None


_CALL = _CallState()


class NodeAdapter(hvac.adapters.JSONAdapter):  # type: ignore[misc]  # hvac has no stubs
    """hvac's `JSONAdapter` for one node, adding the headers of the call under way on this
    thread (its token, the consistency headers) and keeping the answer's `X-Vault-Index`.

    Holds no token of its own: every call says which one it sends (or none, for a login), and
    hvac never reads `VAULT_TOKEN` by itself. A 200 whose body is not JSON reads as no body.
    """

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        raise_exception: bool = True,
        **kwargs: Any,
    ) -> Any:
        extra = _CALL.headers
        merged = {**extra, **headers} if extra and headers else dict(extra or headers or {})
        response = hvac.adapters.RawAdapter.request(
            self, method, url, headers=merged, raise_exception=raise_exception, **kwargs
        )
        _CALL.index = response.headers.get(INDEX_HEADER)
        if response.status_code == 200:
            try:
                return response.json()
            except ValueError:
                return None
        return response


class VaultNode:
    """hvac's API on one Vault node, as an `hvac.Client` gives it (`adapter`, `auth`, `secrets`,
    `sys`), over keyturn's `NodeAdapter`. Built from the adapter rather than by
    `hvac.Client`, which would read `VAULT_TOKEN`, `VAULT_CACERT` and the client certificate
    variables by itself."""

    def __init__(self, adapter: NodeAdapter) -> None:
        self.adapter = adapter
        self.auth = hvac.api.AuthMethods(adapter=adapter)
        self.secrets = hvac.api.SecretsEngines(adapter=adapter)
        self.sys = hvac.api.SystemBackend(adapter=adapter)


# What a call does with hvac on the node it goes to; runs on a Vault thread.
Use = Callable[[VaultNode], object]


class VaultClient:
    """hvac behind a bounded thread pool; the token is held by `TokenKeeper`, not here.

    `transport` is mounted on the `requests.Session` under hvac instead of requests'
    `HTTPAdapter` (tests fake Vault there and open no socket; see
    `keyturn.testing.transport`); `clock` times each call for `on_operation`. Calls
    with `consistent=True` go to the active node of a cluster (see the module docstring).
    """

    def __init__(
        self,
        connection: VaultConnection,
        *,
        clock: Clock | None = None,
        on_operation: OnOperation | None = None,
        transport: BaseAdapter | None = None,
    ) -> None:
        self.connection = connection
        self.on_operation: OnOperation = on_operation or _ignore
        self._clock: Clock = clock or SystemClock()
        self._session = requests.Session()
        # requests looks at the environment (proxy and CA-bundle variables, ~/.netrc) on every
        # call when `trust_env` is on: 5 % of a cold start's CPU. Read it once, here, instead.
        self._session.trust_env = False
        mounted = transport or HTTPAdapter(
            pool_connections=max(2, len(connection.addresses) + 1),
            pool_maxsize=connection.max_workers,  # one connection per Vault thread
            max_retries=0,
        )
        self._session.mount("http://", mounted)
        self._session.mount("https://", mounted)
        # No session-wide query parameters or proxies: requests then takes each call's own
        # as they are instead of merging two mappings per setting on every call (each merge
        # tests both against runtime-checkable protocols, 8-15 us apiece on Python 3.11).
        self._session.params = None  # type: ignore[assignment]
        self._session.proxies = None  # type: ignore[assignment]
        verify = session_verify(connection.ca_cert, os.environ)
        self._session.verify = verify
        self._verify = verify
        # A node's proxies, or None (not {}) when the environment names none: see above.
        self._proxies = {base: environment_proxies(base) or None for base in connection.addresses}
        # One hvac node per address, all on the same session.
        self._nodes: dict[str, VaultNode] = {}
        self._token: str | None = None
        self._addresses = connection.addresses
        self._home = 0  # index in _addresses of the node ordinary calls go to
        self._active: str | None = None
        self._active_checked = float("-inf")
        self._active_lock: asyncio.Lock | None = None
        self._down: dict[str, float] = {}  # node -> when a call to it last failed
        self._standalone = False
        self.index = StorageIndex()
        self._executor = ThreadPoolExecutor(
            max_workers=connection.max_workers, thread_name_prefix="keyturn-vault"
        )
        self._closed = False

    def set_token(self, token: Secret) -> None:
        """Use `token` for every later data call (a plain attribute: safe across threads)."""
        self._token = token.reveal()

    @property
    def home(self) -> str:
        """The node ordinary calls go to: `address`, or the next node once it failed."""
        return self._addresses[self._home]

    @property
    def active(self) -> str | None:
        """The active node as last found (None until a consistent call needed it)."""
        return self._active

    @property
    def standalone(self) -> bool:
        """Whether the server answered `ha_enabled: false` when last asked: a single server
        judges every call against current data."""
        return self._standalone

    def forget_active(self) -> None:
        """Ask `sys/leader` again before the next consistent call (it may have moved)."""
        self._active_checked = float("-inf")

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
        consistent: bool = False,
    ) -> dict[str, Any] | None:
        """One call through hvac's adapter (`method` on `url`, e.g. "v1/sys/…"), for calls
        hvac has no method for; see `call`."""
        body = dict(json) if json is not None else None

        def use(node: VaultNode) -> object:
            return node.adapter.request(method, url, json=body)

        return await self.call(
            use,
            kind=kind,
            operation=operation,
            path=path,
            write=method.upper() != "GET",
            missing_ok=missing_ok,
            auth=auth,
            token=token,
            consistent=consistent,
        )

    async def call(
        self,
        use: Use,
        *,
        kind: VaultOperation,
        operation: str,
        path: str | None,
        write: bool,
        missing_ok: bool = False,
        auth: bool = False,
        token: Secret | None = None,
        consistent: bool = False,
    ) -> dict[str, Any] | None:
        """One Vault call: `use(node)` with hvac on the node it goes to; the JSON body, or
        None for 204 (or 404 when `missing_ok`). `kind`/`operation` name it for metrics and
        errors; a `write` is never resent to another node unless it surely never arrived;
        `auth`/`token` send no token or that one; `consistent` goes to the active node."""
        started = self._clock.monotonic()
        try:
            answer = await self._send(
                use,
                operation=operation,
                path=path,
                write=write,
                missing_ok=missing_ok,
                auth=auth,
                token=token,
                consistent=consistent,
            )
        except Exception as exc:
            self._report(kind, operation_result(exc), started)
            raise
        self._report(kind, "not_found" if answer is _MISSING else "success", started)
        return answer if isinstance(answer, dict) else None

    async def _send(
        self,
        use: Use,
        *,
        operation: str,
        path: str | None,
        write: bool,
        missing_ok: bool,
        auth: bool,
        token: Secret | None,
        consistent: bool,
    ) -> object:
        send_index = consistent
        tried: set[str] = set()
        last: VaultError | None = None
        elections = 0
        for _attempt in range(len(self._addresses) + 2 + ELECTION_RETRIES):
            base = await self._active_node() if consistent else self.home
            if base in tried:
                break
            tried.add(base)
            headers: dict[str, str] = {}
            if token is not None:
                headers["X-Vault-Token"] = token.reveal()
            elif not auth and self._token:
                headers["X-Vault-Token"] = self._token
            if send_index and self.index.header:
                headers[INDEX_HEADER] = self.index.header
                headers[INCONSISTENT_HEADER] = "forward-active-node"
            call = self._caller(self._node(base), use, headers, missing_ok)
            try:
                reply = await self.run(call, operation=operation, path=path, auth=auth)
            except VaultError as exc:
                cause = exc.__cause__
                if send_index and _index_refused(cause):
                    # A server that cannot read the index we hold (another cluster's, or a
                    # format it does not know): drop it and ask once more without.
                    log.warning("vault.index_refused", node=base)
                    self.index.forget()
                    send_index = False
                    tried.discard(base)
                    continue
                if _no_active_node(cause) and elections < ELECTION_RETRIES:
                    # Nothing was carried out: wait for the election, then ask who won.
                    elections += 1
                    log.info("vault.no_active_node", node=base, attempt=elections)
                    self.forget_active()
                    tried.discard(base)
                    last = exc
                    await self._clock.sleep(ELECTION_PAUSE)
                    continue
                if not (not_sent(cause) or (not write and _sealed(cause))):
                    raise
                self._node_failed(base)
                last = exc
                continue
            self.index.update(reply.index, write=write or consistent)
            return reply.body
        assert last is not None  # only a failed attempt ends the loop without returning
        raise last

    @staticmethod
    def _caller(
        node: VaultNode, use: Use, headers: Mapping[str, str], missing_ok: bool
    ) -> Callable[[], _Reply]:
        def call() -> _Reply:
            _CALL.headers, _CALL.index = headers, None
            try:
                body = use(node)
            except hvac_errors.InvalidPath:
                if missing_ok:
                    return _Reply(_MISSING, None)
                raise
            finally:
                _CALL.headers = None
            return _Reply(body if isinstance(body, dict) else None, _CALL.index)

        return call

    def _node(self, base: str) -> VaultNode:
        node = self._nodes.get(base)
        if node is None:
            adapter = NodeAdapter(
                base_uri=base,
                token=None,
                verify=self._verify,
                timeout=self.connection.timeout,
                proxies=self._proxies.get(base),
                session=self._session,
                namespace=self.connection.namespace,
            )
            node = self._nodes[base] = VaultNode(adapter)
        return node

    def _adapter(self, base: str) -> NodeAdapter:
        """hvac's adapter for the node at `base`."""
        return self._node(base).adapter

    def _node_failed(self, base: str) -> None:
        """`base` could not take a call: leave it alone for `ACTIVE_RECHECK` seconds."""
        self._down[base] = self._clock.monotonic()
        if base == self._active:
            self.forget_active()  # the active node may have moved: ask again
        if base == self.home and len(self._addresses) > 1:
            for step in range(1, len(self._addresses)):
                candidate = (self._home + step) % len(self._addresses)
                if not self._is_down(self._addresses[candidate]):
                    self._home = candidate
                    break
            else:
                self._home = (self._home + 1) % len(self._addresses)
            log.warning("vault.node_unreachable", node=base, next=self.home)

    def _is_down(self, base: str) -> bool:
        failed = self._down.get(base)
        return failed is not None and self._clock.monotonic() - failed < ACTIVE_RECHECK

    async def _active_node(self) -> str:
        """Where a consistent call goes: the active node (asking `sys/leader` when the answer
        is older than `ACTIVE_RECHECK`), or the home node when no node names a reachable one
        (the index headers and check-and-set then keep keyturn's decisions safe)."""
        if self._clock.monotonic() - self._active_checked >= ACTIVE_RECHECK:
            if self._active_lock is None:
                self._active_lock = asyncio.Lock()
            async with self._active_lock:
                if self._clock.monotonic() - self._active_checked >= ACTIVE_RECHECK:
                    found, self._standalone = await self.run(
                        self._discover, operation="find the active node", path=None
                    )
                    if found != self._active:
                        log.info("vault.active_node", node=found, previous=self._active)
                    self._active = found
                    # No active node (an election, or none reachable): ask again in a second.
                    self._active_checked = self._clock.monotonic() - (
                        0.0 if found else ACTIVE_RECHECK - 1.0
                    )
        if self._active is not None and not self._is_down(self._active):
            return self._active
        return self.home

    async def server_time(self) -> float | None:
        """Vault's own clock (`sys/health`'s `server_time_utc`, asked of the home node without
        a token, as a standby or a sealed node answers too), or None when it does not say."""

        def ask() -> object:
            return self._node(self.home).sys.read_health_status(
                standby_ok=True, sealed_code=200, uninit_code=200, method="GET"
            )

        try:
            answer = await self.run(ask, operation="health", path=None, auth=True)
        except VaultError:
            return None
        value = answer.get("server_time_utc") if isinstance(answer, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        return None

    def _discover(self) -> tuple[str | None, bool]:
        """Ask the nodes (the last active one, the home node, then the others) for the active
        node (None if none answers with one), and whether it is a single server."""
        order = list(
            dict.fromkeys([*([self._active] if self._active else []), self.home, *self._addresses])
        )
        order.sort(key=self._is_down)  # nodes that just failed last (stable otherwise)
        for base in order:
            try:
                answer = self._node(base).sys.read_leader_status()
            except (requests.RequestException, hvac_errors.VaultError, ValueError):
                continue
            if not isinstance(answer, dict):
                continue
            if answer.get("ha_enabled") is not True:
                return base, True  # a single server: always consistent
            if answer.get("is_self") is True:
                return base, False  # the active node itself
            leader = answer.get("leader_address")
            if isinstance(leader, str) and self._acceptable(leader):
                return leader.rstrip("/"), False
        return None, False

    def _acceptable(self, leader: str) -> bool:
        """A leader address keyturn may send its token to: http(s) with a host, and not plain
        http when keyturn was configured for https."""
        parts = urlsplit(leader)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False
        configured = {urlsplit(address).scheme for address in self._addresses}
        return parts.scheme == "https" or configured == {"http"}

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
        self._session.close()  # requests' pool closes its connections


def _index_refused(exc: BaseException | None) -> bool:
    if not isinstance(exc, hvac_errors.InvalidRequest):
        return False
    return INDEX_HEADER.lower() in str(exc).lower()
