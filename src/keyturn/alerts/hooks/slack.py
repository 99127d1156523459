"""Slack incoming webhook: a one-line `text` (notifications, fallback) and an attachment
coloured by severity whose blocks hold the summary, the fields and the runbook link.

Slack's mrkdwn treats `&`, `<` and `>` as markup, so they are escaped in every text taken
from the alert.
"""

from __future__ import annotations

from typing import Any, ClassVar

from keyturn.alerts.hooks.base import HttpHook
from keyturn.alerts.model import Alert, is_web_link
from keyturn.clock import rfc3339

COLORS = {"critical": "#D00000", "warning": "#F2A900", "info": "#439FE0", "resolved": "#2EB67D"}
ICONS = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


def escape(text: str) -> str:
    """Slack mrkdwn escaping (https://api.slack.com/reference/surfaces/formatting#escaping)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _subject(alert: Alert) -> str:
    parts = [p for p in (alert.credential, alert.provider, alert.hook) if p]
    return escape(" / ".join(parts) if parts else "keyturn")


def slack_payload(alert: Alert) -> dict[str, Any]:
    if alert.firing:
        head = f"{ICONS[alert.severity]} [FIRING {alert.severity}] {alert.name}"
        color = COLORS[alert.severity]
        when = f"since {rfc3339(alert.starts_at)}"
    else:
        head = f":white_check_mark: [RESOLVED] {alert.name}"
        color = COLORS["resolved"]
        when = f"resolved at {rfc3339(alert.ends_at or alert.starts_at)}"
    text = f"{head}: {_subject(alert)}"
    fields = [
        {"type": "mrkdwn", "text": f"*Credential*\n{escape(alert.credential or '-')}"},
        {"type": "mrkdwn", "text": f"*Provider*\n{escape(alert.provider or '-')}"},
        {"type": "mrkdwn", "text": f"*Detector*\n`{escape(alert.detector)}`"},
        {"type": "mrkdwn", "text": f"*Severity*\n{alert.severity}"},
    ]
    if is_web_link(alert.runbook_url):
        runbook = f"<{escape(alert.runbook_url)}|Runbook>"
    else:  # the default, a path in keyturn's source: shown, not linked
        runbook = f"Runbook `{escape(alert.runbook_url)}`"
    context = f"{runbook} · {when} · fingerprint `{alert.fingerprint}`"
    blocks = [
        {"type": "section", "text": {"type": "mrkdwn", "text": escape(alert.summary)}},
        {"type": "section", "fields": fields},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]},
    ]
    return {"text": text, "attachments": [{"color": color, "fallback": text, "blocks": blocks}]}


class SlackHook(HttpHook):
    kind: ClassVar[str] = "slack"

    def payload(self, alert: Alert) -> Any:
        return slack_payload(alert)
