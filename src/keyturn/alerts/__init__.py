"""Alert hooks: what keyturn tells on-call, deduplicated, rate-limited, retried, resolved.

    model.py ...... `Alert` (never a secret), fingerprints, alert names and runbook links
    hooks/ ........ webhook, slack, pagerduty, alertmanager: one payload and one POST each
    dispatcher.py . `AlertDispatcher`: per-hook queues and workers, dedupe, rate limit, retry
    observer.py ... `AlertingObserver`: credential events → firing and resolved alerts
    build.py ...... `build_dispatcher(config, resolver, …)`: `[[alerts]]` → live hooks

See docs/alerts.md for the payloads and the event → alert mapping.
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
