"""Pure timing rules: when to refresh, how long to back off. No I/O, no clock reads.

Refresh (cert-manager, Vault Agent): at `at` (≈2/3) of the lifetime after issue, spread by
`±jitter` of the lifetime so that tokens issued together do not refresh together, and never
later than `expires_at - margin`. Backoff: capped exponential with full jitter (AWS
architecture blog), never shorter than a server's `Retry-After`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


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


def retry_delay(
    failures: int,
    policy: BackoffPolicy,
    rng: random.Random,
    *,
    retry_after: float | None = None,
    remaining: float | None = None,
) -> float:
    """Seconds to wait before retrying a credential after its `failures`-th failure.

    The credential's backoff, capped by `URGENT_SHARE` of the `remaining` lifetime of the
    token apps read now (never below `URGENT_FLOOR`), so backoff that has grown during an
    earlier outage cannot sleep past the expiry of the current token. A server's Retry-After
    stays a floor: it is the server's explicit request, and hammering it would not help.
    """
    delay = backoff_delay(failures, policy, rng)
    if remaining is not None and remaining > 0:
        delay = min(delay, max(URGENT_FLOOR, remaining * URGENT_SHARE))
    if retry_after is not None and retry_after > 0:
        delay = max(delay, min(retry_after, policy.maximum))
    return delay


def still_valid(expires_at: float, now: float, margin: float) -> bool:
    """Whether a token is good for at least `margin` more seconds."""
    return expires_at - now > margin
