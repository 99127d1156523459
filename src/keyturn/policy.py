"""Pure timing rules: when to refresh, how long to back off. No I/O, no clock reads.

Refresh at `at` of the lifetime ±`jitter`, never later than `expires_at - margin`; back off
with capped exponential full jitter, never past what the published token has left. The rules
and their reasons: docs/configuration.md#credentialsbackoff and docs/architecture.md.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class RefreshPolicy:
    at: float = 0.66
    jitter: float = 0.1
    margin: float = 60.0
    min_interval: float = 1.0


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    initial: float = 1.0
    maximum: float = 300.0
    multiplier: float = 2.0
    # Seconds between tries (±AFTER_EXPIRY_JITTER) once the token apps read is past its last
    # planned refresh and the provider did not answer: apps are back within this of the
    # provider (`keyturn.providers.recovery` stretches it when many credentials wait).
    after_expiry: float = 5.0


def refresh_window(
    issued_at: float, expires_at: float, policy: RefreshPolicy
) -> tuple[float, float]:
    """The earliest and latest planned refresh times for a token (epoch seconds).

    The latest is clamped to `expires_at - margin`; for a lifetime shorter than the margin it
    is clamped to the midpoint of the lifetime instead, so short-lived tokens still turn over
    before they expire rather than being refreshed in a hot loop.
    """
    lifetime = max(0.0, expires_at - issued_at)
    deadline = expires_at - policy.margin
    if deadline <= issued_at:
        deadline = issued_at + lifetime / 2
    latest = min(issued_at + (policy.at + policy.jitter) * lifetime, deadline)
    earliest = min(issued_at + (policy.at - policy.jitter) * lifetime, latest)
    floor = issued_at + min(policy.min_interval, lifetime / 2)
    return max(earliest, floor), max(latest, floor)


def refresh_due(
    issued_at: float, expires_at: float, policy: RefreshPolicy, rng: random.Random
) -> float:
    """A due time drawn uniformly from the refresh window."""
    earliest, latest = refresh_window(issued_at, expires_at, policy)
    return rng.uniform(earliest, latest)


def backoff_delay(
    failures: int,
    policy: BackoffPolicy,
    rng: random.Random,
    retry_after: float | None = None,
) -> float:
    """Seconds to wait after the `failures`-th consecutive failure (1-based).

    Full jitter in [initial, cap]; a server's Retry-After is a floor (capped at `maximum`
    so a hostile or broken header cannot park a credential for days).
    """
    exponent = min(max(0, failures - 1), 64)  # 2**64 s is past any cap; no float overflow
    cap = min(policy.maximum, policy.initial * policy.multiplier**exponent)
    delay = rng.uniform(min(policy.initial, cap), cap)
    if retry_after is not None and retry_after > 0:
        delay = max(delay, min(retry_after, policy.maximum))
    return delay


# While the published token is still valid, no retry waits longer than this share of what is
# left of it (nor less than URGENT_FLOOR seconds): attempts grow denser as expiry nears, so the
# first attempt after an outage ends comes before the token expires.
URGENT_SHARE = 0.25
URGENT_FLOOR = 1.0
# The `after_expiry` cadence is drawn from ±this share of it, so credentials that failed
# together do not knock together.
AFTER_EXPIRY_JITTER = 0.2

# What became of a server's Retry-After: waited for in full, shortened to the token's last
# planned refresh, or overridden by the `after_expiry` cadence (past that point, or expired).
RetryAfterOutcome = Literal["honoured", "shortened", "overridden"]


@dataclass(frozen=True, slots=True)
class TokenLeft:
    """What the token apps read has left, as a retry sees it: seconds until it expires, and
    until its last planned refresh (`refresh_window`'s latest point). At or below 0 the
    deadline has passed: the margin kept for a late try is being used up."""

    expires_in: float
    deadline_in: float

    @property
    def past_deadline(self) -> bool:
        return self.deadline_in <= 0


def token_left(
    issued_at: float | None, expires_at: float | None, policy: RefreshPolicy, now: float
) -> TokenLeft | None:
    """The `TokenLeft` of a token issued at `issued_at` (unknown: taken as `expires_at -
    margin`'s deadline), None when there is no published token."""
    if expires_at is None:
        return None
    if issued_at is None:
        deadline = expires_at - policy.margin
    else:
        deadline = refresh_window(issued_at, expires_at, policy)[1]
    return TokenLeft(expires_at - now, deadline - now)


@dataclass(frozen=True, slots=True)
class Retry:
    """When to try again (`delay`, seconds), and what became of a server's Retry-After."""

    delay: float
    retry_after: RetryAfterOutcome | None = None


def retry_delay(
    failures: int,
    policy: BackoffPolicy,
    rng: random.Random,
    *,
    retry_after: float | None = None,
    left: TokenLeft | None = None,
    provider_wait: bool = False,
    crowd: float = 0.0,
) -> Retry:
    """When to retry a credential after its `failures`-th failure.

    A `provider_wait` (no usable answer) past the token's last planned refresh retries every
    `after_expiry` whatever Retry-After says (obeying it would be an outage of the apps); any
    provider wait lasts at least `crowd` (`keyturn.providers.recovery`). Otherwise backoff, capped
    by `URGENT_SHARE` of what the token has left and by its last refresh; Retry-After is a floor.
    """
    asked = retry_after if retry_after is not None and retry_after > 0 else None
    if provider_wait and left is not None and left.past_deadline:
        cadence = policy.after_expiry
        if left.expires_in > 0:  # still valid: denser as expiry nears, as below
            cadence = min(cadence, max(URGENT_FLOOR, left.expires_in * URGENT_SHARE))
        jitter = rng.uniform(1 - AFTER_EXPIRY_JITTER, 1 + AFTER_EXPIRY_JITTER)
        delay = max(cadence, crowd) * jitter
        if asked is None:
            return Retry(delay)
        return Retry(delay, "honoured" if asked <= delay else "overridden")
    retry = _backoff_retry(failures, policy, rng, asked, left)
    if provider_wait and crowd > retry.delay:
        # Many wait for this provider: together no more than its recovery rate (its return
        # wakes them all at once, so a stretched wait costs no recovery time).
        jitter = rng.uniform(1 - AFTER_EXPIRY_JITTER, 1 + AFTER_EXPIRY_JITTER)
        return Retry(crowd * jitter, retry.retry_after)
    return retry


def _backoff_retry(
    failures: int,
    policy: BackoffPolicy,
    rng: random.Random,
    asked: float | None,
    left: TokenLeft | None,
) -> Retry:
    """The backoff, bounded by what a published token has left; Retry-After a floor up to the
    token's last planned refresh (`retry_delay`)."""
    delay = backoff_delay(failures, policy, rng)
    if left is not None and left.expires_in > 0:
        bound = max(URGENT_FLOOR, min(left.expires_in * URGENT_SHARE, max(0.0, left.deadline_in)))
        delay = min(delay, bound)
    if asked is None:
        return Retry(delay)
    wanted = min(asked, policy.maximum)
    if left is not None and left.expires_in > 0 and not left.past_deadline:
        latest = max(URGENT_FLOOR, left.deadline_in)
        if wanted > latest:
            return Retry(max(delay, latest), "shortened")
    return Retry(max(delay, wanted), "honoured")


def still_valid(expires_at: float, now: float, margin: float) -> bool:
    """Whether a token is good for at least `margin` more seconds."""
    return expires_at - now > margin
