"""One credential keyturn publishes in Vault, as an app uses it.

The value read from Vault is kept in memory and handed out without touching Vault until it is
due for a re-read (the published `refresh_at`; without it `expires_at` minus a margin, or an
API key's `rotate_after`). The value itself never appears in a repr, a log or an exception.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import hvac
import hvac.exceptions
import requests

# How often a rejected value's replacement is looked for while waiting for keyturn to publish it.
_REJECTION_POLL = 0.1
# The longest pause between re-reads when Vault keeps failing or keyturn is late with a value
# that has no expiry (an API key past its `rotate_after`).
_MAX_RETRY_DELAY = 300.0
# How long a record that carries no time at all (no refresh_at, expires_at or rotate_after:
# not written by keyturn) is cached.
_UNDATED_CACHE = 60.0
# How many re-reads already under way a coroutine waits for before it starts its own.
_JOIN_LIMIT = 4


class CredentialUnavailable(RuntimeError):
    """No usable value: nothing could be read, or the value read has expired.

    Names the Vault path (`path`, as `mount/path`) and why (`reason`), never the value.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"keyturn credential {path}: {reason}")


class _BadRecord(Exception):
    """The record read is not what keyturn publishes (a field missing or malformed)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    """One version read from Vault. The secrets are left out of repr."""

    version: int
    authorization: str = field(repr=False)
    value: str = field(repr=False)
    expires_at: float | None  # None: no known end (an API key)
    stale_at: float  # when the next re-read is due

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class Credential:
    """The credential published at `path` in the KV v2 mount `mount`.

    `client` is an hvac client authenticated as the app (default: `hvac.Client()`, which
    reads `VAULT_ADDR` and `VAULT_TOKEN`). `margin` (seconds) is used only when the record
    has no `refresh_at`: the value is re-read `margin` seconds before its `expires_at`, and no
    later than half-way through what it had left when it was read. `min_interval` is the
    shortest pause between re-reads that bring nothing new. `rejection_wait` is how long a
    value the service refused waits for keyturn to publish its replacement. `clock` returns
    the wall-clock time in epoch seconds (the published times are wall-clock times).
    """

    def __init__(
        self,
        path: str,
        *,
        mount: str = "secret",
        client: Any = None,
        margin: float = 60.0,
        min_interval: float = 1.0,
        rejection_wait: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not path.strip("/"):
            raise ValueError("path must name a secret")
        if margin < 0 or rejection_wait < 0:
            raise ValueError("margin and rejection_wait must not be negative")
        if min_interval <= 0:
            raise ValueError("min_interval must be positive")
        self._path = path.strip("/")
        self._mount = mount.strip("/")
        self._client = client if client is not None else hvac.Client()
        self._margin = float(margin)
        self._min_interval = float(min_interval)
        self._polls = math.ceil(rejection_wait / _REJECTION_POLL)
        self._clock = clock
        self._lock = threading.Lock()
        self._entry: _Entry | None = None
        self._next_read = -math.inf
        self._last_attempt = -math.inf
        self._misses = 0  # scheduled re-reads in a row that brought nothing new
        self._failure: str | None = None  # why the last read failed; None if it did not
        self._failure_cause: BaseException | None = None
        self._waited_version: int | None = None  # a rejected version already waited for
        self._tasks_lock = threading.Lock()
        self._tasks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )

    # -- what an app uses --------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """`mount/path`, as it appears in errors."""
        return f"{self._mount}/{self._path}"

    @property
    def version(self) -> int | None:
        """The KV version held in memory (None before the first read). Never reads Vault."""
        entry = self._entry
        return None if entry is None else entry.version

    @property
    def expires_at(self) -> float | None:
        """The `expires_at` of the value held in memory (epoch seconds), if it has one."""
        entry = self._entry
        return None if entry is None else entry.expires_at

    @property
    def authorization(self) -> str:
        """The whole `Authorization` header value (the published `authorization` field)."""
        return self._current().authorization

    @property
    def value(self) -> str:
        """The access token (`access_token`) or the API key (`api_key`)."""
        return self._current().value

    async def authorization_async(self) -> str:
        """`authorization` without blocking the event loop on a Vault read."""
        return (await self._current_async()).authorization

    async def value_async(self) -> str:
        """`value` without blocking the event loop on a Vault read."""
        return (await self._current_async()).value

    def refresh(self) -> bool:
        """Read Vault now; returns whether the value changed.

        A failed read returns False and keeps the value held in memory (it is served until it
        expires, as during any outage).
        """
        with self._lock:
            return self._read_locked(self._clock(), scheduled=False)

    async def refresh_async(self) -> bool:
        return await asyncio.to_thread(self.refresh)

    def on_rejected(self, authorization: str) -> str | None:
        """The service refused `authorization` (401/403): a different header value to retry
        with once, or None when Vault has nothing newer.

        When Vault still holds the refused value, waits up to `rejection_wait` for keyturn to
        publish its replacement (some providers revoke the previous access token at refresh,
        a moment before keyturn publishes the new one). A version is waited for once; later
        rejections of it re-read Vault at most once per `min_interval`.
        """
        replacement = self._replacement(authorization)
        if replacement is not None:
            return replacement
        with self._lock:
            self._handle_rejection_locked(authorization)
        return self._replacement(authorization)

    async def on_rejected_async(self, authorization: str) -> str | None:
        """`on_rejected` without blocking the event loop; concurrent callers share the re-read."""
        for _ in range(_JOIN_LIMIT):
            replacement = self._replacement(authorization)
            if replacement is not None:
                return replacement
            running = self._running_task()
            if running is None:
                break
            await asyncio.shield(running)
        replacement = self._replacement(authorization)
        if replacement is not None:
            return replacement
        await self._share(functools.partial(self._handle_rejection, authorization))
        return self._replacement(authorization)

    def __repr__(self) -> str:
        return f"Credential(path={self.path!r}, version={self.version!r})"

    # -- the cache ---------------------------------------------------------------------------------

    def _current(self) -> _Entry:
        now = self._clock()
        entry = self._entry
        if entry is not None and now < self._next_read:
            return self._usable(entry, now)
        if entry is not None and not entry.expired(now):
            # Due for a re-read but still valid: one thread re-reads, the others keep going.
            if not self._lock.acquire(blocking=False):
                return entry
        else:
            self._lock.acquire()
        try:
            now = self._clock()
            if now >= self._next_read:
                self._read_locked(now, scheduled=True)
        finally:
            self._lock.release()
        return self._usable(self._entry, self._clock())

    async def _current_async(self) -> _Entry:
        for _ in range(_JOIN_LIMIT):
            now = self._clock()
            entry = self._entry
            if entry is not None and now < self._next_read:
                return self._usable(entry, now)
            running = self._running_task()
            if running is None:
                await self._share(self._read_if_due)
                break
            if entry is not None and not entry.expired(now):
                return entry  # a re-read is under way; this value is still good meanwhile
            await asyncio.shield(running)
        return self._usable(self._entry, self._clock())

    def _read_if_due(self) -> None:
        with self._lock:
            now = self._clock()
            if now >= self._next_read:
                self._read_locked(now, scheduled=True)

    def _usable(self, entry: _Entry | None, now: float) -> _Entry:
        if entry is None:
            reason = self._failure or "nothing has been read yet"
            raise CredentialUnavailable(
                self.path, f"cannot read it from Vault: {reason}"
            ) from self._failure_cause
        if entry.expires_at is not None and now >= entry.expires_at:
            when = _rfc3339(entry.expires_at)
            if self._failure is not None:
                raise CredentialUnavailable(
                    self.path,
                    f"the value held expired at {when}; reading Vault failed: {self._failure}",
                ) from self._failure_cause
            raise CredentialUnavailable(
                self.path,
                f"the value in Vault expired at {when} and keyturn has not published a new one",
            )
        return entry

    def _replacement(self, refused: str) -> str | None:
        entry = self._entry
        if entry is None or entry.authorization == refused or entry.expired(self._clock()):
            return None
        return entry.authorization

    def _handle_rejection(self, refused: str) -> None:
        with self._lock:
            self._handle_rejection_locked(refused)

    def _handle_rejection_locked(self, refused: str) -> None:
        entry = self._entry
        if entry is not None and entry.authorization != refused:
            return  # replaced while this caller waited for the lock
        now = self._clock()
        version = None if entry is None else entry.version
        if version is not None and version == self._waited_version:
            if now - self._last_attempt >= self._min_interval:
                self._read_locked(now, scheduled=False)
            return
        self._waited_version = version
        if self._read_locked(now, scheduled=False) or self._failure is not None:
            return
        for _ in range(self._polls):
            time.sleep(_REJECTION_POLL)
            if self._read_locked(self._clock(), scheduled=False) or self._failure is not None:
                return

    # -- reading Vault -----------------------------------------------------------------------------

    def _read_locked(self, now: float, *, scheduled: bool) -> bool:
        """Read the path once (the lock held); returns whether the value changed.

        A scheduled read that brings nothing new (or fails) plans the next one after a pause
        that doubles from `min_interval`, capped at a quarter of what the value has left.
        """
        self._last_attempt = now
        try:
            answer = self._client.secrets.kv.v2.read_secret_version(
                path=self._path, mount_point=self._mount, raise_on_deleted_version=True
            )
            entry = self._parse(answer, now)
        except Exception as error:  # any failure to read is an outage for the app
            self._failure = _describe(error)
            self._failure_cause = None if isinstance(error, _BadRecord) else error
            if scheduled:
                self._misses += 1
                self._plan_retry(now)
            return False
        previous = self._entry
        self._entry = entry
        self._failure = None
        self._failure_cause = None
        new_version = previous is None or previous.version != entry.version
        if scheduled or new_version:
            if entry.stale_at > now:
                self._misses = 0
                self._next_read = entry.stale_at
            else:  # keyturn has not replaced it yet (or is not running)
                self._misses = 1 if new_version else self._misses + 1
                self._plan_retry(now)
        return (
            previous is None
            or previous.authorization != entry.authorization
            or previous.value != entry.value
        )

    def _plan_retry(self, now: float) -> None:
        """The next read after one that brought nothing new: `min_interval`, doubling with each
        miss, at most a quarter of what the value has left (at least `min_interval`), and
        never after the value expires (a replacement published meanwhile is served then);
        once it has expired, every `min_interval`."""
        delay = min(self._min_interval * 2.0 ** min(self._misses - 1, 30), _MAX_RETRY_DELAY)
        entry = self._entry
        expires_at = None if entry is None else entry.expires_at
        if expires_at is not None:
            left = expires_at - now
            if left > 0:
                delay = min(delay, max(self._min_interval, left / 4), left)
            else:  # expired: every caller gets the error; look again each min_interval
                delay = self._min_interval
        self._next_read = now + delay

    def _parse(self, answer: Any, now: float) -> _Entry:
        try:
            body = answer["data"]
            data, metadata = body["data"], body["metadata"]
        except (KeyError, TypeError):
            raise _BadRecord("Vault's answer is not a KV v2 secret") from None
        if not isinstance(data, Mapping) or not isinstance(metadata, Mapping):
            raise _BadRecord("Vault's answer is not a KV v2 secret")
        version = metadata.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise _BadRecord("Vault's answer has no version")
        authorization = _text(data, "authorization")
        if "access_token" in data:
            value = _text(data, "access_token")
        elif "api_key" in data:
            value = _text(data, "api_key")
        else:
            raise _BadRecord("the record has neither access_token nor api_key")
        expires_at = _time(data, "expires_at")
        # The times are in the data; keyturn's KV custom metadata holds none (since 0.2.0).
        refresh_at = _time(data, "refresh_at")
        if refresh_at is not None:
            stale_at = refresh_at
        elif expires_at is not None:
            stale_at = max(expires_at - self._margin, now + (expires_at - now) / 2)
        else:
            rotate_after = _time(data, "rotate_after")
            stale_at = rotate_after if rotate_after is not None else now + _UNDATED_CACHE
        if expires_at is not None:
            stale_at = min(stale_at, expires_at)
        return _Entry(version, authorization, value, expires_at, stale_at)

    # -- sharing one re-read between coroutines ----------------------------------------------------

    def _running_task(self) -> asyncio.Task[None] | None:
        loop = asyncio.get_running_loop()
        with self._tasks_lock:
            task = self._tasks.get(loop)
        return task if task is not None and not task.done() else None

    async def _share(self, work: Callable[[], None]) -> None:
        """Run `work` (a blocking Vault read) in a thread; coroutines of this loop that need a
        read meanwhile wait for this one instead of starting their own."""
        loop = asyncio.get_running_loop()
        task = loop.create_task(asyncio.to_thread(work))
        task.add_done_callback(_retrieve)
        with self._tasks_lock:
            self._tasks[loop] = task
        await asyncio.shield(task)


def _retrieve(task: asyncio.Task[None]) -> None:
    # Every waiter may have been cancelled: fetch the outcome so asyncio does not report it.
    if not task.cancelled():
        task.exception()


def _text(data: Mapping[str, Any], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str) or not value:
        raise _BadRecord(f"the record's field {name!r} is missing or not a string")
    return value


def _time(data: Mapping[str, Any], name: str) -> float | None:
    raw = data.get(name)
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise _BadRecord(f"the record's field {name!r} is not an RFC 3339 time")
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise _BadRecord(f"the record's field {name!r} is not an RFC 3339 time") from None
    if parsed.tzinfo is None:
        raise _BadRecord(f"the record's field {name!r} has no UTC offset")
    return parsed.timestamp()


def _rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _describe(error: Exception) -> str:
    """Why a read failed, in words; never the error's text (it is Vault's or the network's)."""
    if isinstance(error, _BadRecord):
        return str(error)
    if isinstance(error, hvac.exceptions.InvalidPath):
        return "nothing is published there (or its latest version is deleted)"
    if isinstance(error, hvac.exceptions.Forbidden):
        return "Vault refused the read (403: the app's token or policy)"
    if isinstance(error, hvac.exceptions.Unauthorized):
        return "Vault refused the app's token (401)"
    if isinstance(error, hvac.exceptions.VaultDown):
        return "Vault is sealed or down"
    if isinstance(error, requests.Timeout):
        return "Vault did not answer in time"
    if isinstance(error, requests.ConnectionError):
        return "Vault cannot be reached"
    return f"the read failed ({type(error).__name__})"
