"""`[[alerts]]`: each hook type, defaults, filters, overrides, every kind of bad value (one
problem each, never echoing a URL or a secret), and the docs and example keeping up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from keyturn.config import AlertHookConfig, load_config, parse_config
from keyturn.config.keys import keys, tables
from keyturn.config.schema import WebhookHookConfig
from keyturn.errors import ConfigError
from keyturn.references import SecretRef
from keyturn_devkit.harness.configs import VAULT

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "docs" / "configuration.md").read_text()
EXAMPLE = (REPO / "deploy" / "keyturn.example.toml").read_text()

BASE = VAULT + """
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

[[credentials]]
name = "billing"
provider = "acme"
kind = "oauth_client"
client_id = "billing-app"
client_secret = "env:BILLING_SECRET"
publish_to = "apps/billing/acme"
"""

HOOKS = """
[[alerts]]
name = "generic"
type = "webhook"
url = "https://hooks.example.com/keyturn"

[[alerts]]
name = "chat"
type = "slack"
url = "vault:secret/keyturn/inputs/slack#webhook_url"
min_severity = "critical"
detectors = ["refresh_token_rejected", "client_rejected"]

[[alerts]]
name = "oncall"
type = "pagerduty"
routing_key = "env:PD_ROUTING_KEY"
credentials = ["billing"]
rate_limit = 5
repeat_interval = "1h"
timeout = "5s"
max_retries = 2
runbook_base = "https://wiki.example.com/keyturn/runbook"

[[alerts]]
name = "am"
type = "alertmanager"
url = "http://127.0.0.1:9093"
"""


def load(text: str, environ: dict[str, str] | None = None) -> dict[str, AlertHookConfig]:
    config = parse_config(BASE + text, "k.toml", environ or {})
    return {hook.name: hook for hook in config.alerts}


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(BASE + text, "k.toml", environ or {})
    return caught.value.problems


def test_every_hook_type_loads_with_its_defaults() -> None:
    hooks = load(HOOKS)
    assert list(hooks) == ["generic", "chat", "oncall", "am"]
    assert all(isinstance(hook, AlertHookConfig) for hook in hooks.values())
    assert hooks["generic"] == WebhookHookConfig(
        name="generic",
        type="webhook",
        url=SecretRef.inline("https://hooks.example.com/keyturn"),
        min_severity="warning",
        detectors=None,
        credentials=None,
        rate_limit=30.0,
        repeat_interval=14400.0,
        timeout=10.0,
        max_retries=5,
        runbook_base=None,
    )
    chat = hooks["chat"]
    assert chat.url == SecretRef.vault("secret", "keyturn/inputs/slack", "webhook_url")
    assert (chat.min_severity, chat.detectors) == (
        "critical",
        ("refresh_token_rejected", "client_rejected"),
    )
    oncall = hooks["oncall"]
    assert (oncall.url, oncall.routing_key) == (None, SecretRef.env("PD_ROUTING_KEY"))
    assert hooks["generic"].routing_key is None  # a webhook takes none
    assert oncall.credentials == ("billing",)
    assert (oncall.rate_limit, oncall.repeat_interval, oncall.timeout) == (5.0, 3600.0, 5.0)
    assert (oncall.max_retries, oncall.runbook_base) == (
        2,
        "https://wiki.example.com/keyturn/runbook",
    )
    assert hooks["am"].url == SecretRef.inline("http://127.0.0.1:9093")


def test_no_alerts_is_an_empty_tuple() -> None:
    assert parse_config(BASE, "k.toml", {}).alerts == ()


def test_urls_may_be_references_for_every_type() -> None:
    text = """
[[alerts]]
name = "w"
type = "webhook"
url = "file:/run/credentials/keyturn.service/webhook_url"
[[alerts]]
name = "a"
type = "alertmanager"
url = "env:ALERTMANAGER_URL"
[[alerts]]
name = "p"
type = "pagerduty"
url = "http://127.0.0.1:8080/v2/enqueue"
routing_key = "vault:secret/keyturn/inputs/pd#routing_key"
"""
    hooks = load(text)
    assert hooks["w"].url == SecretRef.file("/run/credentials/keyturn.service/webhook_url")
    assert hooks["a"].url == SecretRef.env("ALERTMANAGER_URL")
    assert hooks["p"].url == SecretRef.inline("http://127.0.0.1:8080/v2/enqueue")


def test_overrides_set_scalars_and_lists() -> None:
    environ = {
        "KEYTURN_ALERTS_CHAT_MIN_SEVERITY": "warning",
        "KEYTURN_ALERTS_CHAT_URL": "env:OTHER_SLACK_URL",
        "KEYTURN_ALERTS_CHAT_DETECTORS": "grant_drift, loop_stalled",
        "KEYTURN_ALERTS_ONCALL_CREDENTIALS": '["reporting", "billing"]',
        "KEYTURN_ALERTS_ONCALL_MAX_RETRIES": "0",
        "KEYTURN_ALERTS_AM_REPEAT_INTERVAL": "5m",
    }
    hooks = load(HOOKS, environ)
    assert hooks["chat"].min_severity == "warning"
    assert hooks["chat"].url == SecretRef.env("OTHER_SLACK_URL")
    assert hooks["chat"].detectors == ("grant_drift", "loop_stalled")
    assert hooks["oncall"].credentials == ("reporting", "billing")
    assert hooks["oncall"].max_retries == 0
    assert hooks["am"].repeat_interval == 300.0


def hook(type_: str, **keys: str) -> str:
    lines = ["", "[[alerts]]", 'name = "h"', f'type = "{type_}"']
    lines += [f"{k} = {v}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


WEBHOOK_URL = '"https://hooks.example.com/x"'
AT = 'k.toml: alerts["h"]'
BAD = [
    (
        hook("slack", url='"https://hooks.slack.com/services/T0/B0/SECRETPART"'),
        f"{AT}.url: got an inline secret, which is not allowed (its value is not shown); "
        "expected a reference",
    ),
    (hook("slack"), f"{AT}.url: missing; expected a reference"),
    (
        hook("webhook", url='"http://hooks.example.com/x"'),
        f"{AT}.url: plain http to a host that is not a loopback host (the URL is not shown); "
        "expected https://",
    ),
    (
        hook("webhook", url='"https://hooks.example.com/x?token=SECRETPART"'),
        f"{AT}.url: got a string that is not a plain URL without user info, ?query or "
        "#fragment (not shown: it may hold a secret)",
    ),
    (
        hook("webhook", url='"https://user:SECRETPART@hooks.example.com/"'),
        f"{AT}.url: got a string that is not a plain URL",
    ),
    (hook("webhook", url="42"), f"{AT}.url: got an integer; expected the URL alerts are POSTed"),
    (hook("webhook", url='"env:1BAD"'), f"{AT}.url: malformed reference (env: needs"),
    (hook("alertmanager"), f"{AT}.url: missing; expected Alertmanager's base URL"),
    (hook("pagerduty"), f"{AT}.routing_key: missing; expected a reference"),
    (
        hook("pagerduty", routing_key='"SECRETPART0123"'),
        f"{AT}.routing_key: got an inline secret, which is not allowed",
    ),
    (
        hook("webhook", url=WEBHOOK_URL, routing_key='"env:X"'),
        f'{AT}.routing_key: unknown key for type "webhook"',
    ),
    (hook("teams", url=WEBHOOK_URL), f'{AT}.type: got "teams"; expected one of "webhook", "slack"'),
    (
        hook("webhook", url=WEBHOOK_URL, min_severity='"error"'),
        f'{AT}.min_severity: got "error"; expected one of "info", "warning", "critical"',
    ),
    (
        hook("webhook", url=WEBHOOK_URL, detectors='["refresh_token_rejectd"]'),
        f'{AT}.detectors: no detector is named "refresh_token_rejectd"; did you mean '
        '"refresh_token_rejected"?',
    ),
    (
        hook("webhook", url=WEBHOOK_URL, detectors="[]"),
        f"{AT}.detectors: got an array; expected a non-empty array of detector names",
    ),
    (
        hook("webhook", url=WEBHOOK_URL, credentials='["reportng"]'),
        f'{AT}.credentials: no credential is named "reportng"; did you mean "reporting"?',
    ),
    (
        hook("webhook", url=WEBHOOK_URL, credentials='["zzz"]'),
        f'{AT}.credentials: no credential is named "zzz"; expected one of: reporting, billing',
    ),
    (
        hook("webhook", url=WEBHOOK_URL, rate_limit="0"),
        f"{AT}.rate_limit: got 0, which is out of range; expected a number of alerts per minute "
        "greater than zero, at most 10000",
    ),
    (
        hook("webhook", url=WEBHOOK_URL, repeat_interval='"30s"'),
        f'{AT}.repeat_interval: got "30s", which is out of range; expected a duration between 1m '
        "and 365d",
    ),
    (
        hook("webhook", url=WEBHOOK_URL, max_retries="-1"),
        f"{AT}.max_retries: got -1, which is out of range; expected an integer between 0 and 100",
    ),
    (
        hook("webhook", url=WEBHOOK_URL, timeout="0"),
        f"{AT}.timeout: got 0, which is out of range; expected a duration greater than zero, at "
        "most 1h",
    ),
    (
        hook("webhook", url=WEBHOOK_URL, rate_limit="1e308"),
        f"{AT}.rate_limit: got 1e+308, which is out of range; expected a number of alerts per "
        "minute greater than zero, at most 10000",
    ),
    (
        hook("webhook", url=WEBHOOK_URL, rate_limit="nan"),
        f"{AT}.rate_limit: got nan; expected a number of alerts per minute greater than zero, at "
        "most 10000",
    ),
    (
        hook("webhook", url=WEBHOOK_URL, repeat_interval='"366d"'),
        f'{AT}.repeat_interval: got "366d", which is out of range; expected a duration between 1m '
        "and 365d",
    ),
    (
        hook("webhook", url=WEBHOOK_URL, timeout='"100000000000d"'),
        f'{AT}.timeout: got "100000000000d", which is out of range; expected a duration greater '
        "than zero, at most 1h",
    ),
    (
        hook("webhook", url=WEBHOOK_URL, max_retries="101"),
        f"{AT}.max_retries: got 101, which is out of range; expected an integer between 0 and 100",
    ),
    (
        hook("webhook", url=WEBHOOK_URL, runbook_base='"http://wiki.example.com/runbook"'),
        f'{AT}.runbook_base: got "http://wiki.example.com/runbook"; expected an https:// URL',
    ),
    (
        hook("webhook", url=WEBHOOK_URL, min_severty='"info"'),
        f'{AT}.min_severty: unknown key for type "webhook"; did you mean "min_severity"?',
    ),
    (
        '\n[[alerts]]\ntype = "webhook"\nurl = "https://h.example"\n',
        "k.toml: alerts[0].name: missing; expected a name",
    ),
    (
        '\n[[alerts]]\nname = "h"\nurl = "https://h.example"\n',
        f'{AT}.type: missing; expected one of "webhook", "slack", "pagerduty", "alertmanager"',
    ),
]


@pytest.mark.parametrize(("text", "line"), BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_one_bad_value_gives_one_problem(text: str, line: str) -> None:
    [problem] = problems(text)
    assert problem.startswith(line), problem
    assert "SECRETPART" not in problem


def test_duplicate_hook_names_are_reported_by_index() -> None:
    text = hook("webhook", url=WEBHOOK_URL) + hook("webhook", url=WEBHOOK_URL)
    assert problems(text) == [
        'k.toml: alerts[1].name: duplicate alert hook name "h" (also alerts[0]); '
        "expected each alert hook name once"
    ]


BAD_OVERRIDES = [
    (
        {"KEYTURN_ALERTS_NOPE_URL": "https://x.example"},
        "k.toml: environment KEYTURN_ALERTS_NOPE_URL: names no configured alert hook; "
        "expected KEYTURN_ALERTS_<NAME>_<KEY> with <NAME> one of: AM, CHAT, GENERIC, ONCALL",
    ),
    (
        {"KEYTURN_ALERTS_URL": "https://x.example"},  # ignored before [[alerts]] existed
        "k.toml: environment KEYTURN_ALERTS_URL: not a known override; "
        "did you mean KEYTURN_ALERTS_AM_URL?",
    ),
    (
        {"KEYTURN_ALERTS_CHAT_URL": "https://hooks.slack.com/services/SECRETPART"},
        'k.toml: environment KEYTURN_ALERTS_CHAT_URL: alerts["chat"].url: got an inline '
        "secret, which is not allowed",
    ),
    (
        {"KEYTURN_ALERTS_CHAT_DETECTORS": "[not json"},
        'k.toml: environment KEYTURN_ALERTS_CHAT_DETECTORS: alerts["chat"].detectors: got '
        '"[not json"',
    ),
    (
        {"KEYTURN_ALERTS_GENERIC_ROUTING_KEY": "env:X"},
        'k.toml: environment KEYTURN_ALERTS_GENERIC_ROUTING_KEY: not a key of alerts["generic"]',
    ),
    (
        {"KEYTURN_ALERT_CHAT_URL": "env:X"},  # a near miss of the section
        "k.toml: environment KEYTURN_ALERT_CHAT_URL: not a known override; "
        "did you mean KEYTURN_ALERTS_CHAT_URL?",
    ),
]


@pytest.mark.parametrize(("environ", "line"), BAD_OVERRIDES)
def test_bad_overrides_name_the_variable(environ: dict[str, str], line: str) -> None:
    [problem] = problems(HOOKS, environ)
    assert problem.startswith(line), problem
    assert "SECRETPART" not in problem


def test_credential_filters_are_not_guessed_when_a_credential_has_no_valid_name() -> None:
    text = BASE.replace('name = "billing"', 'name = "Billing!"') + hook(
        "webhook", url=WEBHOOK_URL, credentials='["billing"]'
    )
    found = problems_raw(text)
    assert all("alerts" not in p for p in found), found


def problems_raw(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "k.toml", {})
    return caught.value.problems


def test_the_shipped_example_has_every_hook_type() -> None:
    config = load_config(REPO / "deploy" / "keyturn.example.toml", environ={})
    assert sorted(h.type for h in config.alerts) == [
        "alertmanager",
        "pagerduty",
        "slack",
        "webhook",
    ]


KNOWN = re.compile(
    r'k\.toml: alerts\["h"\]\.zzzzzz: unknown key for type "(\w+)"; expected one of: (.+)'
)
HOOK_TABLES = {tag[1]: model for path, model, tag in tables() if path == "alerts[]" and tag}


@pytest.mark.parametrize(
    "text",
    [
        hook("webhook", url=WEBHOOK_URL, zzzzzz="1"),
        hook("slack", url='"env:S"', zzzzzz="1"),
        hook("pagerduty", routing_key='"env:K"', zzzzzz="1"),
        hook("alertmanager", url=WEBHOOK_URL, zzzzzz="1"),
    ],
)
def test_every_key_is_documented_and_in_the_example(text: str) -> None:
    [problem] = problems(text)
    match = KNOWN.fullmatch(problem)
    assert match, problem
    keys_of_type = list(keys(HOOK_TABLES[match[1]]))  # the schema's, as the problem lists them
    assert match[2].split(", ") == keys_of_type
    assert {"name", "type", "url", "min_severity", "max_retries"} <= set(keys_of_type)
    section = EXAMPLE[EXAMPLE.index("[[alerts]]") :]
    for key in keys_of_type:
        assert f"`{key}`" in DOCS, f"alerts.{key} is not documented"
        assert re.search(rf"^#? ?{key} = ", section, re.M), f"alerts.{key} is not in the example"
