"""`keyturn run -c FILE`: the daemon.

SIGTERM and SIGINT stop new work, let in-flight runs finish (their Vault writes included) for
up to `keyturn.shutdown_timeout`, then exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from keyturn.clock import Clock, SystemClock
from keyturn.commands import add_config_argument, load_or_report
from keyturn.config import Config
from keyturn.errors import KeyturnError
from keyturn.logs import get_logger
from keyturn.runtime import Runtime, open_runtime
from keyturn.scheduler import CredentialScheduler


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config, one_shot=False)
    if config is None:
        return 1
    try:
        return asyncio.run(_main(config))
    except KeyturnError as error:
        get_logger("keyturn.daemon").error("daemon.failed", error=str(error))
        return 1


async def _main(config: Config) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return await run_daemon(config, stop)


async def run_daemon(
    config: Config,
    stop: asyncio.Event,
    *,
    clock: Clock | None = None,
    started: asyncio.Event | None = None,
    runtime_out: list[Runtime] | None = None,
) -> int:
    """Run until `stop` is set. `started`/`runtime_out` let an embedding (demo, tests) watch."""
    log = get_logger("keyturn.daemon")
    clock = clock or SystemClock()
    async with open_runtime(config, clock=clock) as runtime:
        scheduler = CredentialScheduler(
            runtime.jobs.values(),
            clock=clock,
            max_concurrency=config.keyturn.max_concurrency,
        )
        runtime.scheduler = scheduler
        scheduler.add_periodic("vault-token", runtime.store.maintain_token)
        scheduler.start()
        log.info(
            "daemon.started",
            instance=config.keyturn.instance_id,
            credentials=len(runtime.jobs),
        )
        if runtime_out is not None:
            runtime_out.append(runtime)
        if started is not None:
            started.set()
        await stop.wait()
        log.info("daemon.stopping")
        drained = await scheduler.shutdown(config.keyturn.shutdown_timeout)
        log.info("daemon.stopped", drained=drained)
    return 0
