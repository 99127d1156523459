"""`TokenBucket`, the one rate limit keyturn uses: provider calls wait for a token (`acquire`),
alerts over a hook's limit are dropped (`take`). Time is a FakeClock's."""

from __future__ import annotations

import asyncio

import pytest

from keyturn.clock import FakeClock
from keyturn.ratelimit import TokenBucket


def test_take_allows_a_burst_then_refills_at_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(2.0, clock, burst=3)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.advance(0.5)  # one token back at 2 per second
    assert [bucket.take(), bucket.take()] == [True, False]
    clock.advance(60)  # never more than the burst
    assert sum(bucket.take() for _ in range(10)) == 3


def test_per_minute_bursts_up_to_a_minute_s_worth() -> None:
    clock = FakeClock()
    bucket = TokenBucket.per_minute(2, clock)
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    clock.advance(30)
    assert [bucket.take(), bucket.take()] == [True, False]
    slow = TokenBucket.per_minute(0.5, clock)  # less than one a minute: still one at a time
    assert [slow.take(), slow.take()] == [True, False]


@pytest.mark.parametrize("rate", [0, -1])
def test_a_rate_must_be_positive(rate: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, FakeClock())
    with pytest.raises(ValueError):
        TokenBucket.per_minute(rate, FakeClock())


async def test_acquire_waits_for_the_next_token_in_turn() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1.0, clock)  # default burst: one second's worth
    await bucket.acquire()
    done: list[int] = []

    async def call(n: int) -> None:
        await bucket.acquire()
        done.append(n)

    tasks = [asyncio.ensure_future(call(n)) for n in range(2)]
    await settle()
    assert (done, clock.sleepers) == ([], 1)  # one waits on the clock, the other in line
    clock.advance(1.0)
    await settle()
    assert done == [0]
    clock.advance(1.0)
    await settle()
    assert done == [0, 1]
    await asyncio.gather(*tasks)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)
