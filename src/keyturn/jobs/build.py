"""From a configuration to jobs: one pooled client per provider, the rotators credentials use,
each credential's inputs, and one job per credential (`build_job`, the one place a credential
kind becomes a job).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import assert_never

from keyturn.config import Config, CredentialConfig, ProviderConfig
from keyturn.errors import SecretReferenceError
from keyturn.jobs.job import CredentialJob, Inputs, JobDeps
from keyturn.kinds import api_key, oauth_client
from keyturn.providers.client import ProviderClient
from keyturn.references import ReferenceResolver
from keyturn.rotators.base import Rotator
from keyturn.rotators.build import build_rotator
from keyturn.secret import Secret

# Added to the longest provider timeout to make the lease: one step is a provider request,
# bounded by its timeout, and a Vault write.
LEASE_SLACK = 10.0


def lease_seconds(providers: Mapping[str, ProviderConfig]) -> float:
    """How long a lease lasts: one step. Runs renew it while they go on, so a dead holder's
    lease ends soon."""
    return max((p.timeout for p in providers.values()), default=10.0) + LEASE_SLACK


class CredentialInputs:
    """One credential's inputs, resolved from their references when a task asks.

    client_id and client_secret are read once (one Vault read when they share a secret) and
    kept in memory (10,000 credentials must not cost 20,000 Vault reads per refresh cycle);
    `fresh=True` re-reads them, which the refresh does on invalid_client in case the secret was
    changed at its source. The starting refresh token and the initial key are read each time
    they are asked for (rarely).
    """

    def __init__(self, credential: CredentialConfig, resolver: ReferenceResolver) -> None:
        self._credential = credential
        self._resolver = resolver
        self._client: tuple[str, Secret] | None = None

    async def client(self, *, fresh: bool = False) -> tuple[str, Secret]:
        if fresh or self._client is None:
            credential = self._credential
            if credential.client_id is None or credential.client_secret is None:
                raise SecretReferenceError(
                    f"{credential.name}: an {credential.kind} has no client inputs"
                )
            # One Vault read when both live in one secret, as they usually do.
            client_id, client_secret = await self._resolver.resolve_all(
                (credential.client_id, credential.client_secret)
            )
            self._client = (client_id.reveal(), client_secret)
        return self._client

    async def refresh_token(self) -> Secret | None:
        ref = self._credential.refresh_token
        return None if ref is None else await self._resolver.resolve(ref)

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        credential = self._credential
        if credential.initial_key is None:
            return None
        return await self._resolver.resolve(credential.initial_key), credential.initial_key_id


def build_job(
    credential: CredentialConfig,
    client: ProviderClient,
    rotator: Rotator | None,
    inputs: Inputs,
    deps: JobDeps,
) -> CredentialJob:
    """The job of one credential, as its kind defines it (`keyturn.kinds`). `rotator`: the
    rotator its `rotation` names, if it has one."""
    match credential.kind:
        case "oauth_client":
            return oauth_client.job(credential, client, rotator, inputs, deps)
        case "api_key":
            return api_key.job(credential, client, rotator, inputs, deps)
        case _:  # pragma: no cover - the configuration admits no other kind
            assert_never(credential.kind)


@dataclass(frozen=True, slots=True)
class JobSet:
    """Everything built from one configuration: provider clients, rotators, jobs.

    A configuration reload builds a new JobSet and closes the old one once its runs are over.
    """

    config: Config
    clients: dict[str, ProviderClient] = field(default_factory=dict)
    rotators: dict[str, Rotator] = field(default_factory=dict)
    jobs: dict[str, CredentialJob] = field(default_factory=dict)

    async def aclose(self) -> None:
        for rotator in self.rotators.values():
            await rotator.aclose()
        for client in self.clients.values():
            await client.aclose()


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
    try:
        used = {c.rotation.rotator for c in config.credentials if c.rotation is not None}
        for name in sorted(used):  # an unused rotator is never built (nor its auth resolved)
            built.rotators[name] = await build_rotator(
                config.rotators[name],
                providers=config.providers,
                resolver=resolver,
                clock=deps.clock,
            )
        for credential in config.credentials:
            built.jobs[credential.name] = build_job(
                credential,
                built.clients[credential.provider],
                built.rotators[credential.rotation.rotator] if credential.rotation else None,
                CredentialInputs(credential, resolver),
                deps,
            )
    except BaseException:
        await built.aclose()
        raise
    return built
