"""Journaled rotation of an API key or a client secret: the `rotation` task of a job.

In the spirit of AWS Secrets Manager's createSecret / setSecret / testSecret / finishSecret and
its pending / current / previous labels. Every arrow is one journal write (check-and-set) in
keyturn's private state, so each step is idempotent and a crash resumes at the last one:

    idle ──due (max_age) or forced──> creating      intent + rotation_id stored first
    creating ──rotator.create──────> pending        the new key is stored privately before
                                                    anything else is done with it; keys a crash
                                                    left behind (found by name) are revoked
    pending ──verify (probe)───────> verified       never publish an unverified key; after
                                                    verify_attempts failures the pending key is
                                                    revoked and a new one created
    verified ──publish (CAS)───────> retiring       apps now read the new key; the old one is
                                                    `previous`, valid for `grace`
    retiring ──after grace: revoke─> idle

A failure leaves the current key published, is recorded (`rotation_error`) and retried with
backoff. The manual rotator waits in `creating` until `keyturn import-key` supplies the key.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from keyturn.clock import Clock, rfc3339
from keyturn.errors import KeyturnError, RotationError, VerificationFailed
from keyturn.events import Observer
from keyturn.job import Journal
from keyturn.layout import CredentialState
from keyturn.logs import get_logger
from keyturn.policy import BackoffPolicy, backoff_delay
from keyturn.refresher import retry_after
from keyturn.rotators.base import AwaitingManualKey, RotationRequest, Rotator
from keyturn.secret import Secret

Kind = Literal["api_key", "oauth_client"]
# Checks a freshly created key against the service; raises VerificationFailed if refused.
Verifier = Callable[[Secret], Awaitable[None]]
# Makes a verified key what apps read; returns the published KV version.
Publisher = Callable[[Secret, str | None, float, CredentialState], Awaitable[int]]
# Reads back what apps read: the key id published there now and its KV version, or None.
PublishedKeyId = Callable[[], Awaitable[tuple[str | None, int] | None]]

# The journal points a rotation passes, in order. After each one is stored, the rotation calls
# its `checkpoint` (credential, point): a no-op in production; the crash tests inject one that
# stops dead there (keyturn.testing.paused_daemon), then kill the daemon.
CHECKPOINTS = ("creating", "created", "pending", "verified", "published", "retiring", "revoked")
Checkpoint = Callable[[str, str], Awaitable[None]]


async def no_checkpoint(credential: str, point: str) -> None:
    """The production checkpoint: nothing."""


@dataclass(frozen=True, slots=True)
class RotationSettings:
    max_age: float
    grace: float
    verify_attempts: int = 5
    backoff: BackoffPolicy = field(
        default_factory=lambda: BackoffPolicy(initial=5.0, maximum=300.0)
    )


class KeyRotation:
    """Moves one credential's rotation journal forward, one saved step at a time."""

    name = "rotation"

    def __init__(
        self,
        *,
        credential: str,
        kind: Kind,
        provider: str,
        settings: RotationSettings,
        rotator: Rotator,
        verify: Verifier,
        publish: Publisher | None,
        published_key_id: PublishedKeyId | None,
        observer: Observer,
        clock: Clock,
        rng: random.Random,
        client_id: Callable[[], Awaitable[str | None]] | None = None,
        initial_key: Callable[[], Awaitable[tuple[Secret, str | None] | None]] | None = None,
        checkpoint: Checkpoint = no_checkpoint,
    ) -> None:
        self.credential = credential
        self.kind = kind
        self.provider = provider
        self.settings = settings
        self._rotator = rotator
        self._verify = verify
        self._publish = publish
        self._published_key_id = published_key_id
        self._observer = observer
        self._clock = clock
        self._rng = rng
        self._client_id = client_id
        self._initial_key = initial_key
        self._checkpoint = checkpoint
        self._log = get_logger("keyturn.rotation")

    # -- Task -----------------------------------------------------------------------------

    async def due(self, state: CredentialState, now: float, force: bool) -> float:
        phase = state.rotation_phase
        retry = state.rotation_retry_at or 0.0
        if phase == "idle":
            if force or state.key_created_at is None:
                return now
            planned = state.key_created_at + self.settings.max_age
            self._observer.rotation_planned(self.credential, self.provider, self.kind, planned)
            # Look again at least once per grace period: a `keyturn rotate` beside the daemon
            # starts a grace period this process did not plan, and the old key must not
            # outlive it by more than that.
            return min(planned, now + max(self.settings.grace, 1.0))
        if phase == "retiring":
            return max(state.previous_retire_at or now, retry)
        return max(now, retry) if not force else now

    async def step(self, journal: Journal) -> str:
        action = "waiting"
        for attempt in range(len(CHECKPOINTS) + 2):  # bounded: each pass moves one phase
            state, now = journal.state, self._clock.time()
            phase = state.rotation_phase
            if phase == "idle":
                if attempt > 0:
                    return action  # finished in this run; `due` plans the next rotation
                await self._begin(journal)
            elif phase == "creating":
                await self._create(journal)
            elif phase == "pending":
                await self._verify_pending(journal)
            elif phase == "verified":
                await self._make_current(journal)
                action = "rotated"
            elif phase == "retiring":
                if now < (state.previous_retire_at or now):
                    return action
                await self._retire(journal)
                return "rotated"
            else:
                raise RotationError(f"unknown rotation phase {phase!r}", credential=self.credential)
        return action

    def failed(
        self, state: CredentialState, error: KeyturnError, now: float
    ) -> tuple[CredentialState, int]:
        failures = state.rotation_failures + 1
        delay = backoff_delay(failures, self.settings.backoff, self._rng, retry_after(error))
        if isinstance(error, AwaitingManualKey):
            delay = self.settings.backoff.maximum  # re-announce, not a hot loop
        self._observer.rotation(self.credential, self.provider, self.kind, _result_of(error))
        return (
            state.with_(
                rotation_failures=failures,
                rotation_error=str(error),
                rotation_retry_at=now + delay,
            ),
            failures,
        )

    # -- steps ----------------------------------------------------------------------------

    async def _begin(self, journal: Journal) -> None:
        state, now = journal.state, self._clock.time()
        if state.key is None and state.key_created_at is None and self.kind == "oauth_client":
            # The client secret in use came from the inputs; its age is unknown. Count from now.
            journal.stage(state.with_(key_created_at=now, rotation_id="baseline"))
            return
        initial = await self._initial_key() if state.key is None and self._initial_key else None
        base = state.with_(
            rotation_id=uuid.uuid4().hex[:12],
            rotation_started=now,
            rotation_failures=0,
            verify_failures=0,
            rotation_error=None,
            rotation_retry_at=None,
        )
        if initial is not None:  # adopt an existing key: it still goes through verification
            key, key_id = initial
            await journal.save(
                base.with_(rotation_phase="pending", pending_key=key, pending_key_id=key_id)
            )
            self._observer.rotation(self.credential, self.provider, self.kind, "adopted")
            return
        await journal.save(base.with_(rotation_phase="creating"))
        self._observer.rotation(self.credential, self.provider, self.kind, "started")
        await self._checkpoint(self.credential, "creating")

    async def _create(self, journal: Journal) -> None:
        request = await self._request(journal.state)
        for orphan in await self._rotator.find(request) or []:
            # Created by this rotation before a crash, never stored: nobody can use it.
            self._log.warning("rotation.orphan_revoked", credential=self.credential, key_id=orphan)
            await self._rotator.revoke(request, orphan)
        new = await self._rotator.create(request)
        await self._checkpoint(self.credential, "created")
        await journal.save(
            journal.state.with_(
                rotation_phase="pending",
                pending_key=new.value,
                pending_key_id=new.key_id,
                rotation_error=None,
            )
        )
        self._observer.rotation(self.credential, self.provider, self.kind, "created")
        await self._checkpoint(self.credential, "pending")

    async def _verify_pending(self, journal: Journal) -> None:
        state = journal.state
        if state.pending_key is None:
            raise RotationError("journal says pending but holds no key", credential=self.credential)
        try:
            await self._verify(state.pending_key)
        except VerificationFailed:
            failures = state.verify_failures + 1
            if failures < self.settings.verify_attempts:
                journal.stage(state.with_(verify_failures=failures))
                raise
            # This key will not work: revoke it and start over with a new one.
            if state.pending_key_id is not None:
                await self._rotator.revoke(await self._request(state), state.pending_key_id)
            await journal.save(
                state.with_(
                    rotation_phase="creating",
                    rotation_id=uuid.uuid4().hex[:12],
                    pending_key=None,
                    pending_key_id=None,
                    verify_failures=0,
                )
            )
            raise
        journal.stage(state.with_(rotation_phase="verified", verify_failures=0))
        self._observer.rotation(self.credential, self.provider, self.kind, "verified")
        await self._checkpoint(self.credential, "verified")

    async def _make_current(self, journal: Journal) -> None:
        state, now = journal.state, self._clock.time()
        if state.pending_key is None:
            raise RotationError(
                "journal says verified but holds no key", credential=self.credential
            )
        published_version = state.published_version
        if self._publish is not None:
            already = await self._published_key_id() if self._published_key_id else None
            if (
                already is not None
                and state.pending_key_id is not None
                and already[0] == state.pending_key_id
            ):
                published_version = already[1]  # keyturn's own write, before a crash
            else:
                published_version = await self._publish(
                    state.pending_key, state.pending_key_id, now, state
                )
            await self._checkpoint(self.credential, "published")
        had_previous = state.key is not None or self.kind == "oauth_client"
        await journal.save(
            state.with_(
                key=state.pending_key,
                key_id=state.pending_key_id,
                key_created_at=now,
                pending_key=None,
                pending_key_id=None,
                previous_key_id=state.key_id,
                previous_retire_at=now + self.settings.grace if had_previous else None,
                rotation_phase="retiring" if had_previous else "idle",
                published_version=published_version,
                rotation_failures=0,
                rotation_error=None,
                rotation_retry_at=None,
                **(
                    {
                        "phase": "ok",
                        "last_success": now,
                        "issued_at": now,
                        "expires_at": now + self.settings.max_age,  # rotate_after
                    }
                    if self.kind == "api_key"
                    else {}
                ),
            )
        )
        self._observer.rotation(self.credential, self.provider, self.kind, "published")
        if state.rotation_started is not None:
            self._observer.rotation_duration(self.provider, self.kind, now - state.rotation_started)
        self._observer.rotation_planned(
            self.credential, self.provider, self.kind, now + self.settings.max_age
        )
        await self._checkpoint(self.credential, "retiring")

    async def _retire(self, journal: Journal) -> None:
        state = journal.state
        if state.previous_key_id is not None:
            await self._rotator.revoke(await self._request(state), state.previous_key_id)
        else:
            self._log.warning(
                "rotation.previous_without_id",
                credential=self.credential,
                detail="the previous key has no id: revoke it by hand if the provider keeps it",
            )
        await self._checkpoint(self.credential, "revoked")
        await journal.save(
            state.with_(
                rotation_phase="idle",
                previous_key_id=None,
                previous_retire_at=None,
                rotation_failures=0,
                rotation_error=None,
                rotation_retry_at=None,
            )
        )
        self._observer.rotation(self.credential, self.provider, self.kind, "retired")

    # -- manual keys ----------------------------------------------------------------------

    def accept_key(self, journal: Journal, key: Secret, key_id: str | None) -> None:
        """`keyturn import-key`: take a key a person created; the rotation goes on from
        verification. Refused while another key is pending or the previous one is in grace."""
        state = journal.state
        if state.rotation_phase in ("pending", "verified"):
            raise RotationError(
                f"a rotation is already at {state.rotation_phase}; see `keyturn status`",
                credential=self.credential,
            )
        if state.rotation_phase == "retiring":
            until = rfc3339(state.previous_retire_at or self._clock.time())
            raise RotationError(
                f"the previous key is in its grace period until {until}; import after that",
                credential=self.credential,
            )
        journal.stage(
            state.with_(
                rotation_phase="pending",
                rotation_id=state.rotation_id
                if state.rotation_phase == "creating"
                else uuid.uuid4().hex[:12],
                rotation_started=state.rotation_started or self._clock.time(),
                pending_key=key,
                pending_key_id=key_id,
                verify_failures=0,
                rotation_retry_at=None,
            )
        )

    # -- helpers --------------------------------------------------------------------------

    async def _request(self, state: CredentialState) -> RotationRequest:
        rotation_id = state.rotation_id or "none"
        return RotationRequest(
            credential=self.credential,
            kind=self.kind,
            rotation_id=rotation_id,
            key_name=f"keyturn-{self.credential}-{rotation_id}",
            client_id=await self._client_id() if self._client_id else None,
        )


def _result_of(error: KeyturnError) -> str:
    if isinstance(error, AwaitingManualKey):
        return "awaiting_manual"
    if isinstance(error, VerificationFailed):
        return "verification_failed"
    return "failed"
