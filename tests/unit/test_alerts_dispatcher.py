"""AlertDispatcher: dedupe, repeat, resolve, rate limit, retry with backoff, bounded queues,
isolation between hooks, and shutdown. Hooks are in-memory fakes with scripted outcomes; time
is a FakeClock, so backoff and repeats are exact."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable

import pytest

from keyturn.alerts.dispatcher import AlertDispatcher, DeliveryResult
from keyturn.alerts.hooks.base import HookPolicy
from keyturn.alerts.model import Alert, Severity
from keyturn.clock import FakeClock, SystemClock
from keyturn.policy import BackoffPolicy
from keyturn.testing.alerts import MemoryHook, failure

T0 = 1_800_000_000.0
REAL = SystemClock()


class Upper(random.Random):
    """Jitter that always takes the longest wait, so backoff is exact."""

    def uniform(self, a: float, b: float) -> float:
        return b


def alert(
    credential: str = "reporting",
    detector: str = "client_rejected",
    severity: Severity = "critical",
    summary: str = "invalid_client",
    at: float = T0,
) -> Alert:
    return Alert.make(
        detector, severity, summary, credential=credential, provider="acme", starts_at=at
    )


class Counts:
    def __init__(self) -> None:
        self.seen: list[tuple[str, DeliveryResult]] = []

    def __call__(self, hook: str, result: DeliveryResult) -> None:
        self.seen.append((hook, result))

    def of(self, hook: str) -> list[DeliveryResult]:
        return [r for h, r in self.seen if h == hook]


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = REAL.monotonic() + timeout
    while not predicate():
        assert REAL.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


async def settle(dispatcher: AlertDispatcher) -> None:
    await asyncio.wait_for(dispatcher.idle(), 5)


async def advance(clock: FakeClock, seconds: float, step: float = 10.0) -> None:
    """Move the clock in steps, letting the ticker and workers run in between."""
    while seconds > 0:
        clock.advance(min(step, seconds))
        seconds -= step
        for _ in range(5):
            await asyncio.sleep(0)


def dispatcher_for(
    *hooks: MemoryHook, clock: FakeClock, counts: Counts | None = None, **options: object
) -> AlertDispatcher:
    return AlertDispatcher(
        hooks,
        clock=clock,
        rng=Upper(),
        on_delivery=counts,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


async def test_a_firing_alert_goes_to_every_hook_once(clock: FakeClock) -> None:
    a, b, counts = MemoryHook("a"), MemoryHook("b"), Counts()
    dispatcher = dispatcher_for(a, b, clock=clock, counts=counts)
    await dispatcher.start()
    for _ in range(3):
        dispatcher.fire(alert())
    await settle(dispatcher)
    assert (
        [x.name for x in a.delivered] == [x.name for x in b.delivered] == ["KeyturnClientRejected"]
    )
    assert counts.of("a") == counts.of("b") == ["success"]
    assert set(dispatcher.active) == {alert().fingerprint}
    await dispatcher.stop(1)


async def test_a_still_firing_alert_is_sent_again_after_repeat_interval(clock: FakeClock) -> None:
    hook = MemoryHook("a", HookPolicy(repeat_interval=600))
    dispatcher = dispatcher_for(hook, clock=clock, tick=60)
    await dispatcher.start()
    dispatcher.fire(alert())
    await settle(dispatcher)
    await advance(clock, 590)
    dispatcher.fire(alert())  # a new occurrence inside the interval is deduplicated
    await settle(dispatcher)
    assert len(hook.delivered) == 1
    await advance(clock, 70)  # the ticker re-sends once the interval has passed
    await settle(dispatcher)
    assert len(hook.delivered) == 2
    assert hook.delivered[1].starts_at == T0  # the condition keeps its start
    await dispatcher.stop(1)


async def test_a_rise_in_severity_is_sent_at_once(clock: FakeClock) -> None:
    hook = MemoryHook("a")
    dispatcher = dispatcher_for(hook, clock=clock)
    await dispatcher.start()
    dispatcher.fire(alert(severity="warning"))
    dispatcher.fire(alert(severity="warning"))
    dispatcher.fire(alert(severity="critical"))
    dispatcher.fire(alert(severity="warning"))
    await settle(dispatcher)
    assert [x.severity for x in hook.delivered] == ["warning", "critical"]
    await dispatcher.stop(1)


async def test_a_resolution_goes_only_where_the_alert_fired(clock: FakeClock) -> None:
    everything = MemoryHook("all", HookPolicy(min_severity="info"))
    other = MemoryHook("billing-only", HookPolicy(credentials=frozenset({"billing"})))
    dispatcher = dispatcher_for(everything, other, clock=clock)
    await dispatcher.start()
    dispatcher.resolve(alert().fingerprint)  # never fired: nothing to send
    dispatcher.fire(alert())
    clock.advance(42)
    dispatcher.resolve(alert())
    dispatcher.resolve(alert())  # once is enough
    await settle(dispatcher)
    assert [(x.status, x.ends_at) for x in everything.delivered] == [
        ("firing", None),
        ("resolved", T0 + 42),
    ]
    assert other.attempts == []
    assert dispatcher.active == {}
    await dispatcher.stop(1)


async def test_no_resolution_for_a_firing_alert_that_never_arrived(clock: FakeClock) -> None:
    hook, counts = MemoryHook("a", None, failure(400)), Counts()
    dispatcher = dispatcher_for(hook, clock=clock, counts=counts)
    await dispatcher.start()
    dispatcher.fire(alert())
    await settle(dispatcher)
    dispatcher.resolve(alert())
    await settle(dispatcher)
    assert [x.status for x in hook.attempts] == ["firing"]
    assert counts.of("a") == ["failed"]
    await dispatcher.stop(1)


async def test_fire_again_after_resolve_is_a_new_alert(clock: FakeClock) -> None:
    hook = MemoryHook("a")
    dispatcher = dispatcher_for(hook, clock=clock)
    await dispatcher.start()
    dispatcher.fire(alert())
    dispatcher.resolve(alert())
    clock.advance(5)
    dispatcher.fire(alert(at=T0 + 5))
    await settle(dispatcher)
    assert [(x.status, x.starts_at) for x in hook.delivered] == [
        ("firing", T0),
        ("resolved", T0),
        ("firing", T0 + 5),
    ]
    await dispatcher.stop(1)


async def test_over_the_rate_limit_alerts_are_dropped_and_counted(clock: FakeClock) -> None:
    hook, counts = MemoryHook("a", HookPolicy(rate_limit=2)), Counts()
    dispatcher = dispatcher_for(hook, clock=clock, counts=counts)
    await dispatcher.start()
    for name in ("c1", "c2", "c3", "c4"):
        dispatcher.fire(alert(credential=name))
    await settle(dispatcher)
    assert [x.credential for x in hook.delivered] == ["c1", "c2"]
    # drops happen in fire(), before the worker delivers
    assert counts.of("a") == ["dropped", "dropped", "success", "success"]
    # Resolutions are not limited; a dropped alert gets another chance once tokens refill.
    dispatcher.resolve(alert(credential="c1"))
    await advance(clock, 30)  # 2 per minute: one token back
    dispatcher.fire(alert(credential="c3"))
    await settle(dispatcher)
    assert [(x.credential, x.status) for x in hook.delivered[2:]] == [
        ("c1", "resolved"),
        ("c3", "firing"),
    ]
    await dispatcher.stop(1)


async def test_retry_waits_for_retry_after(clock: FakeClock) -> None:
    hook, counts = MemoryHook("a", None, failure(429, retry_after=30)), Counts()
    dispatcher = dispatcher_for(hook, clock=clock, counts=counts, tick=86400)
    await dispatcher.start()
    dispatcher.fire(alert())
    await until(lambda: clock.sleepers == 2)  # the ticker, and the worker's backoff
    clock.advance(29.9)
    await asyncio.sleep(0.01)
    assert len(hook.attempts) == 1
    clock.advance(0.1)
    await settle(dispatcher)
    assert len(hook.attempts) == 2
    assert counts.of("a") == ["success"]  # retries are not deliveries
    await dispatcher.stop(1)


async def test_backoff_is_exponential_capped_and_gives_up(clock: FakeClock) -> None:
    backoff = BackoffPolicy(initial=1, maximum=4, multiplier=2)
    policy = HookPolicy(max_retries=4, backoff=backoff)
    hook, counts = MemoryHook("a", policy, *[failure(503)] * 10), Counts()
    dispatcher = dispatcher_for(hook, clock=clock, counts=counts, tick=86400)
    await dispatcher.start()
    dispatcher.fire(alert())
    waits: list[float] = []
    for expected in (1, 2, 4, 4):
        await until(lambda: clock.sleepers == 2)
        attempts = len(hook.attempts)
        clock.advance(expected - 0.01)
        await asyncio.sleep(0.01)
        assert len(hook.attempts) == attempts, f"retried before {expected}s"
        clock.advance(0.01)
        await until(lambda n=attempts: len(hook.attempts) == n + 1)
        waits.append(expected)
    await settle(dispatcher)
    assert len(hook.attempts) == 5  # the first try and max_retries = 4 more
    assert counts.of("a") == ["failed"]
    assert clock.sleepers == 1  # only the ticker: no hot loop, no further waiting
    await dispatcher.stop(1)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 422])
async def test_a_client_error_is_not_retried(clock: FakeClock, status: int) -> None:
    hook, counts = MemoryHook("a", None, failure(status)), Counts()
    dispatcher = dispatcher_for(hook, clock=clock, counts=counts)
    await dispatcher.start()
    dispatcher.fire(alert())
    await settle(dispatcher)
    assert len(hook.attempts) == 1
    assert counts.of("a") == ["failed"]
    await dispatcher.stop(1)


async def test_a_full_queue_drops_and_counts(clock: FakeClock) -> None:
    hook, counts = MemoryHook("a"), Counts()
    dispatcher = dispatcher_for(hook, clock=clock, counts=counts, queue_size=2)
    for name in ("c1", "c2", "c3", "c4"):
        dispatcher.fire(alert(credential=name))  # before start: nothing drains the queue
    assert counts.of("a") == ["dropped", "dropped"]
    await dispatcher.start()
    await settle(dispatcher)
    assert [x.credential for x in hook.delivered] == ["c1", "c2"]
    await dispatcher.stop(1)


async def test_fire_never_waits_for_a_slow_hook(clock: FakeClock) -> None:
    gate = asyncio.Event()
    slow = MemoryHook("slow", None, gate)
    fast = MemoryHook("fast")
    dispatcher = dispatcher_for(slow, fast, clock=clock)
    await dispatcher.start()
    for name in ("c1", "c2", "c3"):
        dispatcher.fire(alert(credential=name))  # returns at once
    await until(lambda: len(fast.delivered) == 3)
    assert len(slow.attempts) == 1 and slow.delivered == []
    gate.set()
    await settle(dispatcher)
    assert len(slow.delivered) == 3
    await dispatcher.stop(1)


async def test_a_hook_in_backoff_never_delays_another(clock: FakeClock) -> None:
    down = MemoryHook("down", None, *[failure(None)] * 100)
    up = MemoryHook("up")
    dispatcher = dispatcher_for(down, up, clock=clock, tick=86400)
    await dispatcher.start()
    dispatcher.fire(alert(credential="c1"))
    dispatcher.fire(alert(credential="c2"))
    await until(lambda: len(up.delivered) == 2)
    assert len(down.attempts) == 1  # still waiting to retry the first
    # stop ends the backoff; what is queued is tried once more, without retries
    assert await dispatcher.stop(1) is True
    assert [x.credential for x in down.attempts] == ["c1", "c2"]
    assert down.closed and up.closed


async def test_a_failing_hook_is_reported_through_the_others(clock: FakeClock) -> None:
    broken = MemoryHook("pager", None, failure(400), failure(400), failure(400))
    chat = MemoryHook("chat", HookPolicy(min_severity="info"))
    dispatcher = dispatcher_for(broken, chat, clock=clock, hook_failing_after=3)
    await dispatcher.start()
    for name in ("c1", "c2", "c3"):
        dispatcher.fire(alert(credential=name))
    await settle(dispatcher)
    failing = [x for x in chat.delivered if x.detector == "alert_hook_failing"]
    assert len(failing) == 1
    assert failing[0].hook == "pager" and failing[0].severity == "warning"
    assert "pager" in failing[0].summary and "HTTP 400" in failing[0].summary
    # the failing hook is not sent its own failure
    assert all(x.detector != "alert_hook_failing" for x in broken.attempts)
    dispatcher.fire(alert(credential="c4"))  # delivers: the hook works again
    await settle(dispatcher)
    await settle(dispatcher)
    assert [x.status for x in chat.delivered if x.detector == "alert_hook_failing"] == [
        "firing",
        "resolved",
    ]
    await dispatcher.stop(1)


async def test_stop_drains_what_is_queued(clock: FakeClock) -> None:
    hook = MemoryHook("a")
    dispatcher = dispatcher_for(hook, clock=clock)
    await dispatcher.start()
    for name in ("c1", "c2", "c3"):
        dispatcher.fire(alert(credential=name))
    assert await dispatcher.stop(2) is True
    assert len(hook.delivered) == 3
    assert hook.closed
    dispatcher.fire(alert(credential="late"))  # after stop: ignored, no error
    assert len(hook.attempts) == 3


async def test_stop_is_bounded_by_its_timeout(clock: FakeClock) -> None:
    hook = MemoryHook("a", None, asyncio.Event())  # never set: the receiver hangs
    dispatcher = dispatcher_for(hook, clock=clock)
    await dispatcher.start()
    dispatcher.fire(alert())
    await until(lambda: len(hook.attempts) == 1)
    started = REAL.monotonic()
    assert await dispatcher.stop(0.2) is False
    assert REAL.monotonic() - started < 2
    assert hook.closed


async def test_stop_ends_a_backoff_and_counts_the_failure(clock: FakeClock) -> None:
    hook, counts = MemoryHook("a", None, failure(503)), Counts()
    dispatcher = dispatcher_for(hook, clock=clock, counts=counts, tick=86400)
    await dispatcher.start()
    dispatcher.fire(alert())
    await until(lambda: clock.sleepers == 2)
    assert await dispatcher.stop(2) is True
    assert counts.of("a") == ["failed"]


async def test_events_are_sent_once_per_interval_and_never_resolved(clock: FakeClock) -> None:
    hook = MemoryHook("a", HookPolicy(repeat_interval=600))
    dispatcher = dispatcher_for(hook, clock=clock, tick=60)
    await dispatcher.start()
    event = alert(detector="grant_drift", severity="warning", summary="scope widened")
    dispatcher.notify(event)
    dispatcher.notify(event)
    await advance(clock, 1200)  # the ticker does not repeat events
    await settle(dispatcher)
    assert len(hook.delivered) == 1
    assert dispatcher.active == {}
    dispatcher.notify(event)  # it happened again, after the interval
    await settle(dispatcher)
    assert len(hook.delivered) == 2
    await dispatcher.stop(1)


async def test_calls_from_another_thread_reach_the_loop(clock: FakeClock) -> None:
    hook = MemoryHook("a")
    dispatcher = dispatcher_for(hook, clock=clock)
    await dispatcher.start()
    thread = threading.Thread(target=dispatcher.fire, args=(alert(),))
    thread.start()
    thread.join()
    await until(lambda: len(hook.delivered) == 1)
    await dispatcher.stop(1)


async def test_summaries_are_scrubbed_and_runbook_base_applied(clock: FakeClock) -> None:
    hook = MemoryHook("a", HookPolicy(runbook_base="https://wiki.example/keyturn"))
    dispatcher = dispatcher_for(hook, clock=clock)
    await dispatcher.start()
    raw = Alert(  # built by hand, bypassing Alert.make's scrubbing
        name="KeyturnGrantDrift",
        detector="grant_drift",
        severity="warning",
        summary="got access_token=abc123 back",
        credential="c",
        provider="p",
        runbook_url="https://x/#y",
        starts_at=T0,
    )
    dispatcher.fire(raw)
    await settle(dispatcher)
    [sent] = hook.delivered
    assert "abc123" not in sent.summary
    assert sent.runbook_url == "https://wiki.example/keyturn#keyturngrantdrift"
    await dispatcher.stop(1)


async def test_a_broken_counter_does_not_stop_deliveries(clock: FakeClock) -> None:
    def broken(hook: str, result: DeliveryResult) -> None:
        raise RuntimeError("metrics bug")

    hook = MemoryHook("a", None, RuntimeError("hook bug"))
    dispatcher = AlertDispatcher([hook], clock=clock, rng=Upper(), on_delivery=broken)
    await dispatcher.start()
    dispatcher.fire(alert(credential="c1"))
    dispatcher.fire(alert(credential="c2"))
    await settle(dispatcher)
    assert [x.credential for x in hook.delivered] == ["c2"]
    await dispatcher.stop(1)


def test_hook_names_are_unique(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="two alert hooks"):
        dispatcher_for(MemoryHook("a"), MemoryHook("a"), clock=clock)


def test_fire_takes_only_firing_alerts(clock: FakeClock) -> None:
    dispatcher = dispatcher_for(MemoryHook("a"), clock=clock)
    with pytest.raises(ValueError):
        dispatcher.fire(alert().resolve(T0))
