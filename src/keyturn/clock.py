"""The one place keyturn reads time.

Everything that decides *when* (refresh due times, backoff, expiry checks, grace periods)
takes a `Clock`, so tests drive time with `FakeClock` instead of patching `time`.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol


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


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told to; `sleep` returns once `advance` passes its deadline."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._mono = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def time(self) -> float:
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

    @property
    def sleepers(self) -> int:
        """How many coroutines are waiting in `sleep`."""
        return sum(1 for _, f in self._sleepers if not f.done())
