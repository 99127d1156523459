"""What the daemon does beside its credentials' runs: keyturn's own Vault token, the liveness
heartbeat, systemd's watchdog, the published-path watcher, Vault's return, the saved plan, this
instance's place among several and the wall-clock guard. Each is a `Periodic` job, run by
`Housekeeping` on the event loop's monotonic clock: never through APScheduler, whose plans
follow the wall clock (the guard is what repairs them after a step).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

from keyturn.clock import Clock, SystemClock, WallClockGuard
from keyturn.config import Config
from keyturn.errors import KeyturnError
from keyturn.events import Suspicious
from keyturn.jobs.job import Outcome, lease_in_force
from keyturn.kinds import kind_of
from keyturn.layout import state_path
from keyturn.logs import get_logger
from keyturn.members import BEATS_PER_TAKEOVER, MIN_TAKEOVER, Membership, takeover_needed
from keyturn.notify import SystemdNotifier
from keyturn.observability.metrics import PrometheusObserver
from keyturn.policy import RefreshPolicy
from keyturn.runtime import Runtime
from keyturn.saved_plan import PlanStore
from keyturn.scheduler import CredentialScheduler
from keyturn.state import CredentialState
from keyturn.vault.renewal import expiring_margin
from keyturn.watch import PublishedWatcher, WatchTarget

log = get_logger("keyturn.housekeeping")

HEARTBEAT_SECONDS = 5.0
VAULT_RECHECK_SECONDS = 1.0  # how often a Vault that failed runs is asked whether it is back
CLOCK_CHECK_SECONDS = 1.0
TOKEN_RETRY_SECONDS = 30.0  # keyturn's own token: the next try after maintenance failed
MIN_DELAY = 1.0  # a job that asks to run again "now" waits this long: no hot loop

Body = Callable[[], Awaitable[float | None]]


@dataclass(frozen=True, slots=True)
class Periodic:
    """One housekeeping job: `body()` every `every` seconds (a function is asked before each
    wait: the membership beat follows its takeover), or, when it returns a number, that many
    seconds later (at least `MIN_DELAY`). The first run comes after `first` seconds (None:
    after `every`). A failing body is logged and runs again after `every`."""

    name: str
    body: Body
    every: float | Callable[[], float]
    first: float | None = None

    def interval(self) -> float:
        return self.every() if callable(self.every) else self.every


class Housekeeping:
    """Runs `Periodic` jobs, each in a loop of its own on the event loop's monotonic clock
    (`asyncio` timeouts), so a wall-clock step moves none of them. `running()` starts them and,
    on exit, stops them: no body starts again, one under way gets `stop_timeout` seconds to
    finish and is then cancelled (`periodic.stopped`, not an error)."""

    def __init__(self, jobs: Iterable[Periodic]) -> None:
        self.jobs = tuple(jobs)
        self._stop = asyncio.Event()

    @contextlib.asynccontextmanager
    async def running(self, *, stop_timeout: float) -> AsyncIterator[None]:
        self._stop.clear()
        tasks = {
            asyncio.create_task(self._loop(job), name=f"keyturn-{job.name}"): job
            for job in self.jobs
        }
        try:
            yield
        finally:
            self._stop.set()
            if tasks:
                _, late = await asyncio.wait(tasks, timeout=stop_timeout)
                for task in late:
                    task.cancel()
                    log.info("periodic.stopped", job=tasks[task].name)
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, job: Periodic) -> None:
        wait = job.first if job.first is not None else job.interval()
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=wait)
            if self._stop.is_set():
                return
            try:
                asked = await job.body()
            except Exception as exc:  # a broken job must not end its loop
                log.exception("periodic.failed", job=job.name, error=type(exc).__name__)
                asked = None
            wait = max(MIN_DELAY, asked) if asked is not None else job.interval()


def vault_waker(runtime: Runtime, scheduler: CredentialScheduler) -> Body:
    """Runs that failed because Vault was down or sealed run again the moment Vault answers,
    not when their backoff ends: every second of that gap is a second apps may read an expired
    token."""

    async def check() -> None:
        if not scheduler.waiting_for_vault:
            return
        try:
            await runtime.store.health()
        except KeyturnError:
            return
        woken = scheduler.vault_back()
        log.info("vault.back", credentials_woken=len(woken))

    return check


def wall_clock_guard(
    runtime: Runtime, clock: Clock, scheduler: CredentialScheduler
) -> Body | None:
    """With the system clock (not a test's), the check that notices wall-clock steps, judges
    them with Vault's clock and re-plans every credential after one (`WallClockGuard`)."""
    if not isinstance(clock, SystemClock):
        return None
    guard = WallClockGuard(
        clock,
        reference=runtime.store.server_time,
        on_jump=lambda _step: scheduler.replan(),
    )

    async def check() -> None:
        await guard.check()

    return check


def heartbeat(runtime: Runtime, metrics: PrometheusObserver) -> Callable[[], Awaitable[float]]:
    """A housekeeping job: the loop is alive (liveness), and the state of keyturn's Vault
    token."""

    async def beat() -> float:
        metrics.heartbeat()
        metrics.vault_token(runtime.store.token_expires_at(), runtime.store.authenticated)
        return HEARTBEAT_SECONDS

    return beat


def systemd_watchdog(notifier: SystemdNotifier) -> Periodic | None:
    """The job that pings systemd's watchdog, if the unit has one, from its start. It runs on
    the event loop: a stalled loop stops the pings, and systemd restarts keyturn."""
    interval = notifier.watchdog_interval()
    if interval is None:
        return None

    async def watchdog() -> None:
        notifier.watchdog()

    return Periodic("watchdog", watchdog, max(MIN_DELAY, interval), first=0.0)


def vault_token_keeper(
    runtime: Runtime, config: Config, clock: Clock
) -> Callable[[], Awaitable[float]]:
    """Renews keyturn's own Vault token, and reports when even that leaves it near its end
    (not renewable, max TTL reached, logins refused): soon keyturn can write nothing. "Near"
    is `vault.renew_margin`, at most a third of the token's TTL (`expiring_margin`)."""

    async def maintain() -> float:
        delay = await runtime.store.maintain_token()
        expires_at = runtime.store.token_expires_at()
        if expires_at is not None:
            left = expires_at - clock.time()
            # After maintenance: a renewal or a new login has already moved expires_at away.
            if left < expiring_margin(runtime.store.token_ttl(), config.vault.renew_margin):
                runtime.observers(
                    Suspicious(
                        None,
                        None,
                        "vault_token_expiring",
                        "critical",
                        f"keyturn's Vault token expires in {max(0.0, left):.0f}s and could not "
                        "be renewed or replaced",
                    )
                )
        return delay

    return maintain


def published_watcher(runtime: Runtime, scheduler: CredentialScheduler) -> PublishedWatcher:
    """Detector 1 over the running configuration; its response goes through the scheduler, so
    it never runs beside a credential's own job."""

    def targets() -> list[WatchTarget]:
        """The published paths of this instance's share."""
        owned = scheduler.owned
        return [
            WatchTarget(c.name, c.provider, c.publish_to)
            for c in runtime.config.credentials
            if c.name in owned
        ]

    async def journal_version(name: str) -> tuple[int | None, bool]:
        """The published version the journal records, and whether a run holds the lease."""
        entry = await runtime.store.read(
            state_path(runtime.config.keyturn.state_prefix, name), consistent=True
        )
        if entry is None:
            return None, False
        state = CredentialState.from_data(entry.data, name)
        publish_to = runtime.config.credential(name).publish_to
        now = runtime.clock.time()
        return state.token.published_version, await lease_in_force(
            runtime.store, state, publish_to, now
        )

    async def republish(name: str) -> None:
        forces = kind_of(runtime.config.credential(name)).run_now_forces
        await scheduler.run_now(name, force={forces})

    keyturn = runtime.config.keyturn
    return PublishedWatcher(
        targets,
        store=runtime.store,
        observer=runtime.observers,
        jobs=scheduler,
        journal_version=journal_version,
        republish=republish,
        response=keyturn.on_external_change,
        interval=keyturn.watch_interval,
        # A quarter of the Vault threads: the sweep never crowds out refreshes.
        concurrency=max(1, keyturn.vault_concurrency // 4),
    )


# The cyclic collector's thresholds (Python's defaults: 700, 10, 10): the youngest generation


@dataclass(frozen=True, slots=True)
class PlanKeeper:
    """The daemon's saved plan (`keyturn.saved_plan`): restored before the first runs, saved
    while runs finish and once more after the drain."""

    plans: PlanStore
    runtime: Runtime
    scheduler: CredentialScheduler

    async def restore(
        self, clock: Clock, rng: random.Random, owns: Callable[[str], bool]
    ) -> dict[str, tuple[Outcome, float]]:
        """The saved plan's credentials in this instance's share as outcomes for the
        scheduler's start (each job tells its observers, as a first run's read of the record
        would)."""
        runtime = self.runtime
        restored = await self.plans.restore(runtime.config, now=clock.time(), rng=rng)
        outcomes = {
            name: (runtime.jobs[name].restored(plan.state, plan.due), plan.finished_at)
            for name, plan in restored.items()
            if owns(name)
        }
        log.info("plan.restored", credentials=len(outcomes), configured=len(runtime.jobs))
        return outcomes

    async def save(self) -> None:
        await self.plans.save(
            self.runtime.config, self.scheduler.statuses(), runs=self.scheduler.runs_finished
        )

    async def save_at_stop(self) -> None:
        """After the drain: the next start plans from it without a read per credential."""
        try:
            await self.save()
        except KeyturnError as error:
            log.warning("plan.not_saved", error=str(error))


@dataclass(slots=True)
class ShareKeeper:
    """This instance's place among several (`keyturn.members`): it joins before the first
    runs, beats beside the scheduler (every `interval`, which follows the takeover), tells the
    membership before each beat the takeover its share's tokens need, follows its share when
    instances come and go, and leaves when the daemon stops."""

    members: Membership
    runtime: Runtime
    scheduler: CredentialScheduler
    metrics: PrometheusObserver
    # No token of its share known yet, though it holds oauth_client credentials (their first
    # runs are on their way): the next beat comes after a second, to advertise their need soon.
    waiting_for_tokens: bool = True

    @classmethod
    def build(
        cls,
        runtime: Runtime,
        *,
        instance_id: str,
        address: str | None,
        scheduler: CredentialScheduler,
        metrics: PrometheusObserver,
    ) -> ShareKeeper:
        config, deps = runtime.config, runtime.deps

        def problem(kind: str, message: str) -> None:
            severity = "critical" if kind == "duplicate_instance_id" else "warning"
            deps.observer(Suspicious(None, None, "instance_membership", severity, message))

        members = Membership(
            runtime.store,
            state_prefix=config.keyturn.state_prefix,
            instance_id=instance_id,
            takeover_after=config.keyturn.takeover_after,
            clock=deps.clock,
            host=socket.gethostname(),
            address=address,
            pid=os.getpid(),
            on_problem=problem,
        )
        return cls(members, runtime, scheduler, metrics)

    def interval(self) -> float:
        """Seconds until the next beat: the membership's, as of the last beat (a third of its
        takeover), or MIN_TAKEOVER's third while the tokens of its share are still unknown."""
        if self.waiting_for_tokens:
            return MIN_TAKEOVER / BEATS_PER_TAKEOVER
        return self.members.interval

    def need(self) -> float | None:
        """The takeover this instance's share needs (`keyturn.members.takeover_needed`), from
        the tokens its last runs left: each credential's issue and expiry and its `refresh`
        policy. Only credentials whose value expires count (`Kind.value_expires`: an access
        token); an api_key's `expires_at` is when its key is due for rotation, and a key whose
        rotation comes late still works. Also says
        whether it is `waiting_for_tokens`."""
        config = self.runtime.config
        policies = {c.name: c.refresh for c in config.credentials if kind_of(c).value_expires}
        tokens: list[tuple[float, float, RefreshPolicy]] = []
        unknown = 0  # such credentials of its share whose first run has not ended
        for view in self.scheduler.statuses():
            state, policy = view.state, policies.get(view.name)
            if policy is None:
                continue
            if state is None:
                unknown += 1
                continue
            issued_at, expires_at = state.token.issued_at, state.token.expires_at
            if issued_at is not None and expires_at is not None:
                tokens.append((issued_at, expires_at, policy))
        self.waiting_for_tokens = not tokens and unknown > 0
        return takeover_needed(tokens)

    async def beat(self) -> None:
        self.members.need(self.need())
        if await self.members.beat():
            summary = self.scheduler.reassign()
            for name in summary["added"]:
                self.runtime.jobs[name].forget_copy()  # others ran it meanwhile
            self.metrics.forget(*summary["removed"])  # their new owners report them
            log.info(
                "share.changed",
                instances=list(self.members.live),
                owned=len(self.scheduler.owned),
                added=len(summary["added"]),
                removed=len(summary["removed"]),
            )
        self.metrics.membership(len(self.members.live), len(self.scheduler.owned))
