"""Loading the configuration: TOML + `KEYTURN_…` overrides → a validated `Config`.

Every problem is collected, then raised at once as one `ConfigError` whose lines read
`<file>: <key path>: <what was wrong>; expected <what>` (or `<file>: environment KEYTURN_X:
…` for an override). Nothing is half-loaded: either the whole file is valid or nothing is
returned.
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from keyturn.config.alerts import load_alerts
from keyturn.config.fields import (
    BOOLEAN,
    DAY,
    HTTP_PATH,
    LISTEN,
    LOOPBACK_HOSTS,
    MAX_TIMEOUT,
    NAME,
    REFERENCE_OR_INLINE,
    URL,
    URLS,
    choice,
    duration,
    fs_path,
    integer,
    is_loopback,
    kv_path,
    number,
    secret_reference,
    text,
)
from keyturn.config.reader import ENV_PREFIX, Context, Table, report_unknown_overrides
from keyturn.config.rotators import RotatorIndex, load_rotation, load_rotators
from keyturn.config.schema import (
    AppRoleAuth,
    AuthMethod,
    ClientAuth,
    Config,
    CredentialConfig,
    CredentialKind,
    DaemonSettings,
    ExternalChangeResponse,
    KubernetesAuth,
    LogLevel,
    MetricsSettings,
    ProviderConfig,
    RotationPolicy,
    TokenAuth,
    TokenFileAuth,
    TokenRequest,
    VaultAuth,
    VaultSettings,
)
from keyturn.config.sinks import load_sinks
from keyturn.errors import ConfigError
from keyturn.policy import BackoffPolicy, RefreshPolicy
from keyturn.references import SecretRef

LOG_LEVELS: tuple[LogLevel, ...] = ("debug", "info", "warning", "error")
EXTERNAL_CHANGE_RESPONSES: tuple[ExternalChangeResponse, ...] = ("republish", "alert")
AUTH_METHODS: tuple[AuthMethod, ...] = ("token", "token_file", "approle", "kubernetes")
TOKEN_REQUESTS: tuple[TokenRequest, ...] = ("json", "form")
CLIENT_AUTHS: tuple[ClientAuth, ...] = ("body", "basic")
KINDS: tuple[CredentialKind, ...] = ("oauth_client", "api_key")

# Prototypes whose field defaults are the configuration's defaults (one source of truth).
_DAEMON = DaemonSettings(instance_id="-")
_VAULT = VaultSettings(address="-", auth=TokenAuth(SecretRef.env("-")))
_APPROLE = AppRoleAuth(role_id=SecretRef.env("-"), secret_id=SecretRef.env("-"))
_KUBERNETES = KubernetesAuth(role="-")
_METRICS = MetricsSettings()
_PROVIDER = ProviderConfig(name="-", base_url="-")
_REFRESH = RefreshPolicy()
_BACKOFF = BackoffPolicy()

_KV_EXPECTED = (
    'a path relative to the mount, e.g. "apps/reporting/acme": segments of letters, digits '
    'and _ . @ + = - joined by single "/", no "." or ".."'
)
_KV_PATH = kv_path(_KV_EXPECTED)
_KIND = choice(KINDS)
_CLIENT_SECRET = secret_reference(
    'client_secret = "vault:secret/keyturn/inputs/<name>#client_secret"'
)
_REFRESH_TOKEN = secret_reference(
    'refresh_token = "vault:secret/keyturn/inputs/<name>#refresh_token"'
)
_INITIAL_KEY = secret_reference('initial_key = "vault:secret/keyturn/inputs/<name>#api_key"')
_INITIAL_KEY_ID = text('the provider\'s id of initial_key, e.g. "key_0123"')
_NOT_FOR_API_KEY = (
    'not allowed for kind "api_key", which has no OAuth client and no token to refresh; '
    'expected it only with kind = "oauth_client"'
)
_NOT_FOR_OAUTH = (
    'not allowed for kind "oauth_client" (its secret is client_secret); '
    'expected it only with kind = "api_key"'
)
_MOUNT = kv_path('a mount path, e.g. "secret" (no leading or trailing "/")')
_INSTANCE_ID = text(
    "an identifier without spaces, at most 253 characters", re.compile(r"\S{1,253}")
)
# Ranges (docs/configuration.md lists them): time-outs up to an hour, other durations up
# to a year unless said otherwise, counts within what one process can use.
_TIMEOUT = duration(positive=True, maximum=MAX_TIMEOUT)
_CONCURRENCY = integer(1, 10_000)
_VAULT_THREADS = integer(1, 1_000)
_WATCH_INTERVAL = duration(off=True, minimum=1.0, maximum=7 * DAY)
_MARGIN = duration()
_LIFETIME = duration(positive=True)
_MAX_RESPONSE_BYTES = integer(1024, 64 * 1024 * 1024, " (1 KiB to 64 MiB)")
_PROVIDER_RATE = number(
    "a number of requests per second greater than zero, at most 10000",
    lambda x: 0 < x <= 10_000,
)
_BACKOFF_WAIT = duration(positive=True, maximum=DAY)
_MULTIPLIER = number("a number between 1 and 10", lambda x: 1 <= x <= 10)


def load_config(path: Path, environ: Mapping[str, str] = os.environ) -> Config:
    """Read and validate the configuration file at `path`; raises ConfigError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError([f"{path}: cannot read the configuration: {reason}"]) from exc
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: not UTF-8 text; expected a UTF-8 TOML file"]) from None
    return parse_config(content, str(path), environ, base_dir=path.parent)


def parse_config(
    text: str,
    source: str,
    environ: Mapping[str, str] = os.environ,
    *,
    base_dir: Path | None = None,
) -> Config:
    """Validate TOML `text` (named `source` in messages); raises ConfigError with every problem.

    Relative filesystem paths are taken from `base_dir` (default: the directory of `source`).
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's messages give the position and never the offending value.
        raise ConfigError([f"{source}: invalid TOML: {exc}; expected a TOML document"]) from None
    except ValueError:  # an integer too long for Python to read (more than 4300 digits)
        raise ConfigError(
            [f"{source}: invalid TOML: a number too long to read; expected a TOML document"]
        ) from None
    ctx = Context(source, environ, base_dir if base_dir is not None else Path(source).parent)
    root = Table(ctx, data, "", ENV_PREFIX)
    daemon = _daemon(root.table("keyturn", "a table ([keyturn])"))
    vault = _vault(root.table("vault", "a table ([vault])"), ctx)
    metrics = _metrics(root.table("metrics", "a table ([metrics])"))
    providers: dict[str, ProviderConfig] = {}
    provider_tables = root.entries("providers", "provider")
    for entry in provider_tables or []:
        provider = _provider(entry)
        if provider is not None:
            providers[provider.name] = provider
    # Provider names a credential may use; None if some entry has no valid name, in which
    # case "no such provider" would be a guess, not a finding.
    declared: list[str] | None = None
    if provider_tables is not None:
        names = [entry.declared_name for entry in provider_tables]
        declared = [n for n in names if n is not None] if None not in names else None
    rotators = load_rotators(root, declared)
    state_prefix = daemon.state_prefix if daemon else _DAEMON.state_prefix
    credential_tables = root.entries("credentials", "credential") or []
    credentials = _credentials(credential_tables, declared, state_prefix, rotators)
    declared_credentials = [entry.declared_name for entry in credential_tables]
    alerts = load_alerts(
        root,
        None
        if None in declared_credentials
        else [n for n in declared_credentials if n is not None],
    )
    root.finish()
    report_unknown_overrides(ctx)
    if ctx.problems or daemon is None or vault is None or metrics is None:
        raise ConfigError(ctx.problems or [f"{source}: invalid configuration"])
    return Config(
        keyturn=daemon,
        vault=vault,
        metrics=metrics,
        providers=providers,
        credentials=tuple(credentials),
        source=Path(source),
        rotators=rotators.configs,
        alerts=tuple(alerts),
    )


def _daemon(t: Table | None) -> DaemonSettings | None:
    if t is None:
        return None
    d = _DAEMON
    settings = DaemonSettings(
        instance_id=t.get("instance_id", _INSTANCE_ID, socket.gethostname() or "keyturn"),
        state_prefix=t.get("state_prefix", _KV_PATH, d.state_prefix),
        log_level=t.get("log_level", choice(LOG_LEVELS), d.log_level),
        max_concurrency=t.get("max_concurrency", _CONCURRENCY, d.max_concurrency),
        vault_concurrency=t.get("vault_concurrency", _VAULT_THREADS, d.vault_concurrency),
        shutdown_timeout=t.get("shutdown_timeout", _TIMEOUT, d.shutdown_timeout),
        watch_interval=t.get("watch_interval", _WATCH_INTERVAL, d.watch_interval),
        on_external_change=t.get(
            "on_external_change", choice(EXTERNAL_CHANGE_RESPONSES), d.on_external_change
        ),
    )
    t.finish()
    return settings


def _check_transport(
    t: Table, url_key: str, url: str, allow: bool, *, loopback_needs_flag: bool
) -> None:
    """https, or http to a loopback host; `allow_insecure_http` is for loopback hosts only."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    loopback = is_loopback(host)
    if allow and not loopback:
        t.problem(
            "allow_insecure_http",
            f'true is accepted only for loopback hosts ({LOOPBACK_HOSTS}), not "{host}"; '
            f"expected false with an https:// {url_key}",
        )
    elif parts.scheme == "http" and not loopback:
        t.problem(
            url_key, f'plain http to "{host}", which is not a loopback host; expected https://'
        )
    elif parts.scheme == "http" and loopback_needs_flag and not allow:
        t.problem(
            url_key,
            "plain http; expected https://, or allow_insecure_http = true "
            f"(accepted for loopback hosts only: {LOOPBACK_HOSTS})",
        )


def _vault(t: Table | None, ctx: Context) -> VaultSettings | None:
    if t is None:
        return None
    d = _VAULT
    address = t.require("address", URL)
    allow = t.get("allow_insecure_http", BOOLEAN, d.allow_insecure_http)
    auth = _auth(
        t.table("auth", 'a table, e.g. auth = { method = "token", token = "env:VAULT_TOKEN" }'), ctx
    )
    mount = t.get("mount", _MOUNT, d.mount)
    namespace = t.optional("namespace", text('a Vault namespace, e.g. "admin/team"'))
    ca_cert = t.optional("ca_cert", fs_path(ctx.base_dir))
    timeout = t.get("timeout", _TIMEOUT, d.timeout)
    renew_margin = t.get("renew_margin", _MARGIN, d.renew_margin)
    nodes = t.get("nodes", URLS, d.nodes)
    if address is not None:
        _check_transport(t, "address", address, allow, loopback_needs_flag=False)
    for node in nodes:
        _check_transport(t, "nodes", node, allow, loopback_needs_flag=False)
    t.finish()
    if address is None or auth is None:
        return None
    return VaultSettings(
        address=address,
        auth=auth,
        mount=mount,
        namespace=namespace,
        ca_cert=ca_cert,
        timeout=timeout,
        renew_margin=renew_margin,
        allow_insecure_http=allow,
        nodes=nodes,
    )


def _auth(t: Table | None, ctx: Context) -> VaultAuth | None:
    if t is None:
        return None
    method = t.require("method", choice(AUTH_METHODS))
    if method is None:
        return None  # which keys are valid depends on the method: no unknown-key check
    auth: VaultAuth | None = None
    if method == "token":
        token = t.require("token", secret_reference('token = "env:VAULT_TOKEN"'))
        auth = TokenAuth(token) if token else None
    elif method == "token_file":
        path = t.require("path", fs_path(ctx.base_dir))
        auth = TokenFileAuth(path) if path else None
    elif method == "approle":
        role_id = t.require("role_id", secret_reference('role_id = "file:/etc/keyturn/role_id"'))
        secret_id = t.require(
            "secret_id", secret_reference('secret_id = "file:/etc/keyturn/secret_id"')
        )
        mount = t.get("mount", _MOUNT, _APPROLE.mount)
        auth = AppRoleAuth(role_id, secret_id, mount) if role_id and secret_id else None
    else:
        role = t.require("role", text('the Vault role to log in as, e.g. "keyturn"'))
        jwt_path = t.get("jwt_path", fs_path(ctx.base_dir), _KUBERNETES.jwt_path)
        mount = t.get("mount", _MOUNT, _KUBERNETES.mount)
        auth = KubernetesAuth(role, jwt_path, mount) if role else None
    t.finish(f' for method "{method}"')
    return auth


def _metrics(t: Table | None) -> MetricsSettings | None:
    if t is None:
        return None
    host, port = t.get("listen", LISTEN, (_METRICS.host, _METRICS.port))
    t.finish()
    return MetricsSettings(host=host, port=port)


def _provider(t: Table) -> ProviderConfig | None:
    d = _PROVIDER
    base_url = t.require("base_url", URL)
    allow = t.get("allow_insecure_http", BOOLEAN, d.allow_insecure_http)
    provider = ProviderConfig(
        name=t.name or "-",
        base_url=base_url or "-",
        allow_insecure_http=allow,
        token_path=t.get("token_path", HTTP_PATH, d.token_path),
        revoke_path=t.optional("revoke_path", HTTP_PATH),
        token_request=t.get("token_request", choice(TOKEN_REQUESTS), d.token_request),
        client_auth=t.get("client_auth", choice(CLIENT_AUTHS), d.client_auth),
        timeout=t.get("timeout", _TIMEOUT, d.timeout),
        max_connections=t.get("max_connections", _CONCURRENCY, d.max_connections),
        rate_limit=t.optional("rate_limit", _PROVIDER_RATE),
        default_lifetime=t.get("default_lifetime", _LIFETIME, d.default_lifetime),
        max_response_bytes=t.get("max_response_bytes", _MAX_RESPONSE_BYTES, d.max_response_bytes),
    )
    if base_url is not None:
        _check_transport(t, "base_url", base_url, allow, loopback_needs_flag=True)
    t.finish()
    return provider if base_url is not None and t.name is not None else None


def _credentials(
    tables: list[Table], providers: list[str] | None, state_prefix: str, rotators: RotatorIndex
) -> list[CredentialConfig]:
    result: list[CredentialConfig] = []
    published: dict[str, str] = {}
    sink_paths: dict[Path, str] = {}
    for t in tables:
        credential = _credential(t, providers, state_prefix, rotators, sink_paths)
        if credential is None:
            continue
        other = published.setdefault(credential.publish_to, t.path)
        if other != t.path:
            t.problem(
                "publish_to",
                f'"{credential.publish_to}" is also the publish_to of {other}; '
                "expected each credential to publish to its own path",
            )
        result.append(credential)
    return result


def _credential(
    t: Table,
    providers: list[str] | None,
    state_prefix: str,
    rotators: RotatorIndex,
    sink_paths: dict[Path, str],
) -> CredentialConfig | None:
    """One `[[credentials]]` entry; which keys it takes depends on its `kind` (with no valid
    kind, every key is read as optional so that only real problems are reported)."""
    provider = t.require("provider", NAME)
    if provider is not None and providers is not None and provider not in providers:
        known = ", ".join(f'"{p}"' for p in providers) or "none (add a [[providers]] entry)"
        t.problem("provider", f'no provider is named "{provider}"; expected one of: {known}')
    kind = t.require("kind", _KIND)
    client_id: SecretRef | None = None
    client_secret: SecretRef | None = None
    scope: str | None = None
    refresh: RefreshPolicy | None = None
    refresh_token: SecretRef | None = None
    if kind == "api_key":
        for key in ("client_id", "client_secret", "scope", "refresh", "refresh_token"):
            t.forbid(key, _NOT_FOR_API_KEY)
    else:
        need = t.require if kind == "oauth_client" else t.optional
        client_id = need("client_id", REFERENCE_OR_INLINE)
        client_secret = need("client_secret", _CLIENT_SECRET)
        scope = t.optional("scope", text('space-separated scopes, e.g. "read write"'))
        refresh_token = t.optional("refresh_token", _REFRESH_TOKEN)
    publish_to = t.require("publish_to", _KV_PATH)
    if publish_to is not None:
        overlap = state_prefix_overlap(publish_to, state_prefix)
        if overlap is not None:
            t.problem("publish_to", overlap)
    probe = (t.require if kind == "api_key" else t.optional)("probe", HTTP_PATH)
    if kind != "api_key":
        refresh = _refresh(t.table("refresh", "a table ([credentials.refresh])"))
    backoff = _backoff(t.table("backoff", "a table ([credentials.backoff])"))
    rotation = _credential_rotation(t, kind, rotators)
    initial_key: SecretRef | None = None
    initial_key_id: str | None = None
    if kind == "oauth_client":
        t.forbid("initial_key", _NOT_FOR_OAUTH)
        t.forbid("initial_key_id", _NOT_FOR_OAUTH)
    else:
        initial_key = t.optional("initial_key", _INITIAL_KEY)
        initial_key_id = t.optional("initial_key_id", _INITIAL_KEY_ID)
        if initial_key_id is not None and initial_key is None and "initial_key" not in t.data:
            t.problem(
                "initial_key_id",
                "is set without initial_key; expected initial_key (a reference to the key "
                "whose id this is) as well",
            )
    sinks = load_sinks(t, sink_paths)
    t.finish()
    if t.name is None or provider is None or kind is None or publish_to is None:
        return None
    if kind == "oauth_client" and (client_id is None or client_secret is None):
        return None
    if kind == "api_key" and (probe is None or rotation is None):
        return None
    return CredentialConfig(
        name=t.name,
        provider=provider,
        kind=kind,
        client_id=client_id,
        client_secret=client_secret,
        publish_to=publish_to,
        scope=scope,
        probe=probe,
        refresh=refresh or _REFRESH,
        backoff=backoff or _BACKOFF,
        rotation=rotation,
        initial_key=initial_key,
        initial_key_id=initial_key_id,
        refresh_token=refresh_token,
        sinks=sinks,
    )


def state_prefix_overlap(publish_to: str, state_prefix: str) -> str | None:
    """Why apps reading `publish_to` could read keyturn's private records under
    `state_prefix` (None if they could not). Paths are compared by "/" segments:
    "keyturn/statefoo" is not under "keyturn/state"."""
    published = publish_to.split("/")
    private = state_prefix.split("/")
    if published == private:
        where = "is keyturn.state_prefix"
    elif published[: len(private)] == private:
        where = f'is under keyturn.state_prefix "{state_prefix}"'
    elif private[: len(published)] == published:
        where = f'is above keyturn.state_prefix "{state_prefix}" (a prefix of it)'
    else:
        return None
    return (
        f'"{publish_to}" {where}, keyturn\'s private records, which no app may read; '
        "expected a path outside keyturn.state_prefix and not a prefix of it (paths compare "
        'by "/" segments)'
    )


def _credential_rotation(
    t: Table, kind: CredentialKind | None, rotators: RotatorIndex
) -> RotationPolicy | None:
    """`rotation`: required for api_key, optional for oauth_client (its client secret)."""
    expected = 'a table, e.g. rotation = { max_age = "30d", rotator = "acme-keys" }'
    table = t.table("rotation", expected)
    if table is None:
        return None
    if not t.present("rotation"):
        if kind == "api_key":
            t.problem("rotation", f"missing; expected {expected}")
        return None
    return load_rotation(table, kind, rotators)


def _refresh(t: Table | None) -> RefreshPolicy | None:
    if t is None:
        return None
    d = _REFRESH
    at = t.get("at", number("a fraction between 0 and 1 (exclusive)", lambda x: 0 < x < 1), d.at)
    jitter = t.get("jitter", number("a fraction >= 0 and < 0.5", lambda x: 0 <= x < 0.5), d.jitter)
    margin = t.get("margin", _MARGIN, d.margin)
    min_interval = t.get("min_interval", _LIFETIME, d.min_interval)
    if at - jitter <= 0 or at + jitter >= 1:
        t.problem(
            "jitter",
            f"at ± jitter spans {at - jitter:.2f} to {at + jitter:.2f} of the lifetime; "
            "expected both ends strictly between 0 and 1",
        )
    t.finish()
    return RefreshPolicy(at=at, jitter=jitter, margin=margin, min_interval=min_interval)


def _backoff(t: Table | None) -> BackoffPolicy | None:
    if t is None:
        return None
    d = _BACKOFF
    initial = t.get("initial", _BACKOFF_WAIT, d.initial)
    maximum = t.get("max", _BACKOFF_WAIT, d.maximum)
    multiplier = t.get("multiplier", _MULTIPLIER, d.multiplier)
    if maximum < initial:
        t.problem("max", f"is shorter than initial; expected max >= initial ({initial:g}s)")
    t.finish()
    return BackoffPolicy(initial=initial, maximum=maximum, multiplier=multiplier)
