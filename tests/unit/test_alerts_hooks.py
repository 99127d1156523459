"""Each hook's payload and endpoint, and how `HttpHook` classifies every HTTP outcome.

HTTP goes through `RecordingTransport` (an httpx MockTransport); no socket is opened.
"""

from __future__ import annotations

import httpx
import pytest

from keyturn.alerts.hooks import (
    AlertmanagerHook,
    DeliveryError,
    HookPolicy,
    PagerDutyHook,
    SlackHook,
    WebhookHook,
)
from keyturn.alerts.hooks.pagerduty import EVENTS_URL
from keyturn.alerts.model import Alert
from keyturn.clock import FakeClock
from keyturn.secret import Secret
from keyturn.testing.alerts import RecordingTransport

T0 = 1_800_000_000.0
SECRET_URL = "https://hooks.slack.example/services/T000/B000/XXXXsecretXXXX"
ROUTING_KEY = "R0UTING-KEY-0123456789abcdef"
POLICY = HookPolicy()


def alert(**changes: object) -> Alert:
    made = Alert.make(
        "refresh_token_rejected",
        "critical",
        "reporting: invalid_grant on the refresh token <possible reuse> & more",
        credential="reporting",
        provider="acme",
        starts_at=T0,
    )
    return made if not changes else made.__class__(**{**_fields(made), **changes})


def _fields(a: Alert) -> dict[str, object]:
    return {
        "name": a.name,
        "detector": a.detector,
        "severity": a.severity,
        "summary": a.summary,
        "credential": a.credential,
        "provider": a.provider,
        "runbook_url": a.runbook_url,
        "starts_at": a.starts_at,
        "status": a.status,
        "ends_at": a.ends_at,
        "hook": a.hook,
    }


async def test_webhook_posts_every_field() -> None:
    transport = RecordingTransport()
    hook = WebhookHook(
        "generic",
        Secret("https://hooks.example.com/k"),
        POLICY,
        clock=FakeClock(T0),
        transport=transport,
    )
    await hook.deliver(alert())
    await hook.deliver(alert().resolve(T0 + 90))
    await hook.aclose()
    first, second = transport.requests
    assert (first.method, first.url) == ("POST", "https://hooks.example.com/k")
    assert first.headers["content-type"] == "application/json"
    assert first.headers["user-agent"].startswith("keyturn/")
    assert first.body == {"version": "1", "status": "firing", "alert": alert().to_dict()}
    assert second.body["status"] == "resolved"
    assert second.body["alert"]["ends_at"] == "2027-01-15T08:01:30Z"


async def test_slack_has_text_severity_colour_and_runbook_link() -> None:
    transport = RecordingTransport()
    hook = SlackHook("chat", Secret(SECRET_URL), POLICY, clock=FakeClock(T0), transport=transport)
    await hook.deliver(alert())
    await hook.deliver(alert().resolve(T0 + 5))
    firing, resolved = transport.bodies
    assert transport.requests[0].url == SECRET_URL
    assert firing["text"] == (
        ":rotating_light: [FIRING critical] KeyturnRefreshTokenRejected: reporting / acme"
    )
    [attachment] = firing["attachments"]
    assert attachment["color"] == "#D00000"
    summary, fields, context = attachment["blocks"]
    # Slack markup characters in keyturn's text are escaped.
    assert summary["text"]["text"] == (
        "reporting: invalid_grant on the refresh token &lt;possible reuse&gt; &amp; more"
    )
    assert {"type": "mrkdwn", "text": "*Severity*\ncritical"} in fields["fields"]
    assert {"type": "mrkdwn", "text": "*Detector*\n`refresh_token_rejected`"} in fields["fields"]
    link = context["elements"][0]["text"]
    # The default runbook reference is a path in keyturn's source: shown, not linked.
    assert alert().runbook_url == "docs/runbook.md#keyturnrefreshtokenrejected"
    assert "Runbook `docs/runbook.md#keyturnrefreshtokenrejected`" in link
    assert "<docs/runbook.md" not in link
    assert alert().fingerprint in link
    assert resolved["text"].startswith(":white_check_mark: [RESOLVED] KeyturnRefreshTokenRejected")
    assert resolved["attachments"][0]["color"] == "#2EB67D"
    await hook.aclose()


async def test_slack_and_pagerduty_link_a_runbook_base_url() -> None:
    """With a hook's runbook_base (the URL of the team's copy), the runbook is a link."""
    wiki = alert().with_runbook_base("https://wiki.example.com/keyturn/runbook")
    assert (
        wiki.runbook_url == "https://wiki.example.com/keyturn/runbook#keyturnrefreshtokenrejected"
    )
    transport = RecordingTransport(httpx.Response(202, json={"status": "success"}))
    slack = SlackHook("chat", Secret(SECRET_URL), POLICY, clock=FakeClock(T0), transport=transport)
    pager = PagerDutyHook(
        "oncall", Secret(ROUTING_KEY), POLICY, clock=FakeClock(T0), transport=transport
    )
    await slack.deliver(wiki)
    await pager.deliver(wiki)
    slack_body, pager_body = transport.bodies
    context = slack_body["attachments"][0]["blocks"][2]["elements"][0]["text"]
    assert context.startswith(f"<{wiki.runbook_url}|Runbook> · ")
    assert pager_body["links"] == [{"href": wiki.runbook_url, "text": "Runbook"}]
    assert pager_body["payload"]["custom_details"]["runbook"] == wiki.runbook_url
    await slack.aclose()
    await pager.aclose()


async def test_pagerduty_triggers_and_resolves_by_dedup_key() -> None:
    transport = RecordingTransport(httpx.Response(202, json={"status": "success"}))
    hook = PagerDutyHook(
        "oncall", Secret(ROUTING_KEY), POLICY, clock=FakeClock(T0), transport=transport
    )
    await hook.deliver(alert())
    await hook.deliver(alert().resolve(T0 + 5))
    trigger, resolve = transport.requests
    assert trigger.url == resolve.url == EVENTS_URL
    assert trigger.body == {
        "routing_key": ROUTING_KEY,
        "event_action": "trigger",
        "dedup_key": alert().fingerprint,
        "payload": {
            "summary": "KeyturnRefreshTokenRejected: " + alert().summary,
            "source": "keyturn",
            "severity": "critical",
            "timestamp": "2027-01-15T08:00:00Z",
            "class": "refresh_token_rejected",
            "component": "reporting",
            "group": "acme",
            "custom_details": {
                "detector": "refresh_token_rejected",
                "runbook": alert().runbook_url,
                "alertname": "KeyturnRefreshTokenRejected",
            },
        },
        # No `links`: the default runbook reference (docs/runbook.md#…) is not a URL.
    }
    assert resolve.body == {
        "routing_key": ROUTING_KEY,
        "event_action": "resolve",
        "dedup_key": alert().fingerprint,
    }
    assert "oncall" in repr(hook) and ROUTING_KEY not in repr(hook)
    await hook.aclose()


async def test_pagerduty_url_is_configurable() -> None:
    transport = RecordingTransport()
    hook = PagerDutyHook(
        "oncall",
        Secret(ROUTING_KEY),
        POLICY,
        url=Secret("http://127.0.0.1:9/v2/enqueue"),
        clock=FakeClock(T0),
        transport=transport,
    )
    await hook.deliver(alert(severity="info"))
    assert transport.requests[0].url == "http://127.0.0.1:9/v2/enqueue"
    assert transport.bodies[0]["payload"]["severity"] == "info"
    await hook.aclose()


async def test_alertmanager_posts_a_list_to_api_v2_alerts() -> None:
    clock = FakeClock(T0 + 30)
    transport = RecordingTransport()
    policy = HookPolicy(repeat_interval=600)
    hook = AlertmanagerHook(
        "am", Secret("http://127.0.0.1:9093/"), policy, clock=clock, transport=transport
    )
    await hook.deliver(alert())
    await hook.deliver(alert().resolve(T0 + 60))
    firing, resolved = transport.requests
    assert firing.url == "http://127.0.0.1:9093/api/v2/alerts"
    assert firing.body == [
        {
            "labels": {
                "alertname": "KeyturnRefreshTokenRejected",
                "severity": "critical",
                "detector": "refresh_token_rejected",
                "credential": "reporting",
                "provider": "acme",
                "service": "keyturn",
            },
            "annotations": {"summary": alert().summary, "runbook_url": alert().runbook_url},
            "startsAt": "2027-01-15T08:00:00Z",
            # held for twice the repeat interval from now, so it expires if keyturn goes away
            "endsAt": "2027-01-15T08:20:30Z",
        }
    ]
    assert resolved.body[0]["endsAt"] == "2027-01-15T08:01:00Z"
    assert resolved.body[0]["labels"] == firing.body[0]["labels"]
    await hook.aclose()


async def test_alertmanager_leaves_out_empty_labels() -> None:
    transport = RecordingTransport()
    hook = AlertmanagerHook(
        "am", Secret("http://127.0.0.1:9093"), POLICY, clock=FakeClock(T0), transport=transport
    )
    await hook.deliver(
        Alert.make("alert_hook_failing", "warning", "hook pager failed", hook="pager", starts_at=T0)
    )
    labels = transport.bodies[0][0]["labels"]
    assert labels == {
        "alertname": "KeyturnAlertHookFailing",
        "severity": "warning",
        "detector": "alert_hook_failing",
        "hook": "pager",
        "service": "keyturn",
    }
    await hook.aclose()


OUTCOMES = [
    (httpx.Response(500), True, None),
    (httpx.Response(503, headers={"Retry-After": "7"}), True, 7.0),
    (httpx.Response(429, headers={"Retry-After": "30"}), True, 30.0),
    (httpx.Response(429), True, None),
    (httpx.Response(408), True, None),
    (httpx.Response(400), False, None),
    (httpx.Response(401), False, None),
    (httpx.Response(404, headers={"Retry-After": "5"}), False, None),
    (httpx.Response(301, headers={"Location": "https://elsewhere.example"}), False, None),
    (httpx.ConnectError("connection refused to " + SECRET_URL), True, None),
    (httpx.ReadTimeout("timed out reading " + SECRET_URL), True, None),
]


@pytest.mark.parametrize(
    ("answer", "retryable", "retry_after"),
    OUTCOMES,
    ids=[
        a.status_code if isinstance(a, httpx.Response) else type(a).__name__ for a, _, _ in OUTCOMES
    ],
)
async def test_outcomes_are_classified_without_the_url(
    answer: httpx.Response | Exception, retryable: bool, retry_after: float | None
) -> None:
    hook = SlackHook(
        "chat",
        Secret(SECRET_URL),
        POLICY,
        clock=FakeClock(T0),
        transport=RecordingTransport(answer),
    )
    with pytest.raises(DeliveryError) as caught:
        await hook.deliver(alert())
    error = caught.value
    assert (error.retryable, error.retry_after) == (retryable, retry_after)
    assert "chat" in str(error)
    assert "XXXXsecretXXXX" not in str(error)
    # httpx's exception (whose text may hold the URL) is not chained.
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__
    await hook.aclose()


@pytest.mark.parametrize("status", [200, 201, 202, 204])
async def test_any_2xx_is_delivered(status: int) -> None:
    hook = WebhookHook(
        "w",
        Secret("https://h.example"),
        POLICY,
        clock=FakeClock(T0),
        transport=RecordingTransport(httpx.Response(status)),
    )
    await hook.deliver(alert())
    await hook.aclose()


async def test_retry_after_as_an_http_date() -> None:
    clock = FakeClock(T0)
    when = "Fri, 15 Jan 2027 08:01:00 GMT"  # T0 + 60
    hook = WebhookHook(
        "w",
        Secret("https://h.example"),
        POLICY,
        clock=clock,
        transport=RecordingTransport(httpx.Response(429, headers={"Retry-After": when})),
    )
    with pytest.raises(DeliveryError) as caught:
        await hook.deliver(alert())
    assert caught.value.retry_after == 60.0
    await hook.aclose()


def test_policy_filters() -> None:
    a = alert()
    assert HookPolicy().accepts(a)
    assert not HookPolicy(min_severity="critical").accepts(alert(severity="warning"))
    assert HookPolicy(min_severity="warning").accepts(alert(severity="critical"))
    assert not HookPolicy().accepts(alert(severity="info"))
    assert HookPolicy(detectors=frozenset({"refresh_token_rejected"})).accepts(a)
    assert not HookPolicy(detectors=frozenset({"grant_drift"})).accepts(a)
    assert HookPolicy(credentials=frozenset({"reporting"})).accepts(a)
    assert not HookPolicy(credentials=frozenset({"billing"})).accepts(a)


async def test_secret_named_fields_are_blanked_in_any_payload() -> None:
    class Careless(WebhookHook):
        def payload(self, alert: Alert) -> object:
            return {"summary": alert.summary, "token": "abc123", "deep": [{"api_key": "k-1"}]}

    transport = RecordingTransport()
    hook = Careless(
        "w", Secret("https://h.example"), POLICY, clock=FakeClock(T0), transport=transport
    )
    await hook.deliver(alert())
    assert transport.bodies == [
        {"summary": alert().summary, "token": "**********", "deep": [{"api_key": "**********"}]}
    ]
    await hook.aclose()
