"""The daemon's life: start, run, reload on SIGHUP, drain on SIGTERM.

`open_daemon` assembles the daemon from small builders, each part entered on one
`AsyncExitStack` before what holds it, so that they stop in the reverse order; `run_daemon`
(`keyturn run`) serves until stopped. A reload re-reads the file and puts its jobs in force,
or refuses it with one log line and keeps the running configuration (docs/cli.md, `keyturn
run`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from keyturn.alerts.build import build_dispatcher
from keyturn.alerts.dispatcher import AlertDispatcher
from keyturn.alerts.observer import AlertingObserver
from keyturn.clock import Clock, SystemClock
from keyturn.config import Config, load_config
from keyturn.errors import ConfigError, KeyturnError
from keyturn.events import LoggingObserver, Observer, Observers
from keyturn.housekeeping import (
    CLOCK_CHECK_SECONDS,
    HEARTBEAT_SECONDS,
    TOKEN_RETRY_SECONDS,
    VAULT_RECHECK_SECONDS,
    Housekeeping,
    Periodic,
    PlanKeeper,
    ShareKeeper,
    heartbeat,
    published_watcher,
    systemd_watchdog,
    vault_token_keeper,
    vault_waker,
    wall_clock_guard,
)
from keyturn.jobs.build import JobSet
from keyturn.jobs.job import JobDeps
from keyturn.logs import get_logger
from keyturn.notify import SystemdNotifier
from keyturn.observability.health import HeartbeatLiveness, readiness_check
from keyturn.observability.metrics import PrometheusObserver
from keyturn.observability.server import MetricsServer, UsageView
from keyturn.references import ReferenceResolver
from keyturn.runtime import Runtime, running, vault_store
from keyturn.saved_plan import SAVE_INTERVAL, PlanStore
from keyturn.scheduler import CredentialScheduler
from keyturn.sinks import SinkManager
from keyturn.usage.audit import Identity
from keyturn.usage.service import UsageService
from keyturn.vault.hvac_store import VaultStore

__all__ = ["Daemon", "changed_credentials", "open_daemon", "published_watcher", "run_daemon"]

RESTART_SECTIONS = ("keyturn", "vault", "metrics", "alerts", "usage")
LIVENESS_MAX_AGE = 60.0

log = get_logger("keyturn.daemon")

# What a reload changed: the scheduler's summary ("added", "removed", "changed": names).
Changes = dict[str, list[str]]
# What follows the jobs a reload puts in force (besides the runtime and the scheduler).
Follow = Callable[[JobSet, Changes], None]


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
    follow: Follow = lambda _jobs, _changes: None  # see `follower`

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
        """Apply the configuration in `path`, or refuse it and keep the running one: its jobs
        go in force in the runtime and the scheduler, what follows them follows (`follow`),
        and the previous jobs close once the runs still using them end."""
        old = self.runtime.config
        new = acceptable(path, old)
        if new is None:
            return False
        try:
            jobs, deps = await self.runtime.build_jobs(new)
        except KeyturnError as error:
            log.error("config.reload_refused", reason=str(error))
            return False
        previous = self.runtime.replace_jobs(jobs, deps)
        changes = self.scheduler.replace_jobs(
            jobs.jobs.values(), changed=changed_credentials(old, new)
        )
        log.info("config.reloaded", **changes)
        self.follow(jobs, changes)
        await self.scheduler.drain(old.keyturn.shutdown_timeout)  # runs still using old clients
        await previous.aclose()
        return True


def acceptable(path: Path, running: Config) -> Config | None:
    """The configuration in `path` if a reload can apply it over `running`; None (one log
    line) if it does not load or changes what needs a restart."""
    try:
        new = load_config(path)
    except ConfigError as error:
        log.error("config.reload_refused", reason="; ".join(error.problems))
        return None
    restart = [s for s in RESTART_SECTIONS if getattr(running, s) != getattr(new, s)]
    if restart:
        log.error(
            "config.reload_refused",
            reason=f"changes to [{'], ['.join(restart)}] need a restart; nothing was changed",
        )
        return None
    return new


def follower(
    scheduler: CredentialScheduler,
    metrics: PrometheusObserver,
    sinks: SinkManager,
    usage: UsageService | None,
) -> Follow:
    """What follows the jobs a reload puts in force: the providers' recovery wakes their
    credentials, the sinks and the usage monitor follow the configuration, the metrics count
    the credentials and forget the removed ones."""

    def follow(jobs: JobSet, changes: Changes) -> None:
        wake_when_providers_answer(jobs, scheduler)
        sinks.configure(jobs.config)
        if usage is not None:
            usage.use_config(jobs.config)
        metrics.credentials_configured(len(jobs.jobs))
        metrics.forget(*changes.get("removed", ()))

    return follow


@contextlib.asynccontextmanager
async def open_daemon(
    config: Config,
    *,
    clock: Clock | None = None,
    registry: CollectorRegistry | None = None,
    notifier: SystemdNotifier | None = None,
) -> AsyncIterator[Daemon]:
    """Start the daemon: Vault, the jobs, the scheduler and its housekeeping, local sinks,
    alerts and /metrics; on exit let in-flight runs finish and stop everything.

    Each part is entered on one exit stack after what it needs, so they close in reverse.
    On a normal exit the housekeeping stops, this instance leaves its share to the others,
    the scheduler drains and the plan is saved. `notifier` tells systemd (Type=notify)."""
    clock = clock or SystemClock()
    notifier = notifier if notifier is not None else SystemdNotifier({})
    registry = registry if registry is not None else CollectorRegistry()
    metrics = PrometheusObserver(registry, clock)
    environ, rng = os.environ, random.Random()  # jitter, not cryptography
    stop_timeout = min(10.0, config.keyturn.shutdown_timeout)  # each part's, at the end
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(
            vault_store(
                config, clock=clock, environ=environ, on_vault_operation=metrics.vault_operation
            )
        )
        sinks, dispatcher, observers = await outputs(config, store, metrics, clock, environ, rng)
        # Reading Vault's audit log (with [usage]) before the jobs run: a rotation may ask it
        # at once; stopped after everything else, the scheduler's drain included.
        usage = await stack.enter_async_context(
            usage_monitor(config, store, observers, clock, registry)
        )
        deps = JobDeps.start(
            config,
            store=store,
            observer=observers,
            clock=clock,
            rng=rng,
            environ=environ,
            consumers=usage.hooks() if usage is not None else None,
        )
        runtime = await stack.enter_async_context(running(config, store, deps))
        daemon = assemble(runtime, metrics, sinks, usage, registry, notifier)
        await start_serving(stack, daemon.server, dispatcher, stop_timeout=stop_timeout)
        housekeeping = await start_running(stack, daemon)
        stack.enter_context(out_of_the_collector())
        await stack.enter_async_context(housekeeping.running(stop_timeout=stop_timeout))
        yield daemon


async def outputs(
    config: Config,
    store: VaultStore,
    metrics: PrometheusObserver,
    clock: Clock,
    environ: Mapping[str, str],
    rng: random.Random,
) -> tuple[SinkManager, AlertDispatcher, Observers]:
    """Where events go: the log, the metrics, the local sinks (files kept equal to what is
    published, following publishes off the refresh path, each synced once when started) and
    the alert dispatcher; built over the store, started later."""
    sinks = SinkManager(
        config, store=store, clock=clock, environ=environ, on_result=metrics.sink_write, rng=rng
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
    return sinks, dispatcher, observers


def assemble(
    runtime: Runtime,
    metrics: PrometheusObserver,
    sinks: SinkManager,
    usage: UsageService | None,
    registry: CollectorRegistry,
    notifier: SystemdNotifier,
) -> Daemon:
    """The scheduler over the jobs and the HTTP server over both (built, not started)."""
    config, clock = runtime.config, runtime.clock
    metrics.credentials_configured(len(runtime.jobs))
    scheduler = CredentialScheduler(
        runtime.jobs.values(),
        clock=clock,
        max_concurrency=config.keyturn.max_concurrency,
        on_lateness=metrics.lateness,
    )
    wake_when_providers_answer(runtime.current, scheduler)
    server = MetricsServer(
        config.metrics,
        registry,
        alive=HeartbeatLiveness(
            lambda: metrics.last_heartbeat_monotonic, clock=clock, max_age=LIVENESS_MAX_AGE
        ),
        ready=readiness_check(vault=runtime.store.health, jobs=scheduler, clock=clock),
        usage=usage_view(usage) if usage is not None else None,
        exposition=metrics.exposition_parts,
    )
    follow = follower(scheduler, metrics, sinks, usage)
    return Daemon(runtime, scheduler, metrics, sinks, server, notifier, usage, follow)


async def start_serving(
    stack: contextlib.AsyncExitStack,
    server: MetricsServer,
    dispatcher: AlertDispatcher,
    *,
    stop_timeout: float,
) -> None:
    """The alert dispatcher, then /metrics; each stopped on the way out, the dispatcher last
    (after the scheduler's drain, so that alerts from the last runs still go out)."""
    await dispatcher.start()
    stack.push_async_callback(dispatcher.stop, timeout=stop_timeout)
    await server.start()
    stack.push_async_callback(server.stop)


async def start_running(stack: contextlib.AsyncExitStack, daemon: Daemon) -> Housekeeping:
    """The first runs: which records exist (one LIST), the sinks, this instance's place among
    several, the scheduler's start from the saved plan; systemd is told the daemon is ready.
    On a normal exit (pushed on `stack`): systemd is told it stops, the instance leaves (the
    others take its share now), the scheduler drains, the plan is saved; then the sinks stop
    (after the drain, so a value the last runs published still reaches its files). Returns
    the housekeeping to run beside the scheduler (`housekeeping`)."""
    runtime, scheduler, metrics = daemon.runtime, daemon.scheduler, daemon.metrics
    config, instance_id = runtime.config, runtime.instance_id
    plans = PlanKeeper(
        PlanStore(runtime.store, state_prefix=config.keyturn.state_prefix, instance_id=instance_id),
        runtime,
        scheduler,
    )
    shares = ShareKeeper.build(
        runtime,
        instance_id=instance_id,
        address=daemon.server.url,
        scheduler=scheduler,
        metrics=metrics,
    )
    stop_timeout = min(10.0, config.keyturn.shutdown_timeout)
    await runtime.list_records()  # which first runs need no read
    metrics.heartbeat()
    daemon.sinks.start()
    stack.push_async_callback(daemon.sinks.stop, timeout=stop_timeout)
    await shares.members.join()  # which credentials are this instance's
    owns = shares.members.owns
    scheduler.start(await plans.restore(runtime.clock, runtime.deps.rng, owns), owns=owns)
    metrics.membership(len(shares.members.live), len(scheduler.owned))

    async def stop(exc_type: type[BaseException] | None, *_exc: object) -> None:
        if exc_type is not None:
            return  # an error: the parts close, nothing more is asked of Vault
        daemon.notifier.stopping(status="stopping: letting in-flight runs finish")
        log.info("daemon.stopping")
        await shares.members.leave()  # the others take the share now
        drained = await scheduler.shutdown(config.keyturn.shutdown_timeout)
        await plans.save_at_stop()
        log.info("daemon.stopped", drained=drained)

    stack.push_async_exit(stop)
    log.info(
        "daemon.started",
        instance=config.keyturn.instance_id,
        credentials=len(runtime.jobs),
        owned=len(scheduler.owned),
        instances=list(shares.members.live),
        metrics=daemon.server.url,
    )
    daemon.notifier.ready(status=_status(runtime))
    return housekeeping(daemon, plans, shares)


def housekeeping(daemon: Daemon, plans: PlanKeeper, shares: ShareKeeper) -> Housekeeping:
    """What runs beside the scheduler (`keyturn.housekeeping`): keyturn's own Vault token, the
    heartbeat, the published-path watcher and systemd's watchdog from the start; Vault's
    return, the saved plan, the membership beat and the wall-clock guard after their first
    interval."""
    runtime, scheduler, metrics = daemon.runtime, daemon.scheduler, daemon.metrics
    config, clock = runtime.config, runtime.clock
    jobs = [
        Periodic(
            "vault-token",
            vault_token_keeper(runtime, config, clock),
            TOKEN_RETRY_SECONDS,
            first=0.0,
        ),
        Periodic("heartbeat", heartbeat(runtime, metrics), HEARTBEAT_SECONDS, first=0.0),
        Periodic("vault-back", vault_waker(runtime, scheduler), VAULT_RECHECK_SECONDS),
        Periodic("plan", plans.save, SAVE_INTERVAL),
        Periodic("members", shares.beat, shares.interval),
    ]
    if config.keyturn.watch_interval > 0:
        sweep = published_watcher(runtime, scheduler).sweep
        jobs.append(Periodic("watch", sweep, config.keyturn.watch_interval, first=0.0))
    watchdog = systemd_watchdog(daemon.notifier)
    if watchdog is not None:
        jobs.append(watchdog)
    guard = wall_clock_guard(runtime, clock, scheduler)
    if guard is not None:
        jobs.append(Periodic("clock", guard, CLOCK_CHECK_SECONDS))
    return Housekeeping(jobs)


async def run_daemon(
    config: Config,
    stop: asyncio.Event,
    *,
    clock: Clock | None = None,
    started: asyncio.Event | None = None,
    reload_requests: asyncio.Queue[None] | None = None,
    registry: CollectorRegistry | None = None,
    notifier: SystemdNotifier | None = None,
) -> int:
    """`keyturn run`: the daemon until `stop` is set; each item put on `reload_requests`
    reloads the config file. `started` is set once it runs (an embedder that watches more
    uses `open_daemon`). See `open_daemon` for the rest."""
    async with open_daemon(config, clock=clock, registry=registry, notifier=notifier) as daemon:
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
