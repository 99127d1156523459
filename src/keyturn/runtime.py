"""Wires a `Config` into live parts: the Vault store, provider clients, input resolution and
one refresher per credential. Every command that touches Vault or the service (run, refresh,
status, check, demo) opens a `Runtime`, so they all see the same layout and rules.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from keyturn.clock import Clock, SystemClock
from keyturn.config import Config, CredentialConfig, ProviderConfig
from keyturn.errors import ConfigError, SecretReferenceError
from keyturn.events import LoggingObserver, Observer, Observers
from keyturn.job import CredentialJob, Task
from keyturn.kinds import api_key_job, client_secret_rotation
from keyturn.observability.metrics import PrometheusObserver
from keyturn.providers.client import ProviderClient, ProviderSettings
from keyturn.references import ReferenceResolver
from keyturn.refresher import OAuthRefresher, OAuthTarget
from keyturn.rotation import Checkpoint, KeyRotation, RotationSettings, no_checkpoint
from keyturn.rotators.base import Rotator
from keyturn.rotators.build import build_rotator
from keyturn.scheduler import CredentialScheduler
from keyturn.secret import Secret
from keyturn.sinks import SinkManager
from keyturn.vault.client import OnOperation
from keyturn.vault.hvac_store import VaultStore
from keyturn.vault.open import open_vault_store

LEASE_SLACK = 10.0


def provider_settings(provider: ProviderConfig) -> ProviderSettings:
    return ProviderSettings(
        name=provider.name,
        base_url=provider.base_url,
        token_path=provider.token_path,
        revoke_path=provider.revoke_path,
        token_request=provider.token_request,
        client_auth=provider.client_auth,
        timeout=provider.timeout,
        max_connections=provider.max_connections,
        rate_limit=provider.rate_limit,
        max_response_bytes=provider.max_response_bytes,
    )


def oauth_target(credential: CredentialConfig, provider: ProviderConfig) -> OAuthTarget:
    return OAuthTarget(
        name=credential.name,
        provider=credential.provider,
        publish_to=credential.publish_to,
        probe=credential.probe,
        scope=credential.scope,
        refresh=credential.refresh,
        backoff=credential.backoff,
        default_lifetime=provider.default_lifetime,
    )


class CredentialInputs:
    """Resolves and caches each credential's client_id and client_secret.

    Inputs are read once and kept in memory (10,000 credentials must not cost 20,000 Vault
    reads per refresh cycle); `fresh=True` re-reads them, which the refresher does on
    invalid_client in case the secret was changed at its source.
    """

    def __init__(self, config: Config, resolver: ReferenceResolver) -> None:
        self._config = config
        self._resolver = resolver
        self._cache: dict[str, tuple[str, Secret]] = {}

    async def __call__(self, name: str, fresh: bool) -> tuple[str, Secret]:
        if fresh or name not in self._cache:
            credential = self._config.credential(name)
            if credential.client_id is None or credential.client_secret is None:
                raise SecretReferenceError(f"{name}: an {credential.kind} has no client inputs")
            client_id = await self._resolver.resolve(credential.client_id)
            client_secret = await self._resolver.resolve(credential.client_secret)
            self._cache[name] = (client_id.reveal(), client_secret)
        return self._cache[name]

    async def client_id(self, name: str) -> str:
        return (await self(name, False))[0]

    async def refresh_token(self, name: str) -> Secret:
        """The credential's `refresh_token` input (a starting refresh token), read afresh: it is
        read once to seed the state, and again only after the provider refused the held one."""
        ref = self._config.credential(name).refresh_token
        if ref is None:
            raise SecretReferenceError(f"{name}: no refresh_token input is configured")
        return await self._resolver.resolve(ref)

    async def initial_key(self, name: str) -> tuple[Secret, str | None] | None:
        credential = self._config.credential(name)
        if credential.initial_key is None:
            return None
        return await self._resolver.resolve(credential.initial_key), credential.initial_key_id


@dataclass(frozen=True, slots=True)
class Context:
    """What every job shares for the life of the process (a reload keeps it)."""

    store: VaultStore
    observers: Observers
    clock: Clock
    rng: random.Random
    environ: Mapping[str, str]
    instance_id: str | None = None
    # Called at each journal point of a rotation (a no-op; crash tests inject one that stops).
    checkpoint: Checkpoint = no_checkpoint


@dataclass
class JobSet:
    """Everything built from one configuration: provider clients, rotators, inputs, jobs.

    A configuration reload builds a new JobSet and closes the old one once its runs are over.
    """

    config: Config
    clients: dict[str, ProviderClient] = field(default_factory=dict)
    rotators: dict[str, Rotator] = field(default_factory=dict)
    jobs: dict[str, CredentialJob] = field(default_factory=dict)
    inputs: CredentialInputs | None = None

    async def aclose(self) -> None:
        for rotator in self.rotators.values():
            await rotator.aclose()
        for client in self.clients.values():
            await client.aclose()


async def build_jobs(config: Config, context: Context) -> JobSet:
    """One pooled client per provider, the rotators credentials use, one job per credential."""
    jobs = JobSet(config)
    try:
        await _build(jobs, context)
    except BaseException:
        await jobs.aclose()
        raise
    return jobs


async def _build(jobs: JobSet, context: Context) -> None:
    config, store, observer = jobs.config, context.store, context.observers
    clock, rng = context.clock, context.rng
    for provider in config.providers.values():
        jobs.clients[provider.name] = ProviderClient(provider_settings(provider), clock=clock)
    resolver = ReferenceResolver(context.environ, store)
    inputs = jobs.inputs = CredentialInputs(config, resolver)
    used = {c.rotation.rotator for c in config.credentials if c.rotation is not None}
    for name in sorted(used):  # an unused rotator is never built (nor its auth resolved)
        jobs.rotators[name] = await build_rotator(
            config.rotators[name], providers=config.providers, resolver=resolver, clock=clock
        )
    # The lease covers one step (a provider request, bounded by its timeout, and a Vault
    # write); runs renew it while they go on, so a dead holder's lease ends soon.
    lease = max((p.timeout for p in config.providers.values()), default=10.0) + LEASE_SLACK
    instance = context.instance_id or config.keyturn.instance_id
    for credential in config.credentials:
        provider = config.providers[credential.provider]
        client = jobs.clients[credential.provider]
        name = credential.name
        policy = credential.rotation
        settings = (
            RotationSettings(
                policy.max_age, policy.grace, policy.verify_attempts, credential.backoff
            )
            if policy is not None
            else None
        )
        if credential.kind == "api_key":
            if policy is None or settings is None or credential.probe is None:
                raise ConfigError(f"{config.source}: credentials[{name!r}]: incomplete")
            jobs.jobs[name] = api_key_job(
                name,
                provider=credential.provider,
                publish_to=credential.publish_to,
                probe=credential.probe,
                settings=settings,
                rotator=jobs.rotators[policy.rotator],
                client=client,
                store=store,
                observer=observer,
                clock=clock,
                rng=rng,
                instance_id=instance,
                state_prefix=config.keyturn.state_prefix,
                initial_key=functools.partial(inputs.initial_key, name),
                lease_seconds=lease,
                backoff=credential.backoff,
                checkpoint=context.checkpoint,
            )
            continue
        extra: tuple[Task, ...] = ()
        if policy is not None and settings is not None:
            extra = (
                client_secret_rotation(
                    name,
                    provider=credential.provider,
                    probe=credential.probe,
                    scope=credential.scope,
                    settings=settings,
                    rotator=jobs.rotators[policy.rotator],
                    client=client,
                    client_id=functools.partial(inputs.client_id, name),
                    observer=observer,
                    clock=clock,
                    rng=rng,
                    checkpoint=context.checkpoint,
                ),
            )
        jobs.jobs[name] = OAuthRefresher(
            oauth_target(credential, provider),
            client=client,
            store=store,
            inputs=inputs,
            observer=observer,
            clock=clock,
            rng=rng,
            instance_id=instance,
            state_prefix=config.keyturn.state_prefix,
            lease_seconds=lease,
            extra_tasks=extra,
            refresh_token_input=(
                functools.partial(inputs.refresh_token, name)
                if credential.refresh_token is not None
                else None
            ),
        )


@dataclass
class Runtime:
    """The live process: the shared context and the current JobSet (and, in the daemon, its
    scheduler, metrics and local sinks)."""

    context: Context
    current: JobSet
    scheduler: CredentialScheduler | None = None
    metrics: PrometheusObserver | None = None
    sinks: SinkManager | None = None

    @property
    def config(self) -> Config:
        return self.current.config

    @property
    def store(self) -> VaultStore:
        return self.context.store

    @property
    def observers(self) -> Observers:
        return self.context.observers

    @property
    def jobs(self) -> dict[str, CredentialJob]:
        return self.current.jobs

    def rotation(self, name: str) -> KeyRotation | None:
        """The rotation task of credential `name`, if it has one."""
        task = self.jobs[name].task("rotation")
        return task if isinstance(task, KeyRotation) else None


@asynccontextmanager
async def open_runtime(
    config: Config,
    *,
    clock: Clock | None = None,
    environ: Mapping[str, str] | None = None,
    instance_id: str | None = None,
    observers: list[Observer] | None = None,
    rng: random.Random | None = None,
    on_vault_operation: OnOperation | None = None,
    checkpoint: Checkpoint = no_checkpoint,
) -> AsyncIterator[Runtime]:
    """Log in to Vault and build the jobs; everything is closed on exit."""
    clock = clock or SystemClock()
    environ = os.environ if environ is None else environ
    store = await open_vault_store(
        config, clock=clock, environ=environ, on_operation=on_vault_operation
    )
    context = Context(
        store=store,
        observers=Observers(LoggingObserver(), *(observers or [])),
        clock=clock,
        rng=rng or random.Random(),  # jitter, not cryptography
        environ=environ,
        instance_id=instance_id,
        checkpoint=checkpoint,
    )
    runtime: Runtime | None = None
    try:
        runtime = Runtime(context, await build_jobs(config, context))
        yield runtime
    finally:
        if runtime is not None:
            await runtime.current.aclose()
        await store.close()
