"""Alert hooks, one small module each: `webhook`, `slack`, `pagerduty`, `alertmanager`.

`base` holds what they share: `HookPolicy` (filters and limits), the `AlertHook` interface,
`DeliveryError`, and `HttpHook`, whose one POST classifies every outcome.
"""

from keyturn.alerts.hooks.alertmanager import AlertmanagerHook, alertmanager_payload
from keyturn.alerts.hooks.base import AlertHook, DeliveryError, HookPolicy, HttpHook
from keyturn.alerts.hooks.pagerduty import PagerDutyHook, pagerduty_payload
from keyturn.alerts.hooks.slack import SlackHook, slack_payload
from keyturn.alerts.hooks.webhook import WebhookHook, webhook_payload

__all__ = [
    "AlertHook",
    "AlertmanagerHook",
    "DeliveryError",
    "HookPolicy",
    "HttpHook",
    "PagerDutyHook",
    "SlackHook",
    "WebhookHook",
    "alertmanager_payload",
    "pagerduty_payload",
    "slack_payload",
    "webhook_payload",
]
