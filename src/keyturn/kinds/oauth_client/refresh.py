"""Keeping an OAuth access token fresh: the `refresh` task of an `oauth_client` credential's
job, what it publishes (`published_fields`), and the `verify` task (`ProbeAgain`).

Due? → seed a refresh token from the input (once) → token request (`refresh_token` grant if one
is held, else `client_credentials`) → store a rotated refresh token before anything is
published → probe (if configured) → publish with check-and-set → record the next due time. It
runs under the job's lease (`keyturn.jobs.job`), so a refresh token is used once, by one
instance. Each step and its failures: docs/architecture.md, "A refresh, step by step".
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from keyturn.clock import rfc3339
from keyturn.config import CredentialConfig
from keyturn.errors import (
    KeyturnError,
    MalformedResponse,
    OAuthError,
    ProbeUnanswered,
    ProviderUnavailable,
    RateLimited,
    SecretReferenceError,
    VerificationFailed,
)
from keyturn.events import (
    Published,
    RefreshTokenPlanned,
    RetryAfterBounded,
    Suspicious,
    TokenRequest,
)
from keyturn.jobs.job import Inputs, JobDeps, Journal
from keyturn.jobs.steps import (
    ProbeAuth,
    input_error,
    outcome_label,
    probe_answered,
    publish_with_cas,
    retry_after,
)
from keyturn.layout import custom_metadata
from keyturn.logs import get_logger
from keyturn.policy import refresh_due, retry_delay, token_left
from keyturn.providers.client import ClientSecret, GrantType, ProviderClient
from keyturn.providers.client_auth import ClientKey
from keyturn.providers.params import TokenParams, token_audience
from keyturn.providers.tokens import TokenResponse
from keyturn.references import SecretRef
from keyturn.secret import Secret
from keyturn.state import (
    CredentialState,
    RefreshTokenRecord,
    TokenRecord,
    fingerprint,
    fingerprint_matches,
)

# The kind's name (`keyturn.kinds.oauth_client.KIND`), in its events.
NAME = "oauth_client"

# RFC 6749 Appendix A: a refresh token is 1*VSCHAR.
_VSCHAR = re.compile(r"[\x20-\x7e]+")

# Answers to an imported refresh token that mean it cannot be used: it is not kept.
IMPORT_REFUSALS = frozenset({"invalid_grant", "unauthorized_client"})


def published_fields(
    access_token: Secret, issued_at: float, expires_at: float, refresh_at: float
) -> dict[str, str | Secret]:
    """The KV data an app reads for an OAuth credential. `refresh_at` is when keyturn plans
    to replace the token (rounded up to whole seconds: a reader that waits until then finds
    the new one or the refresh under way), so consumers can plan their re-reads."""
    return {
        "access_token": access_token,
        "token_type": "Bearer",
        "expires_at": rfc3339(expires_at),
        "issued_at": rfc3339(issued_at),
        "refresh_at": rfc3339(math.ceil(refresh_at)),
        "authorization": Secret(f"Bearer {access_token.reveal()}"),
    }


def _rejected(client: ClientSecret, error: OAuthError) -> str:
    """The client_rejected alert's words: a secret changed elsewhere, or a key or certificate
    the server does not accept (what was sent is in the error's description)."""
    if isinstance(client, Secret):
        return "invalid_client: the client secret was revoked or changed outside keyturn"
    return f"the server refused keyturn's key or certificate: {error.message}"


def valid_refresh_token(value: Secret) -> bool:
    """Whether `value` can be a refresh token (RFC 6749 VSCHAR: %x20-7E, not only spaces)."""
    return bool(_VSCHAR.fullmatch(value.reveal())) and bool(value.reveal().strip())


class RefreshTokenRefused(KeyturnError):
    """The provider refused a refresh token handed over by `keyturn import-refresh-token`; the
    record was put back as it was before the import (the refused token is not kept)."""


log = get_logger("keyturn.refresher")


@dataclass(frozen=True, slots=True)
class PendingImport:
    """A refresh token handed over by `keyturn import-refresh-token`, for one run: `restore` is
    the record's refresh-token part as it was, put back if the provider refuses it;
    `also_revoke` a replaced refresh token that had no room in `burned_refresh_token`."""

    restore: RefreshTokenRecord
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

# A new token's probe that gets no answer is sent again, alone, this many times in all, with
# these pauses between (seconds): a dropped connection must not throw a good token away.
PROBE_ATTEMPTS = 3
PROBE_PAUSES = (0.5, 1.0)
# A token published unverified is probed again this long after (and then after each probe
# that still gets no answer), until its refresh replaces it.
UNVERIFIED_RECHECK = 30.0


# Two reports of a refresh token's end this close together are the same end (the server
# counts `refresh_expires_in` from its own clock, keyturn from when it sent the request).
SAME_END = 5.0


def _scopes(scope: str | None) -> frozenset[str]:
    return frozenset(scope.split()) if scope else frozenset()


async def token_params(
    credential: CredentialConfig, resolve: Callable[[SecretRef], Awaitable[Secret]]
) -> TokenParams:
    """The credential's own token-request parameters, `token_params` references read afresh
    (one that cannot be read is an error naming the credential and the key)."""
    extra = []
    for name, ref in credential.token_params:
        try:
            extra.append((name, await resolve(ref)))
        except KeyturnError as error:
            raise input_error(error, credential.name, f"token_params.{name}") from error
    return TokenParams(credential.audience, credential.resource, tuple(extra))


def _joined(audience: tuple[str, ...] | None) -> str | None:
    """An `aud` claim as the record keeps it: its values sorted, space-separated."""
    return " ".join(sorted(audience)) if audience else None


def _shown(audience: tuple[str, ...]) -> str:
    """A server's `aud` values for a message: a few, each cut short (the server chose them)."""
    values = [value if len(value) <= 100 else value[:97] + "..." for value in sorted(audience)]
    more = f" and {len(values) - 5} more" if len(values) > 5 else ""
    return f"{values[:5]}{more}"


def _family(
    held: RefreshTokenRecord, token: TokenResponse, requested_at: float, refreshed: bool
) -> RefreshTokenRecord:
    """The refresh-token record's family fields after an answer: a refresh keeps the family
    (a record from before keyturn tracked it starts counting now), a client_credentials grant
    that returns a refresh token starts a new one. An end reported again within SAME_END keeps
    the first report, so an absolute end reads as one fixed time."""
    if token.refresh_token is None and not refreshed:
        return held
    started = held.family_started if refreshed and held.family_started is not None else None
    expires_at = None
    if token.refresh_expires_in is not None:
        expires_at = requested_at + token.refresh_expires_in
        previous = held.expires_at if refreshed else None
        if previous is not None and previous <= expires_at <= previous + SAME_END:
            expires_at = previous
    elif token.refresh_token is None:
        expires_at = held.expires_at  # the same refresh token, its end unchanged
    return replace(
        held, expires_at=expires_at, family_started=requested_at if started is None else started
    )


def _not_used(state: CredentialState) -> CredentialState:
    """The refresh token was not used by the attempt (refused before the grant, or answered
    with an error): it stays the one held, no longer in flight."""
    return replace(state, refresh=replace(state.refresh, in_flight=None))


class TokenRefresh:
    """The `refresh` task: obtains, verifies and publishes a new access token when due."""

    name = "refresh"

    def __init__(
        self, credential: CredentialConfig, client: ProviderClient, inputs: Inputs, deps: JobDeps
    ) -> None:
        self.credential = credential
        self._default_lifetime = client.provider.default_lifetime
        self._client = client
        self._recovery = client.recovery
        # When this credential last failed for want of an answer from the provider: a token
        # issued to any credential of the provider since then makes its retry due at once.
        self._failed_at: float | None = None
        # A token whose probe got no answer: probed again at the next try (no new grant).
        self._unprobed: Unsaved | None = None
        self._inputs = inputs
        self._import: PendingImport | None = None
        self._store = deps.store
        self._observer = deps.observer
        self._clock = deps.clock
        self._rng = deps.rng
        self._instance = deps.instance_id
        self._resolve = deps.resolver.resolve
        self._probe_auth = ProbeAuth.of(credential, deps)
        # The provider's absolute refresh-token family lifetime, and the family end last
        # reported (`RefreshTokenPlanned`); False: none reported yet.
        self._max_family = client.provider.refresh_token_max_lifetime
        self._reported_end: float | bool | None = False
        self._confirmed_version: int | None = None  # published version known to be ours
        # The custom metadata known to be at publish_to, and the KV version it was seen (read
        # or written) at: a publish on top of that version writes it only if it differs.
        self._metadata_at: tuple[int, dict[str, str]] | None = None
        self._unsaved: Unsaved | None = None  # an answer Vault failed to store
        # The in-flight mark of an attempt whose write failed: the refresh token was not sent
        # with it, even if Vault stored the mark (an answer lost, then a retry refused).
        self._unsent: str | None = None

    async def due(self, state: CredentialState, now: float, force: bool) -> float:
        self._report_family_end(state)
        token = state.token
        if force:
            # An operator's refresh, or the watcher's republish (which may answer custom
            # metadata changed in place): the publish writes the custom metadata.
            self._metadata_at = None
        if force or token.phase == "pending" or token.next_due is None:
            return now
        if token.phase != "ok":
            if self._recovery.answered_since(self._failed_at):
                return now  # the provider answered another of its credentials since
            return token.next_due  # failing or expired: the retry time (an unsaved answer too)
        if self._unsaved is not None or state.refresh.in_flight is not None:
            return now  # an answer to store, or a refresh token to retire, before anything else
        if token.published_version != self._confirmed_version:
            # First look in this process (e.g. after a restart): is what apps read still ours?
            published = await self._store.read_metadata(self.credential.publish_to, consistent=True)
            if published is not None:
                seen = (published.current_version, dict(published.custom_metadata))
                self._metadata_at = seen
            if published is None or published.current_version != token.published_version:
                return now
            self._confirmed_version = token.published_version
        return token.next_due

    def _report_family_end(self, state: CredentialState) -> None:
        """Tell observers when the held refresh token's family ends, when that changed."""
        ends = state.refresh.family_ends_at(self._max_family)
        if ends != self._reported_end:
            self._reported_end = ends
            name, provider = self.credential.name, self.credential.provider
            self._observer(RefreshTokenPlanned(name, provider, NAME, ends))

    def accept_refresh_token(self, journal: Journal, token: Secret) -> None:
        """`keyturn import-refresh-token`: under the lease, put `token` in the record (the job
        stores it before the run goes on); the forced run that follows refreshes with it. A
        refresh token held until now is revoked (RFC 7009) once a token of the new grant is
        published; if the provider refuses `token`, the record is put back as it was."""
        held = journal.state.refresh
        if held.in_flight is not None:  # the held token's answer was lost: burned
            held = held.burn()
        previous = held.token if held.token != token else None
        burned, also_revoke = held.burned, None
        if previous is not None:
            if burned is None:
                burned = previous
            else:
                also_revoke = previous
        self._import = PendingImport(restore=held, also_revoke=also_revoke)
        imported = replace(
            held.dropped(),
            token=token,
            burned=burned,
            refused_at=None,
            family_started=self._clock.time(),  # consent was given no later than this
        )
        journal.stage(replace(journal.state, refresh=imported))

    async def step(self, journal: Journal) -> str:
        try:
            return await self._step(journal)
        finally:
            self._import = None  # an import is for one run

    async def _carried_over(
        self, journal: Journal, state: CredentialState, now: float
    ) -> tuple[CredentialState, Unsaved | None]:
        """What the last run of this process left to finish first: its own in-flight mark whose
        token never left, an answer Vault failed to store, a refresh token whose answer was
        lost, a token whose probe got no answer. Returns the state and a token still worth
        publishing, if one is left."""
        unsaved, self._unsaved = self._unsaved, None
        unsent, self._unsent = self._unsent, None
        unprobed, self._unprobed = self._unprobed, None
        kept: Unsaved | None = None
        if unsent is not None and unsent == state.refresh.in_flight:
            # This process's own mark, whose token never left: nothing to burn.
            state = journal.stage(_not_used(state))
        if unsaved is not None and unsaved.attempt == state.refresh.in_flight:
            # The last run got an answer but could not store it (Vault failed): store it before
            # anything else. Its refresh token is the live one; the one in the record is used.
            state = await self._store_answer(journal, state, unsaved)
            if unsaved.expires_at(self._default_lifetime) - now > self.credential.refresh.margin:
                kept = unsaved
        elif state.refresh.in_flight is not None:
            state = await self._burn(journal, state, "the answer to its last use was lost")
        if kept is None and unprobed is not None and self._still_good(unprobed, now):
            # The last try's token, whose probe got no answer: probe it again, ask for no other.
            kept = unprobed
        return state, kept

    async def _step(self, journal: Journal) -> str:
        now = self._clock.time()
        state, kept = await self._carried_over(journal, journal.state, now)
        token = kept.token if kept is not None else None
        requested_at = kept.requested_at if kept is not None else now
        answer: Unsaved | None = None
        if token is None:
            token, state = await self._obtain_token(journal, state)
            answer = Unsaved(state.refresh.in_flight, token, requested_at)
        lifetime = token.expires_in if token.expires_in is not None else self._default_lifetime
        # Apps read expires_at in whole seconds (rounded down): plan from that same instant.
        issued_at, expires_at = requested_at, float(math.floor(requested_at + lifetime))
        # Planned before publishing, so apps read when keyturn means to replace this token.
        next_due = refresh_due(issued_at, expires_at, self.credential.refresh, self._rng)
        before, outcome = state, None
        if answer is not None:
            if self._may_store_outcome_first(journal, state):
                # Under check-and-set the publish creates the version after keyturn's last.
                version = (state.token.published_version or 0) + 1
                outcome = self._success(state, token, issued_at, expires_at, next_due, version)
            state = await self._store_answer(journal, state, answer, outcome)
        recorded = outcome is not None and state.token is outcome
        self._check_drift(before, token, lifetime)

        try:
            verified = True
            if self.credential.probe:
                verified = await self._verify(token, requested_at, before, now)
            published_version = await self._publish(
                token.access_token, issued_at, expires_at, next_due, before
            )
        except BaseException:
            if recorded:  # the outcome stored first did not come true: the release stores this
                journal.stage(replace(state, token=before.token))
            raise
        self._confirmed_version = published_version
        self._observer(
            Published(
                self.credential.name,
                self.credential.provider,
                NAME,
                issued_at,
                expires_at,
                verified=verified,
            )
        )
        if recorded and verified and state.token.published_version == published_version:
            journal.ended()  # the record stored before publishing is the outcome: no release
            return "refreshed"
        if state.refresh.burned is not None:  # apps now read a token of another grant
            await self._revoke(state.refresh.burned)
            state = replace(state, refresh=replace(state.refresh, burned=None))
        if self._import is not None and self._import.also_revoke is not None:
            await self._revoke(self._import.also_revoke)
        published = self._success(state, token, issued_at, expires_at, next_due, published_version)
        if not verified:
            published = replace(published, verify_at=self._clock.time() + UNVERIFIED_RECHECK)
        journal.stage(replace(state, token=published))
        return "refreshed"

    def _still_good(self, answer: Unsaved, now: float) -> bool:
        """Whether a token obtained earlier is still worth publishing: not yet past the last
        point at which keyturn would have replaced it."""
        expires_at = answer.expires_at(self._default_lifetime)
        left = token_left(answer.requested_at, expires_at, self.credential.refresh, now)
        return left is not None and not left.past_deadline

    async def _verify(
        self, token: TokenResponse, requested_at: float, before: CredentialState, now: float
    ) -> bool:
        """Probe a new token: True when the service accepted it. Only a refusal (401/403)
        blocks it (VerificationFailed). A probe that gets no answer is sent again alone; if it
        never gets one, the token is kept for the next try (ProbeUnanswered), unless the token
        apps read now would expire before that try (past its last planned refresh, or none is
        published): then False, and it is published unverified. In that case the probe is not
        sent again once the old token is about to expire (its pauses would outlast it)."""
        assert self.credential.probe is not None
        old = before.token
        left = token_left(old.issued_at, old.expires_at, self.credential.refresh, now)
        urgent = left is None or left.past_deadline or old.phase == "pending"
        unanswered: ProviderUnavailable | RateLimited | None = None
        for attempt in range(PROBE_ATTEMPTS):
            if attempt:
                pause = PROBE_PAUSES[min(attempt, len(PROBE_PAUSES)) - 1]
                # The probe's retries never cost apps the token they read now.
                left_now = None if old.expires_at is None else old.expires_at - self._clock.time()
                if urgent and left_now is not None and left_now < 2 * pause + 1:
                    break
                await self._clock.sleep(pause)
            unanswered = await probe_answered(
                self._client,
                self._observer,
                credential=self.credential.name,
                provider=self.credential.provider,
                probe=self.credential.probe,
                value=token.access_token,
                what="token",
                probe_auth=self._probe_auth,
            )
            if unanswered is None:
                return True
        assert unanswered is not None
        if urgent:
            return False
        self._unprobed = Unsaved(None, token, requested_at)
        raise ProbeUnanswered(
            f"probe {self.credential.probe} got no answer in {PROBE_ATTEMPTS} tries "
            f"({unanswered.message}); the new token is kept and probed again at the next try, "
            "nothing published",
            credential=self.credential.name,
            retry_after=unanswered.retry_after,
        ) from unanswered

    def _may_store_outcome_first(self, journal: Journal, state: CredentialState) -> bool:
        """Whether the write that stores a rotated refresh token may also store the run's
        outcome (the token part as it will be once published and verified) and let the lease
        end with the publish: only when nothing need follow the publish (no refresh token to
        revoke, no import, no other task of the job due after this one). A probe comes before
        the publish: if it refuses the token or gets no answer, nothing is published and the
        run puts the token part back (the release stores it, as after a failed publish); a
        token published unverified is recorded with its `verify_at` by a release too."""
        return (
            journal.may_end_with_publish and state.refresh.burned is None and self._import is None
        )

    def _success(
        self,
        state: CredentialState,
        token: TokenResponse,
        issued_at: float,
        expires_at: float,
        next_due: float,
        published_version: int,
    ) -> TokenRecord:
        """The token part once this run's publish created KV `published_version`, verified (a
        token published unverified gets its `verify_at` from the caller)."""
        return replace(
            state.token,
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
            verify_at=None,
            audience=_joined(token_audience(token.access_token)),
        )

    async def _store_answer(
        self,
        journal: Journal,
        state: CredentialState,
        answer: Unsaved,
        outcome: TokenRecord | None = None,
    ) -> CredentialState:
        """Promise 2: the rotated refresh token is durable before any access token is
        published. If Vault fails here the answer is kept in memory and stored first next run
        (the in-flight mark stays in the record, so a restart treats the old token as used).
        With `outcome`, the same write stores the token part as it will be once published,
        and the lease ends with that publish (`Journal.save_ending_with`)."""
        refresh_token = answer.token.refresh_token or state.refresh.token
        # Holding a refresh token again ends a refusal (see _seed_from_input).
        refused = state.refresh.refused_at if refresh_token is None else None
        stored = replace(state.refresh, token=refresh_token, in_flight=None, refused_at=refused)
        stored = _family(
            stored, answer.token, answer.requested_at, refreshed=answer.attempt is not None
        )
        if stored == state.refresh:
            # No refresh token came or went (client_credentials without one): nothing to make
            # durable first; the record is written once the token is published. The run holds
            # the lease by now: a client_credentials grant waits for it (`defers_lease`).
            return journal.stage(state)
        try:
            if outcome is not None and outcome.published_version is not None:
                return await journal.save_ending_with(
                    replace(state, refresh=stored, token=outcome), outcome.published_version
                )
            return await journal.save(replace(state, refresh=stored))
        except KeyturnError:
            if journal.raced:
                # Another writer changed the record before this run's first write: the answer
                # is not this run's to keep (its refresh token is dropped, never stored).
                log.info("refresh.record_changed_first", credential=self.credential.name)
            else:
                self._unsaved = answer
            raise

    async def _burn(self, journal: Journal, state: CredentialState, why: str) -> CredentialState:
        """A refresh token whose answer was lost may have been rotated by the provider: never
        present it again (the provider would see reuse and revoke the family). Drop it, revoke
        it where the provider offers RFC 7009 once a replacement is published (revoking the
        grant also kills the access token apps read until then), and let the next grant be
        client_credentials."""
        log.warning("refresh_token.lost", credential=self.credential.name, reason=why)
        if self._client.provider.revoke_path is None:
            # Nothing can end that family: it lives at the provider until it expires or an
            # administrator revokes it. Said where on-call looks (docs/runbook.md).
            log.warning(
                "refresh_token.orphaned",
                credential=self.credential.name,
                provider=self.credential.provider,
                reason="the provider has no revoke_path: the lost refresh token's family stays "
                "live at the provider until it expires or is revoked there",
            )
        return await journal.save(replace(state, refresh=state.refresh.burn()))

    async def _revoke(self, token: Secret) -> None:
        """Best effort: a failure here is logged; the family then lives out its lifetime."""
        try:
            client_id, client_secret = await self._inputs.client()
            revoked = await self._client.revoke_token(
                self.credential.name,
                token=token,
                token_type_hint="refresh_token",
                client_id=client_id,
                client_secret=client_secret,
            )
        except KeyturnError as error:
            log.warning(
                "refresh_token.revoke_failed", credential=self.credential.name, error=str(error)
            )
            return
        log.info(
            "refresh_token.revoked" if revoked else "refresh_token.not_revoked",
            credential=self.credential.name,
        )

    def _check_drift(self, state: CredentialState, token: TokenResponse, lifetime: float) -> None:
        """Grant drift: a token not what was asked for, or much shorter-lived than usual."""
        asked, granted = _scopes(self.credential.scope), _scopes(token.scope)
        problems = []
        if token.scope is not None and asked and granted != asked:
            extra, missing = sorted(granted - asked), sorted(asked - granted)
            problems.append(f"scope differs from what was asked (extra {extra}, missing {missing})")
        elif (
            token.scope is not None
            and state.token.scope is not None
            and granted != _scopes(state.token.scope)
        ):
            problems.append("scope differs from the previous token's")
        problems += self._audience_drift(state, token)
        previous = state.token
        if previous.issued_at is not None and previous.expires_at is not None:
            usual = previous.expires_at - previous.issued_at
            if usual > 0 and lifetime < usual * DRIFT_LIFETIME_RATIO:
                problems.append(f"lifetime dropped from {usual:.0f}s to {lifetime:.0f}s")
        if problems:
            self._observer(
                Suspicious(
                    self.credential.name,
                    self.credential.provider,
                    "grant_drift",
                    "warning",
                    "; ".join(problems),
                )
            )

    def _audience_drift(self, state: CredentialState, token: TokenResponse) -> list[str]:
        """Grant drift in the `aud` of a JWT access token (opaque tokens say nothing): the
        `audience` asked for missing from it, or it differs from the previous token's."""
        granted = token_audience(token.access_token)
        if granted is None:
            return []
        asked, shown = self.credential.audience, _shown(granted)
        if asked is not None and asked not in granted:
            return [f"aud {shown} does not include the audience asked for ({asked!r})"]
        previous = state.token.audience
        if previous is not None and previous != _joined(granted):
            return [f"aud {shown} differs from the previous token's ({previous[:200]!r})"]
        return []

    def defers_lease(self, state: CredentialState) -> bool:
        """With a refresh token held, the first write is its in-flight mark, stored before the
        token is sent and before anything is published: that write can take the lease. A
        client_credentials grant waits for the lease: instances started together would each
        send one, and every answer but one would leave the provider a token family nobody holds.
        """
        return state.refresh.token is not None

    def failed(
        self, state: CredentialState, error: KeyturnError, now: float
    ) -> tuple[CredentialState, int]:
        if isinstance(error, RefreshTokenRefused):
            # An operator's import was refused; the record is as before it, and so is the
            # credential's own standing (its schedule, its failure count).
            return state, state.token.consecutive_failures
        failures = state.token.consecutive_failures + 1
        provider_wait = isinstance(error, (ProviderUnavailable, RateLimited))
        if provider_wait:
            self._recovery.failed(self.credential.name)
            self._failed_at = now
        else:
            self._recovery.forget(self.credential.name)
            self._failed_at = None
        left = token_left(
            state.token.issued_at, state.token.expires_at, self.credential.refresh, now
        )
        asked = retry_after(error)
        retry = retry_delay(
            failures,
            self.credential.backoff,
            self._rng,
            retry_after=asked,
            left=left,
            provider_wait=provider_wait,
            crowd=self._recovery.crowd(),
        )
        expired = left is not None and left.expires_in <= 0
        if retry.retry_after is not None and asked is not None:
            name, provider = self.credential.name, self.credential.provider
            self._observer(RetryAfterBounded(name, provider, retry.retry_after, asked, expired))
        token = replace(
            state.token,
            consecutive_failures=failures,
            last_error=str(error),
            next_due=now + retry.delay,
            phase="expired" if expired else "failing",
        )
        return replace(state, token=token), failures

    async def _obtain_token(
        self, journal: Journal, state: CredentialState
    ) -> tuple[TokenResponse, CredentialState]:
        client_id, input_secret = await self._inputs.client()
        # After a client-secret rotation the current secret lives in the journal, not the input.
        rotated = state.rotation.key
        client_secret = rotated if rotated is not None else input_secret
        state = await self._seed_from_input(journal, state)
        # The refresh token held, then at most one new one from a changed input after a refusal.
        for attempt_number in range(2):
            if state.refresh.token is None:
                break
            # The intent is stored before the token leaves: if the answer is lost, the next
            # run knows the token may be used up.
            attempt = uuid.uuid4().hex[:16]
            try:
                state = await journal.save(
                    replace(state, refresh=replace(state.refresh, in_flight=attempt))
                )
            except KeyturnError:
                self._unsent = attempt
                raise
            try:
                token = await self._grant(
                    "refresh_token", client_id, client_secret, state.refresh.token, state
                )
                return token, state
            except ProviderUnavailable as error:
                if error.answer_lost:
                    await self._burn(journal, state, f"no answer to the refresh: {error.message}")
                else:  # the provider answered (5xx): the token was not used
                    journal.stage(_not_used(state))
                raise
            except MalformedResponse:
                # A 2xx keyturn cannot read may still have rotated the token.
                await self._burn(journal, state, "the answer to the refresh was malformed")
                raise
            except OAuthError as error:
                if self._import is not None and error.error in IMPORT_REFUSALS:
                    raise await self._refuse_import(journal, state, error, self._import) from error
                if error.error != "invalid_grant":
                    journal.stage(_not_used(state))
                    raise
                # The refresh token keyturn alone should hold was refused: it expired, was
                # revoked, or someone else used it (RFC 9700 reuse detection). Report, drop it.
                self._observer(
                    Suspicious(
                        self.credential.name,
                        self.credential.provider,
                        "refresh_token_rejected",
                        "critical",
                        "invalid_grant on a refresh token only keyturn should hold; "
                        "falling back to client_credentials",
                    )
                )
                refused = replace(
                    state.refresh.dropped(), in_flight=None, refused_at=self._clock.time()
                )
                state = journal.stage(replace(state, refresh=refused))
                if attempt_number == 0:
                    state = await self._seed_from_input(journal, state)
            except KeyturnError:  # rate limited, or refused before the grant: not used
                journal.stage(_not_used(state))
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
        if state.refresh.token is not None:
            return state
        refused = state.refresh.refused_at is not None
        seeded = state.refresh.input_fingerprint
        if seeded is not None and not refused:
            return state
        try:
            value = await self._inputs.refresh_token()
            if value is not None and not valid_refresh_token(value):
                raise SecretReferenceError(
                    "the value contains a character outside %x20-7E (RFC 6749 VSCHAR)"
                )
        except KeyturnError as error:
            named = input_error(error, self.credential.name, "refresh_token")
            if not refused:
                raise named from error
            log.warning(
                "refresh_token.input_unreadable",
                credential=self.credential.name,
                error=named.message,
            )
            return state
        if value is None:  # no refresh_token input: keyturn starts from client_credentials
            return state
        if seeded is not None and fingerprint_matches(seeded, value):
            log.info("refresh_token.input_unchanged", credential=self.credential.name)
            return state
        log.info("refresh_token.seeded", credential=self.credential.name, after_refusal=refused)
        seed = replace(
            state.refresh.dropped(),
            token=value,
            input_fingerprint=fingerprint(value),
            refused_at=None,
            family_started=self._clock.time(),  # consent was given no later than this
        )
        return journal.stage(replace(state, refresh=seed))

    async def _refuse_import(
        self, journal: Journal, state: CredentialState, error: OAuthError, pending: PendingImport
    ) -> KeyturnError:
        """The imported refresh token was refused: put the record's refresh-token fields back as
        they were before the import (durably, before the operator is told), keep nothing of it.
        """
        before = pending.restore
        restored = replace(
            state,
            refresh=replace(
                state.refresh,
                token=before.token,
                burned=before.burned,
                refused_at=before.refused_at,
                in_flight=None,
                expires_at=before.expires_at,
                family_started=before.family_started,
            ),
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
                self.credential.name,
                "refresh_token",
                like=failure,
            )
        return RefreshTokenRefused(
            f"refresh_token: {refusal}; it was not kept", credential=self.credential.name
        )

    async def _grant(
        self,
        grant_type: GrantType,
        client_id: str,
        client_secret: ClientSecret,
        refresh_token: Secret | None,
        state: CredentialState,
    ) -> TokenResponse:
        try:
            return await self._timed_request(grant_type, client_id, client_secret, refresh_token)
        except OAuthError as error:
            if error.error != "invalid_client":
                raise
            fresh_id, fresh_secret = (client_id, client_secret)
            if state.rotation.key is None:  # the input may have changed at its source since read
                fresh_id, fresh_secret = await self._inputs.client(fresh=True)
            if (fresh_id, fresh_secret) == (client_id, client_secret):
                self._observer(
                    Suspicious(
                        self.credential.name,
                        self.credential.provider,
                        "client_rejected",
                        "critical",
                        _rejected(client_secret, error),
                    )
                )
                raise
            return await self._timed_request(grant_type, fresh_id, fresh_secret, refresh_token)

    async def _timed_request(
        self,
        grant_type: GrantType,
        client_id: str,
        client_secret: ClientSecret,
        refresh_token: Secret | None,
    ) -> TokenResponse:
        started = self._clock.monotonic()
        outcome = "success"
        try:
            token = await self._client.request_token(
                self.credential.name,
                grant_type=grant_type,
                client_id=client_id,
                client_secret=client_secret,
                refresh_token=refresh_token,
                scope=self.credential.scope,
                params=await token_params(self.credential, self._resolve),
            )
            self._failed_at = None
            self._recovery.answered(self.credential.name, self._clock.time())
            return token
        except KeyturnError as error:
            outcome = outcome_label(error)
            raise
        finally:
            self._observer(
                TokenRequest(
                    self.credential.name,
                    self.credential.provider,
                    # A JWT bearer grant stands where client credentials would.
                    "jwt_bearer"
                    if grant_type == "client_credentials" and self.credential.grant == "jwt_bearer"
                    else grant_type,
                    outcome,
                    self._clock.monotonic() - started,
                )
            )

    async def _publish(
        self,
        access_token: Secret,
        issued_at: float,
        expires_at: float,
        refresh_at: float,
        state: CredentialState,
    ) -> int:
        """Publish the token; the custom metadata only when the path does not hold it already
        (as this process wrote or read it there at the version this publish goes on top of)."""
        metadata = custom_metadata(self.credential.name, self._instance)
        last = state.token.published_version
        known, self._metadata_at = self._metadata_at, None  # unknown if the publish fails
        version = await publish_with_cas(
            self._store,
            self._observer,
            path=self.credential.publish_to,
            data={
                **published_fields(access_token, issued_at, expires_at, refresh_at),
                **await self._binding(),
            },
            metadata=metadata,
            last_version=last,
            credential=self.credential.name,
            provider=self.credential.provider,
            metadata_in_place=last is not None and known == (last, metadata),
        )
        self._metadata_at = (version, metadata)
        return version

    async def _binding(self) -> dict[str, str | Secret]:
        """What an app needs to use a certificate-bound token (RFC 8705 §3): the certificate
        to present, and the `cnf` thumbprint the token names (docs/consuming.md)."""
        if self.credential.client_auth not in ("tls_client_auth", "self_signed_tls_client_auth"):
            return {}
        _, client = await self._inputs.client()
        if not isinstance(client, ClientKey) or client.tls is None:
            return {}
        return {
            "client_certificate": client.tls.certificate,
            "cnf_x5t_s256": client.tls.thumbprint,
        }


class ProbeAgain:
    """The `verify` task of a credential with a probe: a token published unverified (its probe
    got no answer when it was new, `TokenRefresh._verify`) is probed again every
    UNVERIFIED_RECHECK seconds until the service answers. 2xx: verified. 401/403: the token is
    refused (reported as `fresh_credential_rejected` by the probe step) and a refresh is due at
    once. A token replaced meanwhile (by a refresh, or outside keyturn) needs no probe."""

    name = "verify"

    def __init__(self, credential: CredentialConfig, client: ProviderClient, deps: JobDeps) -> None:
        assert credential.probe is not None
        self.credential = credential
        self._probe = credential.probe
        self._probe_auth = ProbeAuth.of(credential, deps)
        self._client = client
        self._store = deps.store
        self._observer = deps.observer
        self._clock = deps.clock

    async def due(self, state: CredentialState, now: float, force: bool) -> float:
        at = state.token.verify_at
        return at if at is not None else math.inf

    async def step(self, journal: Journal) -> str:
        state = journal.state
        now = self._clock.time()
        entry = await self._store.read(self.credential.publish_to, consistent=True)
        access_token = entry.data.get("access_token") if entry is not None else None
        if entry is None or entry.version != state.token.published_version or not access_token:
            journal.stage(replace(state, token=replace(state.token, verify_at=None)))
            return "replaced"
        try:
            unanswered = await probe_answered(
                self._client,
                self._observer,
                credential=self.credential.name,
                provider=self.credential.provider,
                probe=self._probe,
                value=Secret(str(access_token)),
                what="token (published unverified)",
                probe_auth=self._probe_auth,
            )
        except VerificationFailed:
            # Refused now: apps must not keep it a moment longer than a refresh takes.
            refused = replace(state.token, verify_at=None, next_due=now)
            journal.stage(replace(state, token=refused))
            log.warning("credential.unverified_token_refused", credential=self.credential.name)
            return "refused"
        if unanswered is not None:
            again = replace(state.token, verify_at=now + UNVERIFIED_RECHECK)
            journal.stage(replace(state, token=again))
            return "unverified"
        journal.stage(replace(state, token=replace(state.token, verify_at=None)))
        log.info("credential.verified", credential=self.credential.name)
        return "verified"

    def failed(
        self, state: CredentialState, error: KeyturnError, now: float
    ) -> tuple[CredentialState, int]:
        """Vault could not be read: try again later; the refresh's own standing is untouched."""
        again = replace(state.token, verify_at=now + UNVERIFIED_RECHECK)
        return replace(state, token=again), state.token.consecutive_failures

    def defers_lease(self, state: CredentialState) -> bool:
        return False  # it probes before it writes
