"""Loading `[[alerts]]`: one entry per alert hook.

`type` selects the receiver, and each type has its own keys (a key of another type, such as
`routing_key` on a webhook, is an unknown key):

    [[alerts]]                          [[alerts]]
    name = "oncall"                     name = "team-chat"
    type = "pagerduty"                  type = "slack"
    routing_key = "env:PD_ROUTING_KEY"  url = "vault:secret/keyturn/inputs/slack#webhook_url"
    min_severity = "critical"           detectors = ["credential_failing", "grant_drift"]

A Slack webhook URL is a secret (whoever has it can post), so it is only taken as a
reference; so is a PagerDuty routing key. A generic webhook's and Alertmanager's `url` may
be a reference or a plain URL (https, or http to a loopback host). Nothing here echoes a URL
that was refused: it may hold a token.
"""

from __future__ import annotations

import difflib
import json
from urllib.parse import urlsplit

from keyturn.alerts.model import DETECTORS, SEVERITIES
from keyturn.config.fields import (
    MAX_TIMEOUT,
    NAME_RULE,
    URL,
    Field,
    Invalid,
    choice,
    describe,
    duration,
    integer,
    is_loopback,
    kind_of,
    number,
    secret_reference,
)
from keyturn.config.reader import Table
from keyturn.config.schema import AlertHookConfig, AlertHookType
from keyturn.references import REFERENCE_FORMS, SecretRef, looks_like_reference, parse_reference

HOOK_TYPES: tuple[AlertHookType, ...] = ("webhook", "slack", "pagerduty", "alertmanager")
_SEVERITY = choice(SEVERITIES)
_DEFAULTS = AlertHookConfig(name="-", type="webhook")
_TYPE_URL = {
    "webhook": "the URL alerts are POSTed to",
    "alertmanager": 'Alertmanager\'s base URL, e.g. "https://alertmanager.example.com:9093"',
    "pagerduty": "the Events API v2 endpoint",
}


def _url_or_reference(what: str) -> Field[SecretRef]:
    """A reference, or a plain URL kept as `SecretRef.inline` (never echoed when refused)."""
    expected = f"{what}: a reference ({REFERENCE_FORMS}) or an {URL.expected}"

    def convert(value: object, from_env: bool) -> SecretRef:
        if not isinstance(value, str):
            raise Invalid(f"got {kind_of(value)}; expected {expected}")
        if looks_like_reference(value):
            try:
                return parse_reference(value)
            except ValueError as exc:
                raise Invalid(f"malformed reference ({exc})") from None
        try:
            url = URL.convert(value, from_env)
        except Invalid:
            raise Invalid(
                "got a string that is not a plain URL without user info, ?query or #fragment "
                f"(not shown: it may hold a secret); expected {expected}"
            ) from None
        return SecretRef.inline(url)

    return Field(expected, convert)


def _names(expected: str, known: tuple[str, ...] | None, what: str) -> Field[tuple[str, ...]]:
    """A non-empty array of names (in the environment a JSON array or "a,b"), each among
    `known` when that is given."""

    def convert(value: object, from_env: bool) -> tuple[str, ...]:
        if from_env and isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = json.loads(text)
                except ValueError:
                    raise Invalid(f"got {describe(value)}; expected {expected}") from None
            else:
                value = [part.strip() for part in text.split(",") if part.strip()]
        if not isinstance(value, list) or not value:
            raise Invalid(f"got {describe(value)}; expected {expected}")
        result: list[str] = []
        for item in value:
            if not isinstance(item, str) or not NAME_RULE.fullmatch(item):
                raise Invalid(f"got {describe(item)} in the array; expected {expected}")
            if known is not None and item not in known:
                close = difflib.get_close_matches(item, known, n=1, cutoff=0.6)
                hint = (
                    f'did you mean "{close[0]}"?'
                    if close
                    else "expected one of: " + ", ".join(known)
                )
                raise Invalid(f'no {what} is named "{item}"; {hint}')
            if item not in result:
                result.append(item)
        return tuple(result)

    return Field(expected, convert)


_DETECTORS = _names(
    'a non-empty array of detector names, e.g. ["refresh_token_rejected", "client_rejected"] '
    '(in the environment a JSON array or "a,b")',
    DETECTORS,
    "detector",
)
_RATE = number(
    "a number of alerts per minute greater than zero, at most 10000", lambda x: 0 < x <= 10_000
)
_REPEAT = duration(minimum=60.0)
_TIMEOUT = duration(positive=True, maximum=MAX_TIMEOUT)
_RETRIES = integer(0, 100)


def load_alerts(root: Table, credentials: list[str] | None) -> list[AlertHookConfig]:
    """The `[[alerts]]` entries. `credentials` are the declared credential names (None when
    some entry has no valid name: then "no such credential" would be a guess)."""
    hooks: list[AlertHookConfig] = []
    for entry in root.entries("alerts", "alert hook") or []:
        hook = _hook(entry, credentials)
        if hook is not None and entry.name is not None:
            hooks.append(hook)
    return hooks


def _hook(t: Table, credentials: list[str] | None) -> AlertHookConfig | None:
    hook_type = t.require("type", choice(HOOK_TYPES))
    if hook_type is None:
        return None  # which keys are valid depends on the type: no unknown-key check
    d = _DEFAULTS
    url: SecretRef | None
    routing_key: SecretRef | None = None
    if hook_type == "slack":
        url = t.require(
            "url",
            secret_reference(
                'url = "vault:secret/keyturn/inputs/slack#webhook_url" (a Slack webhook URL '
                "is a secret)"
            ),
        )
    elif hook_type == "pagerduty":
        url = t.optional("url", _url_or_reference(_TYPE_URL["pagerduty"]))
        routing_key = t.require(
            "routing_key", secret_reference('routing_key = "env:PAGERDUTY_ROUTING_KEY"')
        )
    else:
        url = t.require("url", _url_or_reference(_TYPE_URL[hook_type]))
    if url is not None and url.is_inline:
        _check_transport(t, url.location)
    known = tuple(credentials) if credentials is not None else None
    names = _names(
        'a non-empty array of credential names, e.g. ["reporting"] (in the environment a JSON '
        'array or "a,b")',
        known,
        "credential",
    )
    hook = AlertHookConfig(
        name=t.name or "-",
        type=hook_type,
        url=url,
        routing_key=routing_key,
        min_severity=t.get("min_severity", _SEVERITY, d.min_severity),
        detectors=t.optional("detectors", _DETECTORS),
        credentials=t.optional("credentials", names),
        rate_limit=t.get("rate_limit", _RATE, d.rate_limit),
        repeat_interval=t.get("repeat_interval", _REPEAT, d.repeat_interval),
        timeout=t.get("timeout", _TIMEOUT, d.timeout),
        max_retries=t.get("max_retries", _RETRIES, d.max_retries),
        runbook_base=t.optional("runbook_base", _RUNBOOK),
    )
    t.finish(f' for type "{hook_type}"')
    if url is None and hook_type != "pagerduty":
        return None
    if hook_type == "pagerduty" and routing_key is None:
        return None
    return hook


def _check_transport(t: Table, url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme == "http" and not is_loopback(parts.hostname or ""):
        t.problem(
            "url",
            "plain http to a host that is not a loopback host (the URL is not shown); "
            "expected https://, or a loopback host (127.0.0.0/8, ::1, localhost)",
        )


def _runbook(value: object, from_env: bool) -> str:
    expected = _RUNBOOK.expected
    try:
        url = URL.convert(value, from_env)
    except Invalid as exc:
        raise Invalid(str(exc).replace(URL.expected, expected)) from None
    if urlsplit(url).scheme != "https" and not is_loopback(urlsplit(url).hostname or ""):
        raise Invalid(f"got {describe(url)}; expected {expected}")
    return url


_RUNBOOK: Field[str] = Field(
    "an https:// URL of a copy of docs/runbook.md (alerts link to <url>#<alertname>), "
    "without ?query or #fragment",
    _runbook,
)
