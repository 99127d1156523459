"""Prometheus Alertmanager: `POST <url>/api/v2/alerts` with a list of one alert.

Labels identify the alert (`alertname`, `severity`, `detector`, `credential`, `provider`,
`hook`; empty ones are left out, as Prometheus does), annotations describe it. Alertmanager
resolves an alert by itself at its `endsAt`: a firing alert is sent with
`endsAt = now + hold` (twice the hook's repeat_interval; the dispatcher re-sends it before
then while it fires), so an alert keyturn stops sending, because it stopped, expires instead
of firing forever. A resolved alert is sent with `endsAt` = when it was resolved.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from keyturn.alerts.hooks.base import HookPolicy, HttpHook
from keyturn.alerts.model import Alert
from keyturn.clock import Clock, rfc3339
from keyturn.secret import Secret

ALERTS_PATH = "/api/v2/alerts"


def alertmanager_payload(alert: Alert, now: float, hold: float) -> list[dict[str, Any]]:
    labels = {
        "alertname": alert.name,
        "severity": alert.severity,
        "detector": alert.detector,
        "credential": alert.credential,
        "provider": alert.provider,
        "hook": alert.hook,
        "service": "keyturn",
    }
    ends_at = alert.ends_at if alert.ends_at is not None else max(now, alert.starts_at) + hold
    return [
        {
            "labels": {k: v for k, v in labels.items() if v},
            "annotations": {"summary": alert.summary, "runbook_url": alert.runbook_url},
            "startsAt": rfc3339(alert.starts_at),
            "endsAt": rfc3339(ends_at),
        }
    ]


class AlertmanagerHook(HttpHook):
    kind: ClassVar[str] = "alertmanager"

    def __init__(
        self,
        name: str,
        url: Secret,
        policy: HookPolicy,
        *,
        clock: Clock,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        endpoint = Secret(url.reveal().rstrip("/") + ALERTS_PATH)
        super().__init__(name, endpoint, policy, clock=clock, timeout=timeout, transport=transport)
        self.hold = 2 * policy.repeat_interval

    def payload(self, alert: Alert) -> Any:
        return alertmanager_payload(alert, self._clock.time(), self.hold)
