"""Running one credential's job once from the command line, beside a running daemon.

The job takes the same lease in Vault as the daemon does, so a command and the daemon never
work on one credential at once: if the daemon holds the lease, the command waits (bounded).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Collection

from keyturn.clock import SystemClock
from keyturn.commands import add_config_argument
from keyturn.config import Config
from keyturn.errors import KeyturnError
from keyturn.jobs.job import Journal, Outcome
from keyturn.runtime import Runtime, open_runtime
from keyturn.saved_plan import touch


def add_credential_arguments(parser: argparse.ArgumentParser, name_help: str) -> None:
    """-c FILE, the credential's NAME and --wait: what every one-shot command takes."""
    add_config_argument(parser)
    parser.add_argument("name", help=name_help)
    parser.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for a lease held elsewhere"
    )


def credential_or_report(config: Config, name: str, command: str) -> bool:
    try:
        config.credential(name)
    except KeyError:
        print(
            f"keyturn {command}: no credential named {name!r} in {config.source}", file=sys.stderr
        )
        return False
    return True


async def run_once(
    config: Config,
    name: str,
    *,
    force: Collection[str],
    wait: float,
    prepare: Callable[[Runtime], Callable[[Journal], None] | None] | None = None,
) -> Outcome:
    """Run `name`'s job with `force`, waiting up to `wait` seconds for a lease held elsewhere."""
    clock = SystemClock()
    instance = f"{config.keyturn.instance_id}/cli-{os.getpid()}"
    async with open_runtime(config, clock=clock, instance_id=instance) as runtime:
        job = runtime.jobs[name]
        hook = prepare(runtime) if prepare else None
        deadline = clock.monotonic() + wait
        while True:
            outcome = await job.run(force=force, prepare=hook)
            if outcome.action != "lease_held" or clock.monotonic() >= deadline:
                break
            await clock.sleep(min(1.0, max(0.1, outcome.next_due - clock.time())))
        if outcome.action != "lease_held":  # the record may have changed: a restarting
            # daemon reads it at once rather than trust its saved plan
            await touch(runtime.store, config.keyturn.state_prefix, name, clock.time())
        return outcome


def hand_over(
    config: Config,
    name: str,
    command: str,
    *,
    force: Collection[str],
    wait: float,
    prepare: Callable[[Runtime], Callable[[Journal], None] | None],
    refused: str = "",
) -> Outcome | None:
    """`run_once` for a command that hands something over (an `import-…`); None after one
    line on stderr saying why it could not run (`refused` added to it)."""
    try:
        return asyncio.run(run_once(config, name, force=force, wait=wait, prepare=prepare))
    except KeyturnError as error:
        print(f"keyturn {command}: {error}{refused}", file=sys.stderr)
        return None
