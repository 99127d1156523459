"""Wires a `Config` into live parts: the Vault store, provider clients, input resolution and
one refresher per credential. Every command that touches Vault or the service (run, refresh,
status, check, demo) opens a `Runtime`, so they all see the same layout and rules.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from keyturn.clock import Clock, SystemClock
from keyturn.config import Config, CredentialConfig, ProviderConfig
from keyturn.events import LoggingObserver, Observer, Observers
from keyturn.job import CredentialJob
from keyturn.providers.client import ProviderClient, ProviderSettings
from keyturn.references import ReferenceResolver
from keyturn.refresher import OAuthRefresher, OAuthTarget
from keyturn.scheduler import CredentialScheduler
from keyturn.secret import Secret
from keyturn.vault.hvac_store import VaultStore
from keyturn.vault.open import open_vault_store


def provider_settings(provider: ProviderConfig) -> ProviderSettings:
    return ProviderSettings(
        name=provider.name,
        base_url=provider.base_url,
        token_path=provider.token_path,
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
            client_id = await self._resolver.resolve(credential.client_id)
            client_secret = await self._resolver.resolve(credential.client_secret)
            self._cache[name] = (client_id.reveal(), client_secret)
        return self._cache[name]


@dataclass
class Runtime:
    config: Config
    clock: Clock
    store: VaultStore
    clients: Mapping[str, ProviderClient]
    inputs: CredentialInputs
    observers: Observers
    jobs: dict[str, CredentialJob] = field(default_factory=dict)
    scheduler: CredentialScheduler | None = None


@asynccontextmanager
async def open_runtime(
    config: Config,
    *,
    clock: Clock | None = None,
    environ: Mapping[str, str] | None = None,
    instance_id: str | None = None,
    observers: list[Observer] | None = None,
    rng: random.Random | None = None,
) -> AsyncIterator[Runtime]:
    """Log in to Vault, open one pooled client per provider, build one job per credential."""
    clock = clock or SystemClock()
    environ = os.environ if environ is None else environ
    rng = rng or random.Random()  # jitter, not cryptography
    store = await open_vault_store(config, clock=clock, environ=environ)
    clients: dict[str, ProviderClient] = {}
    try:
        for provider in config.providers.values():
            clients[provider.name] = ProviderClient(provider_settings(provider), clock=clock)
        inputs = CredentialInputs(config, ReferenceResolver(environ, store))
        observer = Observers(LoggingObserver(), *(observers or []))
        runtime = Runtime(config, clock, store, clients, inputs, observer)
        lease = 2 * max(p.timeout for p in config.providers.values()) + 60 if clients else 120
        for credential in config.credentials:
            provider = config.providers[credential.provider]
            runtime.jobs[credential.name] = OAuthRefresher(
                oauth_target(credential, provider),
                client=clients[credential.provider],
                store=store,
                inputs=inputs,
                observer=observer,
                clock=clock,
                rng=rng,
                instance_id=instance_id or config.keyturn.instance_id,
                state_prefix=config.keyturn.state_prefix,
                lease_seconds=lease,
            )
        yield runtime
    finally:
        for client in clients.values():
            await client.aclose()
        await store.close()
