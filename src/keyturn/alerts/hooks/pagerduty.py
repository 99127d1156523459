"""PagerDuty Events API v2 (`POST https://events.pagerduty.com/v2/enqueue`).

A firing alert is a `trigger` and a resolved one a `resolve`, both with
`dedup_key = fingerprint`, so PagerDuty folds repeats into one incident and closes it. The
routing key (the integration key) is a secret: it travels as a `Secret` into the body only.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from keyturn.alerts.hooks.base import HookPolicy, HttpHook
from keyturn.alerts.model import Alert, is_web_link
from keyturn.clock import Clock, rfc3339
from keyturn.secret import Secret

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


def pagerduty_payload(alert: Alert, routing_key: str) -> dict[str, Any]:
    if not alert.firing:
        return {
            "routing_key": routing_key,
            "event_action": "resolve",
            "dedup_key": alert.fingerprint,
        }
    details: dict[str, Any] = {
        "detector": alert.detector,
        "runbook": alert.runbook_url,
        "alertname": alert.name,
    }
    if alert.hook:
        details["hook"] = alert.hook
    payload: dict[str, Any] = {
        "summary": f"{alert.name}: {alert.summary}"[:1024],  # PagerDuty's limit
        "source": "keyturn",
        "severity": alert.severity,
        "timestamp": rfc3339(alert.starts_at),
        "class": alert.detector,
        "custom_details": details,
    }
    if alert.credential:
        payload["component"] = alert.credential
    if alert.provider:
        payload["group"] = alert.provider
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": alert.fingerprint,
        "payload": payload,
    }
    if is_web_link(alert.runbook_url):  # not the default `docs/runbook.md#…` path
        event["links"] = [{"href": alert.runbook_url, "text": "Runbook"}]
    return event


class PagerDutyHook(HttpHook):
    kind: ClassVar[str] = "pagerduty"

    def __init__(
        self,
        name: str,
        routing_key: Secret,
        policy: HookPolicy,
        *,
        clock: Clock,
        url: Secret | None = None,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(
            name,
            url or Secret(EVENTS_URL),
            policy,
            clock=clock,
            timeout=timeout,
            transport=transport,
        )
        self._routing_key = routing_key

    def payload(self, alert: Alert) -> Any:
        return pagerduty_payload(alert, self._routing_key.reveal())
