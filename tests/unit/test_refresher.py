"""The OAuth refresh flow over fakes: FakeVaultStore, a MockTransport OAuth server, FakeClock."""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass

import httpx
import pytest

from keyturn.clock import FakeClock, parse_rfc3339
from keyturn.config import CredentialConfig, ProviderConfig
from keyturn.errors import VaultUnavailable
from keyturn.events import Failed, Suspicious
from keyturn.jobs.job import MIN_LEASE, CredentialJob, JobDeps, Journal, Lease, lease_in_force
from keyturn.kinds import build_job
from keyturn.policy import BackoffPolicy, RefreshPolicy
from keyturn.providers.client import ProviderClient
from keyturn.references import SecretRef
from keyturn.secret import Secret
from keyturn.state import CredentialState, LeaseRecord, TokenRecord
from keyturn.testing.oauth import FakeOAuthServer
from keyturn.testing.observer import RecordingObserver
from keyturn.testing.vault import FakeVaultStore

STATE = "keyturn/state/reporting"
PUBLISHED = "apps/reporting/acme"


@dataclass
class Inputs:
    """The client inputs at their source, by credential name."""

    name: str
    values: dict[str, tuple[str, Secret]]

    async def client(self, *, fresh: bool = False) -> tuple[str, Secret]:
        return self.values[self.name]

    async def refresh_token(self) -> Secret | None:
        return None

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        return None


def oauth_credential(name: str, publish_to: str, **options: object) -> CredentialConfig:
    return CredentialConfig(
        name=name,
        provider="acme",
        client_id=SecretRef.env("CLIENT_ID"),
        client_secret=SecretRef.env("CLIENT_SECRET"),
        publish_to=publish_to,
        **options,  # type: ignore[arg-type]
    )


@dataclass
class World:
    clock: FakeClock
    store: FakeVaultStore
    server: FakeOAuthServer
    observer: RecordingObserver
    inputs: dict[str, tuple[str, Secret]]

    def deps(self, instance: str = "i-1", seed: int = 4) -> JobDeps:
        return JobDeps(
            store=self.store,
            observer=self.observer,
            clock=self.clock,
            rng=random.Random(seed),
            instance_id=instance,
            state_prefix="keyturn/state",
        )

    def refresher(
        self, instance: str = "i-1", probe: str | None = "/v1/projects", scope: str | None = None
    ) -> CredentialJob:
        client = ProviderClient(
            ProviderConfig(name="acme", base_url="https://acme.test"),
            clock=self.clock,
            transport=self.server.transport(),
        )
        credential = oauth_credential(
            "reporting",
            PUBLISHED,
            probe=probe,
            scope=scope,
            refresh=RefreshPolicy(at=0.66, jitter=0.1, margin=60),
            backoff=BackoffPolicy(initial=1, maximum=300),
        )
        return build_job(
            credential, client, None, Inputs("reporting", self.inputs), self.deps(instance)
        )

    async def state(self) -> CredentialState:
        entry = await self.store.read(STATE)
        assert entry is not None
        return CredentialState.from_data(entry.data, "reporting")


@pytest.fixture
def world() -> World:
    clock = FakeClock()
    server = FakeOAuthServer()
    return World(
        clock=clock,
        store=FakeVaultStore(clock=clock),
        server=server,
        observer=RecordingObserver(),
        inputs={"reporting": ("cid", Secret(server.client_secret))},
    )


async def test_first_run_publishes_what_apps_read(world: World) -> None:
    outcome = await world.refresher().run()
    assert outcome.action == "refreshed"
    entry = await world.store.read(PUBLISHED)
    assert entry is not None
    assert entry.data["access_token"] == "at-1-secretvalue"
    assert entry.data["authorization"] == "Bearer at-1-secretvalue"
    assert entry.data["token_type"] == "Bearer"
    assert parse_rfc3339(entry.data["expires_at"]) == int(world.clock.time()) + 600
    # What does not change from one refresh to the next; the times are in the data.
    assert entry.custom_metadata == {
        "managed-by": "keyturn",
        "credential": "reporting",
        "writer": "i-1",
    }
    state = await world.state()
    assert state.refresh.token == Secret("rt-1-secretvalue")
    assert state.token.published_version == entry.version
    assert state.token.phase == "ok" and state.token.verify_at is None
    # Stored with the refresh token before the probe and the publish; the lease ended with it.
    assert state.lease.ends_with == entry.version
    assert world.clock.time() + 0.56 * 600 <= outcome.next_due <= world.clock.time() + 0.76 * 600
    # Consumers read when keyturn plans to replace the token: its own plan, in whole seconds.
    refresh_at = parse_rfc3339(entry.data["refresh_at"])
    assert outcome.next_due <= refresh_at < outcome.next_due + 1


async def test_rotated_refresh_token_is_stored_before_the_token_is_published(world: World) -> None:
    await world.refresher().run()
    paths = [path for path, _ in world.store.writes]
    # The lease (a first grant goes out only under it), the refresh token the grant returned
    # (with the outcome the probe and the publish then make true), then the publish.
    assert paths == [STATE, STATE, PUBLISHED]
    versions = world.store._records[("secret", STATE)].versions
    lease = CredentialState.from_data(versions[1].data, "reporting")
    assert lease.lease.owner == "i-1" and lease.lease.until is not None
    assert lease.refresh.token is None
    stored = CredentialState.from_data(versions[2].data, "reporting")
    assert stored.refresh.token == Secret("rt-1-secretvalue")
    assert stored.token.published_version == 1 and stored.lease.ends_with == 1
    assert world.server.grants == ["client_credentials"]


async def test_nothing_is_requested_while_the_token_is_fresh(world: World) -> None:
    refresher = world.refresher()
    first = await refresher.run()
    world.clock.advance(100)  # well before the earliest refresh time (0.56 * 600)
    again = await refresher.run()
    assert again.action == "fresh"
    assert world.server.grants == ["client_credentials"]
    assert again.next_due == pytest.approx(first.next_due, abs=0.2 * 600)


async def test_due_refresh_uses_the_refresh_token_exactly_once(world: World) -> None:
    refresher = world.refresher()
    for _ in range(4):
        outcome = await refresher.run()
        world.clock.advance(outcome.next_due - world.clock.time())
    assert world.server.grants == ["client_credentials"] + ["refresh_token"] * 3
    assert len(world.server.used_refresh) == len(set(world.server.used_refresh)) == 3
    entry = await world.store.read(PUBLISHED)
    assert entry is not None and entry.data["access_token"] == "at-4-secretvalue"


async def test_invalid_grant_is_reported_and_falls_back_to_client_credentials(world: World) -> None:
    refresher = world.refresher()
    outcome = await refresher.run()
    world.server.live_refresh.clear()  # someone else used (or revoked) our refresh token
    world.clock.advance(outcome.next_due - world.clock.time())
    outcome = await refresher.run()
    assert outcome.action == "refreshed"
    assert world.server.grants == ["client_credentials", "refresh_token", "client_credentials"]
    suspicious = world.observer.of(Suspicious)
    assert [s.detector for s in suspicious] == ["refresh_token_rejected"]
    assert (await world.state()).refresh.token == Secret("rt-2-secretvalue")


async def test_a_token_rejected_by_the_probe_is_never_published(world: World) -> None:
    refresher = world.refresher()
    first = await refresher.run()
    before = await world.store.read(PUBLISHED)
    world.server.probe_status = 401
    world.clock.advance(first.next_due - world.clock.time())
    outcome = await refresher.run()
    assert outcome.action == "failed"
    assert "rejected by probe" in str(outcome.error)
    after = await world.store.read(PUBLISHED)
    assert before is not None and after is not None and after.version == before.version
    state = await world.state()
    assert state.token.phase == "failing" and state.token.consecutive_failures == 1
    # the new refresh token was kept even though nothing was published
    assert state.refresh.token == Secret("rt-2-secretvalue")
    assert [s.detector for s in world.observer.of(Suspicious)] == ["fresh_credential_rejected"]
    # The outcome stored with it before the probe is taken back: the record names what apps
    # read, and the lease is released.
    assert state.token.published_version == before.version
    assert state.token.expires_at == parse_rfc3339(before.data["expires_at"])
    assert state.lease.owner is None and state.lease.ends_with is None


@pytest.mark.parametrize(
    ("response", "needle"),
    [
        (
            httpx.Response(
                200, json={"access_token": "x", "token_type": "Bearer", "expires_in": -1}
            ),
            "expires_in",
        ),
        (httpx.Response(200, content=b"<html>"), "body"),
        (httpx.Response(502), "HTTP 502"),
    ],
)
async def test_bad_responses_fail_without_publishing(world: World, response, needle) -> None:
    world.server.next_responses.append(response)
    outcome = await world.refresher().run()
    assert outcome.action == "failed"
    assert needle in str(outcome.error)
    assert await world.store.read(PUBLISHED) is None
    assert (await world.state()).token.last_error == str(outcome.error)


async def test_backoff_grows_and_honours_retry_after(world: World) -> None:
    refresher = world.refresher()
    world.server.next_responses += [httpx.Response(503)] * 5
    delays = []
    for _ in range(5):
        outcome = await refresher.run()
        delays.append(outcome.next_due - world.clock.time())
        early = await refresher.run()  # before the retry time: nothing is requested
        assert early.action == "fresh"
        world.clock.advance(outcome.next_due - world.clock.time())
    assert (await world.state()).token.consecutive_failures == 5
    for attempt, delay in enumerate(delays):  # full jitter below a cap that doubles
        assert 1 <= delay <= 2**attempt
    world.server.next_responses.append(httpx.Response(429, headers={"Retry-After": "120"}))
    outcome = await refresher.run()
    assert outcome.next_due - world.clock.time() >= 120
    assert (await world.state()).token.consecutive_failures == 6


async def test_a_lease_held_by_another_instance_is_respected(world: World) -> None:
    await world.store.write(
        STATE,
        CredentialState(lease=LeaseRecord("i-2", world.clock.time() + 30)).to_data(),
        cas=0,
    )
    outcome = await world.refresher("i-1").run()
    assert outcome.action == "lease_held"
    assert "i-2" in str(outcome.error)
    assert world.server.grants == []
    # It looks again soon (the holder may let go any moment), and while the lease lasts it
    # still keeps off.
    assert world.clock.time() + 2 <= outcome.next_due < world.clock.time() + 3
    world.clock.advance(outcome.next_due - world.clock.time())
    assert (await world.refresher("i-1").run()).action == "lease_held"
    assert world.server.grants == []
    world.clock.advance(31)  # an expired lease (the other instance died) is taken over
    assert (await world.refresher("i-1").run()).action == "refreshed"


async def test_a_first_grant_waits_for_the_lease_so_a_late_instance_sends_none(
    world: World,
) -> None:
    """i-2 found no record at start, but i-1 ran the credential first. A client_credentials
    grant goes out only under the lease: i-2's lease write (check-and-set 0) is refused before
    it asks the provider for anything, so the provider sees one grant, i-2 stores and publishes
    nothing, reports no failure, and reads the record, by which nothing is due."""
    await world.refresher("i-1").run()
    published = await world.store.read(PUBLISHED)
    record = await world.state()
    late = world.refresher("i-2")
    late.assume_absent()
    outcome = await late.run()
    assert outcome.action == "fresh"
    assert outcome.error is None
    assert world.server.grants == ["client_credentials"]
    assert await world.store.read(PUBLISHED) == published
    assert await world.state() == record
    assert world.observer.of(Failed) == [] and world.observer.of(Suspicious) == []
    # Its next run starts from the record it read, and refreshes with i-1's refresh token.
    world.clock.advance(outcome.next_due - world.clock.time())
    assert (await late.run()).action == "refreshed"
    assert world.server.grants[-1] == "refresh_token"
    assert world.server.used_refresh == ["rt-1-secretvalue"]


async def test_a_refresh_from_a_stale_copy_sends_no_refresh_token_before_its_write_wins(
    world: World,
) -> None:
    """A run planned from this process's copy defers its lease to the refresh token's
    in-flight mark: when someone else wrote the record since, that write is refused before
    the refresh token leaves, and the run reads the record and starts again from it."""
    refresher = world.refresher("i-1")
    outcome = await refresher.run()
    entry = await world.store.read(STATE)
    assert entry is not None
    world.store.external_write(STATE, dict(entry.data))  # e.g. `keyturn status --json` tooling
    writes, reads = len(world.store.writes), len(world.store.reads)
    world.clock.advance(outcome.next_due - world.clock.time())
    outcome = await refresher.run()
    assert outcome.action == "refreshed"
    assert world.server.used_refresh == ["rt-1-secretvalue"]  # sent once, after the read
    assert world.store.reads[reads:] == [("read", STATE, True)]
    # The refused in-flight mark wrote nothing; then the in-flight mark, the rotated refresh
    # token with the outcome, the publish (no release).
    assert [path for path, _ in world.store.writes[writes:]] == [STATE, STATE, PUBLISHED]
    assert world.observer.of(Failed) == []


class MarkAnswerLost(FakeVaultStore):
    """Stores the next in-flight mark written to STATE, then fails as if its answer were lost."""

    lose_next_mark = False

    async def write(self, path: str, data: object, **options: object) -> int:  # type: ignore[override]
        version = await super().write(path, data, **options)  # type: ignore[arg-type]
        if self.lose_next_mark and path == STATE and "refresh_in_flight" in data:  # type: ignore[operator]
            self.lose_next_mark = False
            raise VaultUnavailable("write: the answer was lost", path=path)
        return version


async def test_an_in_flight_mark_whose_write_seemed_to_fail_is_not_burned(world: World) -> None:
    """The mark was stored but its answer lost: this process never sent that refresh token, so
    when it reads its own mark back it clears it and sends the token, instead of burning it
    and starting a new grant."""
    store = MarkAnswerLost(clock=world.clock)
    world.store = store
    refresher = world.refresher()
    outcome = await refresher.run()
    store.lose_next_mark = True
    world.clock.advance(outcome.next_due - world.clock.time())
    outcome = await refresher.run()
    assert outcome.action == "refreshed"
    assert world.server.grants == ["client_credentials", "refresh_token"]
    assert world.server.used_refresh == ["rt-1-secretvalue"]
    state = await world.state()
    assert state.refresh.in_flight is None and state.refresh.burned is None
    assert state.refresh.token == Secret("rt-2-secretvalue")


async def test_an_external_write_is_reported_and_overwritten(world: World) -> None:
    refresher = world.refresher()
    outcome = await refresher.run()
    world.store.external_write(PUBLISHED, {"access_token": "planted"})
    world.clock.advance(outcome.next_due - world.clock.time())
    outcome = await refresher.run(force=True)
    assert outcome.action == "refreshed"
    assert [s.detector for s in world.observer.of(Suspicious)] == ["published_secret_changed"]
    entry = await world.store.read(PUBLISHED)
    assert entry is not None and entry.data["access_token"] != "planted"


async def test_a_changed_published_value_is_republished_at_start(world: World) -> None:
    await world.refresher().run()
    world.store.external_write(PUBLISHED, {"access_token": "planted"})
    outcome = await world.refresher().run()  # a restart: not due, but apps read something else
    assert outcome.action == "refreshed"


async def test_vault_down_is_a_failed_outcome_not_an_exception(world: World) -> None:
    world.store.unavailable = True
    outcome = await world.refresher().run()
    assert outcome.action == "failed"
    assert isinstance(outcome.error, VaultUnavailable)
    assert outcome.next_due > world.clock.time()


async def test_a_malformed_state_record_is_named_and_left_alone(world: World) -> None:
    world.store.external_write(STATE, {"expires_at": "tomorrow", "refresh_token": "rt-keep"})
    outcome = await world.refresher().run()
    assert outcome.action == "failed"
    assert "expires_at" in str(outcome.error) and "reporting" in str(outcome.error)
    entry = await world.store.read(STATE)
    assert entry is not None and entry.data["refresh_token"] == "rt-keep"  # nothing lost
    assert world.server.grants == []


async def test_without_refresh_tokens_client_credentials_runs_again(world: World) -> None:
    world.server.issue_refresh = False
    refresher = world.refresher()
    for _ in range(3):
        outcome = await refresher.run()
        world.clock.advance(outcome.next_due - world.clock.time())
    assert world.server.grants == ["client_credentials"] * 3


async def test_missing_expires_in_uses_the_default_lifetime(world: World) -> None:
    world.server.expires_in = None
    await world.refresher().run()
    state = await world.state()
    assert state.token.expires_at is not None and state.token.issued_at is not None
    assert state.token.expires_at - state.token.issued_at == pytest.approx(3600, abs=1)


async def test_no_secret_reaches_observers_or_outcomes(world: World) -> None:
    refresher = world.refresher()
    for _ in range(3):
        outcome = await refresher.run()
        world.clock.advance(outcome.next_due - world.clock.time())
    world.server.probe_status = 401
    outcome = await refresher.run(force=True)
    events = world.observer.events
    text = repr(events) + repr(outcome) + str(outcome.error)
    assert "secretvalue" not in text
    assert "cs-secret-value" not in text
    fields = [str(getattr(e, f.name)) for e in events for f in dataclasses.fields(e)]
    assert json.dumps(fields).count("secretvalue") == 0


MALFORMED = {
    "missing access_token": (
        {"token_type": "Bearer", "expires_in": 60},
        "access_token: missing or not a non-empty string",
    ),
    "negative expires_in": (
        {"access_token": "a", "token_type": "Bearer", "expires_in": -5},
        "expires_in: must be a positive number of seconds",
    ),
    "non-numeric expires_in": (
        {"access_token": "a", "token_type": "Bearer", "expires_in": "later"},
        "expires_in: not a number",
    ),
    "unexpected token_type": (
        {"access_token": "a", "token_type": "mac", "expires_in": 60},
        "token_type: expected 'Bearer', got 'mac'",
    ),
    "not JSON": (b"<html>oops</html>", "body: body is not JSON"),
    "oversized": (b"{" + b" " * 70_000 + b"}", "body: response larger than 65536 bytes"),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
async def test_each_malformed_response_is_a_clear_error_and_others_keep_refreshing(
    world: World, kind: str
) -> None:
    """Two credentials on one provider: one gets a malformed response, the other does not."""
    body, message = MALFORMED[kind]
    good = world.refresher()
    bad_store_path = "apps/bad/acme"

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/oauth/token" and json.loads(request.content)["client_id"] == "bad":
            if isinstance(body, bytes):
                return httpx.Response(200, content=body)
            return httpx.Response(200, json=body)
        return world.server.handle(request)

    client = ProviderClient(
        ProviderConfig(name="acme", base_url="https://acme.test"),
        clock=world.clock,
        transport=httpx.MockTransport(handler),
    )
    bad = build_job(
        oauth_credential("bad", bad_store_path),
        client,
        None,
        Inputs("bad", {"bad": ("bad", Secret("cs-secret-value"))}),
        world.deps(seed=1),
    )
    for _ in range(3):
        bad_outcome = await bad.run()
        good_outcome = await good.run(force=True)
        assert bad_outcome.action == "failed"
        assert good_outcome.action == "refreshed"
        world.clock.advance(bad_outcome.next_due - world.clock.time())
    assert str(bad_outcome.error) == f"bad: {message}"
    assert await world.store.read(bad_store_path) is None
    assert (await world.store.read(PUBLISHED)) is not None
    failures = world.observer.of(Failed)
    assert [f.credential for f in failures] == ["bad"] * 3
    assert [f.failures for f in failures] == [1, 2, 3]


async def test_grant_drift_in_lifetime_is_reported(world: World) -> None:
    refresher = world.refresher()
    outcome = await refresher.run()
    world.server.expires_in = 60  # was 600
    world.clock.advance(outcome.next_due - world.clock.time())
    await refresher.run()
    drift = [s for s in world.observer.of(Suspicious) if s.detector == "grant_drift"]
    assert len(drift) == 1
    assert "lifetime dropped from 600s to 60s" in drift[0].detail


async def test_a_usual_lifetime_is_not_drift(world: World) -> None:
    refresher = world.refresher()
    for _ in range(3):
        outcome = await refresher.run()
        world.clock.advance(outcome.next_due - world.clock.time())
    assert world.observer.of(Suspicious) == []


async def test_a_scope_other_than_asked_is_drift(world: World) -> None:
    world.server.scope = "projects:read admin"
    await world.refresher(scope="projects:read").run()
    drift = [s for s in world.observer.of(Suspicious) if s.detector == "grant_drift"]
    assert len(drift) == 1
    assert "extra ['admin']" in drift[0].detail


async def test_without_a_probe_the_outcome_goes_with_the_refresh_token_and_no_release_is_written(
    world: World,
) -> None:
    """Nothing can fail after the publish, so the write that stores the rotated refresh token
    also stores the run's outcome (the version the publish will create) and the lease ends
    with that publish: three writes, not four."""
    outcome = await world.refresher(probe=None).run()
    assert outcome.action == "refreshed"
    assert [path for path, _ in world.store.writes] == [STATE, STATE, PUBLISHED]
    entry = await world.store.read(PUBLISHED)
    assert entry is not None
    state = await world.state()
    assert state.refresh.token == Secret("rt-1-secretvalue")
    assert state.token.published_version == entry.version
    assert state.token.phase == "ok" and state.token.next_due == outcome.next_due
    assert state.lease.owner == "i-1" and state.lease.ends_with == entry.version
    # The steady refresh: the in-flight mark takes the lease, then the outcome, then publish.
    world.clock.advance(outcome.next_due - world.clock.time())
    writes = len(world.store.writes)
    outcome = await world.refresher(probe=None).run()
    assert outcome.action == "refreshed"
    assert [path for path, _ in world.store.writes[writes:]] == [STATE, STATE, PUBLISHED]
    assert (await world.state()).token.published_version == entry.version + 1


async def test_a_lease_that_ended_with_its_publish_does_not_hold_up_another_instance(
    world: World,
) -> None:
    """Once the version it names is what apps read, the lease is over, well before its time:
    a command or another instance goes ahead at once."""
    await world.refresher("i-1", probe=None).run()
    assert (await world.state()).lease.held(world.clock.time())
    outcome = await world.refresher("i-2", probe=None).run(force=True)
    assert outcome.action == "refreshed"
    assert (await world.state()).token.writer == "i-2"


async def test_a_lease_that_ended_with_its_publish_is_over_once_someone_wrote_on_top(
    world: World,
) -> None:
    """A write on top of the version the lease ends with (someone else's, which the watcher
    must report at once) does not make the lease hold again until its time."""
    await world.refresher("i-1", probe=None).run()
    state = await world.state()
    assert state.lease.ends_with is not None and state.lease.held(world.clock.time())
    now = world.clock.time()
    assert not await lease_in_force(world.store, state, PUBLISHED, now)
    world.store.external_write(PUBLISHED, {"access_token": "planted"})
    assert not await lease_in_force(world.store, state, PUBLISHED, now)
    earlier = dataclasses.replace(
        state, lease=dataclasses.replace(state.lease, ends_with=state.lease.ends_with + 2)
    )
    assert await lease_in_force(world.store, earlier, PUBLISHED, now)  # not landed yet


async def test_a_lease_whose_publish_never_landed_holds_until_its_time(world: World) -> None:
    """An instance that died after storing its outcome and before publishing: its record
    names a version apps do not read. Another instance waits out the lease (a publish may
    still be on its way), then refreshes and publishes; apps read a valid token throughout."""
    first = await world.refresher("i-1", probe=None).run()
    published = await world.store.read(PUBLISHED)
    assert published is not None
    state = await world.state()
    world.clock.advance(first.next_due - world.clock.time())
    dead = dataclasses.replace(
        state,
        lease=LeaseRecord("i-dead", world.clock.time() + 20, published.version + 1),
        token=dataclasses.replace(state.token, published_version=published.version + 1),
    )
    await world.store.write(STATE, dead.to_data(), cas=None)  # as the dead instance left it
    taker = world.refresher("i-2", probe=None)
    held = await taker.run()
    assert held.action == "lease_held"
    assert world.server.grants == ["client_credentials"]
    world.clock.advance(21)
    outcome = await taker.run()
    assert outcome.action == "refreshed"
    entry = await world.store.read(PUBLISHED)
    assert entry is not None and entry.data["access_token"] == "at-2-secretvalue"
    assert (await world.state()).token.published_version == entry.version


class PublishFails(FakeVaultStore):
    """Fails the next write to the published path, as a Vault that is down would."""

    fail_publish = False

    async def write(self, path: str, data: object, **options: object) -> int:  # type: ignore[override]
        if self.fail_publish and path == PUBLISHED:
            self.fail_publish = False
            raise VaultUnavailable("write: connection refused", path=path)
        return await super().write(path, data, **options)  # type: ignore[arg-type]


async def test_an_outcome_stored_before_a_publish_that_failed_is_taken_back(world: World) -> None:
    """The record must never claim a token apps do not read: the release stores the token
    part as it was, with the failure, and keeps the rotated refresh token."""
    store = PublishFails(clock=world.clock)
    world.store = store
    refresher = world.refresher(probe=None)
    first = await refresher.run()
    before = await world.state()
    store.fail_publish = True
    world.clock.advance(first.next_due - world.clock.time())
    outcome = await refresher.run()
    assert outcome.action == "failed"
    state = await world.state()
    assert state.token.published_version == before.token.published_version
    assert state.token.expires_at == before.token.expires_at
    assert state.token.phase == "failing" and state.token.consecutive_failures == 1
    assert state.refresh.token == Secret("rt-2-secretvalue")  # the rotated one, kept
    assert state.lease.owner is None and state.lease.ends_with is None
    world.clock.advance(outcome.next_due - world.clock.time())
    outcome = await refresher.run()
    assert outcome.action == "refreshed"
    assert world.server.used_refresh == ["rt-1-secretvalue", "rt-2-secretvalue"]


class CountingStore(FakeVaultStore):
    """Counts the custom metadata writes (a second Vault call each) beside `writes`."""

    metadata_writes: list[str]

    async def write(self, path: str, data: object, **options: object) -> int:  # type: ignore[override]
        version = await super().write(path, data, **options)  # type: ignore[arg-type]
        if options.get("custom_metadata") is not None:
            self.metadata_writes.append(path)
        return version


def counting(world: World) -> CountingStore:
    store = CountingStore(clock=world.clock)
    store.metadata_writes = []
    world.store = store
    return store


async def steady_refresh(
    world: World, job: CredentialJob, due: float
) -> tuple[list[str], int, int, float]:
    """One refresh at `due`: the paths written, the metadata writes and the reads it made,
    and when the next one is due."""
    store = world.store
    assert isinstance(store, CountingStore)
    world.clock.advance(due - world.clock.time())
    writes, metadata, reads = len(store.writes), len(store.metadata_writes), len(store.reads)
    outcome = await job.run()
    assert outcome.action == "refreshed"
    return (
        [path for path, _ in store.writes[writes:]],
        len(store.metadata_writes) - metadata,
        len(store.reads) - reads,
        outcome.next_due,
    )


@pytest.mark.parametrize(
    ("probe", "refresh_tokens", "written"),
    [
        (None, True, [STATE, STATE, PUBLISHED]),
        (None, False, [STATE, PUBLISHED, STATE]),
        ("/v1/projects", True, [STATE, STATE, PUBLISHED]),
        ("/v1/projects", False, [STATE, PUBLISHED, STATE]),
    ],
)
async def test_a_steady_refresh_writes_the_custom_metadata_only_the_first_time(
    world: World, probe: str | None, refresh_tokens: bool, written: list[str]
) -> None:
    """The custom metadata does not change from one refresh to the next: the first publish of
    a process writes it, later ones do not (one Vault call fewer each), and no refresh reads."""
    store = counting(world)
    world.server.issue_refresh = refresh_tokens
    job = world.refresher(probe=probe)
    first = await job.run()
    assert store.metadata_writes == [PUBLISHED]
    due = first.next_due
    for _ in range(3):
        paths, metadata, reads, due = await steady_refresh(world, job, due)
        assert (paths, metadata, reads) == (written, 0, 0)
    entry = await store.read(PUBLISHED)
    assert entry is not None and entry.version == 4
    assert entry.custom_metadata == {
        "managed-by": "keyturn",
        "credential": "reporting",
        "writer": "i-1",
    }


async def test_the_custom_metadata_is_written_again_when_another_instance_published(
    world: World,
) -> None:
    """`writer` names the instance that published last: after another one did, this one's
    next publish writes it again."""
    store = counting(world)
    first = await world.refresher("i-1", probe=None).run()
    world.clock.advance(first.next_due - world.clock.time())
    other = await world.refresher("i-2", probe=None).run()
    assert other.action == "refreshed"
    assert store.metadata_writes == [PUBLISHED, PUBLISHED]
    entry = await store.read(PUBLISHED)
    assert entry is not None and entry.custom_metadata["writer"] == "i-2"
    mine = world.refresher("i-1", probe=None)
    world.clock.advance(other.next_due - world.clock.time())
    assert (await mine.run()).action == "refreshed"
    assert store.metadata_writes == [PUBLISHED] * 3
    entry = await store.read(PUBLISHED)
    assert entry is not None and entry.custom_metadata["writer"] == "i-1"


async def test_a_restart_writes_the_custom_metadata_only_if_it_is_not_in_place(
    world: World,
) -> None:
    """A new process learns what the path holds from the metadata read its first run makes
    anyway (is the published version still keyturn's?): custom metadata in place is not written
    again; an older keyturn's (with `expires_at` and `refresh_at`) is replaced once."""
    store = counting(world)
    first = await world.refresher(probe=None).run()
    world.clock.advance(first.next_due - world.clock.time())
    restarted = world.refresher(probe=None)
    outcome = await restarted.run()
    assert outcome.action == "refreshed"
    assert store.metadata_writes == [PUBLISHED]
    # An older keyturn wrote the times into the custom metadata too.
    record = store._records[("secret", PUBLISHED)]
    record.custom_metadata = {**record.custom_metadata, "expires_at": "x", "refresh_at": "y"}
    world.clock.advance(outcome.next_due - world.clock.time())
    upgraded = world.refresher(probe=None)
    assert (await upgraded.run()).action == "refreshed"
    assert store.metadata_writes == [PUBLISHED, PUBLISHED]
    assert record.custom_metadata == {
        "managed-by": "keyturn",
        "credential": "reporting",
        "writer": "i-1",
    }


async def test_a_forced_refresh_writes_the_custom_metadata(world: World) -> None:
    """Custom metadata changed in place (no new version) is what the watcher finds and answers
    with a forced refresh: that publish writes the custom metadata back."""
    store = counting(world)
    job = world.refresher(probe=None)
    await job.run()
    store._records[("secret", PUBLISHED)].custom_metadata = {"managed-by": "someone"}
    assert (await job.run(force=True)).action == "refreshed"
    assert store.metadata_writes == [PUBLISHED, PUBLISHED]
    entry = await store.read(PUBLISHED)
    assert entry is not None and entry.custom_metadata["managed-by"] == "keyturn"


async def test_a_publish_over_someone_elses_version_writes_the_custom_metadata(
    world: World,
) -> None:
    """A check-and-set conflict at the published path: whoever wrote it may have left other
    custom metadata, and the publish on top of their version puts keyturn's back."""
    store = counting(world)
    job = world.refresher(probe=None)
    first = await job.run()
    store.external_write(PUBLISHED, {"access_token": "planted"}, custom_metadata={"k": "v"})
    world.clock.advance(first.next_due - world.clock.time())
    assert (await job.run(force=True)).action == "refreshed"
    entry = await store.read(PUBLISHED)
    assert entry is not None and entry.custom_metadata["managed-by"] == "keyturn"
    assert store.metadata_writes == [PUBLISHED, PUBLISHED]


async def test_a_lease_stored_with_the_outcome_is_bounded_by_the_token_apps_still_read(
    world: World,
) -> None:
    """Until the publish lands, apps read the old token: the lease stored with the outcome (and
    each renewal of it) is as short as that token requires, not as the new one would allow,
    so another instance can take over in time if this one dies while probing."""
    now = world.clock.time()
    old = CredentialState(token=TokenRecord(issued_at=now - 590, expires_at=now + 10))
    journal = Journal(
        world.store, STATE, old, 0, clock=world.clock, lease=Lease("i-1", 30.0), leased=False
    )
    new = dataclasses.replace(
        old, token=dataclasses.replace(old.token, issued_at=now, expires_at=now + 600)
    )
    stored = await journal.save_ending_with(new, 1)
    assert stored.lease.until == now + MIN_LEASE  # 10 s left: half is 5, less one step is < 0
    assert stored.lease.ends_with == 1
    renewed = await journal.renew()
    assert renewed.lease.until == now + MIN_LEASE and renewed.lease.ends_with == 1
    journal.stage(new)  # what the run really did: the release stores it, leased as ever
    assert (await journal.save(new)).lease.until == now + 30.0


async def test_a_task_due_after_the_refresh_keeps_the_release(world: World) -> None:
    """A token published unverified is probed again by the job's `verify` task: when that is
    due in the same run, the refresh does not end the run with its publish (the task after it
    writes), and the run ends with a release as before."""
    store = counting(world)
    job = world.refresher()
    first = await job.run()
    state = await world.state()
    world.clock.advance(first.next_due - world.clock.time())
    unverified = dataclasses.replace(state.token, verify_at=world.clock.time())
    await store.write(STATE, dataclasses.replace(state, token=unverified).to_data(), cas=None)
    writes = len(store.writes)
    outcome = await world.refresher().run()
    assert outcome.action == "refreshed"
    # The lease (the verify task takes it first), the in-flight mark, the rotated refresh
    # token (without the outcome), the publish, the release; the verify task then found no
    # unverified token left to probe.
    assert [path for path, _ in store.writes[writes:]] == [STATE, STATE, STATE, PUBLISHED, STATE]
    versions = store._records[("secret", STATE)].versions
    stored = CredentialState.from_data(versions[max(versions) - 1].data, "reporting")
    assert stored.refresh.token == Secret("rt-2-secretvalue") and stored.refresh.in_flight is None
    assert stored.lease.ends_with is None and stored.token.phase == "ok"
    assert stored.token.published_version == state.token.published_version
    state = await world.state()
    assert state.token.verify_at is None and state.lease.owner is None
    assert state.token.published_version == (await store.read(PUBLISHED)).version  # type: ignore[union-attr]
