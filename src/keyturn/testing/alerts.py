"""Fakes for alert tests: a hook that records in memory, and an httpx transport that records
what the HTTP hooks post. Outcomes are scripted, one per call, then success."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from keyturn.alerts.hooks.base import DeliveryError, HookPolicy
from keyturn.alerts.model import Alert

# A scripted outcome: None (delivered), a DeliveryError or other exception (raised), or an
# asyncio.Event (the delivery waits for it, then succeeds).
Outcome = None | BaseException | asyncio.Event


class MemoryHook:
    """An `AlertHook` that keeps every alert it is asked to deliver (`attempts`) and every one
    that got through (`delivered`)."""

    kind: ClassVar[str] = "memory"

    def __init__(self, name: str, policy: HookPolicy | None = None, *outcomes: Outcome) -> None:
        self.name = name
        self.policy = policy or HookPolicy(min_severity="info")
        self.outcomes: deque[Outcome] = deque(outcomes)
        self.attempts: list[Alert] = []
        self.delivered: list[Alert] = []
        self.closed = False

    def script(self, *outcomes: Outcome) -> None:
        self.outcomes.extend(outcomes)

    async def deliver(self, alert: Alert) -> None:
        self.attempts.append(alert)
        outcome = self.outcomes.popleft() if self.outcomes else None
        if isinstance(outcome, asyncio.Event):
            await outcome.wait()
        elif isinstance(outcome, BaseException):
            raise outcome
        self.delivered.append(alert)

    async def aclose(self) -> None:
        self.closed = True


def failure(status: int | None = 503, retry_after: float | None = None) -> DeliveryError:
    """The DeliveryError an HTTP hook raises for `status` (None: a network error)."""
    retryable = status is None or status in (408, 429) or status >= 500
    return DeliveryError(
        f"alert hook x: HTTP {status}", retryable=retryable, retry_after=retry_after, status=status
    )


@dataclass(frozen=True, slots=True)
class Posted:
    method: str
    url: str
    headers: dict[str, str]
    body: Any


class RecordingTransport(httpx.MockTransport):
    """Answers every request with the next scripted response (default 200) and records it."""

    def __init__(self, *responses: httpx.Response | Exception) -> None:
        self.requests: list[Posted] = []
        self.responses: deque[httpx.Response | Exception] = deque(responses)
        super().__init__(self._answer)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append(Posted(request.method, str(request.url), dict(request.headers), body))
        if not self.responses:
            return httpx.Response(200)
        answer = self.responses.popleft()
        if isinstance(answer, Exception):
            raise answer
        return answer

    @property
    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]
