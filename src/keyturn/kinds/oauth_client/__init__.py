"""`oauth_client`: an OAuth 2.0 client whose access token keyturn keeps fresh.

The job runs the token refresh (`refresh.TokenRefresh`, which also says what apps read:
`refresh.published_fields`), then, when `rotation` is configured,
a client-secret rotation, then, with a `probe`, the probe of a token published unverified
(`refresh.ProbeAgain`). A new client secret is verified by a real `client_credentials` grant
with it (and the probe, with the token obtained); it is never published, only kept privately,
and the refresh uses it from then on. Apps read the access token (see `TokenRefresh`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from keyturn.clock import SystemClock, rfc3339
from keyturn.config import CredentialConfig
from keyturn.config.credentials import OAuthClientCredential
from keyturn.errors import (
    ConfigError,
    KeyturnError,
    OAuthError,
    ProviderError,
    VerificationFailed,
)
from keyturn.jobs.job import CredentialJob, Inputs, JobDeps, Task
from keyturn.jobs.rotation import KeyRotation, RotationRules
from keyturn.jobs.steps import ProbeAuth, verify_with_probe
from keyturn.kinds.base import Kind, Resolve, probe_value
from keyturn.kinds.oauth_client.refresh import (
    NAME,
    ProbeAgain,
    TokenRefresh,
    published_fields,
    token_params,
)
from keyturn.logs import get_logger
from keyturn.providers.client import ClientSecret, ProviderClient
from keyturn.providers.client_auth import ClientKey, resolve_keyless
from keyturn.providers.params import TokenParams
from keyturn.providers.tokens import TokenResponse
from keyturn.references import SecretRef
from keyturn.rotators.base import Rotator
from keyturn.secret import Secret
from keyturn.state import CredentialState

log = get_logger("keyturn.kinds")

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
        self._resolve = deps.resolver.resolve
        self._probe_auth = ProbeAuth.of(credential, deps)

    async def verify(self, key: Secret) -> None:
        name, probe = self.credential.name, self.credential.probe
        the_id = await self._client_id()
        params = await token_params(self.credential, self._resolve)
        try:
            token = await self._client.request_token(
                name,
                grant_type="client_credentials",
                client_id=the_id,
                client_secret=key,
                scope=self.credential.scope,
                params=params,
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
                    value=token.access_token,
                    what="token (from the new client secret)",
                    probe_auth=self._probe_auth,
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
    client: ProviderClient, name: str, token: TokenResponse, client_id: str, secret: ClientSecret
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


async def _each(resolve: Resolve, refs: Sequence[SecretRef]) -> list[Secret]:
    return [await resolve(ref) for ref in refs]


async def live_check(
    credential: CredentialConfig,
    client: ProviderClient,
    resolve: Resolve,
    state: CredentialState | None,
) -> str:
    """A client_credentials token request (never the refresh token keyturn holds: using it
    would rotate it) with the client secret in use, and the probe with the token; the token is
    revoked (RFC 7009) where the provider offers it."""
    assert credential.client_id is not None
    rotated = state.rotation.key if state is not None else None
    secret: ClientSecret
    if credential.keyless:
        client_id, secret = await resolve_keyless(
            credential, lambda refs: _each(resolve, refs), SystemClock().time()
        )
    else:
        assert credential.client_secret is not None
        client_id = (await resolve(credential.client_id)).reveal()
        # After a client-secret rotation the current secret lives in the state, not the input.
        secret = rotated or await resolve(credential.client_secret)
    params = await token_params(credential, resolve)
    try:
        token = await client.request_token(
            credential.name,
            grant_type="client_credentials",
            client_id=client_id,
            client_secret=secret,
            scope=credential.scope,
            params=params,
        )
    except OAuthError as error:
        if error.error != "invalid_client" and error.status != 401:
            raise
        if isinstance(secret, ClientKey):
            raise ProviderError(
                f"token request refused: {error.message}", credential=credential.name
            ) from None
        refusal = _refusal(credential, state, error.error, rotated=rotated is not None)
        raise ProviderError(refusal, credential=credential.name) from None
    accepted = _accepted(params)
    try:
        if not credential.probe:
            return f"token issued{accepted} (no probe configured)"
        probed = await probe_value(
            credential, client, token.access_token, "a token issued just now"
        )
        return f"token issued{accepted} and {probed}"
    finally:
        await revoke_verification_grant(client, credential.name, token, client_id, secret)


def _accepted(params: TokenParams) -> str:
    """For `check --live`: which of the credential's own parameters the server took."""
    return f" with {', '.join(params.keys())} accepted" if params else ""


def _refusal(
    credential: CredentialConfig, state: CredentialState | None, code: str, *, rotated: bool
) -> str:
    """Why a token request was refused, as far as keyturn's own record can tell: a credential
    that never worked has wrong inputs; one that did was changed somewhere else."""
    last_success = state.token.last_success if state is not None else None
    if last_success is None:
        client_id = credential.client_id
        named = f"{client_id} (inline)" if client_id and client_id.is_inline else f"{client_id}"
        return (
            f"first token request refused ({code}): check the client_secret reference "
            f"{credential.client_secret} (client_id from {named})"
        )
    secret = (
        "the client secret keyturn rotated to (kept in its private state)"
        if rotated
        else f"the client secret ({credential.client_secret})"
    )
    return (
        f"token request refused ({code}), though it last succeeded at "
        f"{rfc3339(last_success)}: {secret} may have been changed or revoked outside keyturn"
    )


KIND = Kind(
    name=NAME,
    config=OAuthClientCredential,
    value_field="access_token",
    expiry_field="expires_at",
    plan_field="refresh_at",
    secret_fields=frozenset({"access_token", "authorization"}),
    published_fields=published_fields,
    value_expires=True,
    refreshes_tokens=True,
    run_now_forces=TokenRefresh.name,
    rotation=ROTATION,
    job=job,
    live_check=live_check,
    expiry_words=("expires", "expired"),
)
