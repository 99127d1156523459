"""Alert hooks over real HTTP on loopback: an aiohttp receiver stands in for a generic
webhook, Slack and PagerDuty's Events API, and a real Prometheus Alertmanager
(`prometheus-alertmanager`, scripts/system-deps.sh) receives the alertmanager hook.

Each hook is built from a parsed `[[alerts]]` configuration, as the daemon builds it. Waits
are bounded.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from keyturn.alerts.build import build_dispatcher
from keyturn.alerts.dispatcher import AlertDispatcher, DeliveryResult
from keyturn.alerts.hooks import HookPolicy, WebhookHook
from keyturn.alerts.model import Alert
from keyturn.alerts.observer import AlertingObserver
from keyturn.clock import SystemClock
from keyturn.config import parse_config
from keyturn.events import Failed, Published, Suspicious
from keyturn.policy import BackoffPolicy
from keyturn.references import ReferenceResolver
from keyturn.secret import Secret
from keyturn_devkit.dev.alertmanager import AlertmanagerServer

CLOCK = SystemClock()
ROUTING_KEY = "pd-routing-key-0123456789"
BASE = """\
[vault]
address = "https://vault.example.com"
auth = { method = "token", token = "env:VAULT_TOKEN" }

[[providers]]
name = "acme"
base_url = "https://acme.example.com"

[[credentials]]
name = "reporting"
provider = "acme"
kind = "oauth_client"
client_id = "reporting-app"
client_secret = "env:CLIENT_SECRET"
publish_to = "apps/reporting/acme"
"""


@dataclass
class Receiver:
    """Records JSON POSTs by path; answers each path with scripted statuses, then 200."""

    url: str = ""
    posts: dict[str, list[Any]] = field(default_factory=dict)
    script: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    times: dict[str, list[float]] = field(default_factory=dict)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.posts.setdefault(request.path, []).append(body)
        self.times.setdefault(request.path, []).append(time.monotonic())
        queued = self.script.get(request.path)
        if queued:
            status, headers = queued.pop(0)
            return web.json_response({"error": "scripted"}, status=status, headers=headers)
        return web.json_response({"status": "success"}, status=202)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    recorder = Receiver()
    app = web.Application()
    app.router.add_post("/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    recorder.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield recorder
    await runner.cleanup()


@pytest.fixture(scope="module")
def alertmanager() -> Iterator[AlertmanagerServer]:
    with AlertmanagerServer() as server:
        yield server


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def alert(credential: str = "reporting", detector: str = "client_rejected") -> Alert:
    return Alert.make(
        detector,
        "critical",
        f"{credential}: token endpoint returned invalid_client",
        credential=credential,
        provider="acme",
        starts_at=CLOCK.time(),
    )


async def dispatcher_from(text: str, environ: dict[str, str], counts: list[Any]) -> AlertDispatcher:
    config = parse_config(BASE + text, "k.toml", {})
    dispatcher = await build_dispatcher(
        config,
        ReferenceResolver(environ),
        clock=CLOCK,
        rng=random.Random(),
        on_delivery=lambda hook, result: counts.append((hook, result)),
    )
    await dispatcher.start()
    return dispatcher


async def test_webhook_slack_and_pagerduty_fire_and_resolve(receiver: Receiver) -> None:
    text = f"""
[[alerts]]
name = "generic"
type = "webhook"
url = "{receiver.url}/webhook"

[[alerts]]
name = "chat"
type = "slack"
url = "env:SLACK_URL"

[[alerts]]
name = "oncall"
type = "pagerduty"
url = "{receiver.url}/v2/enqueue"
routing_key = "env:PD_KEY"
"""
    environ = {"SLACK_URL": f"{receiver.url}/services/T0/B0/x", "PD_KEY": ROUTING_KEY}
    counts: list[tuple[str, DeliveryResult]] = []
    dispatcher = await dispatcher_from(text, environ, counts)
    observer = AlertingObserver(dispatcher)
    observer(Suspicious("reporting", "acme", "client_rejected", "critical", "invalid_client"))
    observer(Suspicious("reporting", "acme", "client_rejected", "critical", "invalid_client"))
    observer(Published("reporting", "acme", "oauth_client", CLOCK.time(), CLOCK.time() + 60))
    await until(lambda: sum(len(v) for v in receiver.posts.values()) == 6)
    assert await dispatcher.stop(5)

    webhook = receiver.posts["/webhook"]
    assert [p["status"] for p in webhook] == ["firing", "resolved"]
    assert webhook[0]["alert"]["name"] == "KeyturnClientRejected"
    assert webhook[0]["alert"]["credential"] == "reporting"
    assert webhook[1]["alert"]["ends_at"] is not None

    slack = receiver.posts["/services/T0/B0/x"]
    assert slack[0]["text"].startswith(":rotating_light: [FIRING critical] KeyturnClientRejected")
    assert slack[1]["text"].startswith(":white_check_mark: [RESOLVED]")

    trigger, resolve = receiver.posts["/v2/enqueue"]
    assert (trigger["event_action"], resolve["event_action"]) == ("trigger", "resolve")
    assert trigger["routing_key"] == resolve["routing_key"] == ROUTING_KEY
    assert trigger["dedup_key"] == resolve["dedup_key"] == alert().fingerprint
    assert trigger["payload"]["component"] == "reporting"
    assert sorted(counts) == sorted(
        [(h, "success") for h in ("generic", "chat", "oncall") for _ in range(2)]
    )


async def test_a_receiver_429_is_retried_after_its_retry_after(receiver: Receiver) -> None:
    receiver.script["/hook"] = [(429, {"Retry-After": "1"}), (503, {})]
    policy = HookPolicy(backoff=BackoffPolicy(initial=0.05, maximum=2.0))
    hook = WebhookHook("w", Secret(f"{receiver.url}/hook"), policy, clock=CLOCK)
    counts: list[tuple[str, DeliveryResult]] = []
    dispatcher = AlertDispatcher(
        [hook], clock=CLOCK, rng=random.Random(), on_delivery=lambda h, r: counts.append((h, r))
    )
    await dispatcher.start()
    dispatcher.fire(alert())
    await until(lambda: counts == [("w", "success")])
    first, second, third = receiver.times["/hook"]
    assert second - first >= 0.95  # Retry-After: 1
    assert third - second < 1.0  # a plain 503 backs off from 50 ms
    assert await dispatcher.stop(5)


async def test_a_client_error_is_not_retried(receiver: Receiver) -> None:
    receiver.script["/hook"] = [(400, {})]
    hook = WebhookHook("w", Secret(f"{receiver.url}/hook"), HookPolicy(), clock=CLOCK)
    counts: list[tuple[str, DeliveryResult]] = []
    dispatcher = AlertDispatcher(
        [hook], clock=CLOCK, rng=random.Random(), on_delivery=lambda h, r: counts.append((h, r))
    )
    await dispatcher.start()
    dispatcher.fire(alert())
    await until(lambda: counts == [("w", "failed")])
    await asyncio.sleep(0.2)
    assert len(receiver.posts["/hook"]) == 1
    assert await dispatcher.stop(5)


async def test_a_dead_receiver_does_not_delay_a_live_one(receiver: Receiver) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    text = f"""
[[alerts]]
name = "dead"
type = "webhook"
url = "http://127.0.0.1:{dead_port}/hook"

[[alerts]]
name = "live"
type = "webhook"
url = "{receiver.url}/hook"
"""
    counts: list[tuple[str, DeliveryResult]] = []
    dispatcher = await dispatcher_from(text, {}, counts)
    started = time.monotonic()
    for name in ("a", "b", "c"):
        dispatcher.fire(alert(credential=name))
    await until(lambda: len(receiver.posts.get("/hook", [])) == 3, timeout=3)
    assert time.monotonic() - started < 2  # while "dead" backs off between connection errors
    assert ("dead", "success") not in counts
    await dispatcher.stop(2)  # ends the backoff: each queued alert is tried once more
    assert counts.count(("live", "success")) == 3
    assert counts.count(("dead", "failed")) == 3


async def test_alertmanager_receives_and_resolves(alertmanager: AlertmanagerServer) -> None:
    text = f"""
[[alerts]]
name = "am"
type = "alertmanager"
url = "{alertmanager.url}"
"""
    counts: list[tuple[str, DeliveryResult]] = []
    dispatcher = await dispatcher_from(text, {}, counts)
    observer = AlertingObserver(dispatcher)
    observer(Failed("reporting", "acme", "oauth_client", RuntimeError(), 5))

    def ours() -> list[dict[str, Any]]:
        return [
            a
            for a in alertmanager.alerts()
            if a["labels"].get("alertname") == "KeyturnCredentialFailing"
        ]

    await until(lambda: len(ours()) == 1)
    [active] = ours()
    assert active["labels"] == {
        "alertname": "KeyturnCredentialFailing",
        "severity": "critical",
        "detector": "credential_failing",
        "credential": "reporting",
        "provider": "acme",
        "service": "keyturn",
    }
    assert active["annotations"]["summary"] == (
        "reporting: 5 consecutive failed runs; last: RuntimeError"
    )
    assert active["annotations"]["runbook_url"].endswith("#keyturncredentialfailing")
    assert active["status"]["state"] == "active"

    observer(Published("reporting", "acme", "oauth_client", CLOCK.time(), CLOCK.time() + 60))
    await until(lambda: ours() == [])  # resolved: no longer among the active alerts
    assert await dispatcher.stop(5)
    assert counts == [("am", "success"), ("am", "success")]
