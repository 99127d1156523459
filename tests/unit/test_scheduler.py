"""CredentialScheduler on a real event loop with due times a few milliseconds away."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from keyturn.clock import SystemClock
from keyturn.jobs.job import Outcome
from keyturn.scheduler import CredentialScheduler, JobView
from keyturn.state import CredentialState, TokenRecord

CLOCK = SystemClock()


@dataclass
class Probe:
    """A fake credential job that records how often and how concurrently it ran."""

    name: str
    kind: str = "oauth_client"
    work: float = 0.01
    next_in: float = 0.02
    crash: bool = False
    runs: int = 0
    forced: int = 0
    running: int = 0
    max_running: int = 0
    shared: dict[str, int] = field(default_factory=lambda: {"now": 0, "max": 0})

    async def run(self, *, force: bool = False) -> Outcome:
        self.runs += 1
        self.forced += force
        self.running += 1
        self.shared["now"] += 1
        self.max_running = max(self.max_running, self.running)
        self.shared["max"] = max(self.shared["max"], self.shared["now"])
        try:
            await asyncio.sleep(self.work)
            if self.crash:
                raise RuntimeError("bug in a job")
            return Outcome("refreshed", CLOCK.time() + self.next_in, CredentialState())
        finally:
            self.running -= 1
            self.shared["now"] -= 1


async def wait_until(predicate, timeout: float = 5.0) -> None:
    deadline = CLOCK.monotonic() + timeout
    while not predicate():
        assert CLOCK.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_every_job_runs_at_start_and_again_when_due() -> None:
    jobs = [Probe("a"), Probe("b")]
    scheduler = CredentialScheduler(jobs, clock=CLOCK)
    scheduler.start()
    await wait_until(lambda: all(job.runs >= 3 for job in jobs))
    assert await scheduler.shutdown(timeout=5)
    assert all(s.last_outcome is not None for s in scheduler.statuses())


async def test_a_long_overdue_job_still_runs() -> None:
    job = Probe("late", next_in=-3600)  # planned an hour ago: a misfire must not be dropped
    scheduler = CredentialScheduler([job], clock=CLOCK)
    scheduler.start()
    await wait_until(lambda: job.runs >= 3)
    await scheduler.shutdown(timeout=5)
    assert min(scheduler.lateness) >= 0


async def test_one_credential_never_runs_twice_at_once() -> None:
    job = Probe("solo", work=0.05, next_in=0.0)
    scheduler = CredentialScheduler([job], clock=CLOCK)
    scheduler.start()
    await asyncio.gather(*(scheduler.run_now("solo") for _ in range(5)))
    await scheduler.shutdown(timeout=5)
    assert job.forced == 5
    assert job.max_running == 1


async def test_concurrency_is_bounded_across_credentials() -> None:
    shared = {"now": 0, "max": 0}
    jobs = [Probe(f"c{i}", work=0.05, shared=shared) for i in range(8)]
    scheduler = CredentialScheduler(jobs, clock=CLOCK, max_concurrency=2)
    scheduler.start()
    await wait_until(lambda: all(job.runs >= 1 for job in jobs))
    await scheduler.shutdown(timeout=5)
    assert shared["max"] == 2


async def test_a_crashing_job_is_rescheduled_and_does_not_stop_others() -> None:
    broken, healthy = Probe("broken", crash=True), Probe("healthy")
    scheduler = CredentialScheduler([broken, healthy], clock=CLOCK)
    scheduler.start()
    await wait_until(lambda: healthy.runs >= 5)
    await scheduler.shutdown(timeout=5)
    assert broken.runs >= 1
    status = scheduler.status_of("broken")
    outcome = status.last_outcome if status else None
    assert outcome is not None
    assert outcome.action == "failed"
    assert outcome.next_due > CLOCK.time()  # retried later, not in a hot loop


async def test_shutdown_waits_for_in_flight_runs() -> None:
    job = Probe("slow", work=0.3)
    scheduler = CredentialScheduler([job], clock=CLOCK)
    scheduler.start()
    await wait_until(lambda: job.running == 1)
    assert await scheduler.shutdown(timeout=5)
    assert job.running == 0
    runs = job.runs
    await asyncio.sleep(0.1)
    assert job.runs == runs  # nothing starts after shutdown


@dataclass
class Flaky:
    """A job whose first run publishes version 7 and whose later runs crash."""

    name: str = "flaky"
    kind: str = "oauth_client"
    runs: int = 0

    async def run(self, *, force: bool = False) -> Outcome:
        self.runs += 1
        if self.runs > 1:
            raise RuntimeError("bug in a job")
        published = CredentialState(token=TokenRecord(published_version=7))
        return Outcome("refreshed", CLOCK.time() + 3600, published)


async def test_status_is_a_read_only_view_and_a_crash_keeps_the_last_state() -> None:
    """Readiness and the watcher read the record as the last run left it: a run that crashed
    changed nothing in Vault, so it does not blank what they see."""
    scheduler = CredentialScheduler([Flaky()], clock=CLOCK)
    assert scheduler.status_of("flaky") == JobView("flaky", "oauth_client", None, None, False)
    assert scheduler.status_of("unknown") is None
    await scheduler.run_now("flaky")
    await scheduler.run_now("flaky")
    await scheduler.shutdown(timeout=5)
    view = scheduler.status_of("flaky")
    assert view is not None and view.last_outcome is not None
    assert view.last_outcome.action == "failed"
    assert view.state is not None
    assert (view.state.token.published_version, view.state.token.phase) == (7, "failing")
    assert [v.name for v in scheduler.statuses()] == ["flaky"]


async def test_only_the_share_is_planned_and_a_moved_share_is_followed() -> None:
    """With several instances the scheduler runs only what `owns` names; `reassign` runs the
    credentials that came in at once and stops planning those that left."""
    jobs = {name: Probe(name, next_in=0.02) for name in ("a", "b", "c")}
    share = {"a", "b"}
    scheduler = CredentialScheduler(jobs.values(), clock=CLOCK)
    scheduler.start(owns=lambda name: name in share)
    await wait_until(lambda: jobs["a"].runs >= 2 and jobs["b"].runs >= 2)
    assert jobs["c"].runs == 0
    assert [view.name for view in scheduler.statuses()] == ["a", "b"]

    share.clear()
    share.update({"b", "c"})
    assert scheduler.reassign() == {"added": ["c"], "removed": ["a"]}
    await wait_until(lambda: jobs["c"].runs >= 2)
    runs_of_a = jobs["a"].runs
    await asyncio.sleep(0.1)  # several of a's former periods
    assert await scheduler.shutdown(timeout=5)
    assert jobs["a"].runs <= runs_of_a + 1  # at most the run in progress when it left
    assert scheduler.owned == frozenset({"b", "c"})
    assert scheduler.status_of("a") is not None and scheduler.status_of("a").next_due is None
