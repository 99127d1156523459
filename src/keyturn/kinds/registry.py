"""The registry of credential kinds, and from a configuration to jobs: each credential's job
as its kind builds it (`build_job`), and every job of a `Config` with the provider clients
and rotators they share (`build_jobs`).

Adding a kind is one module beside this one declaring its `Kind` (which names its
configuration model), its `KIND` in `REGISTERED`, and that model in
`keyturn.config.credentials.KINDS` (the configuration is loaded without importing any kind, so
it keeps its own list; importing this module fails unless the two agree).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from keyturn.config import Config, CredentialConfig
from keyturn.config import credentials as configured
from keyturn.jobs.build import CredentialInputs, JobSet
from keyturn.jobs.job import CredentialJob, Inputs, JobDeps
from keyturn.kinds import api_key, oauth_client, signing_key
from keyturn.kinds.base import AnyKind
from keyturn.providers.client import ProviderClient
from keyturn.references import ReferenceResolver, SecretRef
from keyturn.rotators.base import Rotator
from keyturn.rotators.build import build_rotator

# Every kind, once.
REGISTERED: tuple[AnyKind, ...] = (oauth_client.KIND, api_key.KIND, signing_key.KIND)

KINDS: Mapping[str, AnyKind] = MappingProxyType({kind.name: kind for kind in REGISTERED})


def _tag(model: type[CredentialConfig]) -> object:
    """A configuration model's `kind` tag (the default of its `kind` field)."""
    return next(f.default for f in dataclasses.fields(model) if f.name == "kind")


def _check_registry() -> None:
    """The registry and the configuration list the same kinds, in the same order, each kind
    naming its own model (a kind missing from either is a programming error, found at import)."""
    declared = tuple(kind.config for kind in REGISTERED)
    if declared != configured.KINDS or any(_tag(k.config) != k.name for k in REGISTERED):
        raise ImportError(
            "keyturn.kinds.registry: REGISTERED "
            f"{[(k.name, k.config.__name__) for k in REGISTERED]} does not match "
            f"keyturn.config.credentials.KINDS {[m.__name__ for m in configured.KINDS]}"
        )


_check_registry()


def kind_of(credential: CredentialConfig) -> AnyKind:
    """The kind of a configured credential (the configuration admits only registered ones)."""
    return KINDS[credential.kind]


def build_job(
    credential: CredentialConfig,
    client: ProviderClient,
    rotator: Rotator | None,
    inputs: Inputs,
    deps: JobDeps,
) -> CredentialJob:
    """The job of one credential, as its kind builds it. `rotator`: the rotator its
    `rotation` names, if it has one."""
    return kind_of(credential).job(credential, client, rotator, inputs, deps)


def _rotator_of(credential: CredentialConfig, rotators: Mapping[str, Rotator]) -> Rotator | None:
    """The rotator a credential's rotation names (a signing key's names none: keyturn makes
    its keys)."""
    named = credential.rotation.rotator if credential.rotation is not None else None
    return rotators[named] if named is not None else None


def published_value(config: Config, credential: CredentialConfig) -> SecretRef:
    """Where `credential`'s value (an access token, an API key) is published, as a reference:
    what `auth = "credential:NAME"` reads."""
    field = kind_of(credential).value_field
    return SecretRef.vault(config.vault.mount, credential.publish_to, field)


async def build_jobs(config: Config, deps: JobDeps, resolver: ReferenceResolver) -> JobSet:
    """One pooled client per provider, the rotators credentials use, one job per credential.
    Whatever was built is closed if a later part fails."""
    built = JobSet(
        config,
        clients={
            name: ProviderClient(provider, clock=deps.clock)
            for name, provider in config.providers.items()
        },
    )
    # By name, once: looking each one up in the list made a restart at 10,000 credentials
    # spend two seconds here.
    credentials = {credential.name: credential for credential in config.credentials}

    def published(name: str) -> SecretRef:
        return published_value(config, credentials[name])

    try:
        used = {c.rotation.rotator for c in config.credentials if c.rotation is not None}
        # An unused rotator is never built (nor its auth resolved).
        for name in sorted(name for name in used if name is not None):
            built.rotators[name] = await build_rotator(
                config.rotators[name],
                providers=config.providers,
                resolver=resolver,
                clock=deps.clock,
                published=published,
            )
        # Its credentials' `credential:NAME` read where this configuration publishes NAME.
        deps = dataclasses.replace(deps, published_at=published)
        # A client key another credential here publishes is read at each request.
        values = {published_value(config, c) for c in config.credentials}
        for credential in config.credentials:
            rotated_key = credential.client_key is not None and credential.client_key in values
            built.jobs[credential.name] = build_job(
                credential,
                built.clients[credential.provider],
                _rotator_of(credential, built.rotators),
                CredentialInputs(credential, resolver, deps.clock, rotated_key=rotated_key),
                deps,
            )
    except BaseException:
        await built.aclose()
        raise
    return built
