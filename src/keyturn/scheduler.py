"""When each credential runs: one APScheduler 3 date job per credential, re-planned after every
run, with a bound on concurrent runs and never two runs of one credential at once; with several
instances, only this instance's share (`owns`, followed by `reassign`). Why it is built so:
docs/architecture.md#the-scheduler. Housekeeping runs beside it (`keyturn.housekeeping`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger

from keyturn.clock import Clock
from keyturn.errors import VaultAuthError, VaultUnavailable
from keyturn.jobs.job import Outcome
from keyturn.logs import get_logger
from keyturn.state import CredentialState


class Runnable(Protocol):
    """A credential's job body: `run(force=…)` returns the outcome with the next due time."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    async def run(self, *, force: bool | Collection[str] = False) -> Outcome: ...


@dataclass(slots=True)
class _JobStatus:
    """What the scheduler keeps about one credential while it runs it."""

    next_due: float | None = None
    last_outcome: Outcome | None = None
    running: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    finished_at: float | None = None  # when `last_outcome`'s run ended


@dataclass(frozen=True, slots=True)
class JobView:
    """A read-only copy of what the scheduler knows about one credential, for readiness and
    the watcher: they read it, only the scheduler changes it."""

    name: str
    kind: str
    next_due: float | None
    last_outcome: Outcome | None
    running: bool
    finished_at: float | None = None  # when the last run ended

    @property
    def state(self) -> CredentialState | None:
        """The record as the last finished run left it (None before the first run ends)."""
        return self.last_outcome.state if self.last_outcome is not None else None


class CredentialScheduler:
    """Runs each credential's job at its due time; `start`, then `shutdown` to drain."""

    def __init__(
        self,
        jobs: Iterable[Runnable],
        *,
        clock: Clock,
        max_concurrency: int = 64,
        lateness_samples: int = 100_000,
        on_lateness: Callable[[float], None] | None = None,
    ) -> None:
        self._jobs = {job.name: job for job in jobs}
        self._status = {name: _JobStatus() for name in self._jobs}
        self._clock = clock
        self._slots = asyncio.Semaphore(max_concurrency)
        self._in_flight: set[asyncio.Task[None]] = set()
        self._accepting = True
        self._log = get_logger("keyturn.scheduler")
        # Seconds each scheduled run started after its planned time (for benchmarks/metrics).
        self.lateness: deque[float] = deque(maxlen=lateness_samples)
        self._on_lateness = on_lateness
        self._scheduler = AsyncIOScheduler(
            timezone=UTC,
            job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 4},
        )
        # Credentials whose last run failed on Vault (down, sealed, token refused): they run
        # again as soon as Vault answers (`vault_back`), not when their backoff ends.
        self._waiting_for_vault: set[str] = set()
        self.runs_finished = 0  # (the saved plan is written again only when this moved)
        self._owns: Callable[[str], bool] = lambda _name: True
        self._owned: set[str] = set(self._jobs)  # the share: only these are planned

    def status_of(self, name: str) -> JobView | None:
        """What the scheduler knows about credential `name` now (None: not configured)."""
        job, status = self._jobs.get(name), self._status.get(name)
        if job is None or status is None:
            return None
        return JobView(
            name,
            job.kind,
            status.next_due,
            status.last_outcome,
            status.running,
            status.finished_at,
        )

    def statuses(self) -> list[JobView]:
        """`status_of` for every credential this instance runs (its share), in configuration
        order."""
        return [
            view
            for name in self._jobs
            if name in self._owned and (view := self.status_of(name)) is not None
        ]

    @property
    def waiting_for_vault(self) -> frozenset[str]:
        """The credentials whose last run failed because Vault was down, sealed or refused
        keyturn's token."""
        return frozenset(self._waiting_for_vault)

    @property
    def owned(self) -> frozenset[str]:
        """The credentials in this instance's share."""
        return frozenset(self._owned)

    def start(
        self,
        restored: Mapping[str, tuple[Outcome, float]] | None = None,
        *,
        owns: Callable[[str], bool] | None = None,
    ) -> None:
        """Plan every credential's first run now (it decides itself whether work is due), or,
        for those in `restored` (from a saved plan, `keyturn.saved_plan`: the outcome and when
        its run ended), at the saved time, with that outcome as what is known of it until
        then. With `owns`, only the credentials it names (this instance's share)."""
        now = self._clock.time()
        restored = restored or {}
        if owns is not None:
            self._owns = owns
            self._owned = {name for name in self._jobs if owns(name)}
        for name in self._jobs:
            saved = restored.get(name)
            if saved is not None:
                status = self._status[name]
                status.last_outcome, status.finished_at = saved
            self._plan(name, saved[0].next_due if saved is not None else now)
        self._scheduler.start()

    def reassign(self) -> dict[str, list[str]]:
        """The share moved (`owns` answers anew): credentials that came into it run now (each
        reads its record and decides), those that left it are no longer planned (a run in
        progress finishes; its lease keeps the new owner waiting)."""
        owned = {name for name in self._jobs if self._owns(name)}
        added, removed = sorted(owned - self._owned), sorted(self._owned - owned)
        self._owned = owned
        for name in removed:
            self._status[name].next_due = None
            if self._scheduler.get_job(f"credential:{name}") is not None:
                self._scheduler.remove_job(f"credential:{name}")
        self._waiting_for_vault.difference_update(removed)
        now = self._clock.time()
        for name in added:
            self._plan(name, now)
        return {"added": added, "removed": removed}

    async def run_now(self, name: str, *, force: bool | Collection[str] = True) -> Outcome:
        """Run a credential's job immediately (waits if it is already running), in this
        instance's share or not."""
        return await self._run(name, self._clock.time(), force=force)

    def replace_jobs(
        self, jobs: Iterable[Runnable], *, changed: Collection[str]
    ) -> dict[str, list[str]]:
        """Swap in the jobs of a new configuration. Added and `changed` credentials run now
        (each decides whether work is due); removed ones stop being scheduled (a run in
        progress finishes); unchanged ones keep their plan."""
        new = {job.name: job for job in jobs}
        removed = sorted(set(self._jobs) - set(new))
        added = sorted(set(new) - set(self._jobs))
        rerun = sorted((set(changed) & set(new)) - set(added))
        self._jobs = new
        self._owned = {name for name in new if self._owns(name)}
        self._waiting_for_vault.intersection_update(new)
        for name in removed:
            self._status.pop(name, None)
            if self._scheduler.get_job(f"credential:{name}") is not None:
                self._scheduler.remove_job(f"credential:{name}")
        now = self._clock.time()
        for name in added:
            self._status[name] = _JobStatus()
        for name in added + rerun:
            self._plan(name, now)
        return {"added": added, "removed": removed, "changed": rerun}

    def wake(self, names: Iterable[str], *, spacing: float = 0.0) -> list[str]:
        """Run these credentials now (e.g. Vault answers again); the semaphore still bounds how
        many run at once. `spacing`: seconds between one's start and the next's, so that runs
        bound by a provider's rate limit do not all start at once and each hold a slot of the
        semaphore while they wait for that rate (other credentials' runs would start late).
        Returns the names planned."""
        now = self._clock.time()
        planned = [name for name in names if name in self._owned]
        for index, name in enumerate(planned):
            self._plan(name, now + index * spacing)
        return planned

    def vault_back(self) -> list[str]:
        """Vault answers again: the credentials whose last run failed on it run now, instead of
        when their backoff ends. Returns the names planned."""
        waiting, self._waiting_for_vault = sorted(self._waiting_for_vault), set()
        return self.wake(waiting)

    def replan(self) -> None:
        """After a wall-clock jump every timer set before it is wrong, and so may be every time
        a plan was computed from: each credential runs now (reading its record, it plans again
        against the clock as it is now; the semaphore bounds the burst)."""
        self.wake([name for name, status in self._status.items() if not status.running])

    async def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` for the runs in progress now to finish; True if they did."""
        tasks = set(self._in_flight)
        if not tasks:
            return True
        _done, pending = await asyncio.wait(tasks, timeout=timeout)
        return not pending

    async def shutdown(self, timeout: float) -> bool:
        """Stop starting runs, let in-flight ones finish for up to `timeout`, then stop the
        scheduler; True if all finished. (APScheduler's own shutdown cancels running coroutine
        jobs, which would cut a rotation between two steps: it comes last.)"""
        self._accepting = False
        if self._scheduler.running:
            self._scheduler.pause()
        pending: set[asyncio.Task[None]] = set()
        tasks = set(self._in_flight)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=timeout)
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        return not pending

    def _run_date(self, due: float) -> datetime:
        """APScheduler's date for `due` on keyturn's clock: planned as a delay from now, so a
        plan does not move when the system's wall clock is stepped (APScheduler then sleeps on
        the event loop's monotonic clock; `replan` re-anchors plans after a detected jump)."""
        return datetime.now(UTC) + timedelta(seconds=max(0.0, due - self._clock.time()))

    def _plan(self, name: str, due: float) -> None:
        if not self._accepting or name not in self._owned:
            return  # shutting down, removed by a reload, or in another instance's share
        self._status[name].next_due = due
        self._scheduler.add_job(
            self._fire,
            trigger=DateTrigger(run_date=self._run_date(due)),
            args=[name, due],
            id=f"credential:{name}",
            name=name,
            replace_existing=True,
        )

    async def _fire(self, name: str, planned: float) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._in_flight.add(task)
        try:
            if name not in self._jobs:
                return  # removed by a reload after this run was planned
            await self._run(name, planned, force=False)
        finally:
            if task is not None:
                self._in_flight.discard(task)

    async def _run(self, name: str, planned: float, *, force: bool | Collection[str]) -> Outcome:
        status = self._status[name]
        async with status.lock, self._slots:
            late = max(0.0, self._clock.time() - planned)
            self.lateness.append(late)
            if self._on_lateness is not None:
                self._on_lateness(late)
            status.running = True
            job = self._jobs.get(name)
            try:
                if job is None:
                    raise LookupError(f"credential {name} is no longer configured")
                outcome = await job.run(force=force)
            except Exception as exc:  # a bug in one credential's run must not stop its schedule
                self._log.exception("job.crashed", credential=name, error=type(exc).__name__)
                # The record is as the last run left it: what apps read did not change.
                last = status.last_outcome.state if status.last_outcome else CredentialState()
                failing = replace(last, token=replace(last.token, phase="failing"))
                outcome = Outcome("failed", self._clock.time() + 30.0, failing)
            finally:
                status.running = False
            status.last_outcome, status.finished_at = outcome, self._clock.time()
            self.runs_finished += 1
            if isinstance(outcome.error, (VaultUnavailable, VaultAuthError)):
                self._waiting_for_vault.add(name)
            else:
                self._waiting_for_vault.discard(name)
            self._plan(name, outcome.next_due)
            return outcome
