"""From `[[alerts]]` to live hooks and a dispatcher: references are resolved here, once.

    dispatcher = await build_dispatcher(config, resolver, clock=clock, rng=rng,
                                        on_delivery=metrics.alert_delivery)

A URL read from a reference is checked like a plain one (https, or http to a loopback
host), and a message about it names the key and the reference, never the URL.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from urllib.parse import urlsplit

import httpx

from keyturn.alerts.dispatcher import AlertDispatcher, OnDelivery
from keyturn.alerts.hooks.alertmanager import AlertmanagerHook
from keyturn.alerts.hooks.base import AlertHook, HookPolicy
from keyturn.alerts.hooks.pagerduty import PagerDutyHook
from keyturn.alerts.hooks.slack import SlackHook
from keyturn.alerts.hooks.webhook import WebhookHook
from keyturn.alerts.model import DEFAULT_RUNBOOK_BASE
from keyturn.clock import Clock
from keyturn.config.fields import is_loopback
from keyturn.config.schema import (
    AlertHookConfig,
    AlertmanagerHookConfig,
    Config,
    PagerDutyHookConfig,
    SlackHookConfig,
    WebhookHookConfig,
)
from keyturn.errors import ConfigError
from keyturn.references import ReferenceResolver, SecretRef
from keyturn.secret import Secret


def hook_policy(config: AlertHookConfig) -> HookPolicy:
    return HookPolicy(
        min_severity=config.min_severity,
        detectors=None if config.detectors is None else frozenset(config.detectors),
        credentials=None if config.credentials is None else frozenset(config.credentials),
        rate_limit=config.rate_limit,
        repeat_interval=config.repeat_interval,
        max_retries=config.max_retries,
        runbook_base=config.runbook_base or DEFAULT_RUNBOOK_BASE,
    )


def url_problem(url: str) -> str | None:
    """Why `url` cannot be posted to (without repeating it), or None."""
    try:
        parts = urlsplit(url.strip())
        _ = parts.port
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "is not an http(s) URL with a host"
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        return "is plain http to a host that is not a loopback host"
    return None


async def _url(
    config: AlertHookConfig, ref: SecretRef, resolver: ReferenceResolver, source: str
) -> Secret:
    url = await resolver.resolve(ref)
    problem = url_problem(url.reveal())
    if problem is not None:
        raise ConfigError(
            f'{source}: alerts["{config.name}"].url: the URL read from {ref} {problem} (the URL '
            "is not shown); expected https://, or http to a loopback host"
        )
    return Secret(url.reveal().strip())


async def build_hook(
    config: AlertHookConfig,
    resolver: ReferenceResolver,
    *,
    clock: Clock,
    source: str = "configuration",
    transport: httpx.AsyncBaseTransport | None = None,
) -> AlertHook:
    """One hook; resolves its references (SecretReferenceError, ConfigError for a bad URL)."""
    policy = hook_policy(config)
    timeout = config.timeout
    hook_class: type[SlackHook | AlertmanagerHook | WebhookHook]
    match config:  # one arm per hook type: the one registration a new type needs here
        case PagerDutyHookConfig():
            url = None if config.url is None else await _url(config, config.url, resolver, source)
            key = await resolver.resolve(config.routing_key)
            return PagerDutyHook(
                config.name, key, policy, url=url, clock=clock, timeout=timeout, transport=transport
            )
        case SlackHookConfig():
            hook_class = SlackHook
        case AlertmanagerHookConfig():
            hook_class = AlertmanagerHook
        case WebhookHookConfig():
            hook_class = WebhookHook
        case _:
            raise ConfigError(f'{source}: alerts["{config.name}"].type: unknown {config.type!r}')
    url = await _url(config, config.url, resolver, source)
    return hook_class(config.name, url, policy, clock=clock, timeout=timeout, transport=transport)


async def build_hooks(
    configs: Iterable[AlertHookConfig],
    resolver: ReferenceResolver,
    *,
    clock: Clock,
    source: str = "configuration",
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[AlertHook]:
    """Every configured hook; on an error the hooks built so far are closed."""
    hooks: list[AlertHook] = []
    try:
        for config in configs:
            hooks.append(
                await build_hook(config, resolver, clock=clock, source=source, transport=transport)
            )
    except BaseException:
        for hook in hooks:
            await hook.aclose()
        raise
    return hooks


async def build_dispatcher(
    config: Config,
    resolver: ReferenceResolver,
    *,
    clock: Clock,
    rng: random.Random,
    on_delivery: OnDelivery | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AlertDispatcher:
    """The dispatcher for `config.alerts` (with no hooks it accepts alerts and sends none)."""
    hooks = await build_hooks(
        config.alerts, resolver, clock=clock, source=str(config.source), transport=transport
    )
    return AlertDispatcher(hooks, clock=clock, rng=rng, on_delivery=on_delivery)
