"""Rate limits and fault injection: the failures keyturn's error paths are tested against.

Both act per endpoint selector (`token`, `revoke`, `users`, `projects`, the groups `oauth` and
`resources`, or `*`); for a request the most specific selector that has a rule wins. Time comes
from the injected `Clock` and the error-rate dice from an injected `random.Random`, so unit
tests are deterministic and an admin can re-seed the dice over HTTP.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keyturn.clock import Clock
from keyturn.errors import ConfigError
from keyturn_devkit.sandbox.config import (
    SELECTORS,
    Problems,
    RateLimit,
    check_bool,
    check_int,
    check_number,
    selectors_for,
)

# key: (default, low, high, whole number?)
_NUMBERS: dict[str, tuple[float, float, float, bool]] = {
    "error_rate": (0, 0, 1, False),
    "error_status": (503, 400, 599, True),
    "latency_ms": (0, 0, 60_000, True),
    "answer_delay_ms": (0, 0, 60_000, True),
    "outage_seconds": (0, 0, 86400, False),
    "outage_status": (503, 400, 599, True),
}
_RULE_KEYS = frozenset({*_NUMBERS, "retry_after", "drop_connection"})


@dataclass(frozen=True, slots=True)
class FaultRule:
    error_rate: float = 0.0
    error_status: int = 503
    latency_ms: int = 0
    answer_delay_ms: int = 0  # after the handler ran: its effects stay if the client left
    outage_until: float | None = None  # wall clock; the outage started when the rule was set
    outage_status: int = 503
    retry_after: int | None = None  # sent with injected errors (outages always send one)
    drop_connection: bool = False  # close the connection instead of answering

    def to_json(self, now: float) -> dict[str, Any]:
        remaining = max(0.0, self.outage_until - now) if self.outage_until is not None else 0.0
        return {
            "error_rate": self.error_rate,
            "error_status": self.error_status,
            "latency_ms": self.latency_ms,
            "answer_delay_ms": self.answer_delay_ms,
            "outage_remaining_seconds": round(remaining, 3),
            "outage_status": self.outage_status,
            "retry_after": self.retry_after,
            "drop_connection": self.drop_connection,
        }


@dataclass(frozen=True, slots=True)
class Fault:
    """What to do to one request instead of (or before) handling it."""

    latency: float = 0.0
    status: int | None = None  # None: handle the request normally (after the latency)
    answer_delay: float = 0.0  # handled requests: wait this long between handling and answering
    retry_after: int | None = None
    drop_connection: bool = False
    reason: str = ""


def _parse_rule(problems: Problems, selector: str, data: Any, now: float) -> FaultRule | None:
    prefix = f"faults.{selector}"
    if not isinstance(data, Mapping):
        problems.add(prefix, "an object of fault settings", data)
        return None
    unknown = set(data) - _RULE_KEYS
    if unknown:
        problems.add(prefix, f"only {', '.join(sorted(_RULE_KEYS))}", sorted(unknown))
        return None
    before = len(problems.lines)
    values: dict[str, float] = {}
    for key, (default, low, high, whole) in _NUMBERS.items():
        value = data.get(key, default)
        name = f"{prefix}.{key}"
        if whole:
            checked: float | None = check_int(problems, name, value, int(low), int(high))
        else:
            checked = check_number(problems, name, value, low, high)
        values[key] = checked or 0
    drop = check_bool(problems, f"{prefix}.drop_connection", data.get("drop_connection", False))
    retry_after = data.get("retry_after")
    if retry_after is not None:
        retry_after = check_int(problems, f"{prefix}.retry_after", retry_after, 0, 86400)
    if len(problems.lines) > before:
        return None
    outage = values["outage_seconds"]
    return FaultRule(
        error_rate=values["error_rate"],
        error_status=int(values["error_status"]),
        latency_ms=int(values["latency_ms"]),
        answer_delay_ms=int(values["answer_delay_ms"]),
        outage_until=now + outage if outage > 0 else None,
        outage_status=int(values["outage_status"]),
        retry_after=retry_after,
        drop_connection=bool(drop),
    )


class FaultInjector:
    """Per-endpoint fault rules, changed at run time through the admin API."""

    def __init__(self, clock: Clock, rng: random.Random) -> None:
        self._clock = clock
        self._rng = rng
        self._rules: dict[str, FaultRule] = {}

    def update(self, data: Mapping[str, Any]) -> None:
        """Set the rules of the selectors named in `data` (null clears one); `seed` re-seeds."""
        problems = Problems("faults")
        now = self._clock.time()
        parsed: dict[str, FaultRule | None] = {}
        seed: int | None = None
        for selector, value in data.items():
            if selector == "seed":
                seed = check_int(problems, "faults.seed", value, 0, 2**63)
            elif selector not in SELECTORS:
                problems.add(selector, f"an endpoint among {', '.join(SELECTORS)}", selector)
            elif value is None:
                parsed[selector] = None
            else:
                parsed[selector] = _parse_rule(problems, selector, value, now)
        if problems.lines:
            raise ConfigError(problems.lines)
        if seed is not None:
            self._rng.seed(seed)
        for selector, rule in parsed.items():
            if rule is None:
                self._rules.pop(selector, None)
            else:
                self._rules[selector] = rule

    def clear(self) -> None:
        self._rules.clear()

    def to_json(self) -> dict[str, Any]:
        now = self._clock.time()
        return {selector: rule.to_json(now) for selector, rule in self._rules.items()}

    def decide(self, endpoint: str) -> Fault | None:
        """The fault for one request to `endpoint`, or None to handle it untouched."""
        if not self._rules:
            return None
        rule = next((self._rules[s] for s in selectors_for(endpoint) if s in self._rules), None)
        if rule is None:
            return None
        latency = rule.latency_ms / 1000.0
        now = self._clock.time()
        if rule.outage_until is not None and now < rule.outage_until:
            return Fault(
                latency=latency,
                status=rule.outage_status,
                retry_after=max(1, math.ceil(rule.outage_until - now)),
                drop_connection=rule.drop_connection,
                reason="outage",
            )
        if rule.error_rate > 0 and self._rng.random() < rule.error_rate:
            return Fault(
                latency=latency,
                status=rule.error_status,
                retry_after=rule.retry_after,
                drop_connection=rule.drop_connection,
                reason="error_rate",
            )
        answer_delay = rule.answer_delay_ms / 1000.0
        if latency or answer_delay:
            return Fault(latency=latency, answer_delay=answer_delay)
        return None


class RateLimiter:
    """Fixed windows per selector, on the monotonic clock."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._limits: Mapping[str, RateLimit] = {}
        self._windows: dict[str, tuple[float, int]] = {}

    def configure(self, limits: Mapping[str, RateLimit]) -> None:
        """New limits start with fresh windows (only when they actually changed)."""
        if dict(limits) != dict(self._limits):
            self._limits = dict(limits)
            self._windows.clear()

    def check(self, endpoint: str) -> int | None:
        """None when the request may pass (and counts it), else the Retry-After in seconds."""
        if not self._limits:
            return None
        selector = next((s for s in selectors_for(endpoint) if s in self._limits), None)
        if selector is None:
            return None
        limit = self._limits[selector]
        now = self._clock.monotonic()
        start, count = self._windows.get(selector, (now, 0))
        if now - start >= limit.per_seconds:
            start, count = now, 0
        if count >= limit.requests:
            return max(1, math.ceil(start + limit.per_seconds - now))
        self._windows[selector] = (start, count + 1)
        return None
