"""When keyturn renews its own Vault token: pure functions of a lease and the time.

Same policy as cert-manager and Vault Agent: renew at 2/3 of the granted TTL, but no later
than `margin` before expiry (as long as that leaves a third of the TTL, so a margin longer
than the TTL cannot turn into a renewal loop). A renewal that grants less than the token's
usual TTL has hit the max TTL: the next step is a fresh login, not another renewal.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MIN_DELAY = 1.0  # never ask to be called back sooner than this: no hot loops near expiry
_RNG = random.Random()


def renewal_delay(ttl: float, margin: float) -> float:
    """Seconds after a grant of `ttl` seconds at which to renew (or log in again)."""
    if ttl <= 0:
        raise ValueError("a token that never expires has no renewal time")
    lead = min(max(ttl / 3, margin), 2 * ttl / 3)
    return ttl - lead


def expiring_margin(natural_ttl: float | None, renew_margin: float) -> float:
    """How close to its end keyturn's token must be before "could not renew or replace it" is
    worth an alert: `renew_margin`, but at most a third of the token's own TTL. A token that
    lives less than `renew_margin` is renewed at a third of its TTL left, so judging it
    against `renew_margin` would call every healthy renewal an emergency."""
    if natural_ttl is None or natural_ttl <= 0:
        return renew_margin
    return min(renew_margin, natural_ttl / 3)


def error_delay(
    failures: int, *, base: float = 5.0, cap: float = 300.0, rng: random.Random | None = None
) -> float:
    """Capped exponential backoff with jitter after `failures` consecutive failures (>= 1).

    Jitter keeps several instances whose Vault went away together from coming back in step;
    the result is between half and all of `min(cap, base * 2**(failures-1))`.
    """
    if failures < 1:
        raise ValueError("error_delay needs at least one failure")
    ceiling = min(cap, base * 2.0 ** min(failures - 1, 32))
    share = (rng or _RNG).uniform(0.5, 1.0)
    return max(MIN_DELAY, ceiling * share)


@dataclass(frozen=True, slots=True)
class TokenLease:
    """What Vault last told us about our token's lifetime."""

    obtained_at: float  # epoch seconds (Clock.time) when the TTL below was granted
    ttl: float  # seconds granted at obtained_at; 0 = never expires (e.g. a root token)
    renewable: bool
    natural_ttl: float  # what a renewal grants when nothing caps it (the token's creation TTL)
    exhausted: bool = False  # the last renewal was capped by the max TTL

    @property
    def expires_at(self) -> float | None:
        return self.obtained_at + self.ttl if self.ttl > 0 else None

    def due_at(self, margin: float) -> float | None:
        """Epoch seconds at which to renew or log in again; None if it never expires."""
        if self.ttl <= 0:
            return None
        return self.obtained_at + renewal_delay(self.ttl, margin)

    def renewed(self, now: float, granted: float, renewable: bool) -> TokenLease:
        """The lease after a successful renewal that granted `granted` seconds at `now`.

        Exhausted if the max TTL capped the grant, or if the renewal did not move the
        expiry forward at all (Vault rounds TTLs to seconds, so the first test can miss).
        """
        previous = self.expires_at
        capped = granted < self.natural_ttl
        stalled = previous is not None and now + granted <= previous
        return TokenLease(now, granted, renewable, self.natural_ttl, exhausted=capped or stalled)

    @property
    def needs_login(self) -> bool:
        """Renewing can no longer extend this token: log in again when due instead."""
        return not self.renewable or self.exhausted
