"""`build_rotator`: the rotator a `[[rotators]]` entry describes, ready to use (then `aclose`).

An `http` rotator's `auth` reference is resolved here, once (a `SecretReferenceError` or a
`VaultError` if it cannot be); `auth = "credential:NAME"` is read at each call instead, from
where that credential is published (the token keyturn keeps fresh). Nothing is run or
contacted until a rotation needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import assert_never

import httpx

from keyturn.clock import Clock
from keyturn.config.credential_auth import CredentialAuth, published_token
from keyturn.config.schema import (
    ExecRotatorConfig,
    HttpRotatorConfig,
    ManualRotatorConfig,
    ProviderConfig,
    RotatorConfig,
)
from keyturn.errors import ConfigError
from keyturn.references import ReferenceResolver, SecretRef
from keyturn.rotators.base import Rotator
from keyturn.rotators.exec import ExecRotator
from keyturn.rotators.http import HttpRotator, TokenSource
from keyturn.rotators.manual import ManualRotator
from keyturn.secret import Secret


async def build_rotator(
    config: RotatorConfig,
    *,
    providers: Mapping[str, ProviderConfig],
    resolver: ReferenceResolver,
    clock: Clock,
    transport: httpx.AsyncBaseTransport | None = None,
    environ: Mapping[str, str] | None = None,
    published: Callable[[str], SecretRef] | None = None,
) -> Rotator:
    """The rotator for `config`. `published(name)`: where the credential `name`'s value is
    published, for `auth = "credential:NAME"`. `transport` (http) and `environ` (exec: the
    environment the command inherits, before keyturn's and Vault's variables are removed) are
    for tests."""
    match config:  # one arm per rotator type: the one registration a new type needs here
        case HttpRotatorConfig():
            auth: Secret | TokenSource | None = None
            if isinstance(config.auth, CredentialAuth):
                if published is None:
                    raise ConfigError(f"rotators[{config.name!r}].auth: {config.auth} needs Vault")
                auth = published_token(config.auth, published(config.auth.name), resolver)
            elif config.auth is not None:
                auth = await resolver.resolve(config.auth)
            return HttpRotator(
                config, providers[config.provider], auth, transport=transport, clock=clock
            )
        case ExecRotatorConfig():
            return ExecRotator(config, environ=environ)
        case ManualRotatorConfig():
            return ManualRotator(config)
        case _:  # pragma: no cover - the configuration admits no other type
            assert_never(config)
