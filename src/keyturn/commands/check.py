"""`keyturn check -c FILE [--live]`: is this configuration ready to run?

Exit 0 when the file, its references, Vault (auth, KV v2 mounts, capabilities), every
provider's token endpoint and, with `[usage]`, the audit log are all usable; else exit 1,
one line per problem. Notes and "warning:" lines (takeover, `revoke_path`, an open `/usage`)
never fail it; `--live` also uses each credential once (`_check_live`). See docs/cli.md.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field

import httpx

from keyturn.alerts.build import build_hooks
from keyturn.clock import SystemClock
from keyturn.commands import add_config_argument, load_or_report
from keyturn.config import Config, CredentialConfig, HttpRotatorConfig
from keyturn.config.fields import is_loopback
from keyturn.errors import (
    KeyturnError,
    SecretReferenceError,
    VaultError,
)
from keyturn.hardening import harden_process
from keyturn.kinds import kind_of
from keyturn.layout import state_path
from keyturn.members import BEATS_PER_TAKEOVER, MIN_TAKEOVER, SLACK_SHARE, slack, takeover_needed
from keyturn.policy import RefreshPolicy
from keyturn.providers.client import ProviderClient
from keyturn.providers.tokens import parse_error_response
from keyturn.references import ReferenceResolver, SecretRef
from keyturn.secret import Secret
from keyturn.state import CredentialState
from keyturn.usage.sources import check_address, check_file
from keyturn.vault.hvac_store import VaultStore
from keyturn.vault.mounts import inspect_mount
from keyturn.vault.store import KvStore
from keyturn.watch import listed_folders


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument(
        "--live",
        action="store_true",
        help="also request a real token for each oauth_client credential (and call its probe "
        "with it) and call each api_key's probe with its current key; nothing is published, "
        "stored or alerted",
    )


@dataclass
class Report:
    """`problems` go to stderr (and make the exit code 1); `notes` (what --live saw work, what
    the tokens ask of several instances) to stdout."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None:
        return 1
    harden_process()  # before any secret is read: keyturn.hardening
    report = asyncio.run(check(config, live=args.live))
    for note in report.notes:
        print(note)
    for problem in report.problems:
        print(problem, file=sys.stderr)
    if not report.problems:
        print(f"{config.source}: ok ({len(config.credentials)} credentials)")
    return 1 if report.problems else 0


def token_param_references(
    credential: CredentialConfig, *, named: bool = True
) -> list[tuple[str, SecretRef | None]]:
    """The references among a credential's `token_params`, each with its key (prefixed with
    the credential when `named`)."""
    prefix = f"credentials[{credential.name!r}]." if named else ""
    return [
        (f"{prefix}token_params.{name}", ref)
        for name, ref in credential.token_params
        if not ref.is_inline
    ]


def vault_references(config: Config) -> list[tuple[str, SecretRef]]:
    """Every `vault:` reference in the configuration, with the key that holds it."""
    keyed: list[tuple[str, SecretRef | None]] = []
    for credential in config.credentials:
        for key, ref in credential.references():
            keyed.append((f"credentials[{credential.name!r}].{key}", ref))
        keyed += token_param_references(credential)
    # Secrets of rotators and alert hooks may live in Vault too.
    for rotator in config.rotators.values():
        if isinstance(rotator, HttpRotatorConfig) and isinstance(rotator.auth, SecretRef):
            keyed.append((f"rotators[{rotator.name!r}].auth", rotator.auth))
    for hook in config.alerts:
        keyed.append((f"alerts[{hook.name!r}].url", hook.url))
        keyed.append((f"alerts[{hook.name!r}].routing_key", hook.routing_key))
    return [(key, ref) for key, ref in keyed if ref is not None and ref.scheme == "vault"]


def required_capabilities(config: Config) -> dict[str, set[str]]:
    """Full API path -> capabilities keyturn needs there."""
    mount = config.vault.mount
    needed: dict[str, set[str]] = defaultdict(set)
    for _key, ref in vault_references(config):
        needed[f"{ref.mount}/data/{ref.path}"].add("read")
    for credential in config.credentials:
        for path in (credential.publish_to, *credential.also_published()):
            needed[f"{mount}/data/{path}"] |= {"create", "update", "read"}
            needed[f"{mount}/metadata/{path}"] |= {"create", "update", "read"}
        private = state_path(config.keyturn.state_prefix, credential.name)
        needed[f"{mount}/data/{private}"] |= {"create", "update", "read"}
    # One LIST at the daemon's start finds the credentials that have no record yet.
    needed[f"{mount}/metadata/{config.keyturn.state_prefix.strip('/')}/"] |= {"list"}
    # The watcher's sweep lists each folder holding several published paths.
    published = [credential.publish_to for credential in config.credentials]
    for folder in listed_folders(published) if config.keyturn.watch_interval > 0 else ():
        needed[f"{mount}/detailed-metadata/{folder}/"] |= {"list"}
    return needed


async def check(config: Config, *, live: bool = False) -> Report:
    from keyturn.vault.open import open_vault_store  # noqa: PLC0415

    report = Report(notes=metrics_notes(config))
    try:
        store = await open_vault_store(config, clock=SystemClock(), check_mount=False)
    except KeyturnError as error:
        report.problems.append(f"vault: {error}")
        return report
    try:
        mount_problems, unusable = await _check_mounts(config, store)
        report.problems += mount_problems
        report.problems += await _check_capabilities(config, store)
        report.problems += await _check_references(config, store, skip=unusable)
        if config.vault.mount not in unusable:
            report.notes += await takeover_notes(config, store)
        if live and config.vault.mount not in unusable:
            await _check_live(config, store, report)
    finally:
        await store.close()
    report.problems += await _check_providers(config)
    report.problems += sink_problems(config)
    report.problems += usage_problems(config)
    if not report.problems:  # a failing check says what fails, one line each, and no more
        report.notes += revocation_notes(config)
    return report


def metrics_notes(config: Config) -> list[str]:
    """A warning when /usage (with `[usage]`) is open to the network: a non-loopback
    `[metrics] listen` and no authentication in `web_config`."""
    metrics = config.metrics
    web = metrics.web_config
    if config.usage is None or is_loopback(metrics.host) or (web and web.authenticates):
        return []
    return [
        f"warning: metrics.listen: /usage on {metrics.listen}, not a loopback address, answers "
        "anyone who reaches it with who reads which credential; set [metrics] web_config "
        "with basic_auth_users or a verified client certificate (docs/configuration.md#metrics)"
    ]


def revocation_notes(config: Config) -> list[str]:
    """A note per provider of oauth_client credentials without `revoke_path`: a refresh whose
    answer was lost (a time-out, a dropped connection, a crash mid-request) may have rotated
    the refresh token at the provider; keyturn never presents it again, and with no revocation
    endpoint nothing ends that token's family (logged as `refresh_token.orphaned`)."""
    used = {c.provider for c in config.credentials if kind_of(c).refreshes_tokens}
    return [
        f"note: providers[{name!r}] has no revoke_path: after a refresh whose answer was lost, "
        "the lost refresh token's family stays live at the provider until it expires or is "
        "revoked there (keyturn logs refresh_token.orphaned; see docs/runbook.md)"
        for name, provider in config.providers.items()
        if name in used and provider.revoke_path is None
    ]


Token = tuple[float, float, RefreshPolicy]  # issued_at, expires_at, the credential's policy


async def takeover_notes(config: Config, store: KvStore) -> list[str]:
    """What the published tokens ask of several instances sharing this configuration. A dead
    instance's credentials must be run by another before their tokens expire: instances beat
    to the takeover their tokens need (`keyturn.members.takeover_needed`, a third of what a
    token has left after its latest planned refresh), `takeover_after` being only a cap. A
    note says when that makes them beat faster than the cap would; a "warning:" line names
    each credential whose tokens need less than MIN_TAKEOVER, which no heartbeat keeps up
    with. From each oauth_client credential's private record (API keys do not expire when
    their rotation is late); a record that cannot be read, or holds no token yet, is left out
    (the capability check names what cannot be read)."""

    async def token(credential: CredentialConfig) -> tuple[str, Token] | None:
        try:
            entry = await store.read(state_path(config.keyturn.state_prefix, credential.name))
            state = CredentialState.from_data(entry.data, credential.name) if entry else None
        except KeyturnError:
            return None
        issued_at = state.token.issued_at if state is not None else None
        expires_at = state.token.expires_at if state is not None else None
        if issued_at is None or expires_at is None:
            return None
        return credential.name, (issued_at, expires_at, credential.refresh)

    oauth = [c for c in config.credentials if kind_of(c).value_expires]
    tokens = dict(found for found in await asyncio.gather(*map(token, oauth)) if found)
    notes = []
    for name, (issued_at, expires_at, policy) in tokens.items():
        left = slack(issued_at, expires_at, policy)
        if left * SLACK_SHARE >= MIN_TAKEOVER:
            continue
        notes.append(
            f"warning: credentials[{name!r}]: its {expires_at - issued_at:.0f}s tokens leave "
            f"{left:.1f}s after their latest planned refresh; a takeover within a third of that "
            f"({left * SLACK_SHARE:.1f}s) is below keyturn's least ({MIN_TAKEOVER:g}s): with "
            "several instances, when the one running it dies apps may read an expired token "
            "before another runs it; use longer-lived tokens, or refresh earlier so that at "
            f"least {MIN_TAKEOVER / SLACK_SHARE:g}s are left (a smaller refresh.at, or a "
            "larger refresh.margin below the lifetime)"
        )
    need, cap = takeover_needed(tokens.values()), config.keyturn.takeover_after
    if need is not None and need < cap:
        tightest = min(tokens, key=lambda name: slack(*tokens[name]))
        issued_at, expires_at, policy = tokens[tightest]
        notes.append(
            f"keyturn.takeover_after: {cap:g}s is a cap: credentials[{tightest!r}]'s "
            f"{expires_at - issued_at:.0f}s tokens leave "
            f"{slack(issued_at, expires_at, policy):.1f}s after "
            f"their latest planned refresh and need a takeover within {need:.1f}s, so several "
            f"instances of this configuration beat every {need / BEATS_PER_TAKEOVER:.1f}s "
            f"instead of every {cap / BEATS_PER_TAKEOVER:.1f}s"
        )
    return notes


def usage_problems(config: Config) -> list[str]:
    """With `[usage]`: Vault's audit log must be readable here (run `check` as keyturn's
    user), the position file's directory writable, a socket address usable."""
    usage = config.usage
    if usage is None:
        return []
    if usage.source == "socket":
        assert usage.socket is not None
        problem = check_address(usage.socket)
        return [] if problem is None else [f"usage.socket: {problem}"]
    assert usage.file is not None
    problems = []
    problem = check_file(usage.file)
    if problem is not None:
        problems.append(f"usage.file: {problem}")
    directory = usage.position_file.parent
    if not directory.is_dir():
        problems.append(
            f"usage.position_file: directory {directory} does not exist (create it, or "
            "systemd's StateDirectory=keyturn does)"
        )
    elif not os.access(directory, os.W_OK | os.X_OK):
        problems.append(f"usage.position_file: keyturn cannot write in {directory}")
    return problems


def sink_problems(config: Config) -> list[str]:
    """A sink's directory must exist and be writable by keyturn here (it is never created:
    its owner, group and mode are the operator's choice)."""
    problems = []
    for credential in config.credentials:
        for index, sink in enumerate(credential.sinks):
            key = f"credentials[{credential.name!r}].sinks[{index}].path"
            directory = sink.path.parent
            if not directory.is_dir():
                problems.append(f"{key}: directory {directory} does not exist (create it)")
            elif not os.access(directory, os.W_OK | os.X_OK):
                problems.append(f"{key}: keyturn cannot write in {directory}")
    return problems


async def _check_mounts(config: Config, store: VaultStore) -> tuple[list[str], set[str]]:
    """One line per mount keyturn uses that is not KV v2: `vault.mount`, then each `vault:`
    reference's. Also returns the mounts keyturn cannot use: their references are not resolved
    one by one (each line would only repeat the mount's)."""
    used_by = {config.vault.mount: "vault.mount"}
    for key, ref in vault_references(config):
        used_by.setdefault(ref.mount, f"{key} = {ref}")
    needed = required_capabilities(config)
    problems: list[str] = []
    unusable: set[str] = set()
    for mount, user in used_by.items():
        under = sorted(path for path in needed if path.startswith(f"{mount}/"))
        try:
            info = await inspect_mount(store, mount, under=under)
        except KeyturnError as error:
            problems.append(f"vault: {mount}/ ({user}): cannot tell what is mounted: {error}")
            continue
        problem = info.problem(user)
        if problem is not None:
            problems.append(f"vault: {problem}")
        if info.kind in ("missing", "kv-v1", "other"):
            unusable.add(mount)
    return problems, unusable


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


async def _check_references(config: Config, store: KvStore, *, skip: set[str]) -> list[str]:
    """Resolve every reference; those on a mount in `skip` (already reported) are left out."""
    resolver = ReferenceResolver(os.environ, store)
    problems = []
    for credential in config.credentials:
        keyed = list(credential.references())
        for key, ref in keyed + token_param_references(credential, named=False):
            if ref is None or (ref.scheme == "vault" and ref.mount in skip):
                continue
            try:
                await resolver.resolve(ref)
            except KeyturnError as error:
                problems.append(f"credentials[{credential.name!r}].{key}: {error.message}")
    for rotator in config.rotators.values():
        if not isinstance(rotator, HttpRotatorConfig) or not isinstance(rotator.auth, SecretRef):
            continue
        if rotator.auth.scheme == "vault" and rotator.auth.mount in skip:
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


class _Unresolved(Exception):
    """An input that does not resolve: `_check_references` has already said so."""


async def _check_live(config: Config, store: VaultStore, report: Report) -> None:
    """Use each credential as the daemon would, and nothing more, as its kind says
    (`keyturn.kinds.Kind.live_check`): a client_credentials token request (never the refresh
    token keyturn holds: using it would rotate it) and the probe for an oauth_client, the
    probe with the current key for an api_key. Nothing is published, no state record is
    written, no alert is raised (no observer is given anything), and the token obtained is
    revoked (RFC 7009) where the provider offers it."""
    resolver = ReferenceResolver(os.environ, store)
    resolve = functools.partial(_resolve, resolver)
    clock = SystemClock()
    clients = {
        name: ProviderClient(provider, clock=clock) for name, provider in config.providers.items()
    }
    try:
        for credential in config.credentials:
            label = f"credentials[{credential.name!r}]"
            client = clients[credential.provider]
            try:
                entry = await store.read(
                    state_path(config.keyturn.state_prefix, credential.name), consistent=True
                )
                state = CredentialState.from_data(entry.data, credential.name) if entry else None
                note = await kind_of(credential).live_check(credential, client, resolve, state)
            except _Unresolved:
                continue
            except KeyturnError as error:
                report.problems.append(f"{label}: {error.message}")
            else:
                report.notes.append(f"{label}: {note}")
    finally:
        for client in clients.values():
            await client.aclose()


async def _resolve(resolver: ReferenceResolver, ref: SecretRef) -> Secret:
    try:
        return await resolver.resolve(ref)
    except (SecretReferenceError, VaultError) as error:
        raise _Unresolved from error


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
