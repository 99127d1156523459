"""Liveness and readiness, as the two callables `MetricsServer` asks.

Liveness (`/healthz`) is the scheduler loop's heartbeat: a restart can help a stalled loop.
Readiness (`/readyz`) is Vault and every credential's published value, as the jobs last found
them (`JobView`, not the metrics): a restart cannot fix those, so it never feeds liveness.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from keyturn.clock import Clock, rfc3339
from keyturn.errors import KeyturnError
from keyturn.kinds import KINDS
from keyturn.scheduler import JobView

Alive = Callable[[], tuple[bool, str]]
Ready = Callable[[], Awaitable[tuple[bool, list[str]]]]
MAX_PROBLEMS = 20  # a readiness answer stays short even with 10,000 credentials down


class JobStatuses(Protocol):
    """Where readiness reads the credentials' state (the scheduler)."""

    def statuses(self) -> list[JobView]: ...


def value_ready(kind: str, issued_at: float | None, expires_at: float | None, now: float) -> bool:
    """Can apps use the published value of a credential of `kind` now? As the kind says
    (`keyturn.kinds.Kind.value_ready`): an access token until it expires, an API key once
    published."""
    return KINDS[kind].value_ready(issued_at, expires_at, now)


def credential_problems(jobs: Iterable[JobView], now: float) -> list[str]:
    """One line per credential whose apps cannot read a valid value now."""
    problems = []
    for job in jobs:
        state = job.state.token if job.state is not None else None
        if state is None or state.expires_at is None:
            problems.append(f"credential {job.name}: nothing published yet")
        elif not value_ready(job.kind, state.issued_at, state.expires_at, now):
            problems.append(f"credential {job.name}: expired at {rfc3339(state.expires_at)}")
    return problems


class HeartbeatLiveness:
    """Alive while the last heartbeat is at most `max_age` seconds old, on the monotonic
    clock (`last_beat` returns `clock.monotonic()` of the beat).

    Before the first heartbeat the process counts as starting, and is alive for `max_age`
    seconds from construction: a loop that never beats at all is stalled too.
    """

    def __init__(
        self, last_beat: Callable[[], float | None], *, clock: Clock, max_age: float
    ) -> None:
        if max_age <= 0:
            raise ValueError("max_age must be positive")
        self._last_beat = last_beat
        self._clock = clock
        self._max_age = max_age
        self._started = clock.monotonic()

    def __call__(self) -> tuple[bool, str]:
        now = self._clock.monotonic()
        beat = self._last_beat()
        limit = f"limit {self._max_age:g} s"
        if beat is None:
            waited = now - self._started
            if waited <= self._max_age:
                return True, "starting: no heartbeat yet"
            return False, f"no scheduler heartbeat since start {waited:.0f} s ago ({limit})"
        age = now - beat
        if age <= self._max_age:
            return True, f"scheduler heartbeat {age:.1f} s ago"
        return False, f"scheduler loop stalled: last heartbeat {age:.0f} s ago ({limit})"


def readiness_check(
    *, vault: Callable[[], Awaitable[None]], jobs: JobStatuses, clock: Clock
) -> Ready:
    """A `ready()` for `MetricsServer`: `vault()` must return (e.g. `VaultStore.health`, a
    token look-up), and each credential the scheduler runs must have an unexpired value
    published (as its last run found it)."""

    async def ready() -> tuple[bool, list[str]]:
        problems: list[str] = []
        try:
            await vault()
        except KeyturnError as exc:  # messages name the operation and path, never a value
            problems.append(f"vault: {exc}")
        except Exception as exc:  # anything else: its type only, its text is unknown
            problems.append(f"vault: check failed ({type(exc).__name__})")
        problems.extend(credential_problems(jobs.statuses(), clock.time()))
        return not problems, shorten(problems)

    return ready


def shorten(problems: list[str], limit: int = MAX_PROBLEMS) -> list[str]:
    """At most `limit` lines; the last one says how many were left out."""
    if len(problems) <= limit:
        return problems
    return [*problems[: limit - 1], f"… and {len(problems) - limit + 1} more"]
