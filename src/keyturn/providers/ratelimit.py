"""A token bucket for keyturn's own calls to a provider (be a polite client)."""

from __future__ import annotations

import asyncio

from keyturn.clock import Clock


class TokenBucket:
    """`rate` calls per second on average, bursts up to `burst` (default: one second's worth)."""

    def __init__(self, rate: float, clock: Clock, burst: float | None = None) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self._rate = rate
        self._capacity = burst if burst is not None else max(1.0, rate)
        self._tokens = self._capacity
        self._clock = clock
        self._updated = clock.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = self._clock.monotonic()
                self._tokens = min(
                    self._capacity, self._tokens + (now - self._updated) * self._rate
                )
                self._updated = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await self._clock.sleep((1 - self._tokens) / self._rate)
