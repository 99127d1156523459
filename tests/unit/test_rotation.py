"""The rotation journal over fakes: FakeVaultStore, a fake key provider, FakeClock."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import pytest

from keyturn.clock import FakeClock
from keyturn.config import CredentialConfig, ProviderConfig, RotationPolicy
from keyturn.errors import ProviderUnavailable, RotationError, VaultUnavailable
from keyturn.events import RotationStep, Suspicious
from keyturn.jobs.job import ConsumerHooks, ConsumersOnOld, CredentialJob, JobDeps, Journal
from keyturn.jobs.rotation import CONSUMERS_NOT_MOVED, NO_MONITOR, KeyRotation
from keyturn.kinds import build_job
from keyturn.policy import BackoffPolicy
from keyturn.providers.client import ProviderClient
from keyturn.rotators.base import AwaitingManualKey, NewKey, RotationRequest
from keyturn.secret import Secret
from keyturn.state import CredentialState
from keyturn.testing.observer import RecordingObserver
from keyturn.testing.rotator import FakeKeyProvider
from keyturn.testing.vault import FakeVaultStore

PUBLISHED = "apps/billing/acme"
STATE = "keyturn/state/billing"
DAY = 86400.0


@dataclass
class Inputs:
    """An api_key has no client inputs; `initial` stands for its `initial_key` input."""

    initial: Callable[[], Awaitable[tuple[Secret, str | None]]] | None = None

    async def client(self, *, fresh: bool = False) -> tuple[str, Secret]:
        raise AssertionError("an api_key has no client inputs")

    async def refresh_token(self) -> Secret | None:
        return None

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        return None if self.initial is None else await self.initial()


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = FakeVaultStore(clock=self.clock)
        self.provider = FakeKeyProvider()
        self.observer = RecordingObserver()

    def job(
        self,
        rotator=None,
        initial=None,
        policy: RotationPolicy | None = None,
        consumers: ConsumerHooks | None = None,
    ) -> CredentialJob:
        client = ProviderClient(
            ProviderConfig(name="acme", base_url="https://acme.test"),
            clock=self.clock,
            transport=httpx.MockTransport(self.provider.probe),
        )
        credential = CredentialConfig(
            name="billing",
            provider="acme",
            kind="api_key",
            client_id=None,
            client_secret=None,
            publish_to=PUBLISHED,
            probe="/v1/users",
            rotation=policy
            or RotationPolicy(max_age=30 * DAY, rotator="fake", grace=DAY, verify_attempts=3),
            backoff=BackoffPolicy(initial=5.0, maximum=300.0),
        )
        deps = JobDeps(
            store=self.store,
            observer=self.observer,
            clock=self.clock,
            rng=random.Random(2),
            instance_id="i-1",
            state_prefix="keyturn/state",
            consumers=consumers,
        )
        return build_job(credential, client, rotator or self.provider, Inputs(initial), deps)

    async def state(self) -> CredentialState:
        entry = await self.store.read(STATE)
        assert entry is not None
        return CredentialState.from_data(entry.data, "billing")

    def rotations(self) -> list[str]:
        """The rotation steps reported, in order."""
        return [event.result for event in self.observer.of(RotationStep)]

    async def published_key(self) -> str | None:
        entry = await self.store.read(PUBLISHED)
        return entry.data["api_key"] if entry else None

    async def until_idle(self, job: CredentialJob, limit: int = 20) -> None:
        """Run the job at each due time until the rotation is idle with no previous key."""
        for _ in range(limit):
            outcome = await job.run()
            state = await self.state()
            if state.rotation.phase == "idle" and state.rotation.key is not None:
                return
            self.clock.advance(max(0.0, outcome.next_due - self.clock.time()))
        raise AssertionError("rotation did not finish")

    def assert_no_orphans(self, current: str | None) -> None:
        """Every key the provider issued is current, within its grace, or revoked."""
        live = [k.value for k in self.provider.live()]
        assert current in live
        assert len(live) <= 2


@pytest.fixture
def world() -> World:
    return World()


async def test_first_run_creates_verifies_and_publishes_a_key(world: World) -> None:
    outcome = await world.job().run()
    assert outcome.action == "rotated"
    entry = await world.store.read(PUBLISHED)
    assert entry is not None
    key = world.provider.live()[0]
    assert entry.data["api_key"] == key.value
    assert entry.data["key_id"] == key.key_id
    assert entry.data["authorization"] == f"Bearer {key.value}"
    assert entry.custom_metadata["managed-by"] == "keyturn"
    state = await world.state()
    assert state.rotation.phase == "idle"
    assert state.token.phase == "ok"
    # Looked at again after one grace period (a `keyturn rotate` elsewhere may start one).
    assert outcome.next_due == pytest.approx(world.clock.time() + DAY, abs=1)
    assert world.rotations() == ["started", "created", "verified", "published"]


async def test_a_due_rotation_publishes_the_new_key_and_retires_the_old_after_grace(
    world: World,
) -> None:
    job = world.job()
    await job.run()
    first = await world.published_key()
    world.clock.advance(30 * DAY)
    outcome = await job.run()
    second = await world.published_key()
    assert second != first
    assert sorted(k.value for k in world.provider.live()) == sorted([first, second])  # in grace
    assert outcome.next_due == pytest.approx(world.clock.time() + DAY, abs=1)
    assert (await world.state()).rotation.phase == "retiring"
    world.clock.advance(DAY)
    await job.run()
    assert [k.value for k in world.provider.live()] == [second]
    assert (await world.state()).rotation.phase == "idle"


async def test_not_due_means_nothing_happens(world: World) -> None:
    job = world.job()
    await job.run()
    world.clock.advance(29 * DAY)
    outcome = await job.run()
    assert outcome.action == "fresh"
    assert world.provider.created == 1


async def test_a_forced_rotation_runs_now(world: World) -> None:
    job = world.job()
    await job.run()
    outcome = await job.run(force={"rotation"})
    assert outcome.action == "rotated"
    assert world.provider.created == 2


async def test_a_failed_verification_keeps_the_current_key_published(world: World) -> None:
    job = world.job()
    await job.run()
    first = await world.published_key()
    world.clock.advance(30 * DAY)
    world.provider.reject_next_verifications = 1
    outcome = await job.run()
    assert outcome.action == "failed"
    assert "rejected by probe" in str(outcome.error)
    assert await world.published_key() == first
    state = await world.state()
    assert state.rotation.phase == "pending"
    assert state.rotation.error is not None
    world.clock.advance(outcome.next_due - world.clock.time())
    await world.until_idle(job)
    assert await world.published_key() != first


async def test_a_key_that_never_verifies_is_revoked_and_replaced(world: World) -> None:
    job = world.job()
    await job.run()
    world.clock.advance(30 * DAY)
    world.provider.reject_next_verifications = 3  # verify_attempts
    for _ in range(3):
        outcome = await job.run()
        assert outcome.action == "failed"
        world.clock.advance(outcome.next_due - world.clock.time())
    await world.until_idle(job)
    assert world.provider.created == 3
    revoked = [k for k in world.provider.keys.values() if k.revoked]
    assert len(revoked) == 2  # the key that never verified, and the old current one
    world.assert_no_orphans(await world.published_key())


@pytest.mark.parametrize(
    "error",
    [
        ProviderUnavailable("HTTP 503", status=503),
        RotationError("exec rotator exited with 1"),
    ],
)
async def test_rotator_failures_back_off_and_leave_the_current_key(world: World, error) -> None:
    job = world.job()
    await job.run()
    first = await world.published_key()
    world.clock.advance(30 * DAY)
    world.provider.failures += [error, error]
    delays = []
    for _ in range(2):
        outcome = await job.run()
        assert outcome.action == "failed"
        delays.append(outcome.next_due - world.clock.time())
        world.clock.advance(delays[-1])
    assert await world.published_key() == first
    assert 0 < delays[0] <= 5 and 0 < delays[1] <= 10
    await world.until_idle(job)
    world.assert_no_orphans(await world.published_key())


# Crash points: the store fails the Nth write or the rotator fails a call, and a *new* job
# (a restarted process) finishes the rotation from the journal.
CRASHES = {
    "before the intent is stored": ("store", 1),
    "after create, before the key is stored": ("store", 2),
    "after storing, before publishing": ("store", 3),
    "after publishing, before recording it": ("store", 4),
    "before revoking the old key": ("rotator-revoke", 0),
}


@pytest.mark.parametrize("crash", list(CRASHES))
async def test_a_crash_at_any_step_resumes_without_a_lost_or_orphaned_key(
    world: World, crash: str
) -> None:
    await world.job().run()
    world.clock.advance(30 * DAY)
    where, n = CRASHES[crash]
    if where == "store":
        # The lease write is the first write of the run; crash on the n-th one after it.
        writes = len(world.store.writes)

        class Crash(Exception):
            pass

        original = world.store.write

        async def write(path, data, *, cas, custom_metadata=None):
            if len(world.store.writes) - writes == n:
                world.store.write = original  # type: ignore[method-assign]
                raise VaultUnavailable("connection reset (simulated crash)")
            return await original(path, data, cas=cas, custom_metadata=custom_metadata)

        world.store.write = write  # type: ignore[method-assign]
        await world.job().run()
    else:
        world.provider.failures.append(ProviderUnavailable("simulated crash", status=503))
        await world.job().run()
        world.clock.advance(DAY)
        world.provider.failures.append(ProviderUnavailable("simulated crash", status=503))
        await world.job().run()
    world.clock.advance(60)
    restarted = world.job()
    await world.until_idle(restarted)
    current = await world.published_key()
    world.assert_no_orphans(current)
    assert len(world.provider.live()) == 1
    assert (await world.state()).rotation.key == Secret(current or "")
    # Resuming after keyturn's own publish is not mistaken for someone else's write, now or
    # at the next rotation (the journal records the version that really holds the key).
    world.clock.advance(30 * DAY)
    await world.until_idle(restarted)
    assert world.observer.of(Suspicious) == []


async def test_an_orphan_created_before_a_crash_is_found_and_revoked(world: World) -> None:
    job = world.job()
    await job.run()
    world.clock.advance(30 * DAY)

    class Dies(FakeKeyProvider):
        async def create(self, request: RotationRequest) -> NewKey:
            await world.provider.create(request)  # the key exists at the provider...
            raise ProviderUnavailable("connection lost before the response")  # ...we never saw it

    await world.job(rotator=Dies(keys=world.provider.keys)).run()
    assert len(world.provider.live()) == 2  # the current one and the orphan
    world.clock.advance(60)
    await world.until_idle(world.job())
    world.clock.advance(DAY)
    await world.job().run()
    assert len(world.provider.live()) == 1
    assert world.provider.live()[0].value == await world.published_key()


async def test_manual_keys_wait_for_import_then_continue_from_verification(
    world: World,
) -> None:
    class Manual(FakeKeyProvider):
        async def create(self, request: RotationRequest) -> NewKey:
            raise AwaitingManualKey("waiting for keyturn import-key", credential="billing")

    job = world.job(rotator=Manual())
    outcome = await job.run()
    assert outcome.action == "failed"
    assert "import-key" in str(outcome.error)
    assert outcome.next_due - world.clock.time() == pytest.approx(300)  # re-announced, no loop
    assert "awaiting_manual" in world.rotations()
    made_by_hand = world.provider.add_key("typed-into-the-dashboard")
    rotation = job.task("rotation")
    assert isinstance(rotation, KeyRotation)

    entry = await world.store.read(STATE)
    assert entry is not None
    journal = Journal(world.store, STATE, CredentialState.from_data(entry.data, "b"), entry.version)
    rotation.accept_key(journal, Secret(made_by_hand.value), made_by_hand.key_id)
    await journal.save(journal.state)
    outcome = await job.run(force={"rotation"})
    assert outcome.action == "rotated"
    assert await world.published_key() == "typed-into-the-dashboard"


async def test_an_initial_key_is_adopted_after_verification(world: World) -> None:
    existing = world.provider.add_key("already-in-use")

    async def initial():
        return Secret("already-in-use"), existing.key_id

    await world.job(initial=initial).run()
    assert await world.published_key() == "already-in-use"
    assert world.provider.created == 0


async def test_no_secret_in_rotation_events_or_errors(world: World) -> None:
    job = world.job()
    await job.run()
    world.provider.reject_next_verifications = 1
    outcome = await job.run(force={"rotation"})
    text = repr(world.observer.events) + str(outcome.error) + repr(outcome)
    for key in world.provider.keys.values():
        assert key.value not in text


# -- rotation.wait_for_consumers -----------------------------------------------------------------

WAITING = RotationPolicy(
    max_age=30 * DAY,
    rotator="fake",
    grace=DAY,
    verify_attempts=3,
    wait_for_consumers=True,
    consumer_window=2 * DAY,
    max_grace=3 * DAY,
)


@dataclass
class FakeConsumers:
    """The usage monitor as a rotation sees it: who still reads the old key (`names`, and
    `unsure` when it cannot tell), what it was asked, and the versions it was told."""

    names: tuple[str, ...] = ()
    unsure: str | None = None
    asked: list[tuple[str, int, float, float]] = field(default_factory=list)
    published: dict[str, int] = field(default_factory=dict)

    def waiting_for(self, credential: str, old: int, window: float, now: float) -> ConsumersOnOld:
        self.asked.append((credential, old, window, now))
        return ConsumersOnOld(self.names, self.unsure)

    def hooks(self) -> ConsumerHooks:
        return ConsumerHooks(self.waiting_for, self.published.__setitem__)


async def rotated_once(world: World, job: CredentialJob) -> tuple[str, float]:
    """The first key published (version 1), then a rotation (version 2): the old key's id and
    when the new one was published."""
    await job.run()
    old = world.provider.live()[0].key_id
    world.clock.advance(30 * DAY)
    assert (await job.run()).action == "rotated"
    state = await world.state()
    assert state.rotation.phase == "retiring"
    assert state.rotation.previous_version == 1  # the version that held the old key
    assert state.rotation.key_created_at is not None
    return old, state.rotation.key_created_at


def live(world: World, key_id: str) -> bool:
    return not world.provider.keys[key_id].revoked


async def test_the_old_key_waits_past_grace_until_its_consumers_moved(world: World) -> None:
    consumers = FakeConsumers(names=("approle/batch",))
    job = world.job(policy=WAITING, consumers=consumers.hooks())
    old, published = await rotated_once(world, job)
    assert consumers.published == {"billing": 2}  # what apps read now, as each run saw it
    assert consumers.asked == []  # not before grace
    world.clock.advance(DAY)
    outcome = await job.run()
    assert live(world, old)
    now = world.clock.time()
    assert consumers.asked == [("billing", 1, 2 * DAY, now)]
    state = await world.state()
    assert state.rotation.phase == "retiring"
    assert state.rotation.waiting_consumers == ("approle/batch",)
    assert state.rotation.waiting_reason is None
    assert outcome.next_due == pytest.approx(now + 60)  # asked again every minute
    assert "retired" not in world.rotations()

    consumers.names = ()  # approle/batch read the new key
    world.clock.advance(60)
    await job.run()
    assert not live(world, old)
    state = await world.state()
    assert state.rotation.phase == "idle"
    assert (state.rotation.previous_version, state.rotation.waiting_consumers) == (None, None)
    assert world.rotations()[-1] == "retired"
    assert world.observer.of(Suspicious) == []
    assert world.clock.time() < published + WAITING.longest_grace()


async def test_at_max_grace_the_old_key_is_revoked_anyway_and_the_laggards_named(
    world: World,
) -> None:
    consumers = FakeConsumers(names=("approle/batch", "token-laptop"))
    job = world.job(policy=WAITING, consumers=consumers.hooks())
    old, published = await rotated_once(world, job)
    world.clock.advance(DAY)
    outcome = await job.run()
    assert live(world, old)
    world.clock.advance(published + 3 * DAY - 1 - world.clock.time())
    outcome = await job.run()
    assert live(world, old)  # a second before max_grace
    assert outcome.next_due == pytest.approx(published + 3 * DAY)  # not later than max_grace
    world.clock.advance(1)
    await job.run()
    assert not live(world, old)
    assert (await world.state()).rotation.phase == "idle"
    [alert] = world.observer.of(Suspicious)
    assert (alert.detector, alert.severity, alert.credential) == (
        CONSUMERS_NOT_MOVED,
        "warning",
        "billing",
    )
    assert alert.detail == (
        "previous key revoked at max_grace (3d after the new one was published) while 2 "
        "consumer(s) still read the old value (version 1 or older): approle/batch, token-laptop"
    )


async def test_when_the_monitor_cannot_tell_the_old_key_waits_for_max_grace(
    world: World,
) -> None:
    consumers = FakeConsumers(unsure="the file audit source cannot be read (Permission denied)")
    job = world.job(policy=WAITING, consumers=consumers.hooks())
    old, published = await rotated_once(world, job)
    world.clock.advance(DAY)
    await job.run()
    state = await world.state()
    assert state.rotation.waiting_consumers == ()
    assert state.rotation.waiting_reason == consumers.unsure
    world.clock.advance(published + 3 * DAY - world.clock.time())
    await job.run()
    assert not live(world, old)
    assert world.observer.of(Suspicious) == []  # nobody to name: a log line says so


async def test_a_process_without_the_monitor_leaves_the_revocation_to_the_daemon(
    world: World,
) -> None:
    """`keyturn rotate` reads no audit log: it does not revoke before max_grace."""
    job = world.job(policy=WAITING)
    old, published = await rotated_once(world, job)
    world.clock.advance(DAY)
    await job.run(force={"rotation"})
    assert live(world, old)
    assert (await world.state()).rotation.waiting_reason == NO_MONITOR
    world.clock.advance(published + 3 * DAY - world.clock.time())
    await job.run()
    assert not live(world, old)


async def test_without_wait_for_consumers_nobody_is_asked(world: World) -> None:
    consumers = FakeConsumers(names=("approle/batch",))
    job = world.job(consumers=consumers.hooks())
    old, _ = await rotated_once(world, job)
    world.clock.advance(DAY)
    await job.run()
    assert not live(world, old)
    assert consumers.asked == []
    assert consumers.published == {"billing": 2}
