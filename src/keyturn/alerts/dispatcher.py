"""`AlertDispatcher`: deduplicates, rate-limits and delivers alerts, off the refresh path.

`fire` (a condition, resolved later), `notify` (an event) and `resolve` never wait: each hook
has its own bounded queue and worker, so a slow or failing hook delays neither a refresh nor
another hook. Dedupe, rate limit, retry and resolution rules: docs/alerts.md#delivery.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

from keyturn.alerts.hooks.base import AlertHook, DeliveryError
from keyturn.alerts.model import (
    DEFAULT_RUNBOOK_BASE,
    SEVERITY_RANK,
    Alert,
    fingerprint,
    scrub_text,
)
from keyturn.clock import Clock
from keyturn.logs import get_logger
from keyturn.policy import backoff_delay
from keyturn.ratelimit import TokenBucket

DeliveryResult = Literal["success", "failed", "dropped"]
OnDelivery = Callable[[str, DeliveryResult], None]
HOOK_FAILING = "alert_hook_failing"


def _firing(alert: Alert) -> None:
    if not alert.firing:
        raise ValueError("fire() and notify() take a firing alert; use resolve()")


@dataclass(slots=True)
class _Sent:
    at: float  # monotonic
    rank: int


@dataclass(slots=True)
class _Lane:
    """One hook's queue, worker and memory of what it was sent."""

    hook: AlertHook
    queue: asyncio.Queue[Alert]
    bucket: TokenBucket
    sent: dict[str, _Sent] = field(default_factory=dict)  # enqueued firing, by fingerprint
    delivered: set[str] = field(default_factory=set)  # firing alerts the receiver has
    failures: int = 0  # consecutive failed deliveries
    drops: int = 0  # dropped since the last logged drop
    task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.hook.name

    def accepts(self, alert: Alert) -> bool:
        if alert.detector == HOOK_FAILING and alert.hook == self.name:
            return False  # a failing hook is not told that it fails
        return self.hook.policy.accepts(alert)


class AlertDispatcher:
    """Delivers alerts to hooks; see the module docstring. Call on the event loop's thread
    (calls from other threads are handed to the loop once `start` has run)."""

    def __init__(
        self,
        hooks: Iterable[AlertHook],
        *,
        clock: Clock,
        rng: random.Random,
        on_delivery: OnDelivery | None = None,
        queue_size: int = 256,
        tick: float = 60.0,
        hook_failing_after: int = 3,
    ) -> None:
        self._clock = clock
        self._rng = rng
        self._on_delivery = on_delivery
        self._tick = tick
        self._hook_failing_after = hook_failing_after
        self._lanes: list[_Lane] = []
        for hook in hooks:
            if any(lane.name == hook.name for lane in self._lanes):
                raise ValueError(f"two alert hooks are named {hook.name!r}")
            bucket = TokenBucket.per_minute(hook.policy.rate_limit, clock)
            self._lanes.append(_Lane(hook, asyncio.Queue(maxsize=queue_size), bucket))
        self._active: dict[str, Alert] = {}
        self._stopping = asyncio.Event()
        self._stopped = False
        self._ticker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._log = get_logger("keyturn.alerts")

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def hooks(self) -> tuple[AlertHook, ...]:
        return tuple(lane.hook for lane in self._lanes)

    @property
    def active(self) -> Mapping[str, Alert]:
        """Firing conditions by fingerprint."""
        return MappingProxyType(self._active)

    # -- the caller's side: never waits ------------------------------------------------

    def fire(self, alert: Alert) -> None:
        """A condition holds: send it (where due) and keep it firing until `resolve`."""
        _firing(alert)
        self._call(functools.partial(self._fire, alert))

    def notify(self, alert: Alert) -> None:
        """An event happened: send it where it was not sent within repeat_interval."""
        _firing(alert)
        self._call(functools.partial(self._offer, alert))

    def resolve(self, target: str | Alert) -> None:
        """The condition (a fingerprint, or an alert with it) cleared: send the resolution."""
        key = target if isinstance(target, str) else target.fingerprint
        self._call(functools.partial(self._resolve, key))

    def _call(self, action: Callable[[], None]) -> None:
        if self._stopped:
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                loop.call_soon_threadsafe(action)
                return
        action()

    def _fire(self, alert: Alert) -> None:
        previous = self._active.get(alert.fingerprint)
        if previous is not None:
            alert = replace(alert, starts_at=previous.starts_at)
        self._active[alert.fingerprint] = alert
        self._offer(alert)

    def _offer(self, alert: Alert) -> None:
        now = self._clock.monotonic()
        rank = SEVERITY_RANK[alert.severity]
        for lane in self._lanes:
            if not lane.accepts(alert):
                continue
            sent = lane.sent.get(alert.fingerprint)
            due = sent is None or now - sent.at >= lane.hook.policy.repeat_interval
            if not due and sent is not None and rank <= sent.rank:
                continue
            if not lane.bucket.take():
                self._dropped(lane, alert, "rate_limited")
            elif self._put(lane, alert):
                lane.sent[alert.fingerprint] = _Sent(now, rank)

    def _resolve(self, key: str) -> None:
        alert = self._active.pop(key, None)
        if alert is None:
            return
        resolved = alert.resolve(self._clock.time())
        for lane in self._lanes:
            if lane.sent.pop(key, None) is not None:
                self._put(lane, resolved)

    def _put(self, lane: _Lane, alert: Alert) -> bool:
        try:
            lane.queue.put_nowait(alert)
        except asyncio.QueueFull:
            self._dropped(lane, alert, "queue_full")
            return False
        if lane.drops:
            self._log.info("alert.drops_ended", hook=lane.name, dropped=lane.drops)
            lane.drops = 0
        return True

    def _dropped(self, lane: _Lane, alert: Alert, reason: str) -> None:
        log = self._log.warning if lane.drops == 0 else self._log.debug
        log("alert.dropped", hook=lane.name, alert=alert.name, reason=reason)
        lane.drops += 1
        self._count(lane, "dropped")

    def _count(self, lane: _Lane, result: DeliveryResult) -> None:
        if self._on_delivery is None:
            return
        try:
            self._on_delivery(lane.name, result)
        except Exception as exc:  # a metrics bug must not stop deliveries
            self._log.error("alert.on_delivery_failed", error=type(exc).__name__)

    # -- the workers -------------------------------------------------------------------

    async def start(self) -> None:
        """Start one worker per hook and the repeat ticker (idempotent)."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        for lane in self._lanes:
            lane.task = asyncio.create_task(self._work(lane), name=f"alert-hook:{lane.name}")
        self._ticker = asyncio.create_task(self._repeat(), name="alert-repeat")

    async def stop(self, timeout: float = 10.0) -> bool:
        """Deliver what is queued (each once more, without further retries) for up to
        `timeout` seconds, then stop the workers and close the hooks. True if all was sent."""
        self._stopped = True
        self._stopping.set()
        if self._ticker is not None:
            self._ticker.cancel()
        drained = True
        started = [lane for lane in self._lanes if lane.task is not None]
        if started:
            joins = [asyncio.ensure_future(lane.queue.join()) for lane in started]
            _done, pending = await asyncio.wait(joins, timeout=timeout)
            drained = not pending
            for join in pending:
                join.cancel()
        tasks = [t for t in (self._ticker, *(lane.task for lane in self._lanes)) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for lane in self._lanes:
            try:
                await lane.hook.aclose()
            except Exception as exc:  # closing is best effort
                self._log.warning(
                    "alert.hook_close_failed", hook=lane.name, error=type(exc).__name__
                )
        if not drained:
            left = sum(lane.queue.qsize() for lane in self._lanes)
            self._log.warning("alert.undelivered_at_stop", alerts=left)
        return drained

    async def idle(self) -> None:
        """Wait until every queued alert has been handled (for tests and embeddings)."""
        await asyncio.gather(*(lane.queue.join() for lane in self._lanes))

    async def _work(self, lane: _Lane) -> None:
        while True:
            alert = await lane.queue.get()
            try:
                if alert.firing or alert.fingerprint in lane.delivered:
                    await self._deliver(lane, alert)
            except Exception as exc:  # a bug in a hook must not end its worker
                self._log.error("alert.worker_error", hook=lane.name, error=type(exc).__name__)
            finally:
                lane.queue.task_done()

    async def _deliver(self, lane: _Lane, alert: Alert) -> None:
        policy = lane.hook.policy
        prepared = replace(alert, summary=scrub_text(alert.summary))
        if policy.runbook_base != DEFAULT_RUNBOOK_BASE:
            prepared = prepared.with_runbook_base(policy.runbook_base)
        attempt = 0
        while True:
            try:
                await lane.hook.deliver(prepared)
            except DeliveryError as error:
                attempt += 1
                if not error.retryable or attempt > policy.max_retries or self._stopping.is_set():
                    self._failed(lane, alert, str(error), attempt)
                    return
                delay = backoff_delay(attempt, policy.backoff, self._rng, error.retry_after)
                self._log.info(
                    "alert.retry",
                    hook=lane.name,
                    alert=alert.name,
                    attempt=attempt,
                    delay=round(delay, 3),
                    error=str(error),
                )
                if not await self._sleep(delay):
                    self._failed(lane, alert, str(error), attempt)
                    return
                continue
            except Exception as exc:
                self._failed(lane, alert, f"{type(exc).__name__} in hook", attempt + 1)
                return
            break
        self._succeeded(lane, alert)

    def _succeeded(self, lane: _Lane, alert: Alert) -> None:
        if alert.firing:
            lane.delivered.add(alert.fingerprint)
        else:
            lane.delivered.discard(alert.fingerprint)
        lane.failures = 0
        self._count(lane, "success")
        failing = fingerprint(HOOK_FAILING, "", "", lane.name)
        if failing in self._active:
            self._resolve(failing)

    def _failed(self, lane: _Lane, alert: Alert, error: str, attempts: int) -> None:
        lane.failures += 1
        self._count(lane, "failed")
        self._log.warning(
            "alert.delivery_failed",
            hook=lane.name,
            hook_type=lane.hook.kind,
            alert=alert.name,
            status=alert.status,
            attempts=attempts,
            error=error,
        )
        if lane.failures >= self._hook_failing_after and not self._stopping.is_set():
            summary = (
                f"alert hook {lane.name} ({lane.hook.kind}) failed {lane.failures} deliveries "
                f"in a row; last: {error}"
            )
            self._fire(
                Alert.make(
                    HOOK_FAILING, "warning", summary, hook=lane.name, starts_at=self._clock.time()
                )
            )

    async def _sleep(self, seconds: float) -> bool:
        """Sleep on the clock; False if `stop` came first."""
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        stopper = asyncio.ensure_future(self._stopping.wait())
        done, pending = await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return sleeper in done and not self._stopping.is_set()

    async def _repeat(self) -> None:
        while True:
            await self._clock.sleep(self._tick)
            self.repeat_due()

    def repeat_due(self) -> None:
        """Re-send still-firing alerts whose repeat_interval passed; forget old events."""
        for alert in list(self._active.values()):
            self._offer(alert)
        now = self._clock.monotonic()
        for lane in self._lanes:
            interval = lane.hook.policy.repeat_interval
            for key in [k for k, s in lane.sent.items() if k not in self._active]:
                if now - lane.sent[key].at >= interval:
                    del lane.sent[key]
                    lane.delivered.discard(key)
