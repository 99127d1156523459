"""How each kind of credential becomes a job: which tasks, how a new key is verified, and what
apps read.

- `api_key`: one task, rotation. A new key is verified by calling `probe` with it, then
  published (`api_key`, `key_id`, `created_at`, `rotate_after`, `authorization`).
- `oauth_client`: the token refresh, preceded by a client-secret rotation when `rotation` is
  configured. A new client secret is verified by a real `client_credentials` grant with it (and
  the probe, with the token obtained); it is never published, only kept privately, and the
  refresh uses it from then on.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from typing import Literal

from keyturn.clock import Clock
from keyturn.errors import KeyturnError, OAuthError, VerificationFailed
from keyturn.events import Observer
from keyturn.job import CredentialJob, Journal
from keyturn.layout import CredentialState, api_key_published_fields, published_metadata
from keyturn.logs import get_logger
from keyturn.policy import BackoffPolicy
from keyturn.providers.client import ProviderClient
from keyturn.providers.tokens import TokenResponse
from keyturn.refresher import publish_with_cas, verify_with_probe
from keyturn.rotation import Checkpoint, KeyRotation, RotationSettings, no_checkpoint
from keyturn.rotators.base import Rotator
from keyturn.secret import Secret
from keyturn.vault.store import KvStore

log = get_logger("keyturn.kinds")

InitialKey = Callable[[], Awaitable[tuple[Secret, str | None] | None]]


def api_key_job(
    name: str,
    *,
    provider: str,
    publish_to: str,
    probe: str,
    settings: RotationSettings,
    rotator: Rotator,
    client: ProviderClient,
    store: KvStore,
    observer: Observer,
    clock: Clock,
    rng: random.Random,
    instance_id: str,
    state_prefix: str,
    initial_key: InitialKey | None = None,
    lease_seconds: float = 30.0,
    backoff: BackoffPolicy | None = None,
    checkpoint: Checkpoint = no_checkpoint,
) -> CredentialJob:
    async def verify(key: Secret) -> None:
        await verify_with_probe(
            client,
            observer,
            credential=name,
            provider=provider,
            probe=probe,
            authorization=Secret(f"Bearer {key.reveal()}"),
            what="API key",
        )

    async def publish(
        key: Secret,
        key_id: str | None,
        created_at: float,
        state: CredentialState,
        report: bool = True,
    ) -> int:
        rotate_after = created_at + settings.max_age
        version = await publish_with_cas(
            store,
            observer,
            path=publish_to,
            data=api_key_published_fields(key, key_id, created_at, rotate_after),
            metadata=published_metadata(name, rotate_after, instance_id),
            last_version=state.published_version,
            credential=name,
            provider=provider,
            report=report,
        )
        observer.published(name, provider, "api_key", created_at, rotate_after)
        return version

    async def published_key_id() -> tuple[str | None, int] | None:
        entry = await store.read(publish_to, consistent=True)
        return (entry.data.get("key_id"), entry.version) if entry else None

    rotation = KeyRotation(
        credential=name,
        kind="api_key",
        provider=provider,
        settings=settings,
        rotator=rotator,
        verify=verify,
        publish=publish,
        published_key_id=published_key_id,
        observer=observer,
        clock=clock,
        rng=rng,
        initial_key=initial_key,
        checkpoint=checkpoint,
    )
    return CredentialJob(
        name,
        provider=provider,
        kind="api_key",
        tasks=[rotation, RepublishKey(publish)],
        store=store,
        observer=observer,
        clock=clock,
        rng=rng,
        instance_id=instance_id,
        state_prefix=state_prefix,
        lease_seconds=lease_seconds,
        backoff=backoff or settings.backoff,
    )


class RepublishKey:
    """The `republish` task (forced only): put the current key back where apps read it, after
    someone else changed or deleted it (the watcher already reported that)."""

    name = "republish"

    def __init__(self, publish: Callable[..., Awaitable[int]]) -> None:
        self._publish = publish

    async def due(self, state: CredentialState, now: float, force: bool) -> float:
        return now if force and state.key is not None else math.inf

    async def step(self, journal: Journal) -> str:
        state = journal.state
        if state.key is None or state.key_created_at is None:
            return "waiting"
        version = await self._publish(
            state.key, state.key_id, state.key_created_at, state, report=False
        )
        journal.stage(state.with_(published_version=version))
        return "republished"

    def failed(
        self, state: CredentialState, error: KeyturnError, now: float
    ) -> tuple[CredentialState, int]:
        return state.with_(rotation_error=str(error)), state.rotation_failures + 1


async def revoke_verification_grant(
    client: ProviderClient, name: str, token: TokenResponse, client_id: str, secret: Secret
) -> None:
    """A verification grant is only a test of the new secret: nothing keeps its tokens, so they
    are revoked (RFC 7009) where the provider offers it, the refresh token first (that revokes
    its family), instead of leaving a live family behind at every rotation. Best effort."""
    tokens: list[tuple[Secret, Literal["refresh_token", "access_token"]]] = [
        (token.access_token, "access_token")
    ]
    if token.refresh_token is not None:
        tokens.insert(0, (token.refresh_token, "refresh_token"))
    for value, hint in tokens:
        try:
            revoked = await client.revoke_token(
                name, token=value, token_type_hint=hint, client_id=client_id, client_secret=secret
            )
        except KeyturnError as error:
            log.warning("verification_grant.revoke_failed", credential=name, error=str(error))
            return
        if not revoked:
            log.info("verification_grant.not_revoked", credential=name, reason="no revoke_path")
            return


def client_secret_rotation(
    name: str,
    *,
    provider: str,
    probe: str | None,
    scope: str | None,
    settings: RotationSettings,
    rotator: Rotator,
    client: ProviderClient,
    client_id: Callable[[], Awaitable[str]],
    observer: Observer,
    clock: Clock,
    rng: random.Random,
    checkpoint: Checkpoint = no_checkpoint,
) -> KeyRotation:
    async def verify(secret: Secret) -> None:
        the_id = await client_id()
        try:
            token = await client.request_token(
                name,
                grant_type="client_credentials",
                client_id=the_id,
                client_secret=secret,
                scope=scope,
            )
        except OAuthError as error:
            if error.error not in ("invalid_client", "unauthorized_client"):
                raise
            raise VerificationFailed(
                f"the new client secret was refused ({error.error}); nothing switched",
                credential=name,
                status=error.status,
            ) from error
        try:
            if probe:
                await verify_with_probe(
                    client,
                    observer,
                    credential=name,
                    provider=provider,
                    probe=probe,
                    authorization=Secret(f"Bearer {token.access_token.reveal()}"),
                    what="token (from the new client secret)",
                )
        finally:
            await revoke_verification_grant(client, name, token, the_id, secret)

    async def the_client_id() -> str | None:
        return await client_id()

    return KeyRotation(
        credential=name,
        kind="oauth_client",
        provider=provider,
        settings=settings,
        rotator=rotator,
        verify=verify,
        publish=None,
        published_key_id=None,
        observer=observer,
        clock=clock,
        rng=rng,
        client_id=the_client_id,
        checkpoint=checkpoint,
    )
