"""One credential's job: the lease, the journal record, and the tasks that move it forward.

Every credential has one private state record in Vault (`layout.CredentialState`), written
with check-and-set. A job run reads it, asks each task when it is next due, and if any task is
due now takes the lease (a CAS write naming this instance) and runs the due tasks in order
(refresh before rotation, so a slow rotator never delays a token that is due). Each
task saves its progress through the same record, so a crash between any two steps resumes
from the last saved one. Failures are the task's own: it records them in the record and plans a
retry with backoff; the other tasks of the job still run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from keyturn.clock import Clock
from keyturn.errors import KeyturnError, VaultCasConflict
from keyturn.events import Observer
from keyturn.layout import CredentialState, state_path
from keyturn.policy import BackoffPolicy, backoff_delay
from keyturn.vault.store import KvStore


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a run did and when the next one is due (epoch seconds)."""

    action: str  # "refreshed" | "rotated" | "fresh" | "lease_held" | "failed" | a task's word
    next_due: float
    state: CredentialState
    error: KeyturnError | None = None


class LeaseHeld(KeyturnError):
    retryable = True


class Journal:
    """The state record of one run. `save` writes it now, with check-and-set (a durability
    point: nothing may happen before it is stored); `stage` only keeps it for the write that
    ends the run and releases the lease."""

    def __init__(self, store: KvStore, path: str, state: CredentialState, version: int) -> None:
        self._store = store
        self._path = path
        self.state = state
        self.version = version

    async def save(self, state: CredentialState) -> CredentialState:
        self.version = await self._store.write(self._path, state.to_data(), cas=self.version)
        self.state = state
        return state

    def stage(self, state: CredentialState) -> CredentialState:
        self.state = state
        return state


class Task(Protocol):
    """One kind of work on a credential (refreshing a token, rotating a key)."""

    name: str

    async def due(self, state: CredentialState, now: float, force: bool) -> float:
        """When this task next needs to run (epoch seconds; `now` or earlier: run now)."""

    async def step(self, journal: Journal) -> str:
        """Do the due work, saving progress through `journal`; returns a word for the outcome.
        Raises a KeyturnError on failure."""

    def failed(
        self, state: CredentialState, error: KeyturnError, now: float
    ) -> tuple[CredentialState, int]:
        """The state after `error` (failure count, last error, retry time) and the number of
        consecutive failures of this task."""


class CredentialJob:
    """Runs one credential's tasks. Stateless between runs: Vault holds the state."""

    def __init__(
        self,
        name: str,
        *,
        provider: str,
        kind: str,
        tasks: Sequence[Task],
        store: KvStore,
        observer: Observer,
        clock: Clock,
        rng: random.Random,
        instance_id: str,
        state_prefix: str,
        lease_seconds: float = 120.0,
    ) -> None:
        self.name = name
        self.provider = provider
        self.kind = kind
        self.tasks = list(tasks)
        self._store = store
        self._observer = observer
        self._clock = clock
        self._rng = rng
        self._instance = instance_id
        self._path = state_path(state_prefix, name)
        self._lease_seconds = lease_seconds
        self._unreadable_failures = 0  # backoff while the record cannot even be read

    def task(self, name: str) -> Task | None:
        return next((t for t in self.tasks if t.name == name), None)

    async def run(
        self,
        *,
        force: bool | Collection[str] = False,
        prepare: Callable[[Journal], None] | None = None,
    ) -> Outcome:
        """Run what is due (and the tasks named in `force`; `True` forces them all), else plan
        the next run. `prepare` changes the journal under the lease before the tasks run (e.g.
        `keyturn import-key`). Never raises a KeyturnError: failures come back in the Outcome."""
        forced = {t.name for t in self.tasks} if force is True else set(force or ())
        try:
            entry = await self._store.read(self._path)
            state = CredentialState.from_data(entry.data, self.name) if entry else CredentialState()
            version = entry.version if entry else 0
        except KeyturnError as error:
            # Nothing is written: a record that may hold a refresh token or a key is never
            # overwritten blindly.
            self._unreadable_failures += 1
            return self._failure_outcome(CredentialState(), error, self._unreadable_failures)
        self._unreadable_failures = 0
        self._observer.restored(
            self.name,
            self.provider,
            self.kind,
            state.issued_at,
            state.expires_at,
            state.last_success,
            state.consecutive_failures,
        )
        now = self._clock.time()
        dues = [await t.due(state, now, t.name in forced) for t in self.tasks]
        if not any(due <= now for due in dues):
            return self._planned(Outcome("fresh", min(dues, default=now + 3600), state))
        if state.lease_held_by_other(self._instance, now):
            return self._lease_held(state, state.lease_until or now)
        journal = Journal(self._store, self._path, state, version)
        try:
            await journal.save(
                state.with_(lease_owner=self._instance, lease_until=now + self._lease_seconds)
            )
        except VaultCasConflict:
            return self._lease_held(state, now + self._rng.uniform(0.5, 2.0))
        except KeyturnError as error:
            return self._failure_outcome(state, error, state.consecutive_failures + 1)
        if prepare is not None:
            try:
                prepare(journal)
                await journal.save(journal.state)  # e.g. an imported key: stored before use
            except KeyturnError as error:
                await journal.save(journal.state.with_(lease_owner=None, lease_until=None))
                return Outcome("refused", now, journal.state, error)
        return await self._run_tasks(journal, forced)

    async def _run_tasks(self, journal: Journal, forced: set[str]) -> Outcome:
        action, error = "fresh", None
        for task in self.tasks:
            now = self._clock.time()
            if await task.due(journal.state, now, task.name in forced) > now:
                continue
            try:
                action = await task.step(journal)
            except KeyturnError as exc:
                action, error = "failed", exc
                state, failures = task.failed(journal.state, exc, self._clock.time())
                self._observer.failed(self.name, self.provider, self.kind, exc, failures)
                journal.stage(state)
        released = journal.state.with_(lease_owner=None, lease_until=None)
        try:
            await journal.save(released)
        except KeyturnError as exc:
            error = error or exc  # the lease expires by itself
        now = self._clock.time()
        dues = [await t.due(journal.state, now, False) for t in self.tasks]
        # A task that could not save its retry time must not be re-run in a hot loop.
        next_due = max(min(dues, default=now + 3600), now + 0.5 if error else now)
        return self._planned(Outcome(action, next_due, journal.state, error))

    def _planned(self, outcome: Outcome) -> Outcome:
        self._observer.scheduled(self.name, self.provider, self.kind, outcome.next_due)
        return outcome

    def _lease_held(self, state: CredentialState, until: float) -> Outcome:
        error = LeaseHeld(
            f"being worked on by instance {state.lease_owner or 'unknown'}", credential=self.name
        )
        return Outcome("lease_held", until + self._rng.uniform(0.1, 1.0), state, error)

    def _failure_outcome(
        self, state: CredentialState, error: KeyturnError, failures: int
    ) -> Outcome:
        self._observer.failed(self.name, self.provider, self.kind, error, failures)
        due = self._clock.time() + backoff_delay(failures, BackoffPolicy(), self._rng)
        return self._planned(Outcome("failed", due, state, error))
