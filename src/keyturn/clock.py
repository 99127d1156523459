"""The one place keyturn reads time.

Everything that decides *when* (refresh due times, backoff, expiry checks, grace periods)
takes a `Clock`, so tests drive time with `FakeClock` instead of patching `time`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Protocol

import structlog


class Clock(Protocol):
    """Wall-clock and monotonic time, plus a sleep that follows the same clock."""

    def time(self) -> float:
        """Seconds since the epoch (wall clock, UTC)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences are meaningful."""

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` on this clock."""


def utc_datetime(clock: Clock) -> datetime:
    """The clock's wall time as an aware UTC datetime."""
    return datetime.fromtimestamp(clock.time(), tz=UTC)


def rfc3339(epoch_seconds: float) -> str:
    """RFC 3339 UTC with a `Z` suffix and whole seconds, the form published to Vault."""
    return datetime.fromtimestamp(int(epoch_seconds), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    """Inverse of `rfc3339` (accepts any ISO 8601 form with an offset); returns epoch seconds."""
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no UTC offset")
    return parsed.timestamp()


# A change of (wall - monotonic) larger than this is a step of the wall clock, not NTP slewing.
STEP_THRESHOLD = 2.0


class SystemClock:
    """The real clock, which holds its wall time steady across a step until told otherwise.

    A wall-clock step beyond STEP_THRESHOLD (against the monotonic clock) is taken back into
    `offset` and waits in `pending_steps` until `WallClockGuard` decides, so nothing is computed
    from an unchecked step. Threads read it too (metrics, Vault calls): a lock takes a step back
    once, not once per thread that saw it.
    """

    def __init__(self) -> None:
        self.offset = 0.0
        self.pending_steps: list[float] = []
        self._base = time.time() - time.monotonic()
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            now = time.time()
            base = now - time.monotonic()
            step = base - self._base
            self._base = base  # slewing moves the base a little at a time: followed silently
            if abs(step) > STEP_THRESHOLD:
                self.offset -= step
                self.pending_steps.append(step)
            return now + self.offset

    def system_time(self) -> float:
        """The system's wall clock, as it is."""
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told to; `sleep` returns once `advance` passes its deadline."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.offset = 0.0
        self.pending_steps: list[float] = []
        self._now = start
        self._mono = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def time(self) -> float:
        return self._now + self.offset

    def system_time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._mono + seconds, future))
        await future

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds
        self._mono += seconds
        due = [s for s in self._sleepers if s[0] <= self._mono]
        self._sleepers = [s for s in self._sleepers if s[0] > self._mono]
        for _, future in due:
            if not future.done():
                future.set_result(None)

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock alone, either way (an NTP step, a VM resume, libfaketime): the
        monotonic clock and the sleepers do not move. As `SystemClock` does, a step larger than
        STEP_THRESHOLD is held back (`offset`) until the guard decides."""
        self._now += seconds
        if abs(seconds) > STEP_THRESHOLD:
            self.offset -= seconds
            self.pending_steps.append(seconds)

    @property
    def sleepers(self) -> int:
        """How many coroutines are waiting in `sleep`."""
        return sum(1 for _, f in self._sleepers if not f.done())


class AdjustableClock(Clock, Protocol):
    """A clock whose wall time the guard can hold steady: `time() = system_time() + offset`."""

    offset: float
    pending_steps: list[float]

    def system_time(self) -> float: ...


# Where keyturn learns the right time when its own clock jumps: Vault's clock (None when
# Vault cannot be asked now).
TimeReference = Callable[[], Awaitable[float | None]]


class WallClockGuard:
    """Decides, with Vault's clock, which time keyturn lives by after a wall-clock step.

    `check` asks `reference` (Vault's clock) about each held step: agreement adopts the stepped
    clock, disagreement keeps the steady time, no answer keeps holding; `on_jump` re-plans.
    Run it from a monotonic loop (`keyturn.housekeeping.Periodic`), never from a scheduler that
    plans by wall time. Why: docs/architecture.md#the-scheduler.
    """

    def __init__(
        self,
        clock: AdjustableClock,
        *,
        reference: TimeReference,
        on_jump: Callable[[float], None],
        threshold: float = STEP_THRESHOLD,
    ) -> None:
        self._clock = clock
        self._reference = reference
        self._on_jump = on_jump
        self._threshold = threshold
        self._log = structlog.get_logger("keyturn.clock")

    async def check(self) -> float:
        """One look; returns the offset now in force."""
        clock = self._clock
        clock.time()  # lets the clock notice a step that no one has read yet
        steps, clock.pending_steps[:] = list(clock.pending_steps), []
        if not steps and clock.offset == 0.0:
            return 0.0
        reference = await self._reference()
        clock.time()
        steps += clock.pending_steps  # a step during the question: judged with the answer
        clock.pending_steps.clear()
        offset = clock.offset
        if reference is not None:
            system = clock.system_time()
            if abs(system - reference) <= self._threshold:
                offset = 0.0  # the system clock is right (again): live by it
            elif abs(system + offset - reference) > self._threshold:
                offset = reference - system  # neither agrees: the reference decides
        changed = offset != clock.offset
        clock.offset = offset
        for step in steps:
            self._log.warning(
                "clock.jumped",
                seconds=round(step, 3),
                keyturn_offset=round(offset, 3),
                reference="unavailable" if reference is None else "vault",
                following="system clock" if offset == 0.0 else "steady time",
            )
        if changed and not steps:
            self._log.warning("clock.offset_changed", keyturn_offset=round(offset, 3))
        if steps or changed:
            self._on_jump(sum(steps))
        return offset
