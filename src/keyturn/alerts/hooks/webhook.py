"""Generic JSON webhook: `{"version": "1", "status": …, "alert": {…every field…}}`.

POST <url>
{"version": "1", "status": "firing",
 "alert": {"name": "KeyturnRefreshTokenRejected", "fingerprint": "…", "status": "firing",
           "severity": "critical", "detector": "refresh_token_rejected", …}}
"""

from __future__ import annotations

from typing import Any, ClassVar

from keyturn.alerts.hooks.base import HttpHook
from keyturn.alerts.model import Alert

VERSION = "1"


def webhook_payload(alert: Alert) -> dict[str, Any]:
    return {"version": VERSION, "status": alert.status, "alert": alert.to_dict()}


class WebhookHook(HttpHook):
    kind: ClassVar[str] = "webhook"

    def payload(self, alert: Alert) -> Any:
        return webhook_payload(alert)
