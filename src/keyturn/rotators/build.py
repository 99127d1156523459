"""`build_rotator`: the rotator a `[[rotators]]` entry describes, ready to use (then `aclose`).

An `http` rotator's `auth` reference is resolved here, once (a `SecretReferenceError` or a
`VaultError` if it cannot be); nothing is run or contacted until a rotation needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import assert_never

import httpx

from keyturn.clock import Clock
from keyturn.config.schema import (
    ExecRotatorConfig,
    HttpRotatorConfig,
    ManualRotatorConfig,
    ProviderConfig,
    RotatorConfig,
)
from keyturn.references import ReferenceResolver
from keyturn.rotators.base import Rotator
from keyturn.rotators.exec import ExecRotator
from keyturn.rotators.http import HttpRotator
from keyturn.rotators.manual import ManualRotator


async def build_rotator(
    config: RotatorConfig,
    *,
    providers: Mapping[str, ProviderConfig],
    resolver: ReferenceResolver,
    clock: Clock,
    transport: httpx.AsyncBaseTransport | None = None,
    environ: Mapping[str, str] | None = None,
) -> Rotator:
    """The rotator for `config`. `transport` (http) and `environ` (exec: the environment the
    command inherits, before keyturn's and Vault's variables are removed) are for tests."""
    match config:  # one arm per rotator type: the one registration a new type needs here
        case HttpRotatorConfig():
            auth = await resolver.resolve(config.auth) if config.auth is not None else None
            return HttpRotator(
                config, providers[config.provider], auth, transport=transport, clock=clock
            )
        case ExecRotatorConfig():
            return ExecRotator(config, environ=environ)
        case ManualRotatorConfig():
            return ManualRotator(config)
        case _:  # pragma: no cover - the configuration admits no other type
            assert_never(config)
