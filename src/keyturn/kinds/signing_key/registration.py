"""How a signing key's public half reaches the server, and leaves it after the grace period.

`Rfc7592` `PUT`s the server's last client metadata back with `jwks` changed, reading it first
only when none is held (always with `registration.auth`): each registration access token is
presented once. `JwksDocument` writes the document a server fetches as `jwks_uri`;
`ThroughRotator` uses an `exec` rotator's `register` and `revoke`. docs/rotation.md, "Signing
keys", says when each reads and what a refused or lost token means.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from keyturn.config.credentials import JwksRegistration, Rfc7592Registration
from keyturn.errors import MalformedResponse, ProviderUnavailable, RotationError
from keyturn.events import Observer, Suspicious
from keyturn.jobs.job import Journal
from keyturn.kinds.signing_key import record
from keyturn.layout import custom_metadata
from keyturn.providers.client import ProviderClient
from keyturn.providers.http import raise_if_transient, send_bounded
from keyturn.references import ReferenceResolver
from keyturn.rotators.base import KeyRegistry, RotationRequest
from keyturn.secret import Secret
from keyturn.state import fingerprint, fingerprint_matches
from keyturn.vault.store import KvStore

# The detector (and alert) of a registration access token keyturn can no longer use.
REGISTRATION_REFUSED = "registration_refused"
# The detector of a server that dropped the key in use when the new one was added.
REGISTRATION_DROPPED_KEY = "registration_dropped_key"
# RFC 7592 §2.2: fields a client must not send back in an update.
NOT_SENT_BACK = (
    "registration_access_token",
    "registration_client_uri",
    "client_secret_expires_at",
    "client_id_issued_at",
)
# RFC 7591 §2: client metadata that hold one string each. Glewlwyd 2.7 reads
# `token_endpoint_auth_method` back as a one-element array, and refuses that array in an update.
SINGLE_VALUED = (
    "token_endpoint_auth_method",
    "client_name",
    "client_uri",
    "logo_uri",
    "tos_uri",
    "policy_uri",
    "jwks_uri",
    "software_id",
    "software_version",
)
# The registration's answers are metadata, never large.
MAX_ANSWER = 256 * 1024

PublicKey = dict[str, Any]


class RegistrationStopped(RotationError):
    """No registration request may be made until a person acts (the alert says what)."""

    retryable = False


class Registrar(Protocol):
    """Where the public keys are registered. Each call gets the journal, to store what it
    must keep (a rotated registration access token) before anything else happens."""

    async def add(
        self, journal: Journal, new: PublicKey, current: PublicKey | None
    ) -> tuple[str, ...]:
        """Make the server hold `new` beside `current`; the key ids it holds after."""

    async def remove(
        self, journal: Journal, kid: str, current: PublicKey | None
    ) -> tuple[str, ...]:
        """Make the server drop `kid` (keeping `current`, the key in use if there is one); the
        key ids it holds after."""


class Rfc7592:
    """The registration through RFC 7592 registration management."""

    def __init__(
        self,
        config: Rfc7592Registration,
        *,
        credential: str,
        provider: str,
        client: ProviderClient,
        resolver: ReferenceResolver,
        observer: Observer,
        now: Callable[[], float],
        auth: Callable[[], Awaitable[Secret]] | None = None,
    ) -> None:
        """`auth`: with `registration.auth`, the other credential's token, read at each call
        (no registration access token is then kept, presented or stopped)."""
        self._auth = auth
        self._config = config
        self._credential = credential
        self._provider = provider
        self._client = client
        self._resolver = resolver
        self._observer = observer
        self._now = now

    async def add(
        self, journal: Journal, new: PublicKey, current: PublicKey | None
    ) -> tuple[str, ...]:
        metadata = await self._metadata(journal)
        keys = _keys_of(metadata, self._credential)
        if any(key.get("kid") == new["kid"] for key in keys):
            return _kids(keys)  # registered before a crash
        answer = await self._update(journal, metadata, [*keys, new])
        held = _kids(_keys_of(answer, self._credential))
        if new["kid"] not in held:
            raise RotationError(
                "registration: the server's answer to the update does not hold the new key; "
                "it may refuse the key (its type or size): see its logs",
                credential=self._credential,
            )
        if current is not None and current["kid"] not in held:
            self._observer(
                Suspicious(
                    self._credential,
                    self._provider,
                    REGISTRATION_DROPPED_KEY,
                    "warning",
                    f"registration: the server dropped the key in use ({current['kid']}) when "
                    f"the new one ({new['kid']}) was added, instead of keeping both through "
                    "the grace period; keyturn switches to the new key now",
                )
            )
        return held

    async def remove(
        self, journal: Journal, kid: str, current: PublicKey | None
    ) -> tuple[str, ...]:
        metadata = await self._metadata(journal)
        keys = _keys_of(metadata, self._credential)
        if kid not in _kids(keys):
            return _kids(keys)
        kept = [key for key in keys if key.get("kid") != kid]
        if current is not None and current["kid"] not in _kids(kept):
            raise RotationError(
                f"registration: the server does not hold the key in use ({current['kid']}); "
                f"the old key ({kid}) is kept until it does",
                credential=self._credential,
            )
        answer = await self._update(journal, metadata, kept)
        return _kids(_keys_of(answer, self._credential))

    # -- the wire --------------------------------------------------------------------------

    async def _metadata(self, journal: Journal) -> dict[str, Any]:
        """The client's metadata: that of the server's last answer if keyturn holds it (no
        request: the update that follows is the token's only presentation), else read."""
        if self._auth is None:
            held = record.read(journal.state, self._credential).metadata
            if held is not None:
                return held
        return await self._exchange(journal, "GET", None)

    async def _update(
        self, journal: Journal, metadata: dict[str, Any], keys: Sequence[PublicKey]
    ) -> dict[str, Any]:
        """PUT back what the server last returned, with `jwks` holding `keys`."""
        body = sendable(metadata)
        body["jwks"] = {"keys": list(keys)}
        _single_values_as_strings(body)
        return await self._exchange(journal, "PUT", body)

    async def _exchange(
        self, journal: Journal, method: str, body: dict[str, Any] | None
    ) -> dict[str, Any]:
        """One request with the registration access token, which is marked in flight first
        and, when the answer brings a new one, replaced before anything else."""
        held = record.read(journal.state, self._credential)
        if self._auth is not None:
            try:
                token = await self._auth()
            except RotationError as error:
                raise RotationError(error.message, credential=self._credential) from error
        else:
            if held.in_flight is not None:  # a crash while it was presented
                await self._stop(journal, held, "lost")
            token, held = await self._token(journal, held)
            attempt = uuid.uuid4().hex[:12]
            await journal.save(record.write(journal.state, held.with_(in_flight=attempt)))
        where = f"registration ({method} {self._config.client_uri})"
        headers = {"Authorization": f"Bearer {token.reveal()}", "Cache-Control": "no-store"}
        http = self._client.http
        request = http.build_request(method, self._config.client_uri, json=body, headers=headers)
        try:
            status, answer_headers, content = await send_bounded(
                http,
                request,
                limit=MAX_ANSWER,
                where=where,
                credential=self._credential,
                oversized=lambda what: MalformedResponse(
                    f"{where}: {what}", credential=self._credential, field="registration"
                ),
            )
        except ProviderUnavailable as error:
            if self._auth is None:
                if error.answer_lost:
                    await self._stop(journal, held, "lost")
                await journal.save(record.write(journal.state, held.with_(in_flight=None)))
            raise
        document = _json(content) if 200 <= status < 300 else None
        if document is not None:
            # With `auth`, a registration access token in the answer is not kept.
            renewed = document.get("registration_access_token") if self._auth is None else None
            issued = document.get("client_secret")
            sent = (body or {}).get("client_secret")
            # Stored before anything else: the token presented may be dead already.
            await journal.save(
                record.write(
                    journal.state,
                    held.with_(
                        in_flight=None,
                        access_token=Secret(renewed)
                        if isinstance(renewed, str) and renewed
                        else held.access_token,
                        client_secret=Secret(issued)
                        if isinstance(issued, str) and issued and issued != sent and method == "PUT"
                        else held.client_secret,
                        registered=registered_kids(document, self._credential),
                        # With `auth`, every update reads first (an admin may change it).
                        metadata=sendable(document) if self._auth is None else None,
                    ),
                )
            )
            return document
        if status in (401, 403) and self._auth is not None:
            raise RotationError(
                f"{where}: refused the token of registration.auth = {self._config.auth} (HTTP "
                f"{status}); check that credential's rights at the server (e.g. Keycloak's "
                "manage-clients role)",
                credential=self._credential,
            )
        if status in (401, 403):
            await self._stop(journal, held, "refused")
        # A refused update rotated nothing: the next attempt reads with the same token.
        reread = method == "PUT" and status == 400 and self._auth is None
        forget = {"metadata": None} if reread else {}
        await journal.save(record.write(journal.state, held.with_(in_flight=None, **forget)))
        raise_if_transient(
            status, answer_headers, now=self._now(), where=where, credential=self._credential
        )
        if 200 <= status < 300:
            raise MalformedResponse(
                f"{where}: the answer is not a JSON object",
                credential=self._credential,
                field="registration",
            )
        code = error_code(content)
        detail = f" ({code})" if code else ""
        sent_back = (
            "what the server last returned; keyturn reads the registration again (GET) before "
            "its next attempt, and if that update is refused too,"
            if reread
            else "what the server returned, so"
        )
        raise RotationError(
            f"{where}: refused with HTTP {status}{detail}; the metadata sent back is "
            f"{sent_back} see the server's logs for the field it refuses",
            credential=self._credential,
        )

    async def _token(
        self, journal: Journal, held: record.Registration
    ) -> tuple[Secret, record.Registration]:
        """The token to present: the one held, or the `access_token` input once (read again
        only while keyturn holds none, and used only if it changed since it was last used);
        without either, RegistrationStopped and no request."""
        if held.access_token is not None and held.stopped is None:
            return held.access_token, held
        ref = self._config.access_token
        seed = await self._resolver.resolve(ref) if ref is not None else None
        used = held.input_fingerprint
        if seed is None or (used is not None and fingerprint_matches(used, seed)):
            raise self._stopped(
                held.stopped
                or "keyturn holds no registration access token: hand one over with "
                f"`keyturn import-signing-key {self._credential}` (or set "
                "registration.access_token to a new one)"
            )
        held = held.with_(access_token=seed, input_fingerprint=fingerprint(seed), stopped=None)
        await journal.save(record.write(journal.state, held))
        return seed, held

    async def _stop(self, journal: Journal, held: record.Registration, why: str) -> None:
        """The token cannot be presented again: forget it, say what a person must do."""
        if why == "lost":
            what = (
                "the answer to a request that presented the registration access token was "
                "lost, so the server may have replaced it"
            )
        else:
            what = "the server refused the registration access token (HTTP 401/403)"
        action = (
            f"{what}; keyturn will not present it again. The key in use keeps working. A person "
            "must get a new registration access token (from the server's admin, or by a new "
            f"initial registration of the client) and hand it over with `keyturn "
            f"import-signing-key {self._credential}`"
        )
        # The metadata too: a new token may come with a new registration; it is read again.
        stopped = held.with_(access_token=None, in_flight=None, stopped=action, metadata=None)
        await journal.save(record.write(journal.state, stopped))
        self._observer(
            Suspicious(self._credential, self._provider, REGISTRATION_REFUSED, "critical", action)
        )
        raise self._stopped(action)

    def _stopped(self, why: str) -> RegistrationStopped:
        return RegistrationStopped(f"registration: {why}", credential=self._credential)


class JwksDocument:
    """The registration by a JWKS document keyturn publishes for the server to fetch."""

    def __init__(
        self,
        config: JwksRegistration,
        *,
        credential: str,
        store: KvStore,
        instance_id: str,
        now: Callable[[], float],
        write: Callable[[Path, bytes, int], str | None] | None = None,
    ) -> None:
        self._config = config
        self._credential = credential
        self._store = store
        self._instance_id = instance_id
        self._now = now
        if write is None:  # here: keyturn.sinks imports the kinds
            from keyturn.sinks.files import write_file  # noqa: PLC0415 - see above

            write = write_file
        self._write = write

    async def add(
        self, journal: Journal, new: PublicKey, current: PublicKey | None
    ) -> tuple[str, ...]:
        """The new key joins the document; it signs `server_cache` after the write that
        first held it completed (a server's fetch may read the old document until then)."""
        held = record.read(journal.state, self._credential)
        joins = new["kid"] not in held.registered or held.signs_after is None
        kids = await self._publish(journal, [key for key in (current, new) if key is not None])
        if joins:
            held = record.read(journal.state, self._credential)
            signs_after = self._now() + self._config.server_cache
            journal.stage(record.write(journal.state, held.with_(signs_after=signs_after)))
        return kids

    async def remove(
        self, journal: Journal, kid: str, current: PublicKey | None
    ) -> tuple[str, ...]:
        held = record.read(journal.state, self._credential)
        journal.stage(record.write(journal.state, held.with_(signs_after=None)))
        return await self._publish(journal, [current] if current is not None else [])

    async def _publish(self, journal: Journal, keys: list[PublicKey]) -> tuple[str, ...]:
        document = json.dumps({"keys": keys}, sort_keys=True)
        if self._config.publish_to is not None:
            path = self._config.publish_to
            entry = await self._store.read(path, consistent=True)
            if entry is None or entry.data.get("jwks") != document:
                await self._store.write(
                    path,
                    {"jwks": document},
                    cas=entry.version if entry is not None else 0,
                    custom_metadata=custom_metadata(self._credential, self._instance_id),
                )
        if self._config.file is not None:
            failed = await asyncio.to_thread(
                self._write, self._config.file, document.encode(), 0o644
            )
            if failed is not None:
                raise RotationError(
                    f"registration.file: the JWKS document could not be written ({failed})",
                    credential=self._credential,
                )
        kids = tuple(key["kid"] for key in keys)
        held = record.read(journal.state, self._credential)
        journal.stage(record.write(journal.state, held.with_(registered=kids)))
        return kids


def _single_values_as_strings(body: dict[str, Any]) -> None:
    """A single-valued field the server read back as a one-element array goes back as that
    one string: the same value, in the type RFC 7591 gives it."""
    for field in SINGLE_VALUED:
        value = body.get(field)
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            body[field] = value[0]


def _json(content: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(content)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def sendable(metadata: dict[str, Any]) -> dict[str, Any]:
    """The client metadata an update may send back (RFC 7592 §2.2: without the token, the
    client URI and the server's timestamps)."""
    return {k: v for k, v in metadata.items() if k not in NOT_SENT_BACK}


def registered_kids(metadata: dict[str, Any], credential: str) -> tuple[str, ...]:
    """The key ids a client's metadata holds (none if it has no readable `jwks`)."""
    return _kids(_keys_of(metadata, credential, strict=False))


def _keys_of(metadata: dict[str, Any], credential: str, *, strict: bool = True) -> list[PublicKey]:
    """The keys of the client's `jwks` (a client registered with `jwks_uri` cannot be
    managed this way)."""
    jwks = metadata.get("jwks")
    if jwks is None and "jwks_uri" in metadata and strict:
        raise RotationError(
            "registration: the client is registered with jwks_uri, not jwks; expected "
            'registration = { method = "jwks", … } for it',
            credential=credential,
        )
    keys = jwks.get("keys") if isinstance(jwks, dict) else None
    if keys is None:
        return []
    if not isinstance(keys, list) or not all(isinstance(key, dict) for key in keys):
        if not strict:
            return []
        raise MalformedResponse(
            "registration: the client's jwks.keys is not an array of JWKs",
            credential=credential,
            field="jwks",
        )
    return keys


def _kids(keys: Sequence[PublicKey]) -> tuple[str, ...]:
    return tuple(str(key.get("kid")) for key in keys if isinstance(key.get("kid"), str))


def error_code(content: bytes) -> str | None:
    """An OAuth-style `error` code of a JSON error body, if it reads like one (never a value
    a server echoed)."""
    document = _json(content)
    code = document.get("error") if document else None
    return (
        code
        if isinstance(code, str) and code.replace("_", "").isalpha() and len(code) < 64
        else None
    )


class ThroughRotator:
    """The registration at a provider's own API, by an `exec` rotator's `register` and
    `revoke` actions. Each key is registered under a name derived from its `kid`, so a key
    registered before a crash (its id not yet stored) is found by name and kept."""

    def __init__(self, registry: KeyRegistry, *, credential: str, kind: str) -> None:
        self._registry = registry
        self._credential = credential
        self._kind = kind

    def _request(self, kid: str, public_key: PublicKey | None = None) -> RotationRequest:
        return RotationRequest(
            credential=self._credential,
            kind=self._kind,
            rotation_id=kid[:12],
            key_name=f"keyturn-{self._credential}-{kid[:12]}",
            public_key=public_key,
        )

    async def add(
        self, journal: Journal, new: PublicKey, current: PublicKey | None
    ) -> tuple[str, ...]:
        held = record.read(journal.state, self._credential)
        ids = dict(held.provider_ids)
        if new["kid"] not in ids:
            request = self._request(new["kid"], new)
            found = await self._registry.find(request) or []
            # Registered before a crash, its id never stored: the same key; keep one.
            key_id = found[0] if found else await self._registry.register(request)
            for extra in found[1:]:
                await self._registry.revoke(request, extra)
            ids[new["kid"]] = key_id
            # Stored before anything else: the id is what removes the key after the grace.
            await journal.save(record.write(journal.state, self._holding(held, ids)))
        return tuple(ids)

    async def remove(
        self, journal: Journal, kid: str, current: PublicKey | None
    ) -> tuple[str, ...]:
        held = record.read(journal.state, self._credential)
        ids = dict(held.provider_ids)
        request = self._request(kid)
        known = ids.pop(kid, None)
        for key_id in [known] if known is not None else await self._registry.find(request) or []:
            await self._registry.revoke(request, key_id)
        journal.stage(record.write(journal.state, self._holding(held, ids)))
        return tuple(ids)

    @staticmethod
    def _holding(held: record.Registration, ids: dict[str, str]) -> record.Registration:
        return held.with_(provider_ids=tuple(ids.items()), registered=tuple(ids))
