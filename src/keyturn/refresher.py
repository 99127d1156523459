"""Keeping an OAuth access token fresh: the `refresh` task of a credential's job.

    due? ── the stored next_due (drawn from the refresh window at the last success), or now
     │      if never refreshed, failing past its retry time, or apps read something else
    seed a starting refresh token from the `refresh_token` input (once; again only after
     │            the provider refused the held one and the input has changed since)
    token request (refresh_token grant if one is held, else client_credentials;
     │            invalid_grant on a refresh: report, drop it, fall back)
    store a rotated refresh token in the journal (CAS) ── before anything is published
     │
    probe the new token (if configured) ── 401/403: VerificationFailed, nothing published
     │
    publish with CAS (+ custom_metadata) ── conflict: someone else wrote; report, publish anew
     │
    record success and the next due time

The job (`keyturn.job`) holds the lease around this, so a refresh token is used at most once,
by one instance (promise 2). `keyturn import-refresh-token` hands a refresh token over through
`TokenRefresh.accept_refresh_token` under the same lease, then runs this task with it.
"""

from __future__ import annotations

import math
import random
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from keyturn.clock import Clock
from keyturn.errors import (
    KeyturnError,
    MalformedResponse,
    OAuthError,
    ProviderUnavailable,
    RateLimited,
    SecretReferenceError,
    VaultCasConflict,
    VaultError,
    VerificationFailed,
)
from keyturn.events import Observer
from keyturn.job import CredentialJob, Journal, LeaseHeld, Outcome, Task
from keyturn.layout import (
    CredentialState,
    fingerprint,
    fingerprint_matches,
    oauth_published_fields,
    published_metadata,
)
from keyturn.logs import get_logger
from keyturn.policy import BackoffPolicy, RefreshPolicy, refresh_due, retry_delay
from keyturn.providers.client import GrantType, ProviderClient
from keyturn.providers.tokens import TokenResponse, error_label
from keyturn.secret import Secret
from keyturn.vault.store import KvStore

__all__ = [
    "LeaseHeld",
    "OAuthRefresher",
    "OAuthTarget",
    "Outcome",
    "RefreshTokenRefused",
    "TokenRefresh",
]

KIND = "oauth_client"

# Resolves (client_id, client_secret) for a credential; `fresh=True` bypasses any cache.
InputSource = Callable[[str, bool], Awaitable[tuple[str, Secret]]]
# Resolves a credential's `refresh_token` input afresh (never cached: it is read rarely).
RefreshTokenInput = Callable[[], Awaitable[Secret]]

# RFC 6749 Appendix A: a refresh token is 1*VSCHAR.
_VSCHAR = re.compile(r"[\x20-\x7e]+")

# Answers to an imported refresh token that mean it cannot be used: it is not kept.
IMPORT_REFUSALS = frozenset({"invalid_grant", "unauthorized_client"})


def valid_refresh_token(value: Secret) -> bool:
    """Whether `value` can be a refresh token (RFC 6749 VSCHAR: %x20-7E, not only spaces)."""
    return bool(_VSCHAR.fullmatch(value.reveal())) and bool(value.reveal().strip())


class RefreshTokenRefused(KeyturnError):
    """The provider refused a refresh token handed over by `keyturn import-refresh-token`; the
    record was put back as it was before the import (the refused token is not kept)."""


@dataclass(frozen=True, slots=True)
class OAuthTarget:
    """Everything the refresh needs to know about one credential (from the configuration)."""

    name: str
    provider: str
    publish_to: str
    probe: str | None = None
    scope: str | None = None
    refresh: RefreshPolicy = field(default_factory=RefreshPolicy)
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    default_lifetime: float = 3600.0


log = get_logger("keyturn.refresher")


@dataclass(frozen=True, slots=True)
class PendingImport:
    """A refresh token handed over by `keyturn import-refresh-token`, for one run: `restore` is
    the record's refresh-token fields as they were, put back if the provider refuses it;
    `also_revoke` a replaced refresh token that had no room in `burned_refresh_token`."""

    restore: CredentialState
    also_revoke: Secret | None = None


@dataclass(frozen=True, slots=True)
class Unsaved:
    """A token answer not yet stored in the record: `attempt` is the in-flight mark it answers
    (None for a client_credentials grant)."""

    attempt: str | None
    token: TokenResponse
    requested_at: float

    def expires_at(self, default_lifetime: float) -> float:
        lifetime = self.token.expires_in
        return self.requested_at + (lifetime if lifetime is not None else default_lifetime)


# A token living less than this share of the previous one's lifetime counts as drift.
DRIFT_LIFETIME_RATIO = 0.5


def _scopes(scope: str | None) -> frozenset[str]:
    return frozenset(scope.split()) if scope else frozenset()


def outcome_label(error: BaseException) -> str:
    """The `outcome` label for a failed token request (bounded set)."""
    if isinstance(error, OAuthError):
        return error_label(error.error)
    if isinstance(error, RateLimited):
        return "rate_limited"
    if isinstance(error, ProviderUnavailable):
        return "http_5xx" if error.status else "network"
    if isinstance(error, MalformedResponse):
        return "malformed"
    return "error"


def retry_after(error: KeyturnError) -> float | None:
    """A server's Retry-After carried by a 429 or a 5xx, if any."""
    if isinstance(error, (RateLimited, ProviderUnavailable)):
        return error.retry_after
    return None


async def verify_with_probe(
    client: ProviderClient,
    observer: Observer,
    *,
    credential: str,
    provider: str,
    probe: str,
    authorization: Secret,
    what: str,
) -> None:
    """Call `probe` with a credential issued just now; only a 2xx lets it be published."""
    status = await client.probe(credential, probe, authorization)
    observer.probe(credential, provider, status)
    if status in (401, 403):
        observer.suspicious(
            credential,
            provider,
            "fresh_credential_rejected",
            "critical",
            f"a {what} issued just now was rejected with {status} on {probe}",
        )
        raise VerificationFailed(
            f"new {what} rejected by probe {probe} (HTTP {status}); nothing published",
            credential=credential,
            status=status,
        )
    if not 200 <= status < 300:
        raise VerificationFailed(
            f"probe {probe} answered HTTP {status}; nothing published",
            credential=credential,
            status=status,
        )


class TokenRefresh:
    """The `refresh` task: obtains, verifies and publishes a new access token when due."""

    name = "refresh"

    def __init__(
        self,
        target: OAuthTarget,
        *,
        client: ProviderClient,
        store: KvStore,
        inputs: InputSource,
        observer: Observer,
        clock: Clock,
        rng: random.Random,
        instance_id: str,
        refresh_token_input: RefreshTokenInput | None = None,
    ) -> None:
        self.target = target
        self._client = client
        self._store = store
        self._inputs = inputs
        self._refresh_token_input = refresh_token_input
        self._import: PendingImport | None = None
        self._observer = observer
        self._clock = clock
        self._rng = rng
        self._instance = instance_id
        self._confirmed_version: int | None = None  # published version known to be ours
        self._unsaved: Unsaved | None = None  # an answer Vault failed to store

    async def due(self, state: CredentialState, now: float, force: bool) -> float:
        if force or state.phase == "pending" or state.next_due is None:
            return now
        if state.phase != "ok":
            return state.next_due  # failing or expired: the retry time (an unsaved answer too)
        if self._unsaved is not None or state.refresh_in_flight is not None:
            return now  # an answer to store, or a refresh token to retire, before anything else
        if state.published_version != self._confirmed_version:
            # First look in this process (e.g. after a restart): is what apps read still ours?
            published = await self._store.read_metadata(self.target.publish_to, consistent=True)
            if published is None or published.current_version != state.published_version:
                return now
            self._confirmed_version = state.published_version
        return state.next_due

    def accept_refresh_token(self, journal: Journal, token: Secret) -> None:
        """`keyturn import-refresh-token`: under the lease, put `token` in the record (the job
        stores it before the run goes on); the forced run that follows refreshes with it. A
        refresh token held until now is revoked (RFC 7009) once a token of the new grant is
        published; if the provider refuses `token`, the record is put back as it was."""
        state = journal.state
        if state.refresh_in_flight is not None:  # the held token's answer was lost: burned
            state = state.with_(
                refresh_token=None,
                refresh_in_flight=None,
                burned_refresh_token=state.refresh_token or state.burned_refresh_token,
            )
        previous = state.refresh_token if state.refresh_token != token else None
        burned, also_revoke = state.burned_refresh_token, None
        if previous is not None:
            if burned is None:
                burned = previous
            else:
                also_revoke = previous
        self._import = PendingImport(restore=state, also_revoke=also_revoke)
        journal.stage(
            state.with_(
                refresh_token=token, burned_refresh_token=burned, refresh_token_refused_at=None
            )
        )

    async def step(self, journal: Journal) -> str:
        try:
            return await self._step(journal)
        finally:
            self._import = None  # an import is for one run

    async def _step(self, journal: Journal) -> str:
        state = journal.state
        now = self._clock.time()
        token: TokenResponse | None = None
        requested_at = now
        unsaved, self._unsaved = self._unsaved, None
        if unsaved is not None and unsaved.attempt == state.refresh_in_flight:
            # The last run got an answer but could not store it (Vault failed): store it before
            # anything else. Its refresh token is the live one; the one in the record is used.
            state = await self._store_answer(journal, state, unsaved)
            if unsaved.expires_at(self.target.default_lifetime) - now > self.target.refresh.margin:
                token, requested_at = unsaved.token, unsaved.requested_at
        elif state.refresh_in_flight is not None:
            state = await self._burn(journal, state, "the answer to its last use was lost")
        if token is None:
            token, state = await self._obtain_token(journal, state)
            state = await self._store_answer(
                journal, state, Unsaved(state.refresh_in_flight, token, requested_at)
            )
        lifetime = (
            token.expires_in if token.expires_in is not None else self.target.default_lifetime
        )
        # Apps read expires_at in whole seconds (rounded down): plan from that same instant.
        issued_at, expires_at = requested_at, float(math.floor(requested_at + lifetime))
        self._check_drift(state, token, lifetime)

        if self.target.probe:
            await verify_with_probe(
                self._client,
                self._observer,
                credential=self.target.name,
                provider=self.target.provider,
                probe=self.target.probe,
                authorization=Secret(f"Bearer {token.access_token.reveal()}"),
                what="token",
            )
        # Planned before publishing, so apps read when keyturn means to replace this token.
        next_due = refresh_due(issued_at, expires_at, self.target.refresh, self._rng)
        published_version = await self._publish(
            token.access_token, issued_at, expires_at, next_due, state
        )
        self._confirmed_version = published_version
        if state.burned_refresh_token is not None:  # apps now read a token of another grant
            await self._revoke(state.burned_refresh_token)
            state = state.with_(burned_refresh_token=None)
        if self._import is not None and self._import.also_revoke is not None:
            await self._revoke(self._import.also_revoke)
        journal.stage(
            state.with_(
                issued_at=issued_at,
                expires_at=expires_at,
                scope=token.scope,
                published_version=published_version,
                writer=self._instance,
                last_success=self._clock.time(),
                last_error=None,
                consecutive_failures=0,
                next_due=next_due,
                phase="ok",
            )
        )
        self._observer.published(
            self.target.name, self.target.provider, KIND, issued_at, expires_at
        )
        return "refreshed"

    async def _store_answer(
        self, journal: Journal, state: CredentialState, answer: Unsaved
    ) -> CredentialState:
        """Promise 2: the rotated refresh token is durable before any access token is
        published. If Vault fails here the answer is kept in memory and stored first next run
        (the in-flight mark stays in the record, so a restart treats the old token as used)."""
        refresh_token = answer.token.refresh_token or state.refresh_token
        # Holding a refresh token again ends a refusal (see _seed_from_input).
        refused = state.refresh_token_refused_at if refresh_token is None else None
        try:
            return await journal.save(
                state.with_(
                    refresh_token=refresh_token,
                    refresh_in_flight=None,
                    refresh_token_refused_at=refused,
                )
            )
        except KeyturnError:
            self._unsaved = answer
            raise

    async def _burn(self, journal: Journal, state: CredentialState, why: str) -> CredentialState:
        """A refresh token whose answer was lost may have been rotated by the provider: never
        present it again (the provider would see reuse and revoke the family). Drop it, revoke
        it where the provider offers RFC 7009 once a replacement is published (revoking the
        grant also kills the access token apps read until then), and let the next grant be
        client_credentials."""
        log.warning("refresh_token.lost", credential=self.target.name, reason=why)
        return await journal.save(
            state.with_(
                refresh_token=None,
                refresh_in_flight=None,
                burned_refresh_token=state.refresh_token or state.burned_refresh_token,
            )
        )

    async def _revoke(self, token: Secret) -> None:
        """Best effort: a failure here is logged; the family then lives out its lifetime."""
        try:
            client_id, client_secret = await self._inputs(self.target.name, False)
            revoked = await self._client.revoke_token(
                self.target.name,
                token=token,
                token_type_hint="refresh_token",
                client_id=client_id,
                client_secret=client_secret,
            )
        except KeyturnError as error:
            log.warning(
                "refresh_token.revoke_failed", credential=self.target.name, error=str(error)
            )
            return
        log.info(
            "refresh_token.revoked" if revoked else "refresh_token.not_revoked",
            credential=self.target.name,
        )

    def _check_drift(self, state: CredentialState, token: TokenResponse, lifetime: float) -> None:
        """Grant drift: a token not what was asked for, or much shorter-lived than usual."""
        asked, granted = _scopes(self.target.scope), _scopes(token.scope)
        problems = []
        if token.scope is not None and asked and granted != asked:
            extra, missing = sorted(granted - asked), sorted(asked - granted)
            problems.append(f"scope differs from what was asked (extra {extra}, missing {missing})")
        elif (
            token.scope is not None and state.scope is not None and granted != _scopes(state.scope)
        ):
            problems.append("scope differs from the previous token's")
        if state.issued_at is not None and state.expires_at is not None:
            usual = state.expires_at - state.issued_at
            if usual > 0 and lifetime < usual * DRIFT_LIFETIME_RATIO:
                problems.append(f"lifetime dropped from {usual:.0f}s to {lifetime:.0f}s")
        if problems:
            self._observer.suspicious(
                self.target.name,
                self.target.provider,
                "grant_drift",
                "warning",
                "; ".join(problems),
            )

    def failed(
        self, state: CredentialState, error: KeyturnError, now: float
    ) -> tuple[CredentialState, int]:
        if isinstance(error, RefreshTokenRefused):
            # An operator's import was refused; the record is as before it, and so is the
            # credential's own standing (its schedule, its failure count).
            return state, state.consecutive_failures
        failures = state.consecutive_failures + 1
        remaining = state.expires_at - now if state.expires_at is not None else None
        delay = retry_delay(
            failures,
            self.target.backoff,
            self._rng,
            retry_after=retry_after(error),
            remaining=remaining,
        )
        expired = remaining is not None and remaining <= 0
        state = state.with_(
            consecutive_failures=failures,
            last_error=str(error),
            next_due=now + delay,
            phase="expired" if expired else "failing",
        )
        return state, failures

    async def _obtain_token(
        self, journal: Journal, state: CredentialState
    ) -> tuple[TokenResponse, CredentialState]:
        client_id, input_secret = await self._inputs(self.target.name, False)
        # After a client-secret rotation the current secret lives in the journal, not the input.
        client_secret = state.key if state.key is not None else input_secret
        state = await self._seed_from_input(journal, state)
        # The refresh token held, then at most one new one from a changed input after a refusal.
        for attempt_number in range(2):
            if state.refresh_token is None:
                break
            # The intent is stored before the token leaves: if the answer is lost, the next
            # run knows the token may be used up.
            attempt = uuid.uuid4().hex[:16]
            state = await journal.save(state.with_(refresh_in_flight=attempt))
            try:
                token = await self._grant(
                    "refresh_token", client_id, client_secret, state.refresh_token, state
                )
                return token, state
            except ProviderUnavailable as error:
                if error.answer_lost:
                    await self._burn(journal, state, f"no answer to the refresh: {error.message}")
                else:  # the provider answered (5xx): the token was not used
                    journal.stage(state.with_(refresh_in_flight=None))
                raise
            except MalformedResponse:
                # A 2xx keyturn cannot read may still have rotated the token.
                await self._burn(journal, state, "the answer to the refresh was malformed")
                raise
            except OAuthError as error:
                if self._import is not None and error.error in IMPORT_REFUSALS:
                    raise await self._refuse_import(journal, state, error, self._import) from error
                if error.error != "invalid_grant":
                    journal.stage(state.with_(refresh_in_flight=None))
                    raise
                # The refresh token keyturn alone should hold was refused: it expired, was
                # revoked, or someone else used it (RFC 9700 reuse detection). Report, drop it.
                self._observer.suspicious(
                    self.target.name,
                    self.target.provider,
                    "refresh_token_rejected",
                    "critical",
                    "invalid_grant on a refresh token only keyturn should hold; "
                    "falling back to client_credentials",
                )
                state = journal.stage(
                    state.with_(
                        refresh_token=None,
                        refresh_in_flight=None,
                        refresh_token_refused_at=self._clock.time(),
                    )
                )
                if attempt_number == 0:
                    state = await self._seed_from_input(journal, state)
            except KeyturnError:  # rate limited, or refused before the grant: not used
                journal.stage(state.with_(refresh_in_flight=None))
                raise
        token = await self._grant("client_credentials", client_id, client_secret, None, state)
        return token, state

    async def _seed_from_input(self, journal: Journal, state: CredentialState) -> CredentialState:
        """Take the `refresh_token` input into the record when keyturn holds no refresh token
        and either never seeded from it, or the provider refused the one it held and the input
        has changed since it was seeded (compared by fingerprint; the value is never kept
        outside the refresh_token field). Otherwise the input is not read: keyturn owns the
        refresh token, rotating it as the provider returns new ones.

        A first seed that cannot be read fails the run (backoff; the other credentials are not
        affected). After a refusal, an unreadable or unchanged input means client_credentials.
        The seeded token is staged here and stored with the in-flight mark, before it is sent.
        """
        if self._refresh_token_input is None or state.refresh_token is not None:
            return state
        refused = state.refresh_token_refused_at is not None
        seeded = state.refresh_token_input_fingerprint
        if seeded is not None and not refused:
            return state
        try:
            value = await self._refresh_token_input()
            if not valid_refresh_token(value):
                raise SecretReferenceError(
                    "the value contains a character outside %x20-7E (RFC 6749 VSCHAR)"
                )
        except KeyturnError as error:
            named = input_error(error, self.target.name, "refresh_token")
            if not refused:
                raise named from error
            log.warning(
                "refresh_token.input_unreadable", credential=self.target.name, error=named.message
            )
            return state
        if seeded is not None and fingerprint_matches(seeded, value):
            log.info("refresh_token.input_unchanged", credential=self.target.name)
            return state
        log.info("refresh_token.seeded", credential=self.target.name, after_refusal=refused)
        return journal.stage(
            state.with_(
                refresh_token=value,
                refresh_token_input_fingerprint=fingerprint(value),
                refresh_token_refused_at=None,
            )
        )

    async def _refuse_import(
        self, journal: Journal, state: CredentialState, error: OAuthError, pending: PendingImport
    ) -> KeyturnError:
        """The imported refresh token was refused: put the record's refresh-token fields back as
        they were before the import (durably, before the operator is told), keep nothing of it.
        """
        before = pending.restore
        restored = state.with_(
            refresh_token=before.refresh_token,
            burned_refresh_token=before.burned_refresh_token,
            refresh_token_refused_at=before.refresh_token_refused_at,
            refresh_in_flight=None,
        )
        refusal = f"the provider refused the imported refresh token ({error.message})"
        try:
            await journal.save(restored)
        except KeyturnError as failure:
            # The record still holds it, marked in flight: the next run never presents it.
            return input_error(
                KeyturnError(
                    f"{refusal}, and the record could not be put back ({failure.message}); "
                    "it is marked as used and never sent again"
                ),
                self.target.name,
                "refresh_token",
                like=failure,
            )
        return RefreshTokenRefused(
            f"refresh_token: {refusal}; it was not kept", credential=self.target.name
        )

    async def _grant(
        self,
        grant_type: GrantType,
        client_id: str,
        client_secret: Secret,
        refresh_token: Secret | None,
        state: CredentialState,
    ) -> TokenResponse:
        try:
            return await self._timed_request(grant_type, client_id, client_secret, refresh_token)
        except OAuthError as error:
            if error.error != "invalid_client":
                raise
            fresh_id, fresh_secret = (client_id, client_secret)
            if state.key is None:  # the input may have been changed at its source since read
                fresh_id, fresh_secret = await self._inputs(self.target.name, True)
            if (fresh_id, fresh_secret) == (client_id, client_secret):
                self._observer.suspicious(
                    self.target.name,
                    self.target.provider,
                    "client_rejected",
                    "critical",
                    "invalid_client: the client secret was revoked or changed outside keyturn",
                )
                raise
            return await self._timed_request(grant_type, fresh_id, fresh_secret, refresh_token)

    async def _timed_request(
        self,
        grant_type: GrantType,
        client_id: str,
        client_secret: Secret,
        refresh_token: Secret | None,
    ) -> TokenResponse:
        started = self._clock.monotonic()
        outcome = "success"
        try:
            return await self._client.request_token(
                self.target.name,
                grant_type=grant_type,
                client_id=client_id,
                client_secret=client_secret,
                refresh_token=refresh_token,
                scope=self.target.scope,
            )
        except KeyturnError as error:
            outcome = outcome_label(error)
            raise
        finally:
            self._observer.token_request(
                self.target.name,
                self.target.provider,
                grant_type,
                outcome,
                self._clock.monotonic() - started,
            )

    async def _publish(
        self,
        access_token: Secret,
        issued_at: float,
        expires_at: float,
        refresh_at: float,
        state: CredentialState,
    ) -> int:
        return await publish_with_cas(
            self._store,
            self._observer,
            path=self.target.publish_to,
            data=oauth_published_fields(access_token, issued_at, expires_at, refresh_at),
            metadata=published_metadata(
                self.target.name, expires_at, self._instance, refresh_at=refresh_at
            ),
            last_version=state.published_version,
            credential=self.target.name,
            provider=self.target.provider,
        )


async def publish_with_cas(
    store: KvStore,
    observer: Observer,
    *,
    path: str,
    data: dict[str, str | Secret],
    metadata: dict[str, str],
    last_version: int | None,
    credential: str,
    provider: str,
    report: bool = True,
) -> int:
    """Write what apps read, on top of the version keyturn last wrote.

    A CAS conflict means someone else wrote the path: it is reported, and keyturn publishes
    anew on top of the current version so apps get a working credential again. (A crash
    between publishing and recording it looks the same, and is reported too: KV metadata cannot
    prove who wrote a version.)
    """
    try:
        return await store.write(path, data, cas=last_version or 0, custom_metadata=metadata)
    except VaultCasConflict:
        current = await store.read_metadata(path, consistent=True)
        seen = current.current_version if current else 0
        if last_version is not None and report:
            observer.suspicious(
                credential,
                provider,
                "published_secret_changed",
                "warning",
                f"published path was at version {seen}, keyturn last wrote {last_version}",
            )
        return await store.write(path, data, cas=seen, custom_metadata=metadata)


def input_error(
    error: KeyturnError, credential: str, field: str, *, like: KeyturnError | None = None
) -> KeyturnError:
    """`error` (e.g. from resolving an input) with the credential and the field named. A Vault
    error (`error`, or `like` when given) keeps its type, so a Vault outage is still retried as
    one when Vault is back."""
    message = f"{field}: {error.message}"
    kind = like if like is not None else error
    if isinstance(kind, VaultError):
        return type(kind)(message, credential=credential)
    return SecretReferenceError(message, credential=credential)


def OAuthRefresher(  # reads as a class at call sites; builds the job
    target: OAuthTarget,
    *,
    client: ProviderClient,
    store: KvStore,
    inputs: InputSource,
    observer: Observer,
    clock: Clock,
    rng: random.Random,
    instance_id: str,
    state_prefix: str,
    lease_seconds: float = 30.0,
    extra_tasks: tuple[Task, ...] = (),
    refresh_token_input: RefreshTokenInput | None = None,
) -> CredentialJob:
    """A job for an OAuth credential: the token refresh, then optional tasks (client-secret
    rotation). `refresh_token_input` resolves the credential's `refresh_token` input (a
    starting refresh token), if it has one."""
    refresh = TokenRefresh(
        target,
        client=client,
        store=store,
        inputs=inputs,
        observer=observer,
        clock=clock,
        rng=rng,
        instance_id=instance_id,
        refresh_token_input=refresh_token_input,
    )
    return CredentialJob(
        target.name,
        provider=target.provider,
        kind=KIND,
        # The refresh first: a slow rotator must never delay a token that is due (the secret
        # it uses stays valid through the rotation's grace period).
        tasks=[refresh, *extra_tasks],
        store=store,
        observer=observer,
        clock=clock,
        rng=rng,
        instance_id=instance_id,
        state_prefix=state_prefix,
        lease_seconds=lease_seconds,
        backoff=target.backoff,
    )
