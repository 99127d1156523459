"""`keyturn import-signing-key -c FILE NAME [--access-token-only]`: hand over a signing key's
existing key pair and its RFC 7592 registration access token, or only a new token. Read from
standard input, never from argv (the JSON object's fields: docs/cli.md); stored privately
first, then the rotation goes on as usual. A key of the wrong type for `algorithm`, or an RSA
key under 2048 bits, is refused, naming the field.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from keyturn.commands import load_or_report
from keyturn.commands.import_key import MAX_KEY_BYTES, read_key
from keyturn.commands.oneshot import add_credential_arguments, credential_or_report, hand_over
from keyturn.commands.rotate import report
from keyturn.config.credentials import SigningKeyCredential
from keyturn.errors import KeyMaterialError, KeyturnError
from keyturn.hardening import harden_process
from keyturn.jobs.job import Journal
from keyturn.kinds.signing_key import accept
from keyturn.kinds.signing_key.keys import SigningKey, stored
from keyturn.providers.assertions import load_signing_key
from keyturn.runtime import Runtime
from keyturn.secret import Secret

COMMAND = "import-signing-key"
EXPECTED = (
    'expected a JSON object on standard input: {"private_key": "<PEM>", '
    '"registration_access_token": "…", "kid": "…", "registration": {…}} (all but '
    "private_key optional; registration: the RFC 7591 registration response), "
    f"at most {MAX_KEY_BYTES} bytes"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_credential_arguments(parser, "the signing_key credential whose key is on standard input")
    parser.add_argument(
        "--access-token-only",
        action="store_true",
        help="read only a new registration access token (one line) and resume the rotation",
    )


def parse(
    text: str, credential: SigningKeyCredential
) -> tuple[SigningKey, Secret | None, dict[str, Any] | None]:
    """The key pair, token and registration response of the JSON handed over;
    KeyMaterialError naming the field."""
    try:
        given = json.loads(text)
    except ValueError:
        given = None
    if not isinstance(given, dict) or not isinstance(given.get("private_key"), str):
        raise KeyMaterialError(EXPECTED, field="private_key", credential=credential.name)
    token, kid = given.get("registration_access_token"), given.get("kid")
    registration = given.get("registration")
    if registration is not None:
        if not isinstance(registration, dict):
            raise KeyMaterialError(
                "is not a JSON object (expected the RFC 7591 registration response)",
                field="registration",
                credential=credential.name,
            )
        issued = registration.get("registration_access_token")
        if token is None:
            token = issued
        elif issued is not None and issued != token:
            raise KeyMaterialError(
                "differs from registration.registration_access_token (give one, or the same)",
                field="registration_access_token",
                credential=credential.name,
            )
        if token is None:
            raise KeyMaterialError(
                "is given without a registration access token (registration_access_token)",
                field="registration",
                credential=credential.name,
            )
    if token is not None and (not isinstance(token, str) or not token):
        raise KeyMaterialError(
            "is not a non-empty string",
            field="registration_access_token",
            credential=credential.name,
        )
    if kid is not None and (not isinstance(kid, str) or not kid):
        raise KeyMaterialError("is not a non-empty string", field="kid", credential=credential.name)
    key = load_signing_key(
        credential.name, Secret(given["private_key"]), alg=credential.algorithm, kid=kid
    )
    return key, Secret(token) if token else None, registration


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None or not credential_or_report(config, args.name, COMMAND):
        return 1
    credential = config.credential(args.name)
    if not isinstance(credential, SigningKeyCredential):
        print(f"keyturn {COMMAND}: {args.name} is not a signing_key", file=sys.stderr)
        return 1
    harden_process()  # before any secret is read: keyturn.hardening
    key: SigningKey | None = None
    registration: dict[str, Any] | None = None
    if args.access_token_only:
        token = read_key()
        if token is None:
            print(
                f"keyturn {COMMAND}: expected the registration access token as one line on "
                f"standard input (at most {MAX_KEY_BYTES} bytes)",
                file=sys.stderr,
            )
            return 1
    else:
        text = sys.stdin.read(MAX_KEY_BYTES + 1)
        try:
            if len(text) > MAX_KEY_BYTES:
                raise KeyMaterialError(EXPECTED, field="private_key", credential=args.name)
            key, token, registration = parse(text, credential)
        except KeyturnError as error:
            print(f"keyturn {COMMAND}: {error}", file=sys.stderr)
            return 1

    def prepare(runtime: Runtime) -> Callable[[Journal], None] | None:
        rotation = runtime.rotation(args.name)
        if rotation is None:
            return None

        def take(journal: Journal) -> None:
            if token is not None:  # stored first: it may be the only one the server honours
                journal.stage(accept(journal.state, args.name, token, registration))
            if key is not None:
                rotation.accept_key(journal, stored(key), key.kid)

        return take

    outcome = hand_over(
        config, args.name, COMMAND, force={"rotation"}, wait=args.wait, prepare=prepare
    )
    return 1 if outcome is None else report(args.name, outcome, COMMAND)
