"""`keyturn rotate -c FILE NAME`: rotate a key or client secret now.

Starts a rotation (or moves one in progress forward) under the same lease the daemon uses, so
it is safe beside a running daemon. The old key stays valid for the grace period; the daemon
(or the next `rotate`) revokes it after that.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from keyturn.clock import rfc3339
from keyturn.commands import load_or_report
from keyturn.commands.oneshot import add_credential_arguments, credential_or_report, run_once
from keyturn.errors import KeyturnError
from keyturn.hardening import harden_process
from keyturn.jobs.job import Outcome


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_credential_arguments(parser, "the credential to rotate")


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None or not credential_or_report(config, args.name, "rotate"):
        return 1
    harden_process()  # before any secret is read: keyturn.hardening
    if config.credential(args.name).rotation is None:
        print(f"keyturn rotate: {args.name} has no rotation policy", file=sys.stderr)
        return 1
    try:
        outcome = asyncio.run(run_once(config, args.name, force={"rotation"}, wait=args.wait))
    except KeyturnError as error:
        print(f"keyturn rotate: {error}", file=sys.stderr)
        return 1
    return report(args.name, outcome, "rotate")


def report(name: str, outcome: Outcome, command: str) -> int:
    """One line saying where the rotation stands; exit 0 when a new key is in use."""
    rotation = outcome.state.rotation
    if outcome.action == "rotated" and rotation.phase in ("retiring", "idle"):
        retire = (
            f"; the previous key is revoked after {rfc3339(rotation.previous_retire_at)}"
            if rotation.previous_retire_at
            else ""
        )
        print(f"{name}: rotated; new key {rotation.key_id or '(no id)'} in use{retire}")
        return 0
    if rotation.phase == "retiring" and outcome.error is None:
        until = rfc3339(rotation.previous_retire_at or 0)
        print(
            f"keyturn {command}: {name}: the previous key is in its grace period until {until}; "
            "a new rotation can start after that",
            file=sys.stderr,
        )
        return 1
    if outcome.action == "waiting" and outcome.error is None and rotation.phase == "pending":
        print(
            f"keyturn {command}: {name}: the new key {rotation.pending_key_id or ''} waits until "
            f"{rfc3339(outcome.next_due)} before it is used; the daemon, or this command run "
            "again then, goes on",
            file=sys.stderr,
        )
        return 1
    print(f"keyturn {command}: {outcome.error or outcome.action}", file=sys.stderr)
    return 1
