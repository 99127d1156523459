"""The promise under faults, over fakes: what a credential's job does when the provider, Vault,
the clock or keyturn's own code fails. (The same faults over real parts: tests/integration/
test_faults.py.)"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import httpx
import pytest

from keyturn.clock import FakeClock, WallClockGuard
from keyturn.config import CredentialConfig, ProviderConfig
from keyturn.errors import (
    ProviderUnavailable,
    RateLimited,
    VaultDataError,
    VaultPermissionDenied,
    VaultUnavailable,
)
from keyturn.events import Failed, Suspicious
from keyturn.jobs.job import MIN_LEASE, CredentialJob, JobDeps, Journal, Lease
from keyturn.kinds import build_job
from keyturn.policy import (
    AFTER_EXPIRY_JITTER,
    URGENT_FLOOR,
    URGENT_SHARE,
    BackoffPolicy,
    RefreshPolicy,
    TokenLeft,
    retry_delay,
)
from keyturn.providers.client import ProviderClient
from keyturn.references import SecretRef
from keyturn.scheduler import CredentialScheduler
from keyturn.secret import Secret
from keyturn.state import CredentialState, RefreshTokenRecord, TokenRecord
from keyturn.testing.oauth import FakeOAuthServer
from keyturn.testing.observer import RecordingObserver
from keyturn.testing.vault import FakeVaultStore

STATE = "keyturn/state/reporting"
PUBLISHED = "apps/reporting/acme"
BACKOFF = BackoffPolicy(initial=1, maximum=300)


@dataclass
class Inputs:
    """The client inputs as the world has them (or the error reading them raises)."""

    world: World

    async def client(self, *, fresh: bool = False) -> tuple[str, Secret]:
        if self.world.inputs_error is not None:
            raise self.world.inputs_error
        return "cid", Secret(self.world.server.client_secret)

    async def refresh_token(self) -> Secret | None:
        return None

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        return None


@dataclass
class World:
    clock: FakeClock = field(default_factory=FakeClock)
    server: FakeOAuthServer = field(default_factory=lambda: FakeOAuthServer(expires_in=60))
    observer: RecordingObserver = field(default_factory=RecordingObserver)
    store: FakeVaultStore = field(init=False)
    on_token_request: list[object] = field(default_factory=list)  # callbacks, run once each
    bug: BaseException | None = None  # raised by the transport itself, as a bug would be
    inputs_error: Exception | None = None  # raised when the job reads client_id/client_secret

    def __post_init__(self) -> None:
        self.store = FakeVaultStore(clock=self.clock)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.bug is not None:
            raise self.bug
        try:
            return self.server.handle(request)
        finally:
            if request.url.path == "/oauth/token" and self.on_token_request:
                self.on_token_request.pop(0)()  # type: ignore[operator]

    def job(self, *, margin: float = 5.0, lease: float = 30.0) -> CredentialJob:
        client = ProviderClient(
            ProviderConfig(name="acme", base_url="https://acme.test", revoke_path="/oauth/revoke"),
            clock=self.clock,
            transport=httpx.MockTransport(self.handle),
        )
        credential = CredentialConfig(
            name="reporting",
            provider="acme",
            client_id=SecretRef.env("CLIENT_ID"),
            client_secret=SecretRef.env("CLIENT_SECRET"),
            publish_to=PUBLISHED,
            refresh=RefreshPolicy(at=0.66, jitter=0.1, margin=margin),
            backoff=BACKOFF,
        )
        deps = JobDeps(
            store=self.store,
            observer=self.observer,
            clock=self.clock,
            rng=random.Random(4),
            instance_id="i-1",
            state_prefix="keyturn/state",
            lease_seconds=lease,
        )
        return build_job(credential, client, None, Inputs(self), deps)

    async def state(self) -> CredentialState:
        entry = await self.store.read(STATE)
        assert entry is not None
        return CredentialState.from_data(entry.data, "reporting")

    async def published(self) -> str:
        entry = await self.store.read(PUBLISHED)
        assert entry is not None
        return entry.data["access_token"]


@pytest.fixture
def world() -> World:
    return World()


# -- 1. retries are bounded by what the token has left -------------------------------------------


def left(expires_in: float, deadline_in: float) -> TokenLeft:
    return TokenLeft(expires_in=expires_in, deadline_in=deadline_in)


def test_retry_delay_never_sleeps_past_a_share_of_the_remaining_lifetime() -> None:
    rng = random.Random(1)
    for failures in range(1, 30):
        for remaining in (3.0, 10.0, 40.0, 600.0):
            for wait in (False, True):
                retry = retry_delay(
                    failures, BACKOFF, rng, left=left(remaining, remaining / 2), provider_wait=wait
                )
                assert retry.delay <= max(URGENT_FLOOR, remaining * URGENT_SHARE)
    # An expired token backs off as configured, up to the cap, after a refusal (not a wait).
    assert max(retry_delay(12, BACKOFF, rng, left=left(-5, -10)).delay for _ in range(50)) > 100


def test_a_credential_failing_for_weeks_still_gets_a_delay() -> None:
    many = retry_delay(
        100_000, BackoffPolicy(initial=1, maximum=300, multiplier=10), random.Random()
    )
    assert 1 <= many.delay <= 300


def test_retry_after_is_a_floor_only_up_to_the_last_planned_refresh() -> None:
    rng = random.Random(1)
    honoured = retry_delay(1, BACKOFF, rng, retry_after=6, left=left(40, 20), provider_wait=True)
    assert (honoured.delay, honoured.retry_after) == (6, "honoured")
    shortened = retry_delay(1, BACKOFF, rng, retry_after=600, left=left(40, 20), provider_wait=True)
    assert (shortened.delay, shortened.retry_after) == (20, "shortened")
    # With no token published, nothing bounds it but `max`.
    alone = retry_delay(1, BACKOFF, rng, retry_after=600, provider_wait=True)
    assert (alone.delay, alone.retry_after) == (300, "honoured")


async def test_a_long_outage_does_not_push_the_retry_past_the_tokens_expiry(world: World) -> None:
    job = world.job()
    first = await job.run()
    expires_at = (await world.state()).token.expires_at
    assert expires_at is not None
    # Earlier outages grew the failure count: the backoff alone would wait minutes.
    world.clock.advance(first.next_due - world.clock.time())
    for _ in range(6):
        world.server.next_responses.append(httpx.Response(503))
        outcome = await job.run()
        assert outcome.action == "failed"
        left_now = expires_at - world.clock.time()
        assert left_now > 0
        bound = max(URGENT_FLOOR, left_now * URGENT_SHARE) * (1 + AFTER_EXPIRY_JITTER)
        assert outcome.next_due - world.clock.time() <= bound + 1e-6
        world.clock.advance(outcome.next_due - world.clock.time())
    # The provider is back before expiry: the next attempt publishes a new token in time.
    assert world.clock.time() < expires_at
    assert (await job.run()).action == "refreshed"


async def test_a_503_retry_after_is_honoured(world: World) -> None:
    job = world.job()
    await job.run()
    world.server.next_responses.append(httpx.Response(503, headers={"Retry-After": "20"}))
    outcome = await job.run(force=True)
    assert outcome.action == "failed"
    assert outcome.next_due - world.clock.time() >= 20


# -- 2. Vault failures back off as configured, bounded by the token ------------------------------


async def test_an_unreadable_record_backs_off_with_the_credentials_policy(world: World) -> None:
    job = world.job()
    await job.run()
    world.store.unavailable = True
    delays = []
    for _ in range(6):
        outcome = await job.run(force=True)
        assert isinstance(outcome.error, VaultUnavailable)
        delays.append(outcome.next_due - world.clock.time())
        world.clock.advance(0.1)
    # Bounded by what the 60 s token has left, not a fixed schedule of its own.
    assert all(d <= 60 * URGENT_SHARE for d in delays)


async def test_a_scheduler_wakes_what_waited_for_vault() -> None:
    clock = FakeClock()
    world = World(clock=clock)
    job = world.job()
    world.store.unavailable = True
    scheduler = CredentialScheduler([job], clock=world.clock)
    outcome = await scheduler.run_now("reporting", force=False)
    assert outcome.action == "failed"
    assert scheduler.waiting_for_vault == {"reporting"}
    world.store.unavailable = False
    assert scheduler.wake(scheduler.waiting_for_vault) == ["reporting"]
    status = scheduler.status_of("reporting")
    assert status is not None and status.next_due == clock.time()
    outcome = await scheduler.run_now("reporting", force=False)
    assert outcome.action == "refreshed"
    assert scheduler.waiting_for_vault == set()


# -- 3. a refresh token whose answer was lost is never presented again ---------------------------


async def refresh_token_world() -> tuple[World, CredentialJob]:
    world = World()
    job = world.job()
    await job.run()  # client_credentials: a refresh token is now held
    assert (await world.state()).refresh.token is not None
    return world, job


async def test_an_answer_lost_in_flight_burns_the_refresh_token() -> None:
    world, job = await refresh_token_world()
    held = (await world.state()).refresh.token
    world.server.lose_answers = 1  # the provider rotates, keyturn never sees the answer
    outcome = await job.run(force=True)
    assert outcome.action == "failed"
    assert isinstance(outcome.error, ProviderUnavailable)
    state = await world.state()
    assert state.refresh.token is None and state.refresh.in_flight is None
    # Not revoked yet: that would kill the access token apps read until a new one is out.
    assert world.server.revoked == [] and state.refresh.burned == held
    assert (await job.run(force=True)).action == "refreshed"
    assert world.server.grants[-1] == "client_credentials"
    assert held is not None and world.server.revoked == [held.reveal()]  # RFC 7009
    assert (await world.state()).refresh.burned is None
    assert world.server.reuse == 0
    assert world.observer.of(Suspicious) == []  # not the theft detector


async def test_a_crash_after_the_request_leaves_the_token_burned_for_the_next_process() -> None:
    world, job = await refresh_token_world()
    held = (await world.state()).refresh.token
    world.server.lose_answers = 1

    def crash() -> None:  # the process dies while the request is in flight
        world.store.unavailable = True

    world.on_token_request.append(crash)
    await job.run(force=True)
    assert (await _raw_state(world)).refresh.in_flight is not None
    world.store.unavailable = False
    restarted = world.job()  # a new process: nothing in memory
    outcome = await restarted.run()
    assert outcome.action == "refreshed"
    assert world.server.used_refresh.count(held.reveal() if held else "") == 1
    assert world.server.reuse == 0
    assert world.server.grants[-1] == "client_credentials"


async def _raw_state(world: World) -> CredentialState:
    world.store.unavailable = False
    try:
        return await world.state()
    finally:
        world.store.unavailable = True


async def test_a_vault_failure_after_a_refresh_keeps_the_answer_and_stores_it_first() -> None:
    world, job = await refresh_token_world()

    def vault_fails() -> None:
        world.store.fail_next(VaultUnavailable("vault: HTTP 500 (fake)"))

    world.on_token_request.append(vault_fails)
    outcome = await job.run(force=True)
    assert outcome.action == "failed"
    assert world.server.grants[-1] == "refresh_token"
    rotated = world.server.live_refresh  # the provider's one live refresh token
    requests = len(world.server.grants)
    world.clock.advance(outcome.next_due - world.clock.time())  # the retry (or Vault's return)
    outcome = await job.run()
    assert outcome.action == "refreshed"
    # The kept answer was stored and published: no new request, no reuse, the live token held.
    assert len(world.server.grants) == requests
    assert world.server.reuse == 0
    state = await world.state()
    assert state.refresh.token is not None and {state.refresh.token.reveal()} == rotated
    assert await world.published() == world.server.access_tokens[-1]


async def test_a_vault_that_keeps_failing_the_answer_is_retried_with_backoff() -> None:
    world, job = await refresh_token_world()
    # The answer's write fails, the lease release succeeds.
    world.on_token_request.append(
        lambda: world.store.fail_next(VaultUnavailable("vault: HTTP 500 (fake)"))
    )
    outcome = await job.run(force=True)
    assert outcome.action == "failed"
    assert outcome.next_due > world.clock.time()  # no hot loop: the backoff holds
    requests = len(world.server.grants)
    assert (await job.run()).action == "fresh"  # not due before the retry time
    world.clock.advance(outcome.next_due - world.clock.time())
    assert (await job.run()).action == "refreshed"  # the kept answer, stored first
    assert len(world.server.grants) == requests and world.server.reuse == 0


async def test_invalid_grant_drops_the_token_once_and_falls_back(world: World) -> None:
    job = world.job()
    await job.run()
    world.server.live_refresh.clear()  # the provider forgot it (expired, revoked)
    world.server.next_responses.append(httpx.Response(400, json={"error": "invalid_grant"}))
    world.server.next_responses.append(httpx.Response(503))  # and the fallback fails too
    assert (await job.run(force=True)).action == "failed"
    assert (await world.state()).refresh.token is None  # dropped after the first alert
    assert (await job.run(force=True)).action == "refreshed"
    detectors = [event.detector for event in world.observer.of(Suspicious)]
    assert detectors == ["refresh_token_rejected"]


async def test_a_rate_limited_refresh_keeps_its_token(world: World) -> None:
    job = world.job()
    await job.run()
    held = (await world.state()).refresh.token
    world.server.next_responses.append(httpx.Response(429, headers={"Retry-After": "3"}))
    outcome = await job.run(force=True)
    assert isinstance(outcome.error, RateLimited)
    state = await world.state()
    assert state.refresh.token == held and state.refresh.in_flight is None


async def test_a_lagging_vault_node_never_makes_a_refresh_token_be_sent_twice() -> None:
    world, _job = await refresh_token_world()
    world.store.stale_by = 2  # plain reads answer from a copy two versions behind
    before = len(world.store.reads)
    for _ in range(4):
        job = world.job()  # a new process each time: it starts by reading the record
        outcome = await job.run(force=True)
        assert outcome.action == "refreshed", outcome.error
    assert world.server.reuse == 0
    assert world.server.grants.count("refresh_token") == 4
    job_reads = [(path, consistent) for _op, path, consistent in world.store.reads[before:]]
    assert len([path for path, _ in job_reads if path == STATE]) == 4
    assert all(consistent for path, consistent in job_reads if path == STATE)


async def test_a_job_starts_from_its_own_copy_and_reads_when_another_writer_moved_on() -> None:
    """A run starts from the record this process last wrote, without a read; when another
    instance refreshed since, the lease write's check-and-set fails, the run reads the record
    and starts again from it: the refresh token goes out once per rotation, never twice."""
    world, job = await refresh_token_world()
    other = world.job()  # another instance working on the same record
    before = len(world.store.reads)
    assert (await job.run(force=True)).action == "refreshed"
    assert [path for _op, path, _c in world.store.reads[before:] if path == STATE] == []
    assert (await other.run(force=True)).action == "refreshed"  # reads: a new process
    before = len(world.store.reads)
    assert (await job.run(force=True)).action == "refreshed"
    assert [path for _op, path, _c in world.store.reads[before:] if path == STATE] == [STATE]
    assert world.server.reuse == 0
    assert world.server.grants.count("refresh_token") == 3


async def test_a_first_run_told_there_is_no_record_creates_it_without_reading() -> None:
    """After the daemon's LIST of the state prefix: no read of a 404, one create (CAS 0);
    when another instance created the record in between, the create fails and the run reads
    it and goes on from it (its refresh token is not presented twice)."""
    world = World()
    job = world.job()
    job.assume_absent()
    assert (await job.run()).action == "refreshed"
    assert [path for _op, path, _c in world.store.reads if path == STATE] == []
    late = world.job()
    late.assume_absent()  # listed before the first job created the record
    outcome = await late.run(force=True)
    assert outcome.action == "refreshed", outcome.error
    assert [path for _op, path, _c in world.store.reads if path == STATE] == [STATE]
    assert world.server.reuse == 0


# -- 4. the lease is short and renewed -----------------------------------------------------------


def expiring(at: float) -> CredentialState:
    """A record whose published token expires at `at`."""
    return CredentialState(token=TokenRecord(expires_at=at))


def test_a_lease_leaves_a_successor_time_to_refresh() -> None:
    lease = Lease("i-1", 13.0)  # a 3 s provider timeout plus slack
    now = 1000.0
    assert lease.until(CredentialState(), now) == now + 13  # nothing published yet
    assert lease.until(expiring(now + 600), now) == now + 13
    assert lease.until(expiring(now + 20), now) == now + 7  # a step left
    assert lease.until(expiring(now + 24), now) == now + 11
    assert lease.until(expiring(now + 7), now) == now + MIN_LEASE
    assert lease.until(expiring(now + 1), now) == now + MIN_LEASE


async def test_a_long_step_renews_the_lease(world: World) -> None:
    await world.store.write(STATE, CredentialState().to_data(), cas=0)
    journal = Journal(
        world.store, STATE, CredentialState(), 1, clock=world.clock, lease=Lease("i-1", 9.0)
    )
    await journal.save(journal.state)
    first = (await world.state()).lease.until
    stop = asyncio.Event()
    keeper = asyncio.ensure_future(journal.keep_alive(stop))
    for _ in range(3):
        await asyncio.sleep(0)
        world.clock.advance(3.1)
        for _ in range(5):
            await asyncio.sleep(0)
    stop.set()
    await keeper
    state = await world.state()
    assert first is not None and state.lease.until is not None
    assert state.lease.until > first + 5
    assert state.lease.owner == "i-1"


class GatedStore(FakeVaultStore):
    """Writes wait for `gate` while it is closed (a slow Vault under a step's save)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.gate = asyncio.Event()
        self.gate.set()

    async def write(self, path, data, *, cas, custom_metadata=None):  # type: ignore[no-untyped-def]
        await self.gate.wait()
        return await super().write(path, data, cas=cas, custom_metadata=custom_metadata)


async def test_a_renewal_queued_behind_a_save_never_writes_back_the_state_it_replaced() -> None:
    """The lease renewal fires while a task's save is slow: it must renew the saved state,
    not the one it saw before it waited (which would bring back a refresh token in flight)."""
    clock = FakeClock()
    store = GatedStore(clock)
    await store.write(STATE, CredentialState().to_data(), cas=0)
    lease = Lease("i-1", 3.0)
    journal = Journal(store, STATE, CredentialState(), 1, clock=clock, lease=lease)
    in_flight = await journal.save(
        CredentialState(refresh=RefreshTokenRecord(in_flight="attempt-1"))
    )
    stop = asyncio.Event()
    keeper = asyncio.ensure_future(journal.keep_alive(stop))
    await asyncio.sleep(0)
    store.gate.clear()
    answered = replace(in_flight, refresh=replace(in_flight.refresh, in_flight=None))
    saving = asyncio.ensure_future(journal.save(answered))
    for _ in range(3):
        await asyncio.sleep(0)
    clock.advance(1.1)  # the renewal is due: it queues behind the save
    for _ in range(3):
        await asyncio.sleep(0)
    store.gate.set()
    await saving
    for _ in range(10):
        await asyncio.sleep(0)
    renewals = len(store.writes)
    stop.set()
    await keeper
    assert renewals >= 4  # the seed, the in-flight mark, the save, the renewal
    entry = await store.read(STATE, consistent=True)
    assert entry is not None
    assert CredentialState.from_data(entry.data, "reporting").refresh.in_flight is None


# -- 6. any exception is a failure of the one credential -----------------------------------------


async def test_an_unexpected_exception_is_recorded_backed_off_and_reported(world: World) -> None:
    job = world.job()
    world.bug = ZeroDivisionError("a bug with a value: at-1-secretvalue")
    outcome = await job.run()
    assert outcome.action == "failed"
    state = await world.state()
    assert state.token.consecutive_failures == 1
    assert state.token.last_error is not None and "ZeroDivisionError" in state.token.last_error
    assert "secretvalue" not in state.token.last_error
    assert state.lease.owner is None
    assert outcome.next_due > world.clock.time()
    failed = world.observer.of(Failed)
    assert len(failed) == 1 and failed[0].failures == 1


# -- 5. a wall-clock step ------------------------------------------------------------------------


class Reference:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.true_time: float | None = None  # None: Vault cannot be asked

    async def __call__(self) -> float | None:
        return self.true_time


async def test_a_step_vault_disagrees_with_is_held_steady_and_everything_replans() -> None:
    clock = FakeClock()
    jumps: list[float] = []
    reference = Reference(clock)
    guard = WallClockGuard(clock, reference=reference, on_jump=jumps.append)
    real = clock.time()
    reference.true_time = real
    assert await guard.check() == 0.0 and jumps == []
    clock.step_wall(-300)  # libfaketime, an operator: Vault's clock did not move
    assert await guard.check() == 300.0
    assert clock.time() == pytest.approx(real)  # keyturn's time stays right
    assert jumps == [-300]
    clock.advance(10)
    reference.true_time = real + 10
    assert await guard.check() == 300.0 and len(jumps) == 1
    clock.step_wall(+300)  # the clock comes back
    assert await guard.check() == 0.0
    assert clock.time() == pytest.approx(real + 10)
    assert len(jumps) == 2


async def test_a_step_vault_agrees_with_is_adopted() -> None:
    clock = FakeClock()
    jumps: list[float] = []
    reference = Reference(clock)
    guard = WallClockGuard(clock, reference=reference, on_jump=jumps.append)
    clock.step_wall(+120)  # NTP corrects a clock that was two minutes slow
    reference.true_time = clock.system_time()
    assert await guard.check() == 0.0
    assert clock.time() == clock.system_time()
    assert jumps == [120]


async def test_without_vault_the_guard_holds_time_steady_until_it_can_ask() -> None:
    clock = FakeClock()
    reference = Reference(clock)
    guard = WallClockGuard(clock, reference=reference, on_jump=lambda _: None)
    before = clock.time()
    clock.step_wall(-300)
    assert await guard.check() == 300.0
    assert clock.time() == before
    reference.true_time = clock.system_time()  # Vault says the new time was right after all
    assert await guard.check() == 0.0


# -- 7. every failure path backs off and counts ----------------------------------------------------


class FailingPaths(FakeVaultStore):
    """A Vault that refuses every call on one path (the state record, the published path)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.refuse: tuple[str, Exception] | None = None

    def _refuse(self, path: str) -> None:
        if self.refuse is not None and path == self.refuse[0]:
            raise self.refuse[1]

    async def read(self, path, *, consistent=False):  # type: ignore[no-untyped-def]
        self._refuse(path)
        return await super().read(path, consistent=consistent)

    async def write(self, path, data, *, cas, custom_metadata=None):  # type: ignore[no-untyped-def]
        self._refuse(path)
        return await super().write(path, data, cas=cas, custom_metadata=custom_metadata)


def _provider_down(world: World) -> None:
    world.bug = httpx.ConnectError("connection refused")


def _answers(status: int, **kwargs: object) -> Callable[[World], None]:
    def arrange(world: World) -> None:
        world.server.next_responses.extend(httpx.Response(status, **kwargs) for _ in range(20))  # type: ignore[arg-type]

    return arrange


def _vault_refuses(path: str, error: Exception) -> Callable[[World], None]:
    def arrange(world: World) -> None:
        assert isinstance(world.store, FailingPaths)
        world.store.refuse = (path, error)

    return arrange


def _inputs_refused(world: World) -> None:
    world.inputs_error = VaultPermissionDenied(
        "vault read: HTTP 403, permission denied", path="secret/data/inputs/reporting"
    )


FAILURE_PATHS: dict[str, Callable[[World], None]] = {
    "provider down": _provider_down,
    "provider 5xx": _answers(502),
    "provider 429": _answers(429),
    "malformed answer": _answers(200, content=b"<html>not json</html>"),
    "vault 404 on state": _vault_refuses(STATE, VaultDataError("HTTP 404, not found", path=STATE)),
    "vault 403 on state": _vault_refuses(
        STATE, VaultPermissionDenied("HTTP 403, permission denied", path=STATE)
    ),
    "vault 5xx on state": _vault_refuses(STATE, VaultUnavailable("HTTP 503", path=STATE)),
    "vault 404 on publish": _vault_refuses(
        PUBLISHED, VaultDataError("HTTP 404, not found", path=PUBLISHED)
    ),
    "vault 403 on publish": _vault_refuses(
        PUBLISHED, VaultPermissionDenied("HTTP 403, permission denied", path=PUBLISHED)
    ),
    "vault 5xx on publish": _vault_refuses(PUBLISHED, VaultUnavailable("HTTP 500", path=PUBLISHED)),
    "vault refuses the inputs": _inputs_refused,
}


@pytest.mark.parametrize("path", list(FAILURE_PATHS))
async def test_every_failure_path_backs_off_and_counts_towards_the_alert(path: str) -> None:
    """A first run that fails the same way eight times: each failure is counted (1, 2, 3…, so
    `credential_failing` fires at its threshold) and the delay grows with the credential's
    backoff; no path retries on a fixed short schedule."""
    clock = FakeClock()
    world = World(clock=clock)
    world.store = FailingPaths(clock)
    FAILURE_PATHS[path](world)
    job = world.job()
    delays = []
    for _ in range(8):
        outcome = await job.run()
        assert outcome.action == "failed", (path, outcome)
        delays.append(outcome.next_due - clock.time())
        clock.advance(max(0.0, outcome.next_due - clock.time()))
    counts = [event.failures for event in world.observer.of(Failed)]
    assert counts == list(range(1, 9)), (path, counts)
    # Full jitter draws each delay in [initial, initial * 2**(n-1)]: the caps grow, and late
    # delays are far above the first second.
    for n, delay in enumerate(delays, start=1):
        assert BACKOFF.initial <= delay <= BACKOFF.initial * 2 ** (n - 1) + 1e-6, (path, delays)
    assert sum(delays[4:]) > 4 * 3 * BACKOFF.initial, (path, delays)


async def test_a_state_staged_during_a_renewal_is_the_one_the_release_stores() -> None:
    """A task stages its outcome (a new published version) while a lease renewal's write is
    under way: the renewal must not put its older state back, or the release stores the old
    version and the next run reports keyturn's own publish as written by someone else."""
    clock = FakeClock()
    store = GatedStore(clock)
    await store.write(STATE, CredentialState().to_data(), cas=0)
    journal = Journal(store, STATE, CredentialState(), 1, clock=clock, lease=Lease("i-1", 3.0))
    before = await journal.save(CredentialState(token=TokenRecord(published_version=14)))
    store.gate.clear()
    renewal = asyncio.ensure_future(journal.renew())
    for _ in range(3):
        await asyncio.sleep(0)
    journal.stage(replace(before, token=replace(before.token, published_version=15)))
    store.gate.set()
    await renewal
    await journal.release()
    entry = await store.read(STATE, consistent=True)
    assert entry is not None
    assert CredentialState.from_data(entry.data, "reporting").token.published_version == 15
