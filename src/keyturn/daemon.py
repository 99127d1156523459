"""The daemon's life: start, run, reload on SIGHUP, drain on SIGTERM.

`run_daemon` builds the runtime from a configuration, starts the scheduler and its
housekeeping jobs, and waits. A reload (SIGHUP) re-reads the file: added credentials start,
removed ones stop (their Vault data stays), changed ones run again at once; a file that does
not load, or that changes what needs a restart ([keyturn], [vault], [metrics]), is refused
with one log line and the running configuration stays in force. ([[alerts]] changes need a
restart too.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from keyturn.alerts import AlertingObserver
from keyturn.alerts.build import build_dispatcher
from keyturn.clock import Clock, SystemClock
from keyturn.config import Config, load_config
from keyturn.errors import ConfigError, KeyturnError
from keyturn.logs import get_logger
from keyturn.observability import (
    HeartbeatLiveness,
    MetricsServer,
    PrometheusObserver,
    readiness_check,
)
from keyturn.references import ReferenceResolver
from keyturn.runtime import Runtime, build_jobs, open_runtime
from keyturn.scheduler import CredentialScheduler

RESTART_SECTIONS = ("keyturn", "vault", "metrics", "alerts")

log = get_logger("keyturn.daemon")


def changed_credentials(old: Config, new: Config) -> set[str]:
    """Credentials present in both whose own settings, provider or rotator differ."""
    changed = set()
    for credential in new.credentials:
        try:
            before = old.credential(credential.name)
        except KeyError:
            continue
        if (
            before != credential
            or old.provider_of(before) != new.provider_of(credential)
            or old.rotator_of(before) != new.rotator_of(credential)
        ):
            changed.add(credential.name)
    return changed


async def reload(runtime: Runtime, path: Path) -> bool:
    """Apply the configuration in `path`, or refuse it and keep the running one."""
    scheduler = runtime.scheduler
    if scheduler is None:
        return False
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
        jobs = await build_jobs(new, runtime.context)
    except KeyturnError as error:
        log.error("config.reload_refused", reason=str(error))
        return False
    previous = runtime.current
    runtime.current = jobs
    summary = scheduler.replace_jobs(jobs.jobs.values(), changed=changed_credentials(old, new))
    log.info("config.reloaded", **summary)
    if runtime.metrics is not None:
        runtime.metrics.credentials_configured(len(jobs.jobs))
        for name in summary["removed"]:
            runtime.metrics.forget(name)
    await scheduler.drain(old.keyturn.shutdown_timeout)  # runs still using the old clients
    await previous.aclose()
    return True


HEARTBEAT_SECONDS = 5.0
LIVENESS_MAX_AGE = 60.0


async def run_daemon(
    config: Config,
    stop: asyncio.Event,
    *,
    clock: Clock | None = None,
    started: asyncio.Event | None = None,
    reload_requests: asyncio.Queue[None] | None = None,
    runtime_out: list[Runtime] | None = None,
    registry: CollectorRegistry | None = None,
) -> int:
    """Run until `stop` is set; each item put on `reload_requests` reloads the config file.
    `started`/`runtime_out` let an embedding (demo, tests, benchmarks) watch."""
    clock = clock or SystemClock()
    registry = registry if registry is not None else CollectorRegistry()
    metrics = PrometheusObserver(registry, clock)
    async with open_runtime(
        config, clock=clock, observers=[metrics], on_vault_operation=metrics.vault_operation
    ) as runtime:
        metrics.credentials_configured(len(runtime.jobs))
        scheduler = CredentialScheduler(
            runtime.jobs.values(),
            clock=clock,
            max_concurrency=config.keyturn.max_concurrency,
            on_lateness=metrics.lateness,
        )
        runtime.scheduler = scheduler
        runtime.metrics = metrics

        async def heartbeat() -> float:
            metrics.heartbeat()
            metrics.vault_token(runtime.store.token_expires_at(), runtime.store.authenticated)
            return HEARTBEAT_SECONDS

        scheduler.add_periodic("vault-token", runtime.store.maintain_token)
        scheduler.add_periodic("heartbeat", heartbeat)
        server = MetricsServer(
            config.metrics,
            registry,
            alive=HeartbeatLiveness(
                lambda: metrics.last_heartbeat, clock=clock, max_age=LIVENESS_MAX_AGE
            ),
            ready=readiness_check(
                vault=runtime.store.health, observer=metrics, credentials=lambda: list(runtime.jobs)
            ),
        )
        dispatcher = await build_dispatcher(
            config,
            ReferenceResolver(runtime.context.environ, runtime.store),
            clock=clock,
            rng=runtime.context.rng,
            on_delivery=metrics.alert_delivery,
        )
        runtime.observers.add(AlertingObserver(dispatcher))
        await dispatcher.start()
        await server.start()
        try:
            metrics.heartbeat()
            scheduler.start()
            log.info(
                "daemon.started",
                instance=config.keyturn.instance_id,
                credentials=len(runtime.jobs),
                metrics=server.url,
            )
            if runtime_out is not None:
                runtime_out.append(runtime)
            if started is not None:
                started.set()
            await _serve(runtime, stop, reload_requests)
            log.info("daemon.stopping")
            drained = await scheduler.shutdown(config.keyturn.shutdown_timeout)
            log.info("daemon.stopped", drained=drained)
        finally:
            await server.stop()
            # After the scheduler's drain, so alerts from the last runs still go out.
            await dispatcher.stop(timeout=min(10.0, config.keyturn.shutdown_timeout))
    return 0


async def _serve(
    runtime: Runtime, stop: asyncio.Event, reload_requests: asyncio.Queue[None] | None
) -> None:
    if reload_requests is None:
        await stop.wait()
        return
    stopping = asyncio.create_task(stop.wait())
    while not stop.is_set():
        request = asyncio.create_task(reload_requests.get())
        done, _ = await asyncio.wait({stopping, request}, return_when=asyncio.FIRST_COMPLETED)
        if request in done:
            await reload(runtime, runtime.config.source)
        else:
            request.cancel()
