"""The promise at its edge, over fakes: back within seconds once the provider answers, a
Retry-After never obeyed past the token's last planned refresh, a provider's return waking its
other credentials, and a good token never thrown away because its probe got no answer.
(The same over real parts: tests/integration/test_edge.py.)"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
import pytest
from structlog.testing import capture_logs

from keyturn.clock import FakeClock
from keyturn.config import CredentialConfig, ProviderConfig
from keyturn.errors import ProbeUnanswered, ProviderUnavailable
from keyturn.events import Published, RetryAfterBounded, Suspicious
from keyturn.jobs.job import CredentialJob, JobDeps
from keyturn.kinds import build_job
from keyturn.kinds.oauth_client.refresh import PROBE_ATTEMPTS, UNVERIFIED_RECHECK
from keyturn.policy import AFTER_EXPIRY_JITTER, BackoffPolicy, RefreshPolicy, TokenLeft, retry_delay
from keyturn.providers.client import ProviderClient
from keyturn.providers.recovery import DEFAULT_RATE, Recovery
from keyturn.references import SecretRef
from keyturn.scheduler import CredentialScheduler
from keyturn.secret import Secret
from keyturn.state import CredentialState
from keyturn.testing.oauth import FakeOAuthServer
from keyturn.testing.observer import RecordingObserver
from keyturn.testing.vault import FakeVaultStore

T = TypeVar("T")
BACKOFF = BackoffPolicy(initial=1, maximum=300, after_expiry=5)
LIFETIME = 60
MARGIN = 10.0


# -- the policy -----------------------------------------------------------------------------------


def test_past_the_last_planned_refresh_a_provider_wait_retries_at_the_cadence() -> None:
    rng = random.Random(3)
    low, high = 5 * (1 - AFTER_EXPIRY_JITTER), 5 * (1 + AFTER_EXPIRY_JITTER)
    for failures in (1, 5, 20, 60):  # the backoff alone would wait up to 300 s
        expired = retry_delay(
            failures, BACKOFF, rng, left=TokenLeft(-30, -40), provider_wait=True
        ).delay
        assert low <= expired <= high
        # Within the margin but still valid: the cadence, and never past a quarter of the rest.
        late = retry_delay(failures, BACKOFF, rng, left=TokenLeft(8, -2), provider_wait=True).delay
        assert late <= 2 * (1 + AFTER_EXPIRY_JITTER)


def test_a_retry_after_past_the_last_planned_refresh_is_overridden() -> None:
    retry = retry_delay(
        1, BACKOFF, random.Random(1), retry_after=600, left=TokenLeft(-1, -11), provider_wait=True
    )
    assert retry.retry_after == "overridden"
    assert retry.delay <= 5 * (1 + AFTER_EXPIRY_JITTER)


def test_the_cadence_stretches_with_the_crowd_but_a_refusal_keeps_its_backoff() -> None:
    rng = random.Random(2)
    crowded = retry_delay(1, BACKOFF, rng, left=TokenLeft(-5, -15), provider_wait=True, crowd=100)
    assert crowded.delay >= 100 * (1 - AFTER_EXPIRY_JITTER)
    # Before the last planned refresh too: a crowd's tries stay at the recovery rate.
    early = retry_delay(1, BACKOFF, rng, left=TokenLeft(600, 540), provider_wait=True, crowd=100)
    assert early.delay >= 100 * (1 - AFTER_EXPIRY_JITTER)
    refusals = [retry_delay(12, BACKOFF, rng, left=TokenLeft(-5, -15)).delay for _ in range(50)]
    assert max(refusals) > 100  # invalid_client after expiry: no 5-second hammering


def test_the_crowd_keeps_many_waiting_credentials_at_the_providers_rate() -> None:
    recovery = Recovery(rate_limit=None)
    for n in range(1000):
        recovery.failed(f"c{n}")
    # Each of 1,000 tries every 100 s: 10 a second together.
    assert recovery.crowd() == pytest.approx(1000 / DEFAULT_RATE)
    # Half a rate_limit: the other half for refreshes that fall due, so the bucket is not kept
    # full by retries (each would hold a max_concurrency slot while it waits in it).
    assert Recovery(rate_limit=50).rate == 25


def test_the_first_token_after_an_outage_wakes_the_others_once() -> None:
    recovery = Recovery()
    woken: list[frozenset[str]] = []
    recovery.on_back(woken.append)
    for name in ("a", "b", "c"):
        recovery.failed(name)
    recovery.answered("a", 100.0)
    recovery.answered("b", 101.0)  # the same return: nobody is woken twice
    assert woken == [frozenset({"b", "c"})]
    assert recovery.answered_since(99.0) and not recovery.answered_since(101.0)
    assert not recovery.answered_since(None)


# -- a job over fakes -----------------------------------------------------------------------------


@dataclass
class Inputs:
    async def client(self, *, fresh: bool = False) -> tuple[str, Secret]:
        return "cid", Secret("cs-secret-value")

    async def refresh_token(self) -> Secret | None:
        return None

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        return None


@dataclass
class World:
    """One provider (token endpoint and probe), Vault, a clock; `drop_probes` probe requests
    lose their connection, as a flaky network does."""

    clock: FakeClock = field(default_factory=FakeClock)
    server: FakeOAuthServer = field(default_factory=lambda: FakeOAuthServer(expires_in=LIFETIME))
    observer: RecordingObserver = field(default_factory=RecordingObserver)
    drop_probes: int = 0
    probes: int = 0
    store: FakeVaultStore = field(init=False)
    client: ProviderClient = field(init=False)

    def __post_init__(self) -> None:
        self.store = FakeVaultStore(clock=self.clock)
        self.client = ProviderClient(
            ProviderConfig(name="acme", base_url="https://acme.test"),
            clock=self.clock,
            transport=httpx.MockTransport(self.handle),
        )

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/projects":
            self.probes += 1
            if self.drop_probes > 0:
                self.drop_probes -= 1
                raise httpx.RemoteProtocolError("connection dropped", request=request)
        return self.server.handle(request)

    def job(self, name: str = "reporting", probe: str | None = "/v1/projects") -> CredentialJob:
        credential = CredentialConfig(
            name=name,
            provider="acme",
            client_id=SecretRef.env("CLIENT_ID"),
            client_secret=SecretRef.env("CLIENT_SECRET"),
            publish_to=f"apps/{name}/acme",
            probe=probe,
            refresh=RefreshPolicy(at=0.66, jitter=0.1, margin=MARGIN),
            backoff=BACKOFF,
        )
        deps = JobDeps(
            store=self.store,
            observer=self.observer,
            clock=self.clock,
            rng=random.Random(4),
            instance_id="i-1",
        )
        return build_job(credential, self.client, None, Inputs(), deps)

    async def state(self, name: str = "reporting") -> CredentialState:
        entry = await self.store.read(f"keyturn/state/{name}")
        assert entry is not None
        return CredentialState.from_data(entry.data, name)

    async def published(self, name: str = "reporting") -> tuple[int, str]:
        entry = await self.store.read(f"apps/{name}/acme")
        assert entry is not None
        return entry.version, str(entry.data["access_token"])

    async def drive(self, run: Awaitable[T], step: float = 0.25) -> T:
        """Await `run`, moving the clock on whenever it waits on it (a probe's pause)."""
        task = asyncio.ensure_future(run)
        while not task.done():
            for _ in range(20):
                await asyncio.sleep(0)
            if not task.done():
                self.clock.advance(step)
        return task.result()


async def test_after_expiry_the_tries_come_at_the_cadence_and_the_return_is_seconds_away() -> None:
    world = World()
    job = world.job(probe=None)
    first = await job.run()
    expires_at = (await world.state()).token.expires_at
    assert expires_at is not None
    world.clock.advance(first.next_due - world.clock.time())
    # Down from the planned refresh until 40 s after expiry.
    tries: list[float] = []
    while world.clock.time() < expires_at + 40:
        world.server.next_responses.append(httpx.Response(503, headers={"Retry-After": "120"}))
        tries.append(world.clock.time())
        outcome = await job.run()
        assert outcome.action == "failed"
        world.clock.advance(outcome.next_due - world.clock.time())
    after = [t for t in tries if t > expires_at]
    gaps = [b - a for a, b in itertools.pairwise(after)]
    assert len(after) >= 6
    assert all(
        5 * (1 - AFTER_EXPIRY_JITTER) - 1e-6 <= g <= 5 * (1 + AFTER_EXPIRY_JITTER) + 1e-6
        for g in gaps
    ), gaps
    # Every Retry-After past the deadline was overridden, and said so.
    outcomes = {e.outcome for e in world.observer.of(RetryAfterBounded) if e.expired}
    assert outcomes == {"overridden"}
    back = world.clock.time()
    assert (await job.run()).action == "refreshed"
    assert world.clock.time() - back < 6


async def test_a_retry_after_of_ten_minutes_before_a_refresh_is_cut_to_the_deadline() -> None:
    world = World()
    job = world.job(probe=None)
    first = await job.run()
    state = await world.state()
    assert state.token.expires_at is not None
    world.clock.advance(first.next_due - world.clock.time())
    world.server.next_responses.append(httpx.Response(503, headers={"Retry-After": "600"}))
    outcome = await job.run()
    assert outcome.action == "failed"
    assert outcome.next_due <= state.token.expires_at - MARGIN + 1e-6
    assert [e.outcome for e in world.observer.of(RetryAfterBounded)] == ["shortened"]
    world.clock.advance(outcome.next_due - world.clock.time())
    assert (await job.run()).action == "refreshed"
    assert world.clock.time() < state.token.expires_at


async def test_a_token_issued_to_one_credential_makes_the_others_due_at_once() -> None:
    world = World()
    jobs = [world.job(f"c{n}", probe=None) for n in range(3)]
    for job in jobs:
        await job.run()
    woken: list[frozenset[str]] = []
    world.client.recovery.on_back(woken.append)
    world.clock.advance(LIFETIME + 1)  # every token expired, and the provider is down
    plans = []
    for job in jobs:
        world.server.next_responses.append(httpx.Response(503))
        plans.append(await job.run(force=True))
    assert all(p.action == "failed" for p in plans)
    world.clock.advance(0.5)
    assert (await jobs[0].run(force=True)).action == "refreshed"
    assert woken == [frozenset({"c1", "c2"})]
    # Woken before their own retry time, they find their refresh due now.
    for job in jobs[1:]:
        assert (await job.run()).action == "refreshed"


def test_a_wake_at_a_rate_limit_plans_one_start_after_another() -> None:
    world = World()
    names = ["c0", "c1", "c2"]
    scheduler = CredentialScheduler([world.job(name) for name in names], clock=world.clock)
    now = world.clock.time()
    assert scheduler.wake([*names, "not-configured"], spacing=0.5) == names
    planned = [scheduler.status_of(name) for name in names]
    assert [p.next_due - now for p in planned if p is not None] == [0.0, 0.5, 1.0]


async def test_a_probe_that_gets_no_answer_is_retried_alone_and_the_token_kept() -> None:
    world = World()
    job = world.job()
    first = await world.drive(job.run())
    assert first.action == "refreshed"
    _, old_token = await world.published()
    world.clock.advance(first.next_due - world.clock.time())  # inside the refresh window
    grants = len(world.server.access_tokens)
    world.drop_probes = PROBE_ATTEMPTS
    probes = world.probes
    failed = await world.drive(job.run())
    assert isinstance(failed.error, ProbeUnanswered)
    assert world.probes - probes == PROBE_ATTEMPTS  # the probe alone, not a new grant
    assert len(world.server.access_tokens) == grants + 1
    assert (await world.published())[1] == old_token  # nothing published yet
    world.clock.advance(failed.next_due - world.clock.time())
    again = await world.drive(job.run())
    assert again.action == "refreshed"
    assert len(world.server.access_tokens) == grants + 1  # the kept token, no other grant
    assert (await world.published())[1] == world.server.access_tokens[-1]
    assert (await world.state()).token.verify_at is None


async def test_a_probe_unanswered_past_the_deadline_publishes_unverified_then_probes_it() -> None:
    world = World()
    job = world.job()
    first = await world.drive(job.run())
    expires_at = (await world.state()).token.expires_at
    assert expires_at is not None
    world.clock.advance(expires_at - MARGIN + 1 - world.clock.time())  # past the deadline
    world.drop_probes = PROBE_ATTEMPTS
    outcome = await world.drive(job.run())
    assert outcome.action == "refreshed", outcome.error
    assert first.state.token.expires_at == expires_at
    state = await world.state()
    assert state.token.verify_at is not None
    assert world.clock.time() < expires_at  # published before the old token expired
    assert (await world.published())[1] == world.server.access_tokens[-1]
    published = world.observer.of(Published)
    assert published[-1].verified is False
    # Probed again later, with the published token: the service answers now.
    assert outcome.next_due <= state.token.verify_at
    world.clock.advance(state.token.verify_at - world.clock.time())
    grants, probes = len(world.server.access_tokens), world.probes
    checked = await world.drive(job.run())
    assert checked.action == "verified"
    assert world.probes == probes + 1 and len(world.server.access_tokens) == grants
    assert (await world.state()).token.verify_at is None


async def test_an_unverified_token_the_service_then_refuses_is_replaced_at_once() -> None:
    world = World()
    job = world.job()
    await world.drive(job.run())
    expires_at = (await world.state()).token.expires_at
    assert expires_at is not None
    world.clock.advance(expires_at - MARGIN + 1 - world.clock.time())
    world.drop_probes = PROBE_ATTEMPTS
    await world.drive(job.run())
    verify_at = (await world.state()).token.verify_at
    assert verify_at is not None and verify_at - world.clock.time() <= UNVERIFIED_RECHECK
    world.clock.advance(verify_at - world.clock.time())
    world.server.probe_status = 401
    refused = await world.drive(job.run())
    assert refused.action == "refused"
    assert refused.next_due <= world.clock.time()
    assert any(e.detector == "fresh_credential_rejected" for e in world.observer.of(Suspicious))
    world.server.probe_status = None
    grants = len(world.server.access_tokens)
    assert (await world.drive(job.run())).action == "refreshed"
    assert len(world.server.access_tokens) == grants + 1


async def test_a_probes_5xx_keeps_the_token_instead_of_refusing_it() -> None:
    world = World()
    job = world.job()
    await world.drive(job.run())
    world.server.probe_status = 503
    world.clock.advance(1)
    failed = await world.drive(job.run(force=True))
    # A 5xx is no answer about the token: kept, not refused.
    assert isinstance(failed.error, ProviderUnavailable)
    assert not any(e.detector == "fresh_credential_rejected" for e in world.observer.of(Suspicious))


@pytest.mark.parametrize("revoke_path", [None, "/oauth/revoke"])
async def test_a_lost_refresh_token_without_revoke_path_is_named_as_orphaned(
    revoke_path: str | None,
) -> None:
    world = World()
    world.client = ProviderClient(
        ProviderConfig(name="acme", base_url="https://acme.test", revoke_path=revoke_path),
        clock=world.clock,
        transport=httpx.MockTransport(world.handle),
    )
    job = world.job(probe=None)
    await job.run()  # holds a refresh token now
    world.server.lose_answers = 1
    with capture_logs() as logs:
        lost = await job.run(force=True)
        assert isinstance(lost.error, ProviderUnavailable)
        assert (await job.run(force=True)).action == "refreshed"
    events = [entry["event"] for entry in logs]
    assert "refresh_token.lost" in events
    orphaned = [entry for entry in logs if entry["event"] == "refresh_token.orphaned"]
    if revoke_path is None:
        assert [(e["credential"], e["provider"]) for e in orphaned] == [("reporting", "acme")]
    else:
        assert orphaned == []
        assert world.server.revoked  # the family was ended instead
