"""No secret in any alert payload or log line (promise 4), end to end: keyturn errors built
with secret values go through AlertingObserver, the dispatcher and all four HTTP hooks, some
of which fail, and every body and log line is searched for every secret used."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import random

import httpx
import structlog

from keyturn.alerts.dispatcher import AlertDispatcher
from keyturn.alerts.hooks import (
    AlertmanagerHook,
    HookPolicy,
    PagerDutyHook,
    SlackHook,
    WebhookHook,
)
from keyturn.alerts.observer import AlertingObserver
from keyturn.clock import FakeClock
from keyturn.errors import KeyturnError, OAuthError, VaultError
from keyturn.events import Failed, Published, RotationStep, Suspicious
from keyturn.logs import configure_logging
from keyturn.secret import Secret
from keyturn.testing.alerts import RecordingTransport

T0 = 1_800_000_000.0
CLIENT_SECRET = "cs-7f3a9b2c4d5e6f708192a3b4"
REFRESH_TOKEN = "rt-0a1b2c3d4e5f60718293a4b5"
ACCESS_TOKEN = "at-99887766554433221100ffee"
API_KEY = "ak-live-5566778899aabbccddeeff"
SLACK_SECRET = "B0SLACKSECRETPATHxyz123"
SLACK_URL = f"https://hooks.slack.example/services/T0/{SLACK_SECRET}"
WEBHOOK_SECRET = "whk-token-31415926535"
WEBHOOK_URL = f"https://hooks.example.com/keyturn/{WEBHOOK_SECRET}"
ROUTING_KEY = "pd-routing-key-2718281828459045"
VALUES = [CLIENT_SECRET, REFRESH_TOKEN, ACCESS_TOKEN, API_KEY]
HOOK_SECRETS = [SLACK_SECRET, WEBHOOK_SECRET, ROUTING_KEY]


async def test_no_secret_reaches_a_payload_or_a_log_line() -> None:
    stream = io.StringIO()
    configure_logging("debug", stream=stream)
    clock = FakeClock(T0)
    policy = HookPolicy(min_severity="info", max_retries=1)
    transports = {
        "webhook": RecordingTransport(httpx.Response(500), httpx.Response(500)),
        "slack": RecordingTransport(),
        "pagerduty": RecordingTransport(httpx.Response(400)),
        "alertmanager": RecordingTransport(),
    }
    hooks = [
        WebhookHook(
            "webhook", Secret(WEBHOOK_URL), policy, clock=clock, transport=transports["webhook"]
        ),
        SlackHook("slack", Secret(SLACK_URL), policy, clock=clock, transport=transports["slack"]),
        PagerDutyHook(
            "pagerduty",
            Secret(ROUTING_KEY),
            policy,
            clock=clock,
            transport=transports["pagerduty"],
        ),
        AlertmanagerHook(
            "alertmanager",
            Secret("http://127.0.0.1:9093"),
            policy,
            clock=clock,
            transport=transports["alertmanager"],
        ),
    ]
    dispatcher = AlertDispatcher(hooks, clock=clock, rng=random.Random(7), tick=86400)
    observer = AlertingObserver(dispatcher)
    try:
        await dispatcher.start()
        errors: list[Exception] = [
            # keyturn's messages interpolate Secrets, which render as a placeholder
            KeyturnError(f"client secret {Secret(CLIENT_SECRET)} rejected", credential="app"),
            VaultError(f"write of {Secret(API_KEY)!r} failed", path="apps/app"),
            # a hostile server's error_description that echoes values back
            OAuthError(
                "invalid_grant",
                credential="app",
                description=f"refresh_token={REFRESH_TOKEN} reused; client_secret: "
                f"{CLIENT_SECRET}; Authorization: Bearer {ACCESS_TOKEN}",
            ),
            OSError(f"cannot open /run/keys/{API_KEY}"),  # not keyturn's: named by type only
        ]
        for n, error in enumerate(errors, start=3):
            observer(Failed("app", "acme", "oauth_client", error, n))
        observer(
            Suspicious(
                "app", "acme", "grant_drift", "warning", f"token came back as token={ACCESS_TOKEN}"
            )
        )
        observer(Suspicious("app", "acme", "client_rejected", "critical", "invalid_client"))
        observer(RotationStep("app", "acme", "api_key", "awaiting_manual"))
        observer(Published("app", "acme", "oauth_client", T0, T0 + 3600))
        observer(RotationStep("app", "acme", "api_key", "published"))
        idle = asyncio.ensure_future(dispatcher.idle())
        for _ in range(500):  # retries back off on the fake clock: move it along
            if idle.done():
                break
            clock.advance(60)
            await asyncio.sleep(0.001)
        assert idle.done()
    finally:
        await dispatcher.stop(1)
        logging.getLogger().handlers.clear()
        structlog.reset_defaults()

    bodies = []
    for name, transport in transports.items():
        assert transport.requests, f"{name} was never called"
        for request in transport.requests:
            body = request.body
            if name == "pagerduty":
                assert body.pop("routing_key") == ROUTING_KEY  # the hook's own credential
            bodies.append(json.dumps(body))
    logs = stream.getvalue()
    assert "alert.delivery_failed" in logs  # failures were logged, by hook name
    for value in VALUES:
        for body in bodies:
            assert value not in body
        assert value not in logs
    for value in HOOK_SECRETS:
        assert value not in logs
        for body in bodies:
            assert value not in body
