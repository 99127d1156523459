"""`keyturn import-key -c FILE NAME [--key-id ID]`: hand over a key made by a person.

For rotators of type `manual`: when a key is due, keyturn announces it and waits; an operator
creates the key in the provider's dashboard and pipes it in (`… | keyturn import-key -c FILE
NAME`). The key is read from standard input, never from argv. It is stored privately, then the
rotation goes on as usual: verified against the probe, published, and the old key retired after
the grace period.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TextIO

from keyturn.commands import load_or_report
from keyturn.commands.oneshot import add_credential_arguments, credential_or_report, hand_over
from keyturn.commands.rotate import report
from keyturn.hardening import harden_process
from keyturn.jobs.job import Journal
from keyturn.runtime import Runtime
from keyturn.secret import Secret

MAX_KEY_BYTES = 16_384


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_credential_arguments(parser, "the credential whose new key is on standard input")
    parser.add_argument("--key-id", help="the provider's id for the key (not secret), if any")


def read_key(stream: TextIO | None = None) -> Secret | None:
    """The key from stdin: one line, surrounding whitespace stripped."""
    text = (stream or sys.stdin).read(MAX_KEY_BYTES + 1)
    if len(text) > MAX_KEY_BYTES:
        return None
    value = text.strip()
    return Secret(value) if value and "\n" not in value else None


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None or not credential_or_report(config, args.name, "import-key"):
        return 1
    harden_process()  # before any secret is read: keyturn.hardening
    if config.credential(args.name).rotation is None:
        print(f"keyturn import-key: {args.name} has no rotation policy", file=sys.stderr)
        return 1
    key = read_key()
    if key is None:
        print(
            "keyturn import-key: expected the key as one line on standard input "
            f"(at most {MAX_KEY_BYTES} bytes)",
            file=sys.stderr,
        )
        return 1

    def prepare(runtime: Runtime) -> Callable[[Journal], None] | None:
        rotation = runtime.rotation(args.name)
        if rotation is None:
            return None
        return lambda journal: rotation.accept_key(journal, key, args.key_id)

    outcome = hand_over(
        config, args.name, "import-key", force={"rotation"}, wait=args.wait, prepare=prepare
    )
    return 1 if outcome is None else report(args.name, outcome, "import-key")
