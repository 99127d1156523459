"""One token bucket for keyturn's own rates: calls to a provider (a polite client waits for a
token, `acquire`) and alerts to a hook (one over the limit is dropped, `take`)."""

from __future__ import annotations

import asyncio

from keyturn.clock import Clock


class TokenBucket:
    """`rate` tokens per second on average, bursts up to `burst` (default: one second's worth,
    at least one). Time is the clock's monotonic time."""

    def __init__(self, rate: float, clock: Clock, burst: float | None = None) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self._rate = rate
        self._capacity = burst if burst is not None else max(1.0, rate)
        self._tokens = self._capacity
        self._clock = clock
        self._updated = clock.monotonic()
        self._lock = asyncio.Lock()

    @classmethod
    def per_minute(cls, count: float, clock: Clock) -> TokenBucket:
        """`count` per minute on average, bursts up to a minute's worth (at least one)."""
        if count <= 0:
            raise ValueError("per_minute must be positive")
        return cls(count / 60.0, clock, burst=max(1.0, count))

    def take(self) -> bool:
        """Take a token if one is there now; never waits."""
        now = self._clock.monotonic()
        self._tokens = min(self._capacity, self._tokens + (now - self._updated) * self._rate)
        self._updated = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    async def acquire(self) -> None:
        """Wait until a token is there, and take it (callers queue in turn)."""
        async with self._lock:
            while not self.take():
                await self._clock.sleep((1 - self._tokens) / self._rate)
