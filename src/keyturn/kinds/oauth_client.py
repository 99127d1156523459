"""`oauth_client`: an OAuth 2.0 client whose access token keyturn keeps fresh.

The job runs the token refresh (`keyturn.jobs.refresh`), then, when `rotation` is configured,
a client-secret rotation, then, with a `probe`, the probe of a token published unverified
(`ProbeAgain`). A new client secret is verified by a real `client_credentials` grant
with it (and the probe, with the token obtained); it is never published, only kept privately,
and the refresh uses it from then on. Apps read the access token (see `TokenRefresh`).
"""

from __future__ import annotations

from typing import Literal

from keyturn.config import CredentialConfig
from keyturn.errors import ConfigError, KeyturnError, OAuthError, VerificationFailed
from keyturn.jobs.job import CredentialJob, Inputs, JobDeps, Task
from keyturn.jobs.refresh import ProbeAgain, TokenRefresh
from keyturn.jobs.rotation import KeyRotation, RotationRules
from keyturn.jobs.steps import verify_with_probe
from keyturn.kinds.base import Kind
from keyturn.layout import oauth_published_fields
from keyturn.logs import get_logger
from keyturn.providers.client import ProviderClient
from keyturn.providers.tokens import TokenResponse
from keyturn.rotators.base import Rotator
from keyturn.secret import Secret
from keyturn.state import CredentialState

log = get_logger("keyturn.kinds")

NAME = "oauth_client"
# A client secret is never published; the one in use at first came from the inputs.
ROTATION = RotationRules(publishes_rotated_value=False, starts_with_unheld_key=True)


class ClientSecretTarget:
    """The `RotationTarget` of a client secret: verified by a grant with it, never published."""

    rules = ROTATION

    def __init__(
        self, credential: CredentialConfig, client: ProviderClient, inputs: Inputs, deps: JobDeps
    ) -> None:
        self.credential = credential
        self._client = client
        self._inputs = inputs
        self._observer = deps.observer

    async def verify(self, key: Secret) -> None:
        name, probe = self.credential.name, self.credential.probe
        the_id = await self._client_id()
        try:
            token = await self._client.request_token(
                name,
                grant_type="client_credentials",
                client_id=the_id,
                client_secret=key,
                scope=self.credential.scope,
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
                    self._client,
                    self._observer,
                    credential=name,
                    provider=self.credential.provider,
                    probe=probe,
                    authorization=Secret(f"Bearer {token.access_token.reveal()}"),
                    what="token (from the new client secret)",
                )
        finally:
            await revoke_verification_grant(self._client, name, token, the_id, key)

    async def publish(
        self, key: Secret, key_id: str | None, created_at: float, state: CredentialState
    ) -> None:
        return None  # kept privately: the refresh uses it from the journal

    async def client_id(self) -> str | None:
        return await self._client_id()

    async def _client_id(self) -> str:
        return (await self._inputs.client())[0]

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        return None


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


def job(
    credential: CredentialConfig,
    client: ProviderClient,
    rotator: Rotator | None,
    inputs: Inputs,
    deps: JobDeps,
) -> CredentialJob:
    # The refresh first: a slow rotator must never delay a token that is due (the secret it
    # uses stays valid through the rotation's grace period).
    tasks: list[Task] = [TokenRefresh(credential, client, inputs, deps)]
    if credential.rotation is not None:
        if rotator is None:
            raise ConfigError(f"credentials[{credential.name!r}]: a rotation needs a rotator")
        target = ClientSecretTarget(credential, client, inputs, deps)
        tasks.append(KeyRotation(target, rotator, deps))
    if credential.probe:
        # Last: a refresh in the same run replaces an unverified token (and clears the mark).
        tasks.append(ProbeAgain(credential, client, deps))
    return CredentialJob(credential, tasks, deps)


KIND = Kind(
    name=NAME,
    value_field="access_token",
    expiry_field="expires_at",
    plan_field="refresh_at",
    secret_fields=frozenset({"access_token", "authorization"}),
    published_fields=oauth_published_fields,
    value_expires=True,
    refreshes_tokens=True,
    run_now_forces=TokenRefresh.name,
    rotation=ROTATION,
    job=job,
    expiry_words=("expires", "expired"),
)
