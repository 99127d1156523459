"""Housekeeping: periodic jobs on the event loop's monotonic clock, beside the scheduler."""

from __future__ import annotations

import asyncio
import logging

import pytest
from structlog.testing import capture_logs

from keyturn.housekeeping import Housekeeping, Periodic


async def test_a_job_runs_at_the_delay_it_asks_for_and_at_least_a_second_later() -> None:
    calls = 0

    async def maintain() -> float:
        nonlocal calls
        calls += 1
        return 0.0  # asks for "now": the loop still waits at least 1 s

    async with Housekeeping([Periodic("vault-token", maintain, 30.0, first=0.0)]).running(
        stop_timeout=1.0
    ):
        await asyncio.sleep(0.3)
    assert calls == 1


async def test_a_job_without_first_waits_its_interval_before_its_first_run() -> None:
    calls = 0

    async def save() -> None:
        nonlocal calls
        calls += 1

    async with Housekeeping([Periodic("plan", save, 0.05)]).running(stop_timeout=1.0):
        assert calls == 0
        await asyncio.sleep(0.3)
    assert calls >= 2  # every 0.05 s: a body returning None keeps its interval


async def test_the_beat_loop_asks_for_its_interval_before_each_wait() -> None:
    """An interval that is a function: a takeover that changed at a beat sets the wait before
    the next one."""
    intervals = [0.001]
    beats = 0

    async def beat() -> None:
        nonlocal beats
        beats += 1
        intervals.append(3600.0)  # the takeover moved: the next wait is long

    async with Housekeeping([Periodic("members", beat, lambda: intervals[-1])]).running(
        stop_timeout=1.0
    ):
        await asyncio.sleep(0.2)
    assert beats == 1


async def test_a_failing_job_is_logged_and_runs_again() -> None:
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("bug")

    with capture_logs() as logs:
        async with Housekeeping([Periodic("vault-back", broken, 0.02)]).running(stop_timeout=1.0):
            await asyncio.sleep(0.2)
    assert calls >= 2
    assert any(e["event"] == "periodic.failed" and e["job"] == "vault-back" for e in logs)


async def test_a_job_under_way_at_stop_finishes_within_the_timeout() -> None:
    started, finished = asyncio.Event(), asyncio.Event()

    async def beat() -> None:
        started.set()
        await asyncio.sleep(0.1)
        finished.set()

    async with Housekeeping([Periodic("members", beat, 3600.0, first=0.0)]).running(
        stop_timeout=5.0
    ):
        await asyncio.wait_for(started.wait(), 5)
    assert finished.is_set()


async def test_a_job_cut_by_the_stop_is_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """A sweep still going past the stop's timeout is cancelled: nothing is logged as an
    error."""
    started = asyncio.Event()

    async def sweep() -> float:
        started.set()
        await asyncio.sleep(3600)
        return 300.0

    with capture_logs() as logs:
        async with Housekeeping([Periodic("watch", sweep, 300.0, first=0.0)]).running(
            stop_timeout=0.05
        ):
            await asyncio.wait_for(started.wait(), 5)

    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert [e for e in logs if e["log_level"] in ("error", "critical")] == []
    assert {"event": "periodic.stopped", "job": "watch", "log_level": "info"} in logs
