"""The clock abstraction: FakeClock drives sleepers; RFC 3339 helpers round-trip."""

from __future__ import annotations

import asyncio
import time

import pytest

from keyturn.clock import FakeClock, SystemClock, parse_rfc3339, rfc3339


async def test_fake_sleep_returns_only_after_advance_passes_deadline() -> None:
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep(10))
    await asyncio.sleep(0)
    clock.advance(9.5)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert task.done()
    assert clock.sleepers == 0


def test_fake_clock_refuses_to_go_backwards() -> None:
    with pytest.raises(ValueError, match="backwards"):
        FakeClock().advance(-1)


def test_fake_clock_moves_wall_and_monotonic_together() -> None:
    clock = FakeClock(start=1000.0)
    before = clock.monotonic()
    clock.advance(42)
    assert clock.time() == 1042.0
    assert clock.monotonic() - before == 42


@pytest.mark.parametrize(
    ("epoch", "text"),
    [(0, "1970-01-01T00:00:00Z"), (1_800_000_000.9, "2027-01-15T08:00:00Z")],
)
def test_rfc3339_formats_whole_utc_seconds(epoch: float, text: str) -> None:
    assert rfc3339(epoch) == text
    assert parse_rfc3339(text) == int(epoch)


def test_parse_rfc3339_rejects_naive_timestamps() -> None:
    with pytest.raises(ValueError, match="offset"):
        parse_rfc3339("2027-01-15T08:00:00")


def test_system_clock_is_close_to_the_epoch_clock() -> None:
    assert abs(SystemClock().time() - time.time()) < 5
