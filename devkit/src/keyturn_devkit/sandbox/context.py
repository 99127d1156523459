"""What every handler shares: one `Sandbox` object stored on the aiohttp application."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from keyturn.clock import Clock
from keyturn.secret import Secret
from keyturn_devkit.sandbox.config import Settings
from keyturn_devkit.sandbox.faults import FaultInjector, RateLimiter
from keyturn_devkit.sandbox.state import SandboxState


@dataclass
class Sandbox:
    """The state, the failure machinery and the admin token of one running sandbox."""

    state: SandboxState
    faults: FaultInjector
    limiter: RateLimiter
    clock: Clock
    admin_token: Secret = field(repr=False)
    # (endpoint, status) -> count, for GET /admin/usage: the daemon's rates seen from outside.
    responses: Counter[tuple[str, int]] = field(default_factory=Counter)

    @classmethod
    def create(
        cls, settings: Settings, clock: Clock, admin_token: Secret, rng: random.Random | None = None
    ) -> Sandbox:
        sandbox = cls(
            state=SandboxState(settings, clock),
            faults=FaultInjector(clock, rng or random.Random()),
            limiter=RateLimiter(clock),
            clock=clock,
            admin_token=admin_token,
        )
        sandbox.limiter.configure(settings.rate_limits)
        return sandbox

    def update_settings(self, data: dict[str, Any], source: str = "settings") -> Settings:
        settings = self.state.update_settings(data, source)
        self.limiter.configure(settings.rate_limits)
        return settings

    def endpoint_counts(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        for (endpoint, status), n in sorted(self.responses.items()):
            counts.setdefault(endpoint, {})[str(status)] = n
        return counts


SANDBOX = web.AppKey("sandbox", Sandbox)
