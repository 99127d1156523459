"""`keyturn refresh -c FILE NAME`: refresh one credential now.

Safe beside a running daemon: the refresh takes the same lease in Vault the daemon takes, so
the refresh token is still used once, by one process. If the daemon is in the middle of a
refresh, this waits for it (bounded) and then refreshes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from keyturn.clock import SystemClock, rfc3339
from keyturn.commands import add_config_argument, load_or_report
from keyturn.errors import KeyturnError
from keyturn.job import Outcome
from keyturn.runtime import open_runtime


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("name", help="the credential to refresh")
    parser.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for a lease held elsewhere"
    )


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None:
        return 1
    try:
        config.credential(args.name)
    except KeyError:
        print(
            f"keyturn refresh: no credential named {args.name!r} in {config.source}",
            file=sys.stderr,
        )
        return 1
    instance = f"{config.keyturn.instance_id}/cli-{os.getpid()}"

    async def refresh() -> Outcome:
        clock = SystemClock()
        async with open_runtime(config, clock=clock, instance_id=instance) as runtime:
            refresher = runtime.jobs[args.name]
            deadline = clock.monotonic() + args.wait
            while True:
                outcome = await refresher.run(force={"refresh"})
                if outcome.action != "lease_held" or clock.monotonic() >= deadline:
                    return outcome
                await clock.sleep(min(1.0, max(0.1, outcome.next_due - clock.time())))

    try:
        outcome = asyncio.run(refresh())
    except KeyturnError as error:
        print(f"keyturn refresh: {error}", file=sys.stderr)
        return 1
    if outcome.action == "refreshed" and outcome.state.expires_at is not None:
        print(f"{args.name}: refreshed; expires {rfc3339(outcome.state.expires_at)}")
        return 0
    print(f"keyturn refresh: {outcome.error or outcome.action}", file=sys.stderr)
    return 1
