"""The daemon's life: start, run, reload on SIGHUP, drain on SIGTERM.

`open_daemon` builds the daemon whole from a configuration (each part before what holds it),
starts the scheduler and its housekeeping jobs, and hands the started `Daemon` to its caller;
`run_daemon` (`keyturn run`) serves until stopped. A reload (SIGHUP) re-reads the file: added
credentials start, removed ones stop (their Vault data stays), changed ones run again at once;
a file that does not load, or that changes what needs a restart ([keyturn], [vault],
[metrics]), is refused with one log line and the running configuration stays in force.
([[alerts]] and [usage] changes need a restart too.) With `[usage]`, the usage monitor reads
Vault's audit log beside the scheduler (`keyturn.usage.service`): its metrics are on /metrics,
its view on /usage, and rotations ask it who still reads an old key.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from keyturn.alerts import AlertingObserver
from keyturn.alerts.build import build_dispatcher
from keyturn.clock import Clock, SystemClock, WallClockGuard
from keyturn.config import Config, load_config
from keyturn.errors import ConfigError, KeyturnError
from keyturn.events import LoggingObserver, Observer, Observers, Suspicious
from keyturn.jobs.build import JobSet
from keyturn.jobs.job import Checkpoint, Outcome, lease_in_force, no_checkpoint
from keyturn.layout import state_path
from keyturn.logs import get_logger
from keyturn.members import BEATS_PER_TAKEOVER, MIN_TAKEOVER, Membership, takeover_needed
from keyturn.notify import SystemdNotifier
from keyturn.observability import (
    HeartbeatLiveness,
    MetricsServer,
    PrometheusObserver,
    readiness_check,
)
from keyturn.observability.server import UsageView
from keyturn.policy import RefreshPolicy
from keyturn.references import ReferenceResolver
from keyturn.runtime import Context, Runtime, running, vault_store
from keyturn.saved_plan import SAVE_INTERVAL, PlanStore
from keyturn.scheduler import CredentialScheduler
from keyturn.sinks import SinkManager
from keyturn.state import CredentialState
from keyturn.usage.audit import Identity
from keyturn.usage.service import UsageService
from keyturn.vault.hvac_store import VaultStore
from keyturn.vault.renewal import expiring_margin
from keyturn.watch import PublishedWatcher, WatchTarget

RESTART_SECTIONS = ("keyturn", "vault", "metrics", "alerts", "usage")

log = get_logger("keyturn.daemon")


def changed_credentials(old: Config, new: Config) -> set[str]:
    """Credentials present in both whose own settings, provider or rotator differ."""
    changed = set()
    previous = {credential.name: credential for credential in old.credentials}
    for credential in new.credentials:
        before = previous.get(credential.name)
        if before is None:
            continue
        if (
            before != credential
            or old.provider_of(before) != new.provider_of(credential)
            or old.rotator_of(before) != new.rotator_of(credential)
        ):
            changed.add(credential.name)
    return changed


HEARTBEAT_SECONDS = 5.0
LIVENESS_MAX_AGE = 60.0
VAULT_RECHECK_SECONDS = 1.0  # how often a Vault that failed runs is asked whether it is back
CLOCK_CHECK_SECONDS = 1.0


async def vault_server_time(config: Config) -> float | None:
    """Vault's own clock (`sys/health` `server_time_utc`, unauthenticated), or None."""
    vault = config.vault
    verify: str | bool = str(vault.ca_cert) if vault.ca_cert else True
    try:
        async with httpx.AsyncClient(verify=verify, timeout=2.0) as http:
            response = await http.get(
                vault.address.rstrip("/") + "/v1/sys/health",
                params={"standbyok": "true", "sealedcode": "200", "uninitcode": "200"},
            )
        value = response.json().get("server_time_utc")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def vault_waker(runtime: Runtime, scheduler: CredentialScheduler) -> Callable[[], Awaitable[None]]:
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
        woken = scheduler.wake(sorted(scheduler.waiting_for_vault))
        scheduler.waiting_for_vault.clear()
        log.info("vault.back", credentials_woken=len(woken))

    return check


def wake_when_providers_answer(jobs: JobSet, scheduler: CredentialScheduler) -> None:
    """When a provider issues a token again after an outage, every other credential that waited
    for it runs now instead of when its backoff or cadence ends (`keyturn.providers.recovery`):
    at most `max_concurrency` at a time, and with a `rate_limit` spaced at that rate, so that
    they do not all queue for the provider's token bucket, each holding a `max_concurrency`
    slot meanwhile (the other providers' runs would wait for the slots)."""
    for name, client in jobs.clients.items():
        rate = client.provider.rate_limit

        def back(waiting: frozenset[str], provider: str = name, rate: float | None = rate) -> None:
            woken = scheduler.wake(sorted(waiting), spacing=1.0 / rate if rate else 0.0)
            log.info("provider.back", provider=provider, credentials_woken=len(woken))

        client.recovery.on_back(back)


Periodic = tuple[float | Callable[[], float], Callable[[], Awaitable[object]]]


@contextlib.asynccontextmanager
async def background(*periodic: Periodic) -> AsyncIterator[None]:
    """Each `(interval, body)`: `body()` every `interval` seconds on the event loop's monotonic
    clock, beside the scheduler (these must not depend on its wall-clock plans); a failing body
    is logged and called again next time. An `interval` that is a function is asked before
    each wait (the membership beat follows its takeover). Stopped and awaited on exit."""
    stop = asyncio.Event()

    async def every(
        interval: float | Callable[[], float], body: Callable[[], Awaitable[object]]
    ) -> None:
        while not stop.is_set():
            wait = interval() if callable(interval) else interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)
            if stop.is_set():
                return
            try:
                await body()
            except Exception as exc:  # a broken check must not end its loop
                log.error("background.failed", error_type=type(exc).__name__)

    tasks = [asyncio.ensure_future(every(interval, body)) for interval, body in periodic]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


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
        config, context = runtime.config, runtime.context

        def problem(kind: str, message: str) -> None:
            severity = "critical" if kind == "duplicate_instance_id" else "warning"
            context.observers(Suspicious(None, None, "instance_membership", severity, message))

        members = Membership(
            context.store,
            state_prefix=config.keyturn.state_prefix,
            instance_id=instance_id,
            takeover_after=config.keyturn.takeover_after,
            clock=context.clock,
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
        policy. Only oauth_client credentials count: an api_key's `expires_at` is when its
        key is due for rotation, and a key whose rotation comes late still works. Also says
        whether it is `waiting_for_tokens`."""
        config = self.runtime.config
        policies = {c.name: c.refresh for c in config.credentials if c.kind == "oauth_client"}
        tokens: list[tuple[float, float, RefreshPolicy]] = []
        unknown = 0  # oauth_client credentials of its share whose first run has not ended
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


@dataclass(frozen=True, slots=True)
class Daemon:
    """A started daemon, built whole: what embedders (the demo, tests, benchmarks) watch."""

    runtime: Runtime
    scheduler: CredentialScheduler
    metrics: PrometheusObserver
    sinks: SinkManager
    server: MetricsServer
    notifier: SystemdNotifier
    usage: UsageService | None = None  # with [usage]: who reads the published credentials

    async def serve(
        self, stop: asyncio.Event, reload_requests: asyncio.Queue[None] | None = None
    ) -> None:
        """Until `stop` is set; each item put on `reload_requests` reloads the config file."""
        if reload_requests is None:
            await stop.wait()
            return
        runtime, notifier = self.runtime, self.notifier
        stopping = asyncio.create_task(stop.wait())
        while not stop.is_set():
            request = asyncio.create_task(reload_requests.get())
            done, _ = await asyncio.wait({stopping, request}, return_when=asyncio.FIRST_COMPLETED)
            if request in done:
                notifier.reloading(status=f"reloading {runtime.config.source}")
                applied = await self.reload(runtime.config.source)
                notifier.ready(status=_status(runtime, reload_refused=not applied))
            else:
                request.cancel()

    async def reload(self, path: Path) -> bool:
        """Apply the configuration in `path`, or refuse it and keep the running one."""
        runtime, scheduler = self.runtime, self.scheduler
        try:
            new = load_config(path)
        except ConfigError as error:
            log.error("config.reload_refused", reason="; ".join(error.problems))
            return False
        old = runtime.config
        restart = [s for s in RESTART_SECTIONS if getattr(old, s) != getattr(new, s)]
        if restart:
            log.error(
                "config.reload_refused",
                reason=f"changes to [{'], ['.join(restart)}] need a restart; nothing was changed",
            )
            return False
        try:
            jobs = await runtime.context.build_jobs(new)
        except KeyturnError as error:
            log.error("config.reload_refused", reason=str(error))
            return False
        previous = runtime.replace_jobs(jobs)
        summary = scheduler.replace_jobs(jobs.jobs.values(), changed=changed_credentials(old, new))
        wake_when_providers_answer(jobs, scheduler)
        log.info("config.reloaded", **summary)
        self.sinks.configure(new)
        if self.usage is not None:
            self.usage.use_config(new)
        self.metrics.credentials_configured(len(jobs.jobs))
        self.metrics.forget(*summary["removed"])
        await scheduler.drain(old.keyturn.shutdown_timeout)  # runs still using the old clients
        await previous.aclose()
        return True


@contextlib.asynccontextmanager
async def open_daemon(
    config: Config,
    *,
    clock: Clock | None = None,
    registry: CollectorRegistry | None = None,
    notifier: SystemdNotifier | None = None,
    checkpoint: Checkpoint = no_checkpoint,
) -> AsyncIterator[Daemon]:
    """Start the daemon: Vault, the jobs, the scheduler and its housekeeping, local sinks,
    alerts and /metrics; on exit let in-flight runs finish and stop everything.

    Each part is built before what holds it: the metrics, sinks and alert dispatcher over the
    store, the observers over those, the usage monitor (with `[usage]`) over the observers, the
    jobs over both, the scheduler over the jobs.
    `notifier` tells systemd (Type=notify) about start, reloads, stop and liveness; without
    one, nobody. `checkpoint` is called at each journal point of a rotation (the crash tests
    stop there)."""
    clock = clock or SystemClock()
    notifier = notifier if notifier is not None else SystemdNotifier({})
    registry = registry if registry is not None else CollectorRegistry()
    metrics = PrometheusObserver(registry, clock)
    environ, rng = os.environ, random.Random()  # jitter, not cryptography
    async with vault_store(
        config, clock=clock, environ=environ, on_vault_operation=metrics.vault_operation
    ) as store:
        # Local files kept equal to what is published: they follow publishes off the refresh
        # path (`keyturn.sinks`), woken by an observer, and each syncs once when started.
        sinks = SinkManager(
            config,
            store=store,
            clock=clock,
            environ=environ,
            on_result=metrics.sink_write,
            rng=rng,
        )
        dispatcher = await build_dispatcher(
            config,
            ReferenceResolver(environ, store),
            clock=clock,
            rng=rng,
            on_delivery=metrics.alert_delivery,
        )
        observers = Observers(
            LoggingObserver(), metrics, sinks.observer(), AlertingObserver(dispatcher)
        )
        # Reading Vault's audit log (with [usage]) before the jobs run: a rotation may ask it
        # at once; stopped after everything else, the scheduler's drain included.
        async with usage_monitor(config, store, observers, clock, registry) as usage:
            context = Context(
                store=store,
                observers=observers,
                clock=clock,
                rng=rng,
                environ=environ,
                checkpoint=checkpoint,
                consumers=usage.hooks() if usage is not None else None,
            )
            async with running(config, context) as runtime:
                metrics.credentials_configured(len(runtime.jobs))
                scheduler = credential_scheduler(runtime, metrics, notifier)
                wake_when_providers_answer(runtime.current, scheduler)
                server = MetricsServer(
                    config.metrics,
                    registry,
                    alive=HeartbeatLiveness(
                        lambda: metrics.last_heartbeat_monotonic,
                        clock=clock,
                        max_age=LIVENESS_MAX_AGE,
                    ),
                    ready=readiness_check(vault=store.health, jobs=scheduler, clock=clock),
                    usage=usage_view(usage) if usage is not None else None,
                    exposition=metrics.exposition_parts,
                )
                daemon = Daemon(runtime, scheduler, metrics, sinks, server, notifier, usage)
                await dispatcher.start()
                await server.start()
                plans = PlanKeeper(
                    PlanStore(
                        store,
                        state_prefix=config.keyturn.state_prefix,
                        instance_id=context.instance(config),
                    ),
                    runtime,
                    scheduler,
                )
                shares = ShareKeeper.build(
                    runtime,
                    instance_id=context.instance(config),
                    address=server.url,
                    scheduler=scheduler,
                    metrics=metrics,
                )
                loops: list[Periodic] = [
                    (VAULT_RECHECK_SECONDS, vault_waker(runtime, scheduler)),
                    (SAVE_INTERVAL, plans.save),
                    (shares.interval, shares.beat),
                ]
                if isinstance(clock, SystemClock):
                    guard = WallClockGuard(
                        clock,
                        reference=lambda: vault_server_time(config),
                        on_jump=lambda _step: scheduler.replan(),
                    )
                    loops.append((CLOCK_CHECK_SECONDS, guard.check))
                try:
                    await runtime.list_records()  # which first runs need no read
                    metrics.heartbeat()
                    sinks.start()
                    await shares.members.join()  # which credentials are this instance's
                    owns = shares.members.owns
                    scheduler.start(await plans.restore(clock, rng, owns), owns=owns)
                    metrics.membership(len(shares.members.live), len(scheduler.owned))
                    log.info(
                        "daemon.started",
                        instance=config.keyturn.instance_id,
                        credentials=len(runtime.jobs),
                        owned=len(scheduler.owned),
                        instances=list(shares.members.live),
                        metrics=server.url,
                    )
                    notifier.ready(status=_status(runtime))
                    with out_of_the_collector():
                        async with background(*loops):
                            yield daemon
                    notifier.stopping(status="stopping: letting in-flight runs finish")
                    log.info("daemon.stopping")
                    await shares.members.leave()  # the others take the share now
                    drained = await scheduler.shutdown(config.keyturn.shutdown_timeout)
                    await plans.save_at_stop()
                    log.info("daemon.stopped", drained=drained)
                finally:
                    # After the drain, so a value the last runs published still reaches its files.
                    await sinks.stop(timeout=min(10.0, config.keyturn.shutdown_timeout))
                    await server.stop()
                    # After the scheduler's drain, so alerts from the last runs still go out.
                    await dispatcher.stop(timeout=min(10.0, config.keyturn.shutdown_timeout))


def credential_scheduler(
    runtime: Runtime, metrics: PrometheusObserver, notifier: SystemdNotifier
) -> CredentialScheduler:
    """The scheduler over the jobs, with its housekeeping jobs: keyturn's own Vault token, the
    heartbeat, the published-path watcher and systemd's watchdog."""
    config, clock = runtime.config, runtime.context.clock
    scheduler = CredentialScheduler(
        runtime.jobs.values(),
        clock=clock,
        max_concurrency=config.keyturn.max_concurrency,
        on_lateness=metrics.lateness,
    )
    scheduler.add_periodic("vault-token", vault_token_keeper(runtime, config, clock))
    scheduler.add_periodic("heartbeat", heartbeat(runtime, metrics))
    if config.keyturn.watch_interval > 0:
        scheduler.add_periodic("watch", published_watcher(runtime, scheduler).sweep)
    watchdog = systemd_watchdog(notifier)
    if watchdog is not None:
        scheduler.add_periodic("watchdog", watchdog)
    return scheduler


async def run_daemon(
    config: Config,
    stop: asyncio.Event,
    *,
    clock: Clock | None = None,
    started: asyncio.Event | None = None,
    reload_requests: asyncio.Queue[None] | None = None,
    registry: CollectorRegistry | None = None,
    notifier: SystemdNotifier | None = None,
    checkpoint: Checkpoint = no_checkpoint,
) -> int:
    """`keyturn run`: the daemon until `stop` is set; each item put on `reload_requests`
    reloads the config file. `started` is set once it runs (an embedder that watches more
    uses `open_daemon`). See `open_daemon` for the rest."""
    async with open_daemon(
        config, clock=clock, registry=registry, notifier=notifier, checkpoint=checkpoint
    ) as daemon:
        if started is not None:
            started.set()
        await daemon.serve(stop, reload_requests)
    return 0


@contextlib.asynccontextmanager
async def usage_monitor(
    config: Config,
    store: VaultStore,
    observer: Observer,
    clock: Clock,
    registry: CollectorRegistry,
) -> AsyncIterator[UsageService | None]:
    """The usage monitor of a configuration with `[usage]` (None without), reading and on
    /metrics until exit. keyturn's own identity in Vault's audit log is its token's, from
    `auth/token/lookup-self`."""
    if config.usage is None:
        yield None
        return
    own = Identity.from_lookup(await store.lookup_self())
    log.info("usage.identity", consumers=sorted(own.labels), source=config.usage.source)
    usage = UsageService(config, own=own, observer=observer, clock=clock)
    registry.register(usage.collector)
    await usage.start()
    try:
        yield usage
    finally:
        await usage.stop()
        registry.unregister(usage.collector)


def usage_view(usage: UsageService) -> UsageView:
    def view(names: Sequence[str] | None, summary: bool) -> dict[str, Any]:
        return usage.view(names, summary=summary)

    return view


def heartbeat(runtime: Runtime, metrics: PrometheusObserver) -> Callable[[], Awaitable[float]]:
    """A periodic job: the loop is alive (liveness), and the state of keyturn's Vault token."""

    async def beat() -> float:
        metrics.heartbeat()
        metrics.vault_token(runtime.store.token_expires_at(), runtime.store.authenticated)
        return HEARTBEAT_SECONDS

    return beat


def systemd_watchdog(notifier: SystemdNotifier) -> Callable[[], Awaitable[float]] | None:
    """A periodic job that pings systemd's watchdog, if the unit has one. It runs on the event
    loop through the scheduler: a stalled loop or a dead scheduler stops the pings, and systemd
    restarts keyturn."""
    interval = notifier.watchdog_interval()
    if interval is None:
        return None

    async def watchdog() -> float:
        notifier.watchdog()
        return interval

    return watchdog


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
        now = runtime.context.clock.time()
        return state.token.published_version, await lease_in_force(
            runtime.store, state, publish_to, now
        )

    async def republish(name: str) -> None:
        kind = runtime.config.credential(name).kind
        await scheduler.run_now(name, force={"republish" if kind == "api_key" else "refresh"})

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
# is collected every 5,000 net allocations of container objects (a run allocates a few hundred,
# rarely in a cycle), the middle one every 20 of those.
GC_THRESHOLDS = (5000, 20, 10)


@contextlib.contextmanager
def out_of_the_collector() -> Iterator[None]:
    """What the daemon built at start (the parsed configuration, the jobs, the scheduler's
    plan) lives as long as it does: `gc.freeze` takes it out of the cyclic collector's view,
    so that its full collections stop walking it again and again, and the youngest generation
    is collected less often. At N = 10,000 the collector took 6.5 s of a cold start's CPU, and
    2.3 s with this (docs/performance.md). On the way out both are handed back."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def _status(runtime: Runtime, reload_refused: bool = False) -> str:
    """The one line `systemctl status` shows (counts only, never a secret)."""
    line = f"running: {len(runtime.jobs)} credentials"
    return line + ("; last reload refused, see the log" if reload_refused else "")
