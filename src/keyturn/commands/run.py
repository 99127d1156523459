"""`keyturn run -c FILE`: the daemon (see `keyturn.daemon`).

SIGTERM and SIGINT stop new work, let in-flight runs finish (their Vault writes included) for
up to `keyturn.shutdown_timeout`, then exit 0. SIGHUP reloads the configuration file.
A start that cannot log in to Vault, or finds `vault.mount` missing or not KV v2, is one
`daemon.failed` log line and exit 1, before anything is written.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from keyturn.commands import add_config_argument, load_or_report
from keyturn.config import Config
from keyturn.daemon import run_daemon
from keyturn.errors import KeyturnError
from keyturn.hardening import harden_process
from keyturn.logs import get_logger
from keyturn.notify import SystemdNotifier


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config, one_shot=False)
    if config is None:
        return 1
    harden_process()  # before any secret is read: keyturn.hardening
    try:
        return asyncio.run(_main(config))
    except KeyturnError as error:
        get_logger("keyturn.daemon").error("daemon.failed", error=str(error))
        return 1


async def _main(config: Config) -> int:
    stop = asyncio.Event()
    reloads: asyncio.Queue[None] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reloads.put_nowait, None)
    # Reads NOTIFY_SOCKET/WATCHDOG_* and removes them from os.environ before the runtime
    # builds exec rotators (which copy the environment): their commands must not inherit them.
    notifier = SystemdNotifier()
    return await run_daemon(config, stop, reload_requests=reloads, notifier=notifier)
