"""Refresh windows and backoff, as pure functions over a seeded random source."""

from __future__ import annotations

import random

import pytest

from keyturn.policy import (
    BackoffPolicy,
    RefreshPolicy,
    backoff_delay,
    refresh_due,
    refresh_window,
    still_valid,
)


@pytest.mark.parametrize(
    ("lifetime", "margin", "expected"),
    [
        (3600, 60, (2016.0, 2736.0)),  # 0.56..0.76 of an hour
        (300, 60, (168.0, 228.0)),  # 0.56*300 .. min(0.76*300, 240)
        (90, 60, (30.0, 30.0)),  # margin dominates: never later than expiry - margin
        (30, 60, (15.0, 15.0)),  # shorter than the margin: the midpoint
        (1, 60, (0.5, 0.5)),
    ],
)
def test_window_sits_around_two_thirds_and_before_the_margin(lifetime, margin, expected) -> None:
    policy = RefreshPolicy(at=0.66, jitter=0.1, margin=margin, min_interval=0.1)
    earliest, latest = refresh_window(1000.0, 1000.0 + lifetime, policy)
    assert (round(earliest - 1000, 6), round(latest - 1000, 6)) == expected
    assert latest < 1000 + lifetime


def test_due_times_spread_across_the_window_and_never_pass_expiry_minus_margin() -> None:
    rng = random.Random(7)
    policy = RefreshPolicy(margin=60)
    dues = [refresh_due(0, 3600, policy, rng) for _ in range(2000)]
    assert min(dues) >= 0.56 * 3600
    assert max(dues) <= 3600 - 60
    assert max(dues) - min(dues) > 600  # jitter actually spreads them


def test_min_interval_prevents_a_hot_loop_on_tiny_lifetimes() -> None:
    policy = RefreshPolicy(at=0.01, jitter=0.0, margin=0, min_interval=1.0)
    assert refresh_window(0, 1.0, policy) == (0.5, 0.5)  # half the lifetime, not 0.01 s
    assert refresh_window(0, 100.0, policy) == (1.0, 1.0)  # min_interval, not 1 s * 0.01


def test_backoff_grows_exponentially_and_is_capped() -> None:
    rng = random.Random(1)
    policy = BackoffPolicy(initial=1, maximum=60, multiplier=2)
    caps = [max(backoff_delay(n, policy, rng) for _ in range(300)) for n in (1, 2, 3, 4, 10, 50)]
    assert caps[0] <= 1
    assert 1 < caps[1] <= 2
    assert 2 < caps[2] <= 4
    assert 4 < caps[3] <= 8
    assert 30 < caps[4] <= 60
    assert caps[5] <= 60


def test_backoff_has_full_jitter() -> None:
    rng = random.Random(3)
    delays = {round(backoff_delay(6, BackoffPolicy(), rng), 3) for _ in range(50)}
    assert len(delays) > 40


@pytest.mark.parametrize(("retry_after", "floor"), [(30, 30), (10_000, 300)])
def test_retry_after_is_a_floor_capped_at_the_maximum(retry_after, floor) -> None:
    rng = random.Random(5)
    delays = [backoff_delay(1, BackoffPolicy(), rng, retry_after) for _ in range(20)]
    assert min(delays) >= floor
    assert max(delays) <= 300


def test_still_valid_respects_the_margin() -> None:
    assert still_valid(expires_at=100, now=30, margin=60)
    assert not still_valid(expires_at=100, now=40, margin=60)
