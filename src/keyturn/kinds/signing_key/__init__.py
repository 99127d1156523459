"""`signing_key`: a key pair that replaces a client secret (`private_key_jwt`), rotated through
the same journal as an API key (`keyturn.jobs.rotation`): made and stored privately, its public
half registered (RFC 7592 or a published JWKS), proven by a signed token request, published,
and the old key removed after the grace. docs/rotation.md tells each step.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from keyturn.clock import rfc3339
from keyturn.config import CredentialConfig
from keyturn.config.credentials import (
    Rfc7592Registration,
    RotatorRegistration,
    SigningKeyCredential,
)
from keyturn.errors import (
    ConfigError,
    KeyturnError,
    OAuthError,
    RotationError,
    VerificationFailed,
)
from keyturn.events import Published
from keyturn.jobs.job import CredentialJob, Inputs, JobDeps, Journal, Task
from keyturn.jobs.rotation import CHECKPOINT, KeyRotation, RepublishKey, RotationRules
from keyturn.jobs.steps import publish_with_cas
from keyturn.kinds.base import Kind, Resolve
from keyturn.kinds.signing_key import record
from keyturn.kinds.signing_key.registration import (
    JwksDocument,
    PublicKey,
    Registrar,
    Rfc7592,
    ThroughRotator,
    registered_kids,
    sendable,
)
from keyturn.layout import custom_metadata
from keyturn.providers.client import ProviderClient
from keyturn.providers.client_auth import ClientKey

# The key pairs (cryptography, PyJWT: a tenth of a second to import) are loaded when a signing
# key is made or used, not by every keyturn process that registers this kind.
if TYPE_CHECKING:
    from keyturn.kinds.signing_key.keys import SigningKey
from keyturn.rotators.base import KeyRegistry, NewKey, RotationRequest, Rotator
from keyturn.secret import Secret
from keyturn.state import CredentialState

NAME = "signing_key"
# Apps (and oauth_client credentials) read the key itself; keyturn makes the first one.
ROTATION = RotationRules(publishes_rotated_value=True, starts_with_unheld_key=False)
# The journal point between the registration of a new public key and its proof.
REGISTERED = "registered"

# Proves a key: a token request for the client, authenticated by an assertion signed with it
# (`private_key_jwt`); VerificationFailed if the server refuses it.
# (credential, client, client_id, key, now)
Prover = Callable[[SigningKeyCredential, ProviderClient, str, "SigningKey"], Awaitable[None]]


def published_fields(
    key: SigningKey,
    client_id: str,
    created_at: float,
    rotate_after: float,
    client_secret: Secret | None = None,
) -> dict[str, str | Secret]:
    """The KV data an app reads for a signing key."""
    fields: dict[str, str | Secret] = {
        "private_key": key.pem,
        "kid": key.kid,
        "alg": key.alg,
        "public_jwk": json.dumps(key.public_jwk(), sort_keys=True),
        "client_id": client_id,
        "created_at": rfc3339(created_at),
        "rotate_after": rfc3339(rotate_after),
    }
    if client_secret is not None:  # the server issued one on a registration update
        fields["client_secret"] = client_secret
    return fields


class KeyMaker:
    """The journal's `Rotator` for a signing key: `create` makes a key pair here (nothing is
    created at the server, so nothing is orphaned there); `revoke` removes a public key from the
    registration."""

    name = "keyturn"

    def __init__(self, target: SigningKeyTarget) -> None:
        self._target = target

    async def create(self, request: RotationRequest) -> NewKey:
        credential = self._target.credential
        from keyturn.kinds.signing_key import keys  # noqa: PLC0415 - see the imports

        made = keys.generate(credential.name, credential.algorithm, credential.key_size)
        return NewKey(keys.stored(made), made.kid)

    async def revoke(self, request: RotationRequest, key_id: str) -> None:
        await self._target.unregister(key_id)

    async def find(self, request: RotationRequest) -> list[str] | None:
        return None

    async def aclose(self) -> None:
        return None


class SigningKeyTarget:
    """The `RotationTarget` of a signing key: registered then proven by a token request,
    published where apps read it."""

    rules = ROTATION

    def __init__(
        self,
        credential: SigningKeyCredential,
        client: ProviderClient,
        inputs: Inputs,
        deps: JobDeps,
        registrar: Registrar,
        prove: Prover,
    ) -> None:
        self.credential = credential
        self._client = client
        self._deps = deps
        self._registrar = registrar
        self._prove = prove
        self._journal: Journal | None = None

    def bind(self, journal: Journal | None) -> None:
        """The journal of the run in progress (registration calls store their tokens in it)."""
        self._journal = journal

    @property
    def journal(self) -> Journal:
        if self._journal is None:  # pragma: no cover - the rotation task binds it
            raise KeyturnError("a signing key's rotation ran outside its task")
        return self._journal

    def _load(self, value: Secret) -> SigningKey:
        from keyturn.kinds.signing_key import keys  # noqa: PLC0415 - see the imports

        return keys.load(value, credential=self.credential.name)

    def _current(self) -> PublicKey | None:
        current = self.journal.state.rotation.key
        return self._load(current).public_jwk() if current is not None else None

    async def verify(self, key: Secret) -> None:
        new = self._load(key)
        await self._registrar.add(self.journal, new.public_jwk(), self._current())
        await CHECKPOINT.get()(self.credential.name, REGISTERED)
        signs_after = record.read(self.journal.state, self.credential.name).signs_after
        if signs_after is not None and self._deps.clock.time() < signs_after:
            raise NotFetchedYet(signs_after)
        await self._prove(self.credential, self._client, await self._client_id(), new)

    async def unregister(self, kid: str) -> None:
        # No key in use: the first key failed its proof, and nothing else there is keyturn's.
        await self._registrar.remove(self.journal, kid, self._current())

    async def publish(
        self, key: Secret, key_id: str | None, created_at: float, state: CredentialState
    ) -> int:
        entry = await self._deps.store.read(self.credential.publish_to, consistent=True)
        if entry is not None and key_id is not None and entry.data.get("kid") == key_id:
            return entry.version  # keyturn's own write, before a crash
        return await self.write(key, key_id, created_at, state)

    async def write(
        self,
        key: Secret,
        key_id: str | None,
        created_at: float,
        state: CredentialState,
        *,
        report: bool = True,
    ) -> int:
        """Publish `key` on top of the version keyturn last wrote (`report=False`: a conflict
        is not reported again; the watcher already did)."""
        name, provider = self.credential.name, self.credential.provider
        rotate_after = created_at + self.credential.rotation.max_age
        held = record.read(state, name)
        version = await publish_with_cas(
            self._deps.store,
            self._deps.observer,
            path=self.credential.publish_to,
            data=published_fields(
                self._load(key),
                await self._client_id(),
                created_at,
                rotate_after,
                held.client_secret,
            ),
            metadata=custom_metadata(name, self._deps.instance_id),
            last_version=state.token.published_version,
            credential=name,
            provider=provider,
            report=report,
        )
        self._deps.observer(Published(name, provider, NAME, created_at, rotate_after))
        return version

    def forget_metadata(self) -> None:
        """Nothing to forget: a signing key's publish always writes its custom metadata (a
        rotation is rare)."""

    async def client_id(self) -> str | None:
        return await self._client_id()

    async def _client_id(self) -> str:
        return (await self._deps.resolver.resolve(self.credential.client_id)).reveal()

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        return None


class NotFetchedYet(Exception):
    """A new key is in the JWKS document, but a server may still hold the document it fetched
    before: the key signs from `signs_after` on (a wait, not a failure)."""

    def __init__(self, signs_after: float) -> None:
        super().__init__(signs_after)
        self.signs_after = signs_after


class SigningKeyRotation(KeyRotation):
    """The journal's rotation, with the run's journal lent to the target while a step runs
    (its registration calls store a rotated registration access token before anything else),
    and a pending key that waits for a server to fetch the JWKS document again."""

    def __init__(self, target: SigningKeyTarget, deps: JobDeps) -> None:
        super().__init__(target, KeyMaker(target), deps)
        self._signing = target

    async def due(self, state: CredentialState, now: float, force: bool) -> float:
        due = await super().due(state, now, force)
        if state.rotation.phase == "pending":
            signs_after = record.read(state, self.credential).signs_after
            if signs_after is not None:
                due = max(due, signs_after)
        return due

    async def step(self, journal: Journal) -> str:
        self._signing.bind(journal)
        try:
            return await super().step(journal)
        except NotFetchedYet:
            return "waiting"  # `due` says until when; what the registration stored is staged
        finally:
            self._signing.bind(None)


def registrar_for(
    credential: SigningKeyCredential,
    client: ProviderClient,
    deps: JobDeps,
    rotator: Rotator | None = None,
) -> Registrar:
    """The registration `credential.registration` describes (`rotator`: the one
    `rotation.rotator` names, for `method = "rotator"`)."""
    config = credential.registration
    if isinstance(config, RotatorRegistration):
        if not isinstance(rotator, KeyRegistry):
            raise ConfigError(
                f"credentials[{credential.name!r}].rotation.rotator: expected an exec rotator, "
                "which registers public keys"
            )
        return ThroughRotator(rotator, credential=credential.name, kind=NAME)
    if isinstance(config, Rfc7592Registration):
        return Rfc7592(
            config,
            credential=credential.name,
            provider=credential.provider,
            client=client,
            resolver=deps.resolver,
            observer=deps.observer,
            now=deps.clock.time,
            auth=None
            if config.auth is None
            else deps.credential_token(
                config.auth, field="registration.auth", error=RotationError
            ),
        )
    return JwksDocument(
        config,
        credential=credential.name,
        store=deps.store,
        instance_id=deps.instance_id,
        now=deps.clock.time,
    )


async def prove_with_assertion(
    credential: SigningKeyCredential, client: ProviderClient, client_id: str, key: SigningKey
) -> None:
    """A client_credentials token request authenticated by an assertion signed with `key`
    (`private_key_jwt`); VerificationFailed if the server refuses the client. The token is only
    a proof: nothing keeps it."""
    try:
        await client.request_token(
            credential.name,
            grant_type="client_credentials",
            client_id=client_id,
            client_secret=ClientKey("private_key_jwt", signing_key=key),
            scope=credential.scope,
        )
    except OAuthError as error:
        if error.error not in ("invalid_client", "unauthorized_client"):
            raise
        raise VerificationFailed(
            f"a token request signed with the new key {key.kid} was refused ({error}); "
            "nothing switched",
            credential=credential.name,
            status=error.status,
        ) from None


def make_job(
    prove: Prover,
    registrar: Callable[[SigningKeyCredential, ProviderClient, JobDeps, Rotator | None], Registrar],
) -> Callable[..., CredentialJob]:
    """The kind's job builder over `prove` and `registrar` (tests give fakes)."""

    def job(
        credential: CredentialConfig,
        client: ProviderClient,
        rotator: Rotator | None,
        inputs: Inputs,
        deps: JobDeps,
    ) -> CredentialJob:
        if not isinstance(credential, SigningKeyCredential):
            raise ConfigError(f"credentials[{credential.name!r}]: not a signing_key")
        target = SigningKeyTarget(
            credential, client, inputs, deps, registrar(credential, client, deps, rotator), prove
        )
        tasks: list[Task] = [SigningKeyRotation(target, deps), RepublishKey(target)]
        return CredentialJob(credential, tasks, deps)

    return job


async def live_check(
    credential: CredentialConfig,
    client: ProviderClient,
    resolve: Resolve,
    state: CredentialState | None,
) -> str:
    """A token request signed with the key in use."""
    assert isinstance(credential, SigningKeyCredential)
    if state is None or state.rotation.key is None:
        return "no key yet: keyturn makes one on its first run; nothing to prove"
    from keyturn.kinds.signing_key import keys  # noqa: PLC0415 - see the imports

    key = keys.load(state.rotation.key, credential=credential.name)
    client_id = (await resolve(credential.client_id)).reveal()
    await PROVE(credential, client, client_id, key)
    return f"a token request signed with key {key.kid} accepted"


def status_details(state: CredentialState, credential: str) -> Mapping[str, str]:
    """What `keyturn status` adds for a signing key: the key ids the server holds."""
    held = record.read(state, credential)
    details = {"registered": ", ".join(held.registered) or "-"}
    if held.stopped is not None:
        details["registration"] = "stopped: a person must hand over a registration access token"
    return details


def accept(
    state: CredentialState,
    credential: str,
    access_token: Secret,
    registration: dict[str, Any] | None = None,
) -> CredentialState:
    """`keyturn import-signing-key`'s registration access token: kept, and usable again. With
    the RFC 7591 registration response it came in, its metadata is what the first update sends
    back (no read first); without, the metadata held is dropped and read again."""
    held = record.read(state, credential)
    metadata = sendable(registration) if registration is not None else None
    kept = replace(held, access_token=access_token, in_flight=None, stopped=None, metadata=metadata)
    if registration is not None:
        kept = replace(kept, registered=registered_kids(registration, credential))
    return record.write(state, kept)


PROVE: Prover = prove_with_assertion

KIND = Kind(
    name=NAME,
    config=SigningKeyCredential,
    value_field="private_key",
    expiry_field="rotate_after",
    plan_field="rotate_after",
    secret_fields=frozenset({"private_key", "client_secret"}),
    published_fields=published_fields,
    value_expires=False,
    refreshes_tokens=False,
    run_now_forces=RepublishKey.name,
    rotation=ROTATION,
    job=make_job(PROVE, registrar_for),
    live_check=live_check,
    expiry_words=("rotates", "rotation due"),
    status_details=status_details,
)
