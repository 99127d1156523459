"""One credential's job: the lease, the journal record, and the tasks that move it forward.

A run starts from the credential's private record (written with check-and-set), takes the lease
if a task is due (`Task.defers_lease`: a refresh holding a refresh token takes it with its own
first write) and runs the due tasks in order, refresh before rotation; each saves its progress
through the record, so a crash resumes from the last step. The lease covers one step and never
outlasts half of what the published token has left. docs/architecture.md, "Jobs and tasks",
tells the whole story.
"""

from __future__ import annotations

import asyncio
import random
import traceback
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from keyturn.clock import Clock
from keyturn.config import Config, CredentialConfig, ProviderConfig
from keyturn.config.credential_auth import CredentialAuth, published_token
from keyturn.errors import ConfigError, KeyturnError, VaultCasConflict
from keyturn.events import Failed, Observer, Restored, Scheduled
from keyturn.layout import state_path
from keyturn.logs import get_logger
from keyturn.policy import retry_delay, token_left
from keyturn.providers.client import ClientSecret
from keyturn.references import ReferenceResolver, SecretRef
from keyturn.secret import Secret
from keyturn.state import CredentialState, LeaseRecord
from keyturn.vault.store import KvStore

log = get_logger("keyturn.job")

# A lease is never shorter than this, whatever the token has left: a step must be able to
# start. Renewals come every third of the lease.
MIN_LEASE = 2.0
# A run that finds another's lease looks again this soon (at the latest: the lease's end):
# a holder usually lets go within a second, and with several instances the credential may now
# be this instance's to run (the holder saw the share move and stopped planning it). Each
# look is one read of the record.
LEASE_RECHECK = 2.0

# Added to the longest provider timeout to make the lease: one step is a provider request,
# bounded by its timeout, and a Vault write.
LEASE_SLACK = 10.0


def lease_seconds(providers: Mapping[str, ProviderConfig]) -> float:
    """How long a lease lasts: one step. Runs renew it while they go on, so a dead holder's
    lease ends soon."""
    return max((p.timeout for p in providers.values()), default=10.0) + LEASE_SLACK


@dataclass(frozen=True, slots=True)
class ConsumersOnOld:
    """Who still reads a previous key, as the usage monitor sees it: `names` of the consumers
    whose last read got that version (or an older one), and `unsure`, why the monitor cannot
    rule out others (None when it can)."""

    names: tuple[str, ...] = ()
    unsure: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerHooks:
    """What jobs ask of and tell the usage monitor (keyturn.usage, wired by the daemon when
    `[usage]` is configured; tests pass fakes). `waiting_for(credential, old_version, window,
    now)`: the consumers that read `old_version` (or older) within `window` seconds before
    `now` and nothing newer since (`rotation.wait_for_consumers`). `published(credential,
    version)`: the KV version now published at the credential's path, as a run read or wrote
    it (what `keyturn usage` calls current)."""

    waiting_for: Callable[[str, int, float, float], ConsumersOnOld]
    published: Callable[[str, int], None]


@dataclass(frozen=True, slots=True)
class JobDeps:
    """What every job and task of one configuration shares, passed once: where the records
    live, who hears about runs, the time and the jitter, who this instance is, and where
    inputs are resolved from. One per process (`JobDeps.start`); a reload keeps it but for the
    lease length (`replace(deps, lease_seconds=lease_seconds(new.providers))`)."""

    store: KvStore
    observer: Observer
    clock: Clock
    rng: random.Random  # jitter, not cryptography
    instance_id: str
    state_prefix: str = "keyturn/state"
    # One step's worth of work: the longest provider timeout plus slack (see Lease).
    lease_seconds: float = 30.0
    # The usage monitor, in a daemon with `[usage]`; None elsewhere (one-shot commands).
    consumers: ConsumerHooks | None = None
    # The process's environment, for `env:` references (`resolver`).
    environ: Mapping[str, str] = field(default_factory=dict)
    # Where each credential of the configuration is published, for `credential:NAME` (set by
    # `build_jobs` for the configuration it builds; None: no credential may use another's).
    published_at: Callable[[str], SecretRef] | None = None

    @classmethod
    def start(
        cls,
        config: Config,
        *,
        store: KvStore,
        observer: Observer,
        clock: Clock,
        rng: random.Random,
        environ: Mapping[str, str],
        consumers: ConsumerHooks | None = None,
        instance_id: str | None = None,
    ) -> JobDeps:
        """The process's: the configuration's instance id (unless `instance_id` names
        another), state prefix and lease length."""
        return cls(
            store=store,
            observer=observer,
            clock=clock,
            rng=rng,
            instance_id=instance_id or config.keyturn.instance_id,
            state_prefix=config.keyturn.state_prefix,
            lease_seconds=lease_seconds(config.providers),
            consumers=consumers,
            environ=environ,
        )

    @property
    def resolver(self) -> ReferenceResolver:
        """Secret references resolved from this process's environment and its Vault store."""
        return ReferenceResolver(self.environ, self.store)

    def credential_token(
        self, auth: CredentialAuth, *, field: str, error: type[KeyturnError]
    ) -> Callable[[], Awaitable[Secret]]:
        """The token of the credential `auth` names, read afresh from where it is published
        at each call (`field`: the key that set it, for the `error` a failure raises)."""
        if self.published_at is None:
            raise ConfigError(f"{field}: {auth} needs the configuration's credentials")
        at = self.published_at(auth.name)
        return published_token(auth, at, self.resolver, field=field, error=error)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a run did and when the next one is due (epoch seconds)."""

    action: str  # "refreshed" | "rotated" | "fresh" | "lease_held" | "failed" | a task's word
    next_due: float
    state: CredentialState
    error: KeyturnError | None = None


class LeaseHeld(KeyturnError):
    retryable = True


class UnexpectedError(KeyturnError):
    """An exception keyturn did not expect (a bug, or input nobody foresaw). It is a failure of
    the one credential: recorded, backed off and alerted like any other, never a dead job.
    Its text names the exception type and where it happened, never the exception's own text
    (which could hold a value)."""

    retryable = True


def unexpected(error: BaseException, *, credential: str, where: str) -> UnexpectedError:
    frames = traceback.extract_tb(error.__traceback__)
    at = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    log.error(
        "job.unexpected_error",
        credential=credential,
        where=where,
        error_type=type(error).__name__,
        frames=[f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}" for f in frames[-6:]],
    )
    return UnexpectedError(f"{where}: unexpected {type(error).__name__}{at}", credential=credential)


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a credential's record, and for how long each write extends the hold."""

    owner: str
    seconds: float

    def until(self, state: CredentialState, now: float) -> float:
        """`now` plus the lease length: `seconds` (one step's worth of work), but while the
        published token is valid at most half of what it has left, and at most what it has
        left minus one step (at least MIN_LEASE), so a dead holder's lease ends in time for
        another instance to take over and refresh before apps see an expired token."""
        length = self.seconds
        expires_at = state.token.expires_at
        if expires_at is not None and expires_at > now:
            left = expires_at - now
            length = min(length, max(MIN_LEASE, min(left / 2, left - self.seconds)))
        return now + length


async def lease_in_force(
    store: KvStore, state: CredentialState, publish_to: str, now: float
) -> bool:
    """Whether a run holds the credential's lease: its time has not run out, and, for a lease
    that ends with a publish (`LeaseRecord.ends_with`), `publish_to` is not yet at that version
    (one metadata read; if it fails, the lease counts as held). A path past that version was
    written since, by the run or by someone else on top of it: either way the run is over
    (the watcher must see such a write at once, not once the lease has run out)."""
    lease = state.lease
    if not lease.held(now):
        return False
    if lease.ends_with is None:
        return True
    try:
        published = await store.read_metadata(publish_to, consistent=True)
    except KeyturnError:
        return True
    return published is None or published.current_version < lease.ends_with


class Journal:
    """The state record of one run. `save` writes it now, with check-and-set (a durability
    point: nothing may happen before it is stored); `stage` only keeps it for the write that
    ends the run and releases the lease. With a `lease`, every save also extends the lease, and
    `keep_alive` renews it while a long step runs. Writes are serialised, so a renewal never
    races a task's own save for the CAS version.

    `leased=False`: the run has not written the record yet, so it holds no lease; its first
    write takes it (`leased` then turns True). If that write loses its check-and-set, `raced`
    is set: another writer changed the record since it was read, and this run must stop.

    `may_end_with_publish`: no task of the job is due after the running one, so it may store
    the run's outcome before it publishes (`save_ending_with`) and, once the publish lands as
    planned, call `ended()`: the job then writes no release (one Vault write fewer per run).
    Until then the lease is as long as the record as it was before that outcome allows: the
    token apps read until the publish lands is the one that bounds it."""

    def __init__(
        self,
        store: KvStore,
        path: str,
        state: CredentialState,
        version: int,
        *,
        clock: Clock | None = None,
        lease: Lease | None = None,
        leased: bool = True,
    ) -> None:
        self._store = store
        self._path = path
        self.state = state
        self.version = version
        self._clock = clock
        self._lease = lease
        self._lock = asyncio.Lock()
        self.leased = leased
        self.raced = False
        self.may_end_with_publish = False
        self._ends_with: int | None = None
        # The record as it was before `save_ending_with` stored the outcome: its token (the
        # one apps read until the publish lands) bounds the lease meanwhile.
        self._before_outcome: CredentialState | None = None
        self.over = False

    async def save(self, state: CredentialState) -> CredentialState:
        async with self._lock:
            return await self._write(self._leased(state))

    async def renew(self) -> CredentialState:
        """Extend the lease on the record as it is when the write starts: the state is read
        under the lock, so a renewal queued behind a task's save never writes back the state
        that save replaced."""
        async with self._lock:
            return await self._write(self._leased(self.state))

    async def save_ending_with(self, state: CredentialState, version: int) -> CredentialState:
        """Store `state`, the run's outcome, before the publish that makes it true: the lease
        then ends when KV `version` lands at the published path (others check it with
        `lease_in_force`). The task calls `ended()` once it has, or stages the record as it
        really is (the release then stores it)."""
        async with self._lock:
            self._ends_with, self._before_outcome = version, self.state
            return await self._write(self._leased(state))

    def ended(self) -> None:
        """The publish named by `save_ending_with` landed: the record is final, the lease ends
        with it, and the job writes no release."""
        self.over = self._ends_with is not None  # else a release stores what is staged

    def _leased(self, state: CredentialState) -> CredentialState:
        if self._lease is None or self._clock is None:
            return state
        now = self._clock.time()
        until = self._lease.until(state, now)
        if self._ends_with is not None and self._before_outcome is not None:
            until = min(until, self._lease.until(self._before_outcome, now))
        return replace(state, lease=LeaseRecord(self._lease.owner, until, self._ends_with))

    def stage(self, state: CredentialState) -> CredentialState:
        self.state = state
        # What is staged now is not the outcome stored before publishing: the release stores it.
        self._ends_with, self.over = None, False
        return state

    async def release(self) -> CredentialState:
        """Write the staged state with the lease given up: the run is over."""
        async with self._lock:
            self._ends_with = None
            return await self._write(replace(self.state, lease=LeaseRecord()))

    async def _write(self, state: CredentialState) -> CredentialState:
        staged = self.state
        try:
            self.version = await self._store.write(self._path, state.to_data(), cas=self.version)
        except VaultCasConflict:
            self.raced = not self.leased
            raise
        self.leased = True
        if self.state is staged:
            self.state = state
        # else a task staged a newer state while this write (a lease renewal) was under way:
        # that one is what the run has done, and what the release will store.
        return state

    async def keep_alive(self, stop: asyncio.Event) -> None:
        """Renew the lease every third of its length until `stop` is set. A lost CAS means
        another instance took the record: the running step's next save fails the same way."""
        if self._lease is None or self._clock is None:
            return
        clock = self._clock
        while True:
            now = clock.time()
            interval = max(0.5, (self._lease.until(self.state, now) - now) / 3)
            sleeper = asyncio.ensure_future(clock.sleep(interval))
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                stopper.cancel()
            if stop.is_set():
                return
            if not self.leased:
                continue  # no lease to renew before the run's first write
            try:
                await self.renew()
            except VaultCasConflict:
                log.warning("lease.lost", path=self._path)
                return
            except KeyturnError as error:
                log.warning("lease.renewal_failed", path=self._path, error=str(error))


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

    def defers_lease(self, state: CredentialState) -> bool:
        """Whether a run of this task may leave the lease to its first journal write: true only
        if that write comes before anything it sends or publishes. That write's check-and-set
        proves the record current, so a copy kept in memory is safe to start from."""


class Inputs(Protocol):
    """One credential's configured inputs, resolved when a task asks (implemented by
    `keyturn.jobs.build.CredentialInputs`; tests pass fakes)."""

    async def client(self, *, fresh: bool = False) -> tuple[str, ClientSecret]:
        """(client_id, client_secret or the key that replaces it); `fresh=True` reads them
        again at their source."""

    async def refresh_token(self) -> Secret | None:
        """The `refresh_token` input (a starting refresh token), read afresh; None if none is
        configured."""

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        """The `initial_key` input and its id, an existing key to adopt; None if none."""


class CredentialJob:
    """Runs one credential's tasks. Stateless between runs: Vault holds the state. Failures
    outside any task back off by the credential's own `backoff`."""

    def __init__(self, credential: CredentialConfig, tasks: Sequence[Task], deps: JobDeps) -> None:
        self.name = credential.name
        self.provider = credential.provider
        self.kind = credential.kind
        self.tasks = list(tasks)
        self._store = deps.store
        self._observer = deps.observer
        self._clock = deps.clock
        self._rng = deps.rng
        self._instance = deps.instance_id
        self._path = state_path(deps.state_prefix, credential.name)
        self._publish_to = credential.publish_to
        self._lease = Lease(deps.instance_id, deps.lease_seconds)
        self._consumers = deps.consumers
        self._backoff = credential.backoff
        self._refresh = credential.refresh
        # Failures outside any task (the record cannot be read, the lease cannot be taken or
        # released), and the last state read, whose token bounds the retry delay.
        self._job_failures = 0
        self._last_state = CredentialState()
        # The record as this process last wrote or read it (state, KV version): the next run
        # starts from it instead of reading Vault. A write by anyone else since makes that
        # run's first check-and-set write fail; the run then reads the record and decides
        # again. None: the next run reads first.
        self._record: tuple[CredentialState, int] | None = None

    def forget_copy(self) -> None:
        """The record may have moved on without this process (the credential was in another
        instance's share): the next run reads it, instead of writing from a stale copy, being
        refused, and reading then."""
        self._record = None

    def assume_absent(self) -> None:
        """The daemon's start listed the state prefix and found no record for this credential:
        its first run creates one (check-and-set 0) without reading a 404 first. Another
        writer in between fails that write, and the run reads."""
        if self._record is None:
            self._record = (CredentialState(), 0)

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
        `keyturn import-key`). Never raises: failures, expected or not, come back in the
        Outcome."""
        try:
            return await self._run(force, prepare)
        except Exception as exc:  # a bug must cost one credential one retry, not its job
            error = (
                exc
                if isinstance(exc, KeyturnError)
                else unexpected(exc, credential=self.name, where="run")
            )
            self._job_failures += 1
            return self._failure_outcome(self._last_state, error, self._job_failures)

    async def _run(
        self, force: bool | Collection[str], prepare: Callable[[Journal], None] | None
    ) -> Outcome:
        forced = {t.name for t in self.tasks} if force is True else set(force or ())
        known, self._record = self._record, None
        if known is not None:
            outcome = await self._run_from(*known, forced, prepare, read=False)
            if outcome is not None:
                return outcome
            # The copy in memory had no work by it, or was out of date: read the record.
        try:
            entry = await self._store.read(self._path, consistent=True)
            state = CredentialState.from_data(entry.data, self.name) if entry else CredentialState()
        except KeyturnError as error:
            # Nothing is written: a record that may hold a refresh token or a key is never
            # overwritten blindly.
            self._job_failures += 1
            return self._failure_outcome(self._last_state, error, self._job_failures)
        self._announce(state)
        outcome = await self._run_from(
            state, entry.version if entry else 0, forced, prepare, read=True
        )
        assert outcome is not None  # a run from the record as read always ends in an outcome
        return outcome

    def restored(self, state: CredentialState, due: float) -> Outcome:
        """A saved plan's word on this credential (`keyturn.saved_plan`), taken without reading
        the record: told to the observers as a read of the record is, and planned at `due`."""
        self._last_state = state
        self._announce(state)
        return self._planned(Outcome("restored", due, state))

    def _announce(self, state: CredentialState) -> None:
        """What the record says, as read: to the observers and the usage monitor."""
        token = state.token
        self._published(state)
        self._observer(
            Restored(
                self.name,
                self.provider,
                self.kind,
                token.issued_at,
                token.expires_at,
                token.last_success,
                token.consecutive_failures,
            )
        )

    async def _run_from(
        self,
        state: CredentialState,
        version: int,
        forced: set[str],
        prepare: Callable[[Journal], None] | None,
        *,
        read: bool,
    ) -> Outcome | None:
        """One run from the record at `version`; None when that was this process's copy
        (`read=False`) and either nothing is due by it (a run that only looks must see what
        others did: e.g. a `keyturn rotate` beside the daemon) or the lease write proved
        another writer changed the record since."""
        self._last_state = state
        now = self._clock.time()
        dues = [await t.due(state, now, t.name in forced) for t in self.tasks]
        if not any(due <= now for due in dues):
            if not read:
                return None  # a look, not work: only the record can show what others did
            self._job_failures = 0
            self._record = (state, version)
            return self._planned(Outcome("fresh", min(dues, default=now + 3600), state))
        if state.lease.held_by_other(self._instance, now) and await lease_in_force(
            self._store, state, self._publish_to, now
        ):
            return self._lease_held(state, state.lease.until or now)
        # After a failure the lease comes first again: a Vault that refuses the record's writes
        # then costs no token request per retry.
        deferred = (
            prepare is None
            and self._job_failures == 0
            and all(
                task.defers_lease(state)
                for task, due in zip(self.tasks, dues, strict=True)
                if due <= now
            )
        )
        journal = Journal(
            self._store,
            self._path,
            state,
            version,
            clock=self._clock,
            lease=self._lease,
            leased=not deferred,
        )
        if not deferred:
            try:
                await journal.save(state)  # takes the lease; CAS proves the record was current
            except VaultCasConflict:
                return self._another_writer_first(state, read)
            except KeyturnError as error:
                self._job_failures += 1
                return self._failure_outcome(state, error, self._job_failures)
        stop = asyncio.Event()
        keeper = asyncio.ensure_future(journal.keep_alive(stop))
        try:
            if prepare is not None:
                try:
                    prepare(journal)
                    await journal.save(journal.state)  # e.g. an imported key: stored before use
                except KeyturnError as refused:
                    stop.set()
                    await keeper
                    await journal.release()
                    self._record = (journal.state, journal.version)
                    return Outcome("refused", now, journal.state, refused)
            action, failure = await self._run_tasks(journal, forced)
        finally:
            stop.set()
            await keeper
        outcome = await self._finish(journal, action, failure)
        if outcome is None:  # a deferred lease lost to another writer: nothing of ours stored
            return self._another_writer_first(state, read)
        return outcome

    def _another_writer_first(self, state: CredentialState, read: bool) -> Outcome | None:
        """The run's first write lost its check-and-set: someone wrote the record since. From
        this process's copy: None, so the record is read. From a read: look again soon."""
        if not read:
            return None
        return self._lease_held(state, self._clock.time() + self._rng.uniform(0.5, 2.0))

    async def _run_tasks(
        self, journal: Journal, forced: set[str]
    ) -> tuple[str, KeyturnError | None]:
        action, error = "fresh", None
        for task in self.tasks:
            now = self._clock.time()
            if await task.due(journal.state, now, task.name in forced) > now:
                continue
            if journal.over:
                # This run's outcome is stored and its lease ended with the publish: a task
                # due only now runs in the next run, under a lease of its own.
                break
            journal.may_end_with_publish = not await self._due_after(task, journal, forced)
            try:
                action = await task.step(journal)
            except Exception as exc:
                if journal.raced:
                    return "raced", None  # not a failure: another writer got there first
                if isinstance(exc, KeyturnError):
                    failure: KeyturnError = exc
                else:
                    failure = unexpected(exc, credential=self.name, where=task.name)
                action, error = "failed", failure
                state, failures = task.failed(journal.state, failure, self._clock.time())
                self._observer(Failed(self.name, self.provider, self.kind, failure, failures))
                journal.stage(state)
        return action, error

    async def _due_after(self, task: Task, journal: Journal, forced: set[str]) -> bool:
        """Whether a task after `task` is due now (by the record as it is now, and forced)."""
        later = self.tasks[self.tasks.index(task) + 1 :]
        now = self._clock.time()
        return any([await t.due(journal.state, now, t.name in forced) <= now for t in later])

    async def _finish(
        self, journal: Journal, action: str, error: KeyturnError | None
    ) -> Outcome | None:
        """Store the run's outcome and release the lease (unless the outcome was stored before
        a publish that landed: `Journal.ended`); None when the run's deferred lease was lost
        (`Journal.raced`): another writer changed the record, which must be read."""
        if journal.raced:
            return None
        try:
            if not journal.over:
                await journal.release()
        except KeyturnError as exc:
            if journal.raced:
                return None
            # The lease expires by itself. What was staged is not stored: the next run reads
            # the record again; it backs off like any failure so a broken Vault is no hot loop.
            self._job_failures += 1
            return self._failure_outcome(
                journal.state, error or exc, self._job_failures, report=error is None
            )
        self._job_failures = 0
        self._last_state = journal.state
        self._record = (journal.state, journal.version)
        self._published(journal.state)
        now = self._clock.time()
        dues = [await t.due(journal.state, now, False) for t in self.tasks]
        next_due = min(dues, default=now + 3600)
        return self._planned(Outcome(action, next_due, journal.state, error))

    def _published(self, state: CredentialState) -> None:
        """Tell the usage monitor which version apps read now (it marks who has it)."""
        version = state.token.published_version
        if self._consumers is not None and version is not None:
            self._consumers.published(self.name, version)

    def _planned(self, outcome: Outcome) -> Outcome:
        self._observer(Scheduled(self.name, self.provider, self.kind, outcome.next_due))
        return outcome

    def _lease_held(self, state: CredentialState, until: float) -> Outcome:
        error = LeaseHeld(
            f"being worked on by instance {state.lease.owner or 'unknown'}", credential=self.name
        )
        # Soon, or just after the lease ends (a dead holder's successor must not lose time),
        # spread a little so that several instances do not race for it in step.
        due = min(until, self._clock.time() + LEASE_RECHECK)
        return Outcome("lease_held", due + self._rng.uniform(0.05, 0.3), state, error)

    def _failure_outcome(
        self, state: CredentialState, error: KeyturnError, failures: int, *, report: bool = True
    ) -> Outcome:
        """A failure outside any task: the credential's own backoff, bounded by what the token
        apps read has left. (`report=False`: a task already reported this run's failure.)"""
        if report:
            self._observer(Failed(self.name, self.provider, self.kind, error, failures))
        now = self._clock.time()
        left = token_left(state.token.issued_at, state.token.expires_at, self._refresh, now)
        retry = retry_delay(
            failures,
            self._backoff,
            self._rng,
            retry_after=getattr(error, "retry_after", None),
            left=left,
        )
        due = now + retry.delay
        return self._planned(Outcome("failed", due, state, error))
