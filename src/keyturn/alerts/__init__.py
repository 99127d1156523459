"""Alert hooks: what keyturn tells on-call, deduplicated, rate-limited, retried, resolved.

`model` holds the `Alert` (never a secret), `hooks/` one payload and POST per receiver,
`dispatcher` the per-hook queues, `observer` the event → alert mapping, and `build` turns
`[[alerts]]` into live hooks. Payloads and the mapping: docs/alerts.md.
"""

from keyturn.alerts.dispatcher import AlertDispatcher, DeliveryResult, OnDelivery
from keyturn.alerts.model import Alert, Severity, alert_name, fingerprint, runbook_url
from keyturn.alerts.observer import AlertingObserver

__all__ = [
    "Alert",
    "AlertDispatcher",
    "AlertingObserver",
    "DeliveryResult",
    "OnDelivery",
    "Severity",
    "alert_name",
    "fingerprint",
    "runbook_url",
]
