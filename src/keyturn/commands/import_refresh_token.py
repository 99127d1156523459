"""`keyturn import-refresh-token -c FILE NAME`: hand over a refresh token issued elsewhere.

The token is read from stdin (never argv), stored under the daemon's own lease (safe beside
a running daemon) and used at once, so the operator learns now whether it works; a refused
token is not kept and the record is put back. Outcomes and exit codes: docs/cli.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from keyturn.clock import rfc3339
from keyturn.commands import load_or_report
from keyturn.commands.import_key import MAX_KEY_BYTES, read_key
from keyturn.commands.oneshot import add_credential_arguments, credential_or_report, hand_over
from keyturn.hardening import harden_process
from keyturn.jobs.job import Journal, Outcome
from keyturn.kinds import kind_of
from keyturn.kinds.oauth_client.refresh import (
    RefreshTokenRefused,
    TokenRefresh,
    valid_refresh_token,
)
from keyturn.runtime import Runtime
from keyturn.secret import Secret

COMMAND = "import-refresh-token"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_credential_arguments(
        parser, "the oauth_client credential whose refresh token is on standard input"
    )


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None or not credential_or_report(config, args.name, COMMAND):
        return 1
    harden_process()  # before any secret is read: keyturn.hardening
    if not kind_of(config.credential(args.name)).refreshes_tokens:
        print(
            f"keyturn {COMMAND}: {args.name} is an API key, which has no refresh token",
            file=sys.stderr,
        )
        return 1
    token = read_key()
    if token is None or not valid_refresh_token(token):
        print(
            f"keyturn {COMMAND}: expected the refresh token as one line on standard input "
            f"(printable ASCII, at most {MAX_KEY_BYTES} bytes)",
            file=sys.stderr,
        )
        return 1
    accepted: list[bool] = []

    def prepare(runtime: Runtime) -> Callable[[Journal], None] | None:
        task = runtime.jobs[args.name].task("refresh")
        if not isinstance(task, TokenRefresh):
            return None

        def hand_over(journal: Journal) -> None:
            task.accept_refresh_token(journal, token)
            accepted.append(True)

        return hand_over

    outcome = hand_over(
        config,
        args.name,
        COMMAND,
        force={"refresh"},
        wait=args.wait,
        prepare=prepare,
        refused="; nothing was imported",
    )
    return 1 if outcome is None else report(args.name, outcome, token, imported=bool(accepted))


def report(name: str, outcome: Outcome, token: Secret, *, imported: bool) -> int:
    """One line: on stdout when the imported token worked, else on stderr with what keyturn
    holds now. Never the token."""
    held, expires_at = outcome.state.refresh, outcome.state.token.expires_at
    if imported and outcome.action == "refreshed" and expires_at is not None:
        print(f"{name}: refresh token imported; refreshed with it; expires {rfc3339(expires_at)}")
        return 0
    error = outcome.error or outcome.action
    if not imported:
        after = "nothing was imported"
    elif isinstance(outcome.error, RefreshTokenRefused):
        after = ""  # its message says the token was not kept
    elif held.token == token and held.in_flight is not None:
        after = "the imported refresh token is marked as used: keyturn never sends it again"
    elif held.token == token:
        after = "the imported refresh token is stored; keyturn tries it again at the next run"
    elif held.burned == token:
        after = (
            "the answer to the refresh was lost, so the imported token may be used up: keyturn "
            "never sends it again; import a new one"
        )
    elif held.token is not None:
        after = "the provider accepted it; keyturn holds the refresh token it was rotated to"
    else:
        after = "keyturn holds no refresh token"
    print(f"keyturn {COMMAND}: {error}" + (f"; {after}" if after else ""), file=sys.stderr)
    return 1
