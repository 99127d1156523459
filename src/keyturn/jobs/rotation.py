"""Journaled rotation of an API key or a client secret: the `rotation` task of a job.

idle → creating → pending → verified → retiring → idle, one check-and-set journal write per
arrow, so each step is idempotent and a crash resumes at the last one; a failure leaves the
current key published and is retried with backoff. The states, waiting for consumers and why a
crash at any step is safe: docs/rotation.md. Verifying and publishing are the kind's (a
`RotationTarget`, `keyturn.kinds`); the rotator (`keyturn.rotators`) creates and revokes keys.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Protocol, assert_never

from keyturn.clock import rfc3339
from keyturn.config import CredentialConfig, RotationPolicy, format_duration
from keyturn.errors import ConfigError, KeyturnError, RotationError, VerificationFailed
from keyturn.events import RotationDuration, RotationPlanned, RotationStep, Suspicious
from keyturn.jobs.job import ConsumersOnOld, JobDeps, Journal
from keyturn.jobs.steps import retry_after
from keyturn.logs import get_logger
from keyturn.policy import backoff_delay
from keyturn.rotators.base import AwaitingManualKey, RotationRequest, Rotator
from keyturn.secret import Secret
from keyturn.state import CredentialState, RotationJournal

__all__ = [
    "CHECKPOINT",
    "CHECKPOINTS",
    "Checkpoint",
    "KeyRotation",
    "RepublishKey",
    "Republisher",
    "RotationRules",
    "RotationTarget",
    "no_checkpoint",
]

# The journal points a rotation passes, in order. After each one is stored, the rotation calls
# the `CHECKPOINT` in force (credential, point): a no-op in production; the crash tests set one
# that stops dead there (keyturn_devkit.harness.paused_daemon), then kill the daemon.
CHECKPOINTS = ("creating", "created", "pending", "verified", "published", "retiring", "revoked")

# Called (credential, point) after a rotation stores a journal point.
Checkpoint = Callable[[str, str], Awaitable[None]]


async def no_checkpoint(credential: str, point: str) -> None:
    """The production checkpoint: nothing."""


# The checkpoint in force, read at each journal point: set before `asyncio.run` (by
# keyturn_devkit.harness.paused_daemon only), it reaches every task, as asyncio's tasks and
# callbacks (APScheduler's runs among them) start from a copy of the context they came from.
CHECKPOINT: ContextVar[Checkpoint] = ContextVar("keyturn_checkpoint", default=no_checkpoint)

# The detector of a previous key revoked at `max_grace` while consumers still read it.
CONSUMERS_NOT_MOVED = "consumers_not_moved"
# At most this many names in that alert's summary (the journal keeps them all).
NAMED_IN_ALERT = 10
# Why a process without the usage monitor (`keyturn rotate`) leaves the revocation to the
# daemon until `max_grace`.
NO_MONITOR = "this process does not read Vault's audit log; the daemon (keyturn run) does"


def recheck_interval(policy: RotationPolicy) -> float:
    """How often a rotation waiting for consumers asks again: a minute, or `grace` when that
    is shorter (at least a second)."""
    return min(60.0, max(1.0, policy.grace))


@dataclass(frozen=True, slots=True)
class RotationRules:
    """What a credential kind's rotated key is, as far as the rotation's journal cares (each
    kind declares its own: `keyturn.kinds.Kind.rotation`)."""

    # Apps read the rotated key itself at `publish_to` (an API key): once published, the
    # record's token part describes it (issued now, `expires_at` its rotate-after time).
    publishes_rotated_value: bool
    # The credential already runs on a key keyturn never held (a client secret from the
    # inputs): its age is unknown, so the first rotation only starts counting it from then,
    # and the first new key has that key to retire after `grace`.
    starts_with_unheld_key: bool

    @property
    def waits_for_consumers(self) -> bool:
        """Whether `wait_for_consumers` applies: only a published key has consumers that
        Vault's audit log shows reading the old version."""
        return self.publishes_rotated_value


class RotationTarget(Protocol):
    """The thing being rotated, as its credential kind defines it (`keyturn.kinds`): how a new
    key is checked, whether apps read it, and what the rotator is told."""

    @property
    def credential(self) -> CredentialConfig:
        """Its configuration: name, provider, kind, `rotation` policy (set) and `backoff`."""

    @property
    def rules(self) -> RotationRules:
        """What its kind's key is to the journal (`RotationRules`)."""

    async def verify(self, key: Secret) -> None:
        """Check a freshly created key against the service; raise VerificationFailed if it is
        refused."""

    async def publish(
        self, key: Secret, key_id: str | None, created_at: float, state: CredentialState
    ) -> int | None:
        """Make a verified key what apps read, unless keyturn already did before a crash; the
        published KV version, or None for a key apps never read (a client secret)."""

    async def client_id(self) -> str | None:
        """The OAuth client whose secret is rotated (told to the rotator), or None."""

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        """An existing key (and its id) to adopt at the first rotation, or None."""


class KeyRotation:
    """Moves one credential's rotation journal forward, one saved step at a time."""

    name = "rotation"

    def __init__(self, target: RotationTarget, rotator: Rotator, deps: JobDeps) -> None:
        credential = target.credential
        if credential.rotation is None:
            raise ConfigError(f"{credential.name}: a rotation needs a rotation policy")
        self.credential = credential.name
        self.kind = credential.kind
        self.provider = credential.provider
        self.policy = credential.rotation
        self.rules = target.rules
        self._backoff = credential.backoff
        self._target = target
        self._rotator = rotator
        self._observer = deps.observer
        self._clock = deps.clock
        self._rng = deps.rng
        self._consumers = deps.consumers
        self._log = get_logger("keyturn.rotation")

    # -- Task -----------------------------------------------------------------------------

    async def due(self, state: CredentialState, now: float, force: bool) -> float:
        rotation = state.rotation
        retry = rotation.retry_at or 0.0
        if rotation.phase == "idle":
            if force or rotation.key_created_at is None:
                return now
            planned = rotation.key_created_at + self.policy.max_age
            self._observer(RotationPlanned(self.credential, self.provider, self.kind, planned))
            # Look again at least once per grace period: a `keyturn rotate` beside the daemon
            # starts a grace period this process did not plan, and the old key must not
            # outlive it by more than that.
            return min(planned, now + max(self.policy.grace, 1.0))
        if rotation.phase == "retiring":
            return max(rotation.previous_retire_at or now, retry)
        return max(now, retry) if not force else now

    async def step(self, journal: Journal) -> str:
        action = "waiting"
        for attempt in range(len(CHECKPOINTS) + 2):  # bounded: each pass moves one phase
            rotation, now = journal.state.rotation, self._clock.time()
            phase = rotation.phase
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
                if now < (rotation.previous_retire_at or now) or self._still_used(journal, now):
                    return action
                await self._retire(journal)
                return "rotated"
            else:  # pragma: no cover - a record with another phase does not decode
                assert_never(phase)
        return action

    def defers_lease(self, state: CredentialState) -> bool:
        return False  # a key is created under the lease

    def failed(
        self, state: CredentialState, error: KeyturnError, now: float
    ) -> tuple[CredentialState, int]:
        failures = state.rotation.failures + 1
        delay = backoff_delay(failures, self._backoff, self._rng, retry_after(error))
        if isinstance(error, AwaitingManualKey):
            delay = self._backoff.maximum  # re-announce, not a hot loop
        self._step_event(_result_of(error))
        rotation = replace(
            state.rotation, failures=failures, error=str(error), retry_at=now + delay
        )
        return replace(state, rotation=rotation), failures

    # -- steps ----------------------------------------------------------------------------

    async def _begin(self, journal: Journal) -> None:
        rotation, now = journal.state.rotation, self._clock.time()
        unheld = self.rules.starts_with_unheld_key
        if rotation.key is None and rotation.key_created_at is None and unheld:
            # The key in use came from the inputs; its age is unknown. Count from now.
            self._stage(journal, replace(rotation, key_created_at=now, id="baseline"))
            return
        initial = await self._target.initial_key() if rotation.key is None else None
        base = replace(
            rotation,
            id=uuid.uuid4().hex[:12],
            started=now,
            failures=0,
            verify_failures=0,
            error=None,
            retry_at=None,
        )
        if initial is not None:  # adopt an existing key: it still goes through verification
            key, key_id = initial
            adopted = replace(base, phase="pending", pending_key=key, pending_key_id=key_id)
            await self._save(journal, adopted)
            self._step_event("adopted")
            return
        await self._save(journal, replace(base, phase="creating"))
        self._step_event("started")
        await CHECKPOINT.get()(self.credential, "creating")

    async def _create(self, journal: Journal) -> None:
        request = await self._request(journal.state.rotation)
        for orphan in await self._rotator.find(request) or []:
            # Created by this rotation before a crash, never stored: nobody can use it.
            self._log.warning("rotation.orphan_revoked", credential=self.credential, key_id=orphan)
            await self._rotator.revoke(request, orphan)
        new = await self._rotator.create(request)
        await CHECKPOINT.get()(self.credential, "created")
        created = replace(
            journal.state.rotation,
            phase="pending",
            pending_key=new.value,
            pending_key_id=new.key_id,
            error=None,
        )
        await self._save(journal, created)
        self._step_event("created")
        await CHECKPOINT.get()(self.credential, "pending")

    async def _verify_pending(self, journal: Journal) -> None:
        rotation = journal.state.rotation
        if rotation.pending_key is None:
            raise RotationError("journal says pending but holds no key", credential=self.credential)
        try:
            await self._target.verify(rotation.pending_key)
        except VerificationFailed:
            failures = rotation.verify_failures + 1
            if failures < self.policy.verify_attempts:
                self._stage(journal, replace(rotation, verify_failures=failures))
                raise
            # This key will not work: revoke it and start over with a new one.
            if rotation.pending_key_id is not None:
                await self._rotator.revoke(await self._request(rotation), rotation.pending_key_id)
            anew = replace(
                rotation,
                phase="creating",
                id=uuid.uuid4().hex[:12],
                pending_key=None,
                pending_key_id=None,
                verify_failures=0,
            )
            await self._save(journal, anew)
            raise
        self._stage(journal, replace(rotation, phase="verified", verify_failures=0))
        self._step_event("verified")
        await CHECKPOINT.get()(self.credential, "verified")

    async def _make_current(self, journal: Journal) -> None:
        state, now = journal.state, self._clock.time()
        rotation = state.rotation
        if rotation.pending_key is None:
            raise RotationError(
                "journal says verified but holds no key", credential=self.credential
            )
        token = state.token
        published = await self._target.publish(
            rotation.pending_key, rotation.pending_key_id, now, state
        )
        if published is not None:
            token = replace(token, published_version=published)
            await CHECKPOINT.get()(self.credential, "published")
        if self.rules.publishes_rotated_value:  # apps read the key: its record is the token's
            rotate_after = now + self.policy.max_age
            token = replace(
                token, phase="ok", last_success=now, issued_at=now, expires_at=rotate_after
            )
        had_previous = rotation.key is not None or self.rules.starts_with_unheld_key
        current = replace(
            rotation,
            key=rotation.pending_key,
            key_id=rotation.pending_key_id,
            key_created_at=now,
            pending_key=None,
            pending_key_id=None,
            previous_key_id=rotation.key_id,
            previous_retire_at=now + self.policy.grace if had_previous else None,
            previous_version=state.token.published_version if had_previous else None,
            waiting_consumers=None,
            waiting_reason=None,
            phase="retiring" if had_previous else "idle",
            failures=0,
            error=None,
            retry_at=None,
        )
        await journal.save(replace(state, token=token, rotation=current))
        self._step_event("published")
        if rotation.started is not None:
            self._observer(RotationDuration(self.provider, self.kind, now - rotation.started))
        self._observer(
            RotationPlanned(self.credential, self.provider, self.kind, now + self.policy.max_age)
        )
        await CHECKPOINT.get()(self.credential, "retiring")

    async def _retire(self, journal: Journal) -> None:
        rotation = journal.state.rotation
        if rotation.previous_key_id is not None:
            await self._rotator.revoke(await self._request(rotation), rotation.previous_key_id)
        else:
            self._log.warning(
                "rotation.previous_without_id",
                credential=self.credential,
                detail="the previous key has no id: revoke it by hand if the provider keeps it",
            )
        await CHECKPOINT.get()(self.credential, "revoked")
        retired = replace(
            rotation,
            phase="idle",
            previous_key_id=None,
            previous_retire_at=None,
            previous_version=None,
            waiting_consumers=None,
            waiting_reason=None,
            failures=0,
            error=None,
            retry_at=None,
        )
        await self._save(journal, retired)
        self._step_event("retired")

    # -- waiting for consumers ------------------------------------------------------------

    def _still_used(self, journal: Journal, now: float) -> bool:
        """With `wait_for_consumers`, after grace: whether the previous key must live on
        because consumers still read it (or keyturn cannot tell), until `max_grace` after the
        new key was published. Waiting is staged in the journal (who, why, when to ask
        again); at `max_grace` the key is revoked anyway and the consumers on it named."""
        policy = self.policy
        if not policy.wait_for_consumers or not self.rules.waits_for_consumers:
            return False
        rotation = journal.state.rotation
        old = rotation.previous_version
        if old is None:  # a journal from before the field: every version before the current
            current = journal.state.token.published_version
            old = current - 1 if current is not None else None
        if old is None or old < 1:
            return False  # no earlier version was published: nobody can read one
        if self._consumers is None:
            on_old = ConsumersOnOld(rotation.waiting_consumers or (), NO_MONITOR)
        else:
            on_old = self._consumers.waiting_for(self.credential, old, policy.consumer_window, now)
        if not on_old.names and on_old.unsure is None:
            return False
        deadline = (rotation.key_created_at or now) + policy.longest_grace()
        if now >= deadline:
            self._revoked_anyway(on_old, old)
            return False
        if (on_old.names, on_old.unsure) != (rotation.waiting_consumers, rotation.waiting_reason):
            self._log.info(
                "rotation.waiting_for_consumers",
                credential=self.credential,
                consumers=list(on_old.names),
                unsure=on_old.unsure,
                until=rfc3339(deadline),
            )
        waiting = replace(
            rotation,
            waiting_consumers=on_old.names,
            waiting_reason=on_old.unsure,
            retry_at=min(deadline, now + recheck_interval(policy)),
        )
        self._stage(journal, waiting)
        return True

    def _revoked_anyway(self, on_old: ConsumersOnOld, old: int) -> None:
        """`max_grace` has passed: the old key goes now. Consumers still on it are named in
        `consumers_not_moved` (they will fail until they read the new key); when keyturn only
        could not tell, a log line says so."""
        longest = format_duration(self.policy.longest_grace())
        if not on_old.names:
            self._log.warning(
                "rotation.consumers_unknown",
                credential=self.credential,
                reason=on_old.unsure,
                detail=f"previous key revoked at max_grace ({longest}) without knowing that "
                "every consumer moved",
            )
            return
        shown = ", ".join(on_old.names[:NAMED_IN_ALERT])
        if len(on_old.names) > NAMED_IN_ALERT:
            shown += f" and {len(on_old.names) - NAMED_IN_ALERT} more"
        self._observer(
            Suspicious(
                self.credential,
                self.provider,
                CONSUMERS_NOT_MOVED,
                "warning",
                f"previous key revoked at max_grace ({longest} after the new one was "
                f"published) while {len(on_old.names)} consumer(s) still read the old value "
                f"(version {old} or older): {shown}",
            )
        )

    # -- manual keys ----------------------------------------------------------------------

    def accept_key(self, journal: Journal, key: Secret, key_id: str | None) -> None:
        """`keyturn import-key`: take a key a person created; the rotation goes on from
        verification. Refused while another key is pending or the previous one is in grace."""
        rotation = journal.state.rotation
        if rotation.phase in ("pending", "verified"):
            raise RotationError(
                f"a rotation is already at {rotation.phase}; see `keyturn status`",
                credential=self.credential,
            )
        if rotation.phase == "retiring":
            until = rfc3339(rotation.previous_retire_at or self._clock.time())
            raise RotationError(
                f"the previous key is in its grace period until {until}; import after that",
                credential=self.credential,
            )
        imported = replace(
            rotation,
            phase="pending",
            id=rotation.id if rotation.phase == "creating" else uuid.uuid4().hex[:12],
            started=rotation.started or self._clock.time(),
            pending_key=key,
            pending_key_id=key_id,
            verify_failures=0,
            retry_at=None,
        )
        self._stage(journal, imported)

    # -- helpers --------------------------------------------------------------------------

    async def _save(self, journal: Journal, rotation: RotationJournal) -> None:
        """Store the journal as `rotation` now (a durability point)."""
        await journal.save(replace(journal.state, rotation=rotation))

    def _stage(self, journal: Journal, rotation: RotationJournal) -> None:
        """Keep the journal as `rotation` for the write that ends the run."""
        journal.stage(replace(journal.state, rotation=rotation))

    def _step_event(self, result: str) -> None:
        self._observer(RotationStep(self.credential, self.provider, self.kind, result))

    async def _request(self, rotation: RotationJournal) -> RotationRequest:
        rotation_id = rotation.id or "none"
        return RotationRequest(
            credential=self.credential,
            kind=self.kind,
            rotation_id=rotation_id,
            key_name=f"keyturn-{self.credential}-{rotation_id}",
            client_id=await self._target.client_id(),
        )


def _result_of(error: KeyturnError) -> str:
    if isinstance(error, AwaitingManualKey):
        return "awaiting_manual"
    if isinstance(error, VerificationFailed):
        return "verification_failed"
    return "failed"


class Republisher(Protocol):
    """A target whose rotated key apps read (an API key, a signing key): it can write the
    current key back where apps read it."""

    async def write(
        self,
        key: Secret,
        key_id: str | None,
        created_at: float,
        state: CredentialState,
        *,
        report: bool = True,
    ) -> int:
        """Publish `key` on top of the version keyturn last wrote; the KV version."""

    def forget_metadata(self) -> None:
        """What is at the published path is no longer known (someone else wrote there)."""


class RepublishKey:
    """The `republish` task (forced only): put the current key back where apps read it, after
    someone else changed or deleted it (the watcher already reported that)."""

    name = "republish"

    def __init__(self, target: Republisher) -> None:
        self._target = target

    async def due(self, state: CredentialState, now: float, force: bool) -> float:
        return now if force and state.rotation.key is not None else math.inf

    async def step(self, journal: Journal) -> str:
        state = journal.state
        current = state.rotation
        if current.key is None or current.key_created_at is None:
            return "waiting"
        # Someone else changed what apps read (perhaps only its custom metadata): the
        # publish writes the custom metadata too.
        self._target.forget_metadata()
        version = await self._target.write(
            current.key, current.key_id, current.key_created_at, state, report=False
        )
        journal.stage(replace(state, token=replace(state.token, published_version=version)))
        return "republished"

    def defers_lease(self, state: CredentialState) -> bool:
        return False  # it publishes before it writes the record

    def failed(
        self, state: CredentialState, error: KeyturnError, now: float
    ) -> tuple[CredentialState, int]:
        rotation = replace(state.rotation, error=str(error))
        return replace(state, rotation=rotation), state.rotation.failures + 1
