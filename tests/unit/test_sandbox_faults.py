"""Fault injection and rate limits with FakeClock and a seeded Random: deterministic, no sleeps."""

from __future__ import annotations

import random

import pytest

from keyturn.clock import FakeClock
from keyturn.errors import ConfigError
from keyturn_devkit.sandbox.config import RateLimit
from keyturn_devkit.sandbox.faults import FaultInjector, RateLimiter


def injector(seed: int = 7) -> tuple[FaultInjector, FakeClock]:
    clock = FakeClock()
    return FaultInjector(clock, random.Random(seed)), clock


def test_no_rules_means_no_fault() -> None:
    faults, _ = injector()
    assert all(faults.decide(e) is None for e in ("token", "users", "projects", "revoke"))


def test_error_rate_one_always_fails_and_zero_never_does() -> None:
    faults, _ = injector()
    faults.update({"token": {"error_rate": 1, "error_status": 500, "retry_after": 3}})
    decided = [faults.decide("token") for _ in range(50)]
    assert all(d is not None and (d.status, d.retry_after) == (500, 3) for d in decided)
    assert faults.decide("users") is None
    faults.update({"token": {"error_rate": 0}})
    assert faults.decide("token") is None


def test_partial_error_rate_fails_about_that_share_and_a_seed_replays_it() -> None:
    faults, _ = injector()
    faults.update({"seed": 42, "resources": {"error_rate": 0.3}})
    first = [faults.decide("users") is not None for _ in range(1000)]
    assert 230 < sum(first) < 370
    faults.update({"seed": 42})
    assert [faults.decide("projects") is not None for _ in range(1000)] == first


def test_outage_answers_with_remaining_seconds_until_it_ends() -> None:
    faults, clock = injector()
    faults.update({"*": {"outage_seconds": 10}})
    fault = faults.decide("revoke")
    assert fault is not None
    assert (fault.status, fault.retry_after, fault.reason) == (503, 10, "outage")
    clock.advance(8.5)
    fault = faults.decide("token")
    assert fault is not None
    assert fault.retry_after == 2
    clock.advance(1.5)
    assert faults.decide("token") is None
    assert faults.to_json()["*"]["outage_remaining_seconds"] == 0


def test_latency_alone_delays_without_failing() -> None:
    faults, _ = injector()
    faults.update({"users": {"latency_ms": 250}})
    fault = faults.decide("users")
    assert fault is not None
    assert (fault.latency, fault.status) == (0.25, None)


def test_the_most_specific_selector_wins_and_null_clears_a_rule() -> None:
    faults, _ = injector()
    faults.update({"*": {"error_rate": 1}, "token": {"latency_ms": 5}})
    token_fault = faults.decide("token")
    assert token_fault is not None
    assert token_fault.status is None
    assert faults.decide("users") is not None
    faults.update({"*": None})
    assert faults.decide("users") is None
    assert set(faults.to_json()) == {"token"}
    faults.clear()
    assert faults.to_json() == {}


def test_invalid_fault_rules_name_each_key_and_change_nothing() -> None:
    faults, _ = injector()
    with pytest.raises(ConfigError) as caught:
        faults.update(
            {
                "token": {"error_rate": 2, "latency_ms": -1},
                "nowhere": {},
                "users": {"colour": "red"},
                "projects": "down",
            }
        )
    text = "\n".join(caught.value.problems)
    for fragment in (
        "faults.token.error_rate",
        "faults.token.latency_ms",
        "nowhere",
        "faults.users",
        "faults.projects",
    ):
        assert fragment in text
    assert faults.to_json() == {}


def test_rate_limit_allows_the_window_then_says_when_to_retry() -> None:
    clock = FakeClock()
    limiter = RateLimiter(clock)
    limiter.configure({"token": RateLimit(requests=3, per_seconds=10)})
    assert [limiter.check("token") for _ in range(3)] == [None, None, None]
    clock.advance(2.2)
    assert limiter.check("token") == 8
    assert limiter.check("users") is None
    clock.advance(7.8)
    assert limiter.check("token") is None


def test_reconfiguring_resets_windows_only_when_limits_change() -> None:
    clock = FakeClock()
    limiter = RateLimiter(clock)
    limits = {"resources": RateLimit(requests=1, per_seconds=60)}
    limiter.configure(limits)
    assert limiter.check("projects") is None
    limiter.configure(dict(limits))
    assert limiter.check("users") == 60
    limiter.configure({"resources": RateLimit(requests=2, per_seconds=60)})
    assert limiter.check("users") is None
