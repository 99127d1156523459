"""One OAuth credential's refresh, start to finish, safe to run from several processes.

    read state ─ still fresh? ─yes─> plan the next run, nothing requested
        │no
    take the lease (CAS write) ─ held by another instance? ─> wait for it
        │
    token request (refresh_token grant if one is held, else client_credentials;
        │          invalid_grant on a refresh: report, drop it, fall back)
    store a rotated refresh token in private state (CAS) ── before anything is published
        │
    probe the new token (if configured) ── 401/403: VerificationFailed, nothing published
        │
    publish with CAS (+ custom_metadata) ── conflict: someone else wrote; report, publish anew
        │
    record success, release the lease, plan the next run

The lease, refresh token and published version live in one private record written with
check-and-set, so a refresh token is used at most once, by one instance (promise 2).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from keyturn.clock import Clock
from keyturn.errors import (
    KeyturnError,
    MalformedResponse,
    OAuthError,
    ProviderUnavailable,
    RateLimited,
    VaultCasConflict,
    VerificationFailed,
)
from keyturn.events import Observer
from keyturn.layout import (
    CredentialState,
    oauth_published_fields,
    published_metadata,
    state_path,
)
from keyturn.policy import BackoffPolicy, RefreshPolicy, backoff_delay, refresh_due, refresh_window
from keyturn.providers.client import GrantType, ProviderClient
from keyturn.providers.tokens import TokenResponse, error_label
from keyturn.secret import Secret
from keyturn.vault.store import KvStore

KIND = "oauth_client"

# Resolves (client_id, client_secret) for a credential; `fresh=True` bypasses any cache.
InputSource = Callable[[str, bool], Awaitable[tuple[str, Secret]]]


@dataclass(frozen=True, slots=True)
class OAuthTarget:
    """Everything the refresher needs to know about one credential (from the configuration)."""

    name: str
    provider: str
    publish_to: str
    probe: str | None = None
    scope: str | None = None
    refresh: RefreshPolicy = field(default_factory=RefreshPolicy)
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    default_lifetime: float = 3600.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a run did and when the next one is due (epoch seconds)."""

    action: str  # "refreshed" | "fresh" | "lease_held" | "failed"
    next_due: float
    state: CredentialState
    error: KeyturnError | None = None


class LeaseHeld(KeyturnError):
    retryable = True


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


class OAuthRefresher:
    """Refreshes one credential. Stateless between runs: Vault holds the state."""

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
        state_prefix: str,
        lease_seconds: float = 120.0,
    ) -> None:
        self.target = target
        self._client = client
        self._store = store
        self._inputs = inputs
        self._observer = observer
        self._clock = clock
        self._rng = rng
        self._instance = instance_id
        self._state_path = state_path(state_prefix, target.name)
        self._lease_seconds = lease_seconds
        self._failures = 0  # in memory too, so backoff grows even while Vault is unreachable

    @property
    def name(self) -> str:
        return self.target.name

    async def run(self, *, force: bool = False) -> Outcome:
        """Refresh if due (or `force`), else plan the next run. Never raises a KeyturnError:
        failures come back as an Outcome with a backoff-delayed `next_due`."""
        try:
            return await self._run(force)
        except KeyturnError as error:
            return await self._record_failure(error)

    async def _run(self, force: bool) -> Outcome:
        state, version = await self._load_state()
        now = self._clock.time()
        lifetime = None if force else await self._fresh_lifetime(state, now)
        if lifetime is not None:
            due = refresh_due(*lifetime, self.target.refresh, self._rng)
            self._observer.scheduled(self.name, self.target.provider, KIND, due)
            return Outcome("fresh", due, state)
        if state.lease_held_by_other(self._instance, now):
            return self._lease_held(state, state.lease_until or now)
        # The phase stays what the last run left (ok, failing, …): status shows the lease apart.
        leased = state.with_(lease_owner=self._instance, lease_until=now + self._lease_seconds)
        try:
            state, version = await self._write_state(leased, version)
        except VaultCasConflict:
            return self._lease_held(state, now + self._rng.uniform(0.5, 2.0))
        return await self._refresh(state, version)

    def _lease_held(self, state: CredentialState, until: float) -> Outcome:
        error = LeaseHeld(
            f"being refreshed by instance {state.lease_owner or 'unknown'}", credential=self.name
        )
        return Outcome("lease_held", until + self._rng.uniform(0.1, 1.0), state, error)

    # -- steps ---------------------------------------------------------------------------

    async def _refresh(self, state: CredentialState, version: int) -> Outcome:
        requested_at = self._clock.time()
        token, state = await self._obtain_token(state)
        lifetime = (
            token.expires_in if token.expires_in is not None else self.target.default_lifetime
        )
        issued_at, expires_at = requested_at, requested_at + lifetime

        if token.refresh_token is not None and token.refresh_token != state.refresh_token:
            state = state.with_(refresh_token=token.refresh_token)
        # Promise 2: the rotated refresh token is durable before any access token is published.
        state, version = await self._write_state(state, version)

        authorization = Secret(f"Bearer {token.access_token.reveal()}")
        if self.target.probe:
            status = await self._client.probe(self.name, self.target.probe, authorization)
            if status in (401, 403):
                self._observer.suspicious(
                    self.name,
                    self.target.provider,
                    "fresh_credential_rejected",
                    "critical",
                    f"a token issued just now was rejected with {status} on {self.target.probe}",
                )
                raise VerificationFailed(
                    f"new token rejected by probe {self.target.probe} (HTTP {status}); "
                    "nothing published",
                    credential=self.name,
                    status=status,
                )
            if not 200 <= status < 300:
                raise VerificationFailed(
                    f"probe {self.target.probe} answered HTTP {status}; nothing published",
                    credential=self.name,
                    status=status,
                )

        published_version = await self._publish(token.access_token, issued_at, expires_at, state)
        now = self._clock.time()
        due = refresh_due(issued_at, expires_at, self.target.refresh, self._rng)
        state = state.with_(
            issued_at=issued_at,
            expires_at=expires_at,
            scope=token.scope,
            published_version=published_version,
            writer=self._instance,
            lease_owner=None,
            lease_until=None,
            last_success=now,
            last_error=None,
            consecutive_failures=0,
            next_due=due,
            phase="ok",
        )
        self._failures = 0
        await self._write_state(state, version)
        self._observer.published(self.name, self.target.provider, KIND, issued_at, expires_at)
        self._observer.scheduled(self.name, self.target.provider, KIND, due)
        return Outcome("refreshed", due, state)

    async def _obtain_token(self, state: CredentialState) -> tuple[TokenResponse, CredentialState]:
        if state.refresh_token is not None:
            try:
                return await self._grant("refresh_token", state.refresh_token), state
            except OAuthError as error:
                if error.error != "invalid_grant":
                    raise
                # The refresh token keyturn alone should hold was refused: it expired, was
                # revoked, or someone else used it (RFC 9700 reuse detection). Report, drop it.
                self._observer.suspicious(
                    self.name,
                    self.target.provider,
                    "refresh_token_rejected",
                    "critical",
                    "invalid_grant on a refresh token only keyturn should hold; "
                    "falling back to client_credentials",
                )
                state = state.with_(refresh_token=None)
        return await self._grant("client_credentials", None), state

    async def _grant(self, grant_type: GrantType, refresh_token: Secret | None) -> TokenResponse:
        client_id, client_secret = await self._inputs(self.name, False)
        try:
            return await self._timed_request(grant_type, client_id, client_secret, refresh_token)
        except OAuthError as error:
            if error.error != "invalid_client":
                raise
            # The secret may have been changed in its source (e.g. Vault) since we read it.
            fresh_id, fresh_secret = await self._inputs(self.name, True)
            if (fresh_id, fresh_secret) == (client_id, client_secret):
                self._observer.suspicious(
                    self.name,
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
        try:
            token = await self._client.request_token(
                self.name,
                grant_type=grant_type,
                client_id=client_id,
                client_secret=client_secret,
                refresh_token=refresh_token,
                scope=self.target.scope,
            )
        except KeyturnError as error:
            self._observer.token_request(
                self.name,
                self.target.provider,
                grant_type,
                outcome_label(error),
                self._clock.monotonic() - started,
            )
            raise
        self._observer.token_request(
            self.name,
            self.target.provider,
            grant_type,
            "success",
            self._clock.monotonic() - started,
        )
        return token

    async def _publish(
        self, access_token: Secret, issued_at: float, expires_at: float, state: CredentialState
    ) -> int:
        data = oauth_published_fields(access_token, issued_at, expires_at)
        metadata = published_metadata(self.name, expires_at, self._instance)
        try:
            return await self._store.write(
                self.target.publish_to,
                data,
                cas=state.published_version or 0,
                custom_metadata=metadata,
            )
        except VaultCasConflict:
            current = await self._store.read_metadata(self.target.publish_to)
            seen = current.current_version if current else 0
            if state.published_version is not None:
                self._observer.suspicious(
                    self.name,
                    self.target.provider,
                    "published_secret_changed",
                    "warning",
                    f"published path was at version {seen}, keyturn last wrote "
                    f"{state.published_version}",
                )
            return await self._store.write(
                self.target.publish_to, data, cas=seen, custom_metadata=metadata
            )

    async def _record_failure(self, error: KeyturnError) -> Outcome:
        """Count the failure, plan a retry with backoff, release the lease (best effort).

        If the state cannot be read (Vault down, a malformed record) nothing is written: a
        record that may hold the refresh token is never overwritten blindly.
        """
        try:
            state, version = await self._load_state()
        except KeyturnError:
            state, version = CredentialState(), -1
        self._failures = max(self._failures, state.consecutive_failures) + 1
        failures = self._failures
        now = self._clock.time()
        retry_after = error.retry_after if isinstance(error, RateLimited) else None
        due = now + backoff_delay(failures, self.target.backoff, self._rng, retry_after)
        expired = state.expires_at is not None and state.expires_at <= now
        state = state.with_(
            consecutive_failures=failures,
            last_error=str(error),
            next_due=due,
            phase="expired" if expired else "failing",
            lease_owner=None,
            lease_until=None,
        )
        if version >= 0:
            # If this fails too, the lease expires by itself; the failure is reported below.
            with contextlib.suppress(KeyturnError):
                await self._write_state(state, version)
        self._observer.failed(self.name, self.target.provider, KIND, error, failures)
        self._observer.scheduled(self.name, self.target.provider, KIND, due)
        return Outcome("failed", due, state, error)

    # -- state -----------------------------------------------------------------------------

    async def _fresh_lifetime(
        self, state: CredentialState, now: float
    ) -> tuple[float, float] | None:
        """(issued_at, expires_at) of the current token if no refresh is due yet and apps read
        what keyturn last published; None if a refresh is due."""
        if state.issued_at is None or state.expires_at is None or state.phase != "ok":
            return None
        earliest, _ = refresh_window(state.issued_at, state.expires_at, self.target.refresh)
        if now >= earliest:
            return None
        published = await self._store.read_metadata(self.target.publish_to)
        if published is None or published.current_version != state.published_version:
            return None
        return state.issued_at, state.expires_at

    async def _load_state(self) -> tuple[CredentialState, int]:
        entry = await self._store.read(self._state_path)
        if entry is None:
            return CredentialState(), 0
        return CredentialState.from_data(entry.data, self.name), entry.version

    async def _write_state(
        self, state: CredentialState, version: int
    ) -> tuple[CredentialState, int]:
        new_version = await self._store.write(self._state_path, state.to_data(), cas=version)
        return state, new_version
