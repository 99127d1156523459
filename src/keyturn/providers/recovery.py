"""One provider's outage as its credentials live it: who waits for it, how often they may knock.

Every retry of a credential waiting for the provider is stretched to at least `crowd()`
(waiting ÷ rate, rate half its `rate_limit`), so thousands of them do not stampede a provider
that is down; the first that gets a token again wakes the rest (`on_back`), so the stretch
costs no recovery time. Why half, and the figures: docs/architecture.md#a-refresh-step-by-step.
"""

from __future__ import annotations

from collections.abc import Callable

# Tries a second, all waiting credentials of a provider together, for a provider without a
# `rate_limit`; with one, RATE_LIMIT_SHARE of it.
DEFAULT_RATE = 10.0
RATE_LIMIT_SHARE = 0.5

Listener = Callable[[frozenset[str]], None]


class Recovery:
    """Shared by every credential of one provider (it lives on its `ProviderClient`)."""

    def __init__(self, rate_limit: float | None = None) -> None:
        self.rate = rate_limit * RATE_LIMIT_SHARE if rate_limit else DEFAULT_RATE
        self.waiting: set[str] = set()
        self.answered_at: float | None = None
        self._down = False
        self._listeners: list[Listener] = []

    def on_back(self, listener: Listener) -> None:
        """Call `listener(waiting)` when the provider answers again after a failure."""
        self._listeners.append(listener)

    def failed(self, credential: str) -> None:
        """`credential`'s last try got no usable answer from the provider."""
        self.waiting.add(credential)
        self._down = True

    def forget(self, credential: str) -> None:
        """`credential` no longer waits for the provider (it failed otherwise, or was removed)."""
        self.waiting.discard(credential)

    def crowd(self) -> float:
        """Seconds between one waiting credential's tries that keep all of them together at
        about `rate` tries a second."""
        return len(self.waiting) / self.rate

    def answered(self, credential: str, now: float) -> None:
        """The provider issued `credential` a token at `now`: the others may try again now."""
        self.answered_at = now
        self.waiting.discard(credential)
        if not self._down:
            return
        self._down = False
        if self.waiting:
            woken = frozenset(self.waiting)
            for listener in self._listeners:
                listener(woken)

    def answered_since(self, when: float | None) -> bool:
        """Whether the provider issued a token after `when` (None: never failed here)."""
        return when is not None and self.answered_at is not None and self.answered_at > when
