"""`keyturn refresh -c FILE NAME`: refresh one credential's access token now.

Safe beside a running daemon: it takes the same lease in Vault, so the refresh token is still
used once, by one process. If the daemon is refreshing at that moment, this waits and then
refreshes.
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
from keyturn.kinds import kind_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_credential_arguments(parser, "the credential to refresh")


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None or not credential_or_report(config, args.name, "refresh"):
        return 1
    harden_process()  # before any secret is read: keyturn.hardening
    if not kind_of(config.credential(args.name)).refreshes_tokens:
        print(f"keyturn refresh: {args.name} is an API key; use `keyturn rotate`", file=sys.stderr)
        return 1
    try:
        outcome = asyncio.run(run_once(config, args.name, force={"refresh"}, wait=args.wait))
    except KeyturnError as error:
        print(f"keyturn refresh: {error}", file=sys.stderr)
        return 1
    expires_at = outcome.state.token.expires_at
    if outcome.action == "refreshed" and expires_at is not None:
        print(f"{args.name}: refreshed; expires {rfc3339(expires_at)}")
        return 0
    print(f"keyturn refresh: {outcome.error or outcome.action}", file=sys.stderr)
    return 1
