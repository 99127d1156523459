"""When keyturn renews its own Vault token: the pure schedule, no Vault, no sockets."""

from __future__ import annotations

import random

import pytest

from keyturn.vault.renewal import MIN_DELAY, TokenLease, error_delay, expiring_margin, renewal_delay


@pytest.mark.parametrize(
    ("ttl", "margin", "expected"),
    [
        (3600, 60, 2400),  # 2/3 of the TTL: the margin is well inside it
        (3600, 1800, 1800),  # no later than the margin before expiry
        (60, 30, 30),
        (4, 1, 8 / 3),
        (60, 100, 20),  # margin longer than the TTL: a third of it, never a renewal loop
        (60, 0, 40),
    ],
)
def test_renewal_delay(ttl: float, margin: float, expected: float) -> None:
    assert renewal_delay(ttl, margin) == pytest.approx(expected)


@pytest.mark.parametrize("ttl", [1, 4, 60, 3600, 86400 * 32])
@pytest.mark.parametrize("margin", [0, 1, 30, 300, 10_000])
def test_renewal_delay_is_between_a_third_and_two_thirds(ttl: float, margin: float) -> None:
    delay = renewal_delay(ttl, margin)
    assert ttl / 3 - 1e-9 <= delay <= 2 * ttl / 3 + 1e-9
    if margin <= 2 * ttl / 3:
        assert ttl - delay >= margin - 1e-9


def test_a_token_without_ttl_has_no_renewal_time() -> None:
    with pytest.raises(ValueError):
        renewal_delay(0, 10)
    assert TokenLease(100.0, 0, False, 0).due_at(10) is None
    assert TokenLease(100.0, 0, False, 0).expires_at is None


def test_lease_due_and_expiry() -> None:
    lease = TokenLease(obtained_at=1000.0, ttl=60, renewable=True, natural_ttl=60)
    assert lease.expires_at == 1060
    assert lease.due_at(margin=5) == pytest.approx(1040)
    assert not lease.needs_login


def test_a_full_renewal_is_not_exhausted() -> None:
    lease = TokenLease(1000.0, 60, True, 60).renewed(now=1040.0, granted=60, renewable=True)
    assert (lease.obtained_at, lease.expires_at, lease.exhausted) == (1040.0, 1100.0, False)
    assert not lease.needs_login


def test_a_capped_renewal_means_log_in_next_time() -> None:
    lease = TokenLease(1000.0, 60, True, 60).renewed(now=1040.0, granted=25, renewable=True)
    assert lease.exhausted
    assert lease.needs_login
    assert lease.due_at(5) == pytest.approx(1040 + 25 * 2 / 3)


def test_a_renewal_that_does_not_move_the_expiry_is_exhausted() -> None:
    lease = TokenLease(1000.0, 60, True, 60).renewed(now=1000.5, granted=59.5, renewable=True)
    assert lease.exhausted  # 59.5 < 60 anyway; and a rounded-up grant:
    same = TokenLease(1000.0, 60, True, 59).renewed(now=1001.0, granted=59, renewable=True)
    assert same.exhausted


def test_a_non_renewable_token_needs_a_login() -> None:
    assert TokenLease(1000.0, 60, False, 60).needs_login


def test_error_delay_grows_and_is_capped() -> None:
    rng = random.Random(7)
    ceilings = [error_delay(n, base=5, cap=300, rng=rng) for n in range(1, 12)]
    assert all(MIN_DELAY <= d <= 300 for d in ceilings)
    assert 2.5 <= ceilings[0] <= 5
    assert 150 <= ceilings[-1] <= 300


def test_error_delay_jitters() -> None:
    rng = random.Random(1)
    assert len({error_delay(3, rng=rng) for _ in range(20)}) > 10


def test_error_delay_needs_a_failure() -> None:
    with pytest.raises(ValueError):
        error_delay(0)


def test_the_expiring_alert_margin_is_at_most_a_third_of_the_ttl() -> None:
    # A 24 s token with a 60 s renew_margin is renewed with 8 s left: only less than that is
    # "could not renew or replace it", not every healthy renewal.
    assert expiring_margin(24, 60) == 8
    assert expiring_margin(3600, 60) == 60
    assert expiring_margin(None, 60) == 60  # no TTL known (never expires, no login yet)
    assert expiring_margin(0, 60) == 60
