"""From `[[alerts]]` to live hooks: references resolved, resolved URLs checked without being
shown, policies carried over, and a dispatcher that delivers through them."""

from __future__ import annotations

import asyncio
import random

import pytest

from keyturn.alerts.build import build_dispatcher, build_hooks, url_problem
from keyturn.alerts.hooks import AlertmanagerHook, PagerDutyHook, SlackHook, WebhookHook
from keyturn.alerts.model import DEFAULT_RUNBOOK_BASE, Alert
from keyturn.clock import FakeClock
from keyturn.config import parse_config
from keyturn.errors import ConfigError, SecretReferenceError
from keyturn.references import ReferenceResolver
from keyturn.testing.alerts import RecordingTransport
from keyturn_devkit.harness.configs import VAULT

T0 = 1_800_000_000.0
SLACK_URL = "https://hooks.slack.example/services/T0/B0/SLACKSECRET"
BASE = VAULT
HOOKS = """
[[alerts]]
name = "chat"
type = "slack"
url = "env:SLACK_URL"
min_severity = "critical"
detectors = ["client_rejected"]

[[alerts]]
name = "oncall"
type = "pagerduty"
routing_key = "env:PD_KEY"
url = "http://127.0.0.1:9/v2/enqueue"
max_retries = 1
runbook_base = "https://wiki.example.com/runbook"

[[alerts]]
name = "hook"
type = "webhook"
url = "https://hooks.example.com/x"

[[alerts]]
name = "am"
type = "alertmanager"
url = "env:AM_URL"
repeat_interval = "10m"
"""
ENV = {"SLACK_URL": SLACK_URL, "PD_KEY": "pd-key-123", "AM_URL": "http://127.0.0.1:9093"}


async def test_every_hook_is_built_with_its_policy() -> None:
    config = parse_config(BASE + HOOKS, "k.toml", {})
    hooks = await build_hooks(config.alerts, ReferenceResolver(ENV), clock=FakeClock(T0))
    chat, oncall, webhook, am = hooks
    assert isinstance(chat, SlackHook) and isinstance(oncall, PagerDutyHook)
    assert isinstance(webhook, WebhookHook) and isinstance(am, AlertmanagerHook)
    assert [h.name for h in hooks] == ["chat", "oncall", "hook", "am"]
    assert chat.policy.min_severity == "critical"
    assert chat.policy.detectors == frozenset({"client_rejected"})
    assert oncall.policy.max_retries == 1
    assert oncall.policy.runbook_base == "https://wiki.example.com/runbook"
    assert webhook.policy.runbook_base == DEFAULT_RUNBOOK_BASE
    assert am.hold == 1200.0
    assert "SLACKSECRET" not in repr(chat)
    for hook in hooks:
        await hook.aclose()


async def test_the_dispatcher_delivers_through_resolved_urls() -> None:
    config = parse_config(BASE + HOOKS, "k.toml", {})
    transport = RecordingTransport()
    clock = FakeClock(T0)
    dispatcher = await build_dispatcher(
        config, ReferenceResolver(ENV), clock=clock, rng=random.Random(1), transport=transport
    )
    await dispatcher.start()
    dispatcher.fire(
        Alert.make("client_rejected", "critical", "x", credential="c", provider="p", starts_at=T0)
    )
    await asyncio.wait_for(dispatcher.idle(), 5)
    assert await dispatcher.stop(1)
    assert sorted(r.url for r in transport.requests) == [
        "http://127.0.0.1:9/v2/enqueue",
        "http://127.0.0.1:9093/api/v2/alerts",
        "https://hooks.example.com/x",
        SLACK_URL,
    ]


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (
            "http://hooks.example.com/SLACKSECRET",
            "is plain http to a host that is not a loopback host",
        ),
        ("ftp://hooks.example.com/SLACKSECRET", "is not an http(s) URL with a host"),
        ("SLACKSECRET", "is not an http(s) URL with a host"),
        ("https://hooks.example.com:99999/SLACKSECRET", "is not a valid URL"),
    ],
)
async def test_a_bad_resolved_url_is_named_by_its_reference(url: str, problem: str) -> None:
    config = parse_config(BASE + HOOKS, "k.toml", {})
    with pytest.raises(ConfigError) as caught:
        await build_hooks(
            config.alerts,
            ReferenceResolver({**ENV, "SLACK_URL": url}),
            clock=FakeClock(T0),
            source="k.toml",
        )
    message = str(caught.value)
    assert message.startswith(
        f'k.toml: alerts["chat"].url: the URL read from env:SLACK_URL {problem}'
    )
    assert "SLACKSECRET" not in message
    assert url_problem(url) == problem


async def test_a_missing_reference_fails_the_build() -> None:
    config = parse_config(BASE + HOOKS, "k.toml", {})
    with pytest.raises(SecretReferenceError):
        await build_hooks(config.alerts, ReferenceResolver({}), clock=FakeClock(T0))


def test_good_urls_pass() -> None:
    for url in (
        "https://h.example/x",
        "http://127.0.0.1:9093",
        "http://localhost/x",
        "http://[::1]:1",
    ):
        assert url_problem(url) is None
