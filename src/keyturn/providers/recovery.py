"""One provider's outage as its credentials live it: who waits for it to answer again, and how
often they may knock meanwhile.

When a provider stops answering, each credential behind it fails on its own schedule. Those
whose published token is past its last planned refresh retry at the short `after_expiry`
cadence (`keyturn.policy.retry_delay`), so apps are back within seconds of the provider. With
thousands of them, that cadence, and the tries before each token's last planned refresh too,
would be a stampede on a provider that is down, so every retry of a credential that waits for
the provider is stretched to at least `crowd()` seconds: `len(waiting) / rate`. Together the
waiting credentials then knock about `rate` times a second, however many they are. `rate` is
half the provider's `rate_limit` (the other half is left for refreshes that fall due and for
the wake below: retries that kept the provider's token bucket full would each hold one of the
scheduler's `max_concurrency` slots while they wait in it, and make every other run late), or
DEFAULT_RATE without one.

The stretch costs no recovery time: the first credential that gets a token again tells
`on_back`'s listeners (the daemon wakes every other waiting credential of the provider at once,
through the scheduler's concurrency bound and the provider's rate limit), and each woken
refresh is due at once (`answered_since`).
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
