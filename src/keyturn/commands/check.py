"""`keyturn check -c FILE`: is this configuration ready to run?

Validates the file, resolves every secret reference, checks Vault auth and the token's
capabilities on every path keyturn will touch, and reaches every provider's token endpoint.
Exit 0 when all is well; exit 1 with one line per problem otherwise.

Reaching a provider sends an unsupported grant type to its token endpoint: any RFC 6749
answer proves the endpoint is there without issuing a token (client credentials themselves are
proven by the first real refresh, with `probe` before anything is published).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import defaultdict

import httpx

from keyturn.alerts.build import build_hooks
from keyturn.clock import SystemClock
from keyturn.commands import add_config_argument, load_or_report
from keyturn.config import Config, HttpRotatorConfig
from keyturn.errors import KeyturnError
from keyturn.layout import state_path
from keyturn.providers.tokens import parse_error_response
from keyturn.references import ReferenceResolver
from keyturn.vault.store import KvStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None:
        return 1
    problems = asyncio.run(check(config))
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"{config.source}: ok ({len(config.credentials)} credentials)")
    return 1 if problems else 0


def required_capabilities(config: Config) -> dict[str, set[str]]:
    """Full API path -> capabilities keyturn needs there."""
    mount = config.vault.mount
    needed: dict[str, set[str]] = defaultdict(set)
    for credential in config.credentials:
        for ref in (credential.client_id, credential.client_secret, credential.initial_key):
            if ref is not None and ref.scheme == "vault":
                needed[f"{ref.mount}/data/{ref.path}"].add("read")
        needed[f"{mount}/data/{credential.publish_to}"] |= {"create", "update", "read"}
        needed[f"{mount}/metadata/{credential.publish_to}"] |= {"create", "update", "read"}
        private = state_path(config.keyturn.state_prefix, credential.name)
        needed[f"{mount}/data/{private}"] |= {"create", "update", "read"}
    # Secrets of rotators and alert hooks may live in Vault too.
    others = [r.auth for r in config.rotators.values() if isinstance(r, HttpRotatorConfig)]
    others += [ref for hook in config.alerts for ref in (hook.url, hook.routing_key)]
    for ref in others:
        if ref is not None and ref.scheme == "vault":
            needed[f"{ref.mount}/data/{ref.path}"].add("read")
    return needed


async def check(config: Config) -> list[str]:
    from keyturn.vault.open import open_vault_store  # noqa: PLC0415

    problems: list[str] = []
    try:
        store = await open_vault_store(config, clock=SystemClock())
    except KeyturnError as error:
        return [f"vault: {error}"]
    try:
        problems += await _check_capabilities(config, store)
        problems += await _check_references(config, store)
    finally:
        await store.close()
    problems += await _check_providers(config)
    return problems


async def _check_capabilities(config: Config, store: KvStore) -> list[str]:
    needed = required_capabilities(config)
    try:
        granted = await store.capabilities(sorted(needed))
    except KeyturnError as error:
        return [f"vault: cannot read the token's capabilities: {error}"]
    problems = []
    for path, wanted in sorted(needed.items()):
        have = granted.get(path, frozenset())
        if "root" in have:
            continue
        missing = sorted(wanted - have)
        if missing:
            problems.append(f"vault: {path}: policy lacks {', '.join(missing)}")
    return problems


async def _check_references(config: Config, store: KvStore) -> list[str]:
    resolver = ReferenceResolver(os.environ, store)
    problems = []
    for credential in config.credentials:
        for field in ("client_id", "client_secret", "initial_key"):
            ref = getattr(credential, field)
            if ref is None:
                continue
            try:
                await resolver.resolve(ref)
            except KeyturnError as error:
                problems.append(f"credentials[{credential.name!r}].{field}: {error.message}")
    for rotator in config.rotators.values():
        if not isinstance(rotator, HttpRotatorConfig) or rotator.auth is None:
            continue
        try:
            await resolver.resolve(rotator.auth)
        except KeyturnError as error:
            problems.append(f"rotators[{rotator.name!r}].auth: {error.message}")
    try:
        hooks = await build_hooks(
            config.alerts, resolver, clock=SystemClock(), source=str(config.source)
        )
    except KeyturnError as error:
        problems.append(f"alerts: {error.message}")
    else:
        for hook in hooks:
            await hook.aclose()
    return problems


async def _check_providers(config: Config) -> list[str]:
    problems = []
    async with httpx.AsyncClient(timeout=5.0, follow_redirects=False) as http:
        for provider in config.providers.values():
            try:
                response = await http.post(
                    provider.token_url, data={"grant_type": "urn:keyturn:check"}
                )
            except httpx.HTTPError as exc:
                problems.append(
                    f"providers[{provider.name!r}]: {provider.token_url} unreachable "
                    f"({type(exc).__name__})"
                )
                continue
            problem = token_endpoint_problem(response.status_code, response.content)
            if problem is not None:
                problems.append(f"providers[{provider.name!r}]: {provider.token_url} {problem}")
    return problems


def token_endpoint_problem(status: int, body: bytes) -> str | None:
    """Why an answer to a bogus grant does not prove a token endpoint (None if it does).

    Only a 2xx or an RFC 6749 §5.2 error (400/401 with its JSON body) proves one: a 404 or
    405 (a wrong `token_path`), an HTML error page or a 5xx could come from anything there.
    """
    if 200 <= status < 300:
        return None
    # RFC 6749 §5.2: an error is a 400 (401 for client authentication) with a JSON body
    # naming it; a 404 that happens to be JSON with an "error" member proves nothing.
    if status in (400, 401) and parse_error_response(body[:65536], status, "check") is not None:
        return None
    if status >= 500:
        return f"answered HTTP {status}; expected the token endpoint to answer"
    return (
        f"answered HTTP {status} without an RFC 6749 error body: not a token endpoint; "
        "expected token_path to name the provider's token endpoint (e.g. /oauth/token)"
    )
