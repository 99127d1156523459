"""The configuration's schema: one frozen pydantic dataclass per TOML table.

These models are the single source of truth for the file's keys (a field's name, or its
`alias`), their types and ranges (`Annotated[T, <a check from keyturn.config.fields>]`), their
defaults and their `Literal`s. `keyturn.config.load` validates the file against `Config`:
unknown keys are refused (`extra="forbid"`); `[vault].auth`, `[[rotators]]` and `[[alerts]]`
are discriminated unions on `method` / `type`, each variant with its own keys. Where the
file's shape differs from the object the code reads, `Via(<table>)` validates the table and
`build()`s the object: `[metrics]` (MetricsSettings), `refresh`/`backoff` (keyturn.policy's
policies), `create`/`revoke` (HttpCall), an alert hook (AlertHookConfig). Durations are float
seconds; secret inputs are `SecretRef`s, never values.

    Config ── keyturn: DaemonSettings, vault: VaultSettings (auth: TokenAuth | TokenFileAuth |
              AppRoleAuth | KubernetesAuth), metrics: MetricsSettings,
              providers: {name: ProviderConfig}, rotators: {name: HttpRotatorConfig (create,
              revoke: HttpCall; find: HttpFind) | ExecRotatorConfig | ManualRotatorConfig},
              credentials: (CredentialConfig (refresh, backoff, rotation: RotationPolicy,
              sinks: (SinkConfig (on_publish: HookConfig), ...)), ...),
              alerts: (AlertHookConfig, ...), usage: UsageSettings | None
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import re
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal, Self, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic.fields import FieldInfo
from pydantic_core import (
    CoreSchema,
    ErrorDetails,
    InitErrorDetails,
    PydanticKnownError,
    core_schema,
)

from keyturn.alerts.model import DETECTORS
from keyturn.config.fields import (
    BOOLEAN,
    DAY,
    ENTRY_NAME,
    FS_PATH,
    HOUR,
    HTTP_PATH,
    LISTEN,
    LOOPBACK_HOSTS,
    MAX_TIMEOUT,
    MODE,
    NAME,
    ONE_OF,
    OUTSIDE_STATE_PREFIX,
    REFERENCE_OR_INLINE,
    RUNBOOK,
    SINK_PATH,
    STATUSES,
    URL,
    URLS,
    Check,
    Invalid,
    LoadContext,
    Names,
    body_template,
    command,
    context_of,
    describe,
    duration,
    integer,
    is_loopback,
    json_pointer,
    kv_path,
    number,
    path_template,
    problem,
    refers_to,
    secret_reference,
    text,
    url_or_reference,
)
from keyturn.config.templates import REQUEST_PLACEHOLDERS, REVOKE_PLACEHOLDERS, placeholders
from keyturn.config.webconfig import WebConfig, load_web_config, read_web_config
from keyturn.policy import BackoffPolicy, RefreshPolicy
from keyturn.references import SecretRef

LogLevel = Literal["debug", "info", "warning", "error"]
ExternalChangeResponse = Literal["republish", "alert"]
TokenRequest = Literal["json", "form"]
ClientAuth = Literal["body", "basic"]
CredentialKind = Literal["oauth_client", "api_key"]
CREDENTIAL_KINDS = frozenset(get_args(CredentialKind))
RotatorType = Literal["http", "exec", "manual"]
HttpMethod = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
AuthMethod = Literal["token", "token_file", "approle", "kubernetes"]
AlertHookType = Literal["webhook", "slack", "pagerduty", "alertmanager"]
AlertSeverity = Literal["info", "warning", "critical"]
SinkFormat = Literal["raw", "json", "env"]

KUBERNETES_JWT_PATH = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
OK_STATUS = (200, 201, 202, 204)
# How long after a new key is published its predecessor lives at most while keyturn waits for
# consumers to move, unless `max_grace` says otherwise.
DEFAULT_MAX_GRACE = DAY

# Key types of several tables. Ranges (docs/configuration.md lists them): time-outs up to an
# hour, other durations up to a year unless said otherwise, counts one process can use.
TIMEOUT = duration(positive=True, maximum=MAX_TIMEOUT)
MARGIN = duration()
LIFETIME = duration(positive=True)
CONCURRENCY = integer(1, 10_000)
KV_PATH = kv_path(
    'a path relative to the mount, e.g. "apps/reporting/acme": segments of letters, digits '
    'and _ . @ + = - joined by single "/", no "." or ".."'
)
MOUNT = kv_path('a mount path, e.g. "secret" (no leading or trailing "/")')
PROVIDER = refers_to("providers", "provider")
RATE = "greater than zero, at most 10000"
FRACTION = number("a fraction between 0 and 1 (exclusive)", lambda x: 0 < x < 1)
JITTER = number("a fraction >= 0 and < 0.5", lambda x: 0 <= x < 0.5)
WAIT = duration(positive=True, maximum=DAY)
MULTIPLIER = number("a number between 1 and 10", lambda x: 1 <= x <= 10)
AFTER_EXPIRY = duration(minimum=1.0, maximum=HOUR)
# (a field called `command` hides the function in its class)
EXEC_COMMAND = command('["/usr/local/bin/rotate-key", "--vendor", "acme"]')
HOOK_COMMAND = command('["/usr/bin/systemctl", "try-restart", "reporting"]', from_env=False)

TABLE = ConfigDict(extra="forbid")
Where = str | tuple[str | int, ...]  # a key of a table, or a key path below it


def _problem(where: Where, message: str) -> InitErrorDetails:
    loc = (where,) if isinstance(where, str) else where
    return InitErrorDetails(type=problem(message), loc=loc, input=None)


def report(found: list[tuple[Where, str]]) -> ValidationError:
    """Problems in one table, as pydantic's error (one line each)."""
    return ValidationError.from_exception_data("keyturn", [_problem(*p) for p in found])


def fields_of(model: type) -> dict[str, FieldInfo]:
    """A schema model's fields (pydantic's), in order."""
    fields: dict[str, FieldInfo] = model.__pydantic_fields__  # type: ignore[attr-defined]
    return fields


def described(text: str) -> Any:
    """What a table key expects, as problem lines say it ("got 5; expected <text>")."""
    return Field(description=text)


@dataclass(frozen=True, slots=True, config=TABLE)
class Table:
    """A TOML table. Its keys' types check what a file says, and `problems` (rules across
    keys, run once each key is valid) what a whole table says; neither judges the objects the
    code makes itself (no `LoadContext`). `NAMED_IN_PROBLEMS`: an unknown key is reported
    "for <the table's key>"."""

    NAMED_IN_PROBLEMS: ClassVar[bool] = False

    @model_validator(mode="after")
    def _across_keys(self, info: ValidationInfo) -> Self:
        context = context_of(info)
        found = [] if context is None else list(self.problems(context))
        if found:
            raise report(found)
        return self

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        return iter(())


class Via:
    """The file holds `table` (a model with `build()`) where the code reads another object
    (the annotated type); an object of that type made by the code is taken as it is."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def validate(value: Any, table: core_schema.ValidatorFunctionWrapHandler) -> Any:
            return value if isinstance(value, source) else table(value).build()

        schema = handler.generate_schema(self.table)
        return core_schema.no_info_wrap_validator_function(validate, schema)


class Entries:
    """An array of named tables (`[[providers]]`): a read-only mapping by name, or a tuple."""

    def __init__(self, singular: str) -> None:
        self.singular = singular

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        keyed = get_origin(source) is Mapping
        items = core_schema.list_schema(handler.generate_schema(get_args(source)[int(keyed)]))

        def collect(values: list[Any]) -> Any:
            return MappingProxyType({v.name: v for v in values}) if keyed else tuple(values)

        return core_schema.no_info_after_validator_function(collect, items)


def transport(
    key: str, url: str, allow: bool, *, loopback_needs_flag: bool
) -> Iterator[tuple[Where, str]]:
    """https, or http to a loopback host; `allow_insecure_http` is for loopback hosts only."""
    scheme, host = urlsplit(url).scheme, urlsplit(url).hostname or ""
    loopback = is_loopback(host)
    if allow and not loopback:
        yield (
            "allow_insecure_http",
            f'true is accepted only for loopback hosts ({LOOPBACK_HOSTS}), not "{host}"; '
            f"expected false with an https:// {key}",
        )
    elif scheme == "http" and not loopback:
        yield key, f'plain http to "{host}", which is not a loopback host; expected https://'
    elif scheme == "http" and loopback_needs_flag and not allow:
        yield (
            key,
            "plain http; expected https://, or allow_insecure_http = true "
            f"(accepted for loopback hosts only: {LOOPBACK_HOSTS})",
        )


# -- [keyturn], [vault], [metrics] ---------------------------------------------------------


@dataclass(frozen=True, slots=True, config=TABLE)
class DaemonSettings(Table):
    """`[keyturn]`: daemon-wide settings. instance_id: this instance's name in Vault metadata
    and locks. state_prefix: keyturn's private KV prefix, which apps must not read.
    vault_concurrency: threads for (blocking) hvac calls. watch_interval: seconds between
    sweeps of the published paths for changes made outside keyturn (0: none), which
    on_external_change puts right ("republish") or only reports ("alert"). takeover_after:
    the longest takeover: an instance whose heartbeat has not moved for its takeover is gone,
    and the others take its share of the credentials; the instances beat to a shorter one
    when their tokens need it (`keyturn.members`)."""

    instance_id: Annotated[
        str, text("an identifier without spaces, at most 253 characters", re.compile(r"\S{1,253}"))
    ] = dataclasses.field(default_factory=lambda: socket.gethostname() or "keyturn")
    state_prefix: Annotated[str, KV_PATH] = "keyturn/state"
    log_level: Annotated[LogLevel, ONE_OF] = "info"
    max_concurrency: Annotated[int, CONCURRENCY] = 64
    vault_concurrency: Annotated[int, integer(1, 1_000)] = 16
    shutdown_timeout: Annotated[float, TIMEOUT] = 30.0
    watch_interval: Annotated[float, duration(off=True, minimum=1.0, maximum=7 * DAY)] = 300.0
    on_external_change: Annotated[ExternalChangeResponse, ONE_OF] = "republish"
    takeover_after: Annotated[float, duration(minimum=3.0, maximum=HOUR)] = 30.0


@dataclass(frozen=True, slots=True, config=TABLE)
class TokenAuth(Table):
    """`method = "token"`: a Vault token from a reference."""

    method: Literal["token"] = dataclasses.field(default="token", kw_only=True)
    token: Annotated[SecretRef, secret_reference('token = "env:VAULT_TOKEN"')]


@dataclass(frozen=True, slots=True, config=TABLE)
class TokenFileAuth(Table):
    """`method = "token_file"`: a token file kept current by someone else (e.g. Vault Agent)."""

    method: Literal["token_file"] = dataclasses.field(default="token_file", kw_only=True)
    path: Annotated[Path, FS_PATH]


@dataclass(frozen=True, slots=True, config=TABLE)
class AppRoleAuth(Table):
    """`method = "approle"`: AppRole login at `auth/<mount>/login`."""

    method: Literal["approle"] = dataclasses.field(default="approle", kw_only=True)
    role_id: Annotated[SecretRef, secret_reference('role_id = "file:/etc/keyturn/role_id"')]
    secret_id: Annotated[SecretRef, secret_reference('secret_id = "file:/etc/keyturn/secret_id"')]
    mount: Annotated[str, MOUNT] = "approle"


@dataclass(frozen=True, slots=True, config=TABLE)
class KubernetesAuth(Table):
    """`method = "kubernetes"`: log in with the pod's service-account JWT."""

    method: Literal["kubernetes"] = dataclasses.field(default="kubernetes", kw_only=True)
    role: Annotated[str, text('the Vault role to log in as, e.g. "keyturn"')]
    jwt_path: Annotated[Path, FS_PATH] = KUBERNETES_JWT_PATH
    mount: Annotated[str, MOUNT] = "kubernetes"


VaultAuth = TokenAuth | TokenFileAuth | AppRoleAuth | KubernetesAuth


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class VaultSettings(Table):
    """`[vault]`: where keyturn stores and publishes, and how it logs in. address: without a
    trailing slash. renew_margin: keyturn renews its own token at 2/3 of its TTL and no later
    than this before it expires. nodes: more addresses of the cluster, tried in turn."""

    address: Annotated[str, URL]
    allow_insecure_http: Annotated[bool, BOOLEAN] = False
    auth: Annotated[
        VaultAuth,
        Field(discriminator="method"),
        described('a table, e.g. auth = { method = "token", token = "env:VAULT_TOKEN" }'),
    ]
    mount: Annotated[str, MOUNT] = "secret"
    namespace: Annotated[str | None, text('a Vault namespace, e.g. "admin/team"')] = None
    ca_cert: Annotated[Path | None, FS_PATH] = None
    timeout: Annotated[float, TIMEOUT] = 10.0
    renew_margin: Annotated[float, MARGIN] = 300.0
    nodes: Annotated[tuple[str, ...], URLS] = ()

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        allow = self.allow_insecure_http
        yield from transport("address", self.address, allow, loopback_needs_flag=False)
        for node in self.nodes:
            yield from transport("nodes", node, allow, loopback_needs_flag=False)


@dataclasses.dataclass(frozen=True, slots=True)
class MetricsSettings:
    """Where /metrics, /healthz, /readyz and /usage listen. `host` has no brackets.
    web_config: the exporter toolkit's web configuration (TLS, client certificates, basic
    auth), read; None: plain HTTP without authentication. open_paths: the paths served
    without basic auth (of OPEN_PATHS)."""

    host: str = "127.0.0.1"
    port: int = 9797
    web_config: WebConfig | None = None
    open_paths: frozenset[str] = frozenset()

    @property
    def listen(self) -> str:
        """`host:port`, with an IPv6 host in brackets."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


# The paths `[metrics] open_paths` may open: the probes', never /metrics or /usage.
OPEN_PATHS = ("/healthz", "/readyz")
_OPEN_PATHS_EXPECTED = 'an array of "/healthz" and "/readyz", e.g. ["/healthz"]'


def _open_paths(value: object, from_env: bool) -> tuple[str, ...]:
    if from_env and isinstance(value, str):  # KEYTURN_METRICS_OPEN_PATHS="/healthz,/readyz"
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list):
        raise Invalid(f"got {describe(value)}; expected {_OPEN_PATHS_EXPECTED}")
    for item in value:
        if item not in OPEN_PATHS:
            raise Invalid(f"got {describe(item)} in the array; expected {_OPEN_PATHS_EXPECTED}")
    return tuple(dict.fromkeys(value))


@dataclass(frozen=True, slots=True, config=TABLE)
class MetricsTable(Table):
    """`[metrics]`: `listen` is "host:port" (absent: MetricsSettings' defaults); `web_config`
    the exporter toolkit's web configuration file (keyturn.config.webconfig), read at load."""

    listen: Annotated[tuple[str, int] | None, LISTEN] = None
    web_config: Annotated[Path | None, FS_PATH] = None
    open_paths: Annotated[tuple[str, ...], Check(_OPEN_PATHS_EXPECTED, _open_paths)] = ()

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        if self.web_config is not None:
            _, found = read_web_config(self.web_config)
            for line in found:
                yield "web_config", f"{self.web_config}: {line}"

    def build(self) -> MetricsSettings:
        web = None if self.web_config is None else load_web_config(self.web_config)
        default = MetricsSettings()
        host, port = self.listen or (default.host, default.port)
        return MetricsSettings(host, port, web, frozenset(self.open_paths))


# -- [[providers]] and [[rotators]] ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class ProviderConfig(Table):
    """`[[providers]]`: one OAuth 2.0 authorization server / API. base_url: without a trailing
    slash. rate_limit: requests per second for keyturn's own calls (None: unlimited).
    default_lifetime: seconds, when a token response has no expires_in."""

    name: Annotated[str, ENTRY_NAME]
    base_url: Annotated[str, URL]
    allow_insecure_http: Annotated[bool, BOOLEAN] = False
    token_path: Annotated[str, HTTP_PATH] = "/oauth/token"
    revoke_path: Annotated[str | None, HTTP_PATH] = None
    token_request: Annotated[TokenRequest, ONE_OF] = "json"
    client_auth: Annotated[ClientAuth, ONE_OF] = "body"
    timeout: Annotated[float, TIMEOUT] = 10.0
    max_connections: Annotated[int, CONCURRENCY] = 100
    rate_limit: Annotated[
        float | None, number(f"a number of requests per second {RATE}", lambda x: 0 < x <= 1e4)
    ] = None
    default_lifetime: Annotated[float, LIFETIME] = 3600.0
    max_response_bytes: Annotated[int, integer(1024, 64 << 20, " (1 KiB to 64 MiB)")] = 65536

    @property
    def token_url(self) -> str:
        return self.base_url + self.token_path

    @property
    def revoke_url(self) -> str | None:
        return None if self.revoke_path is None else self.base_url + self.revoke_path

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        allow = self.allow_insecure_http
        yield from transport("base_url", self.base_url, allow, loopback_needs_flag=True)


@dataclasses.dataclass(frozen=True, slots=True)
class HttpCall:
    """One call of an `http` rotator to the provider's key API. path: relative to the
    provider's base_url, with `{placeholders}`; body: a JSON template (placeholders filled
    JSON-string-escaped); value / id: JSON pointers to the new key's value and id; ok_status:
    the statuses of success (for revoke, 404 and 410 too)."""

    path: str
    method: HttpMethod = "POST"
    body: str | None = None
    value: str | None = None
    id: str | None = None
    ok_status: tuple[int, ...] = OK_STATUS


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class CreateTable(Table):
    """`create`: the call that makes a key, and where the key's value and id are."""

    NAMED_IN_PROBLEMS = True
    method: Annotated[HttpMethod, ONE_OF] = "POST"
    path: Annotated[str, path_template(REQUEST_PLACEHOLDERS)]
    body: Annotated[str | None, body_template(REQUEST_PLACEHOLDERS)] = None
    value: Annotated[str, json_pointer('to the new key\'s value, e.g. "/key"')]
    id: Annotated[str, json_pointer('to the new key\'s id, e.g. "/key_id" (revoke needs it)')]
    ok_status: Annotated[tuple[int, ...], STATUSES] = OK_STATUS

    def build(self) -> HttpCall:
        return HttpCall(self.path, self.method, self.body, self.value, self.id, self.ok_status)


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class RevokeTable(Table):
    """`revoke`: the call that revokes the key `{key_id}`."""

    NAMED_IN_PROBLEMS = True
    method: Annotated[HttpMethod, ONE_OF] = "DELETE"
    path: Annotated[str, path_template(REVOKE_PLACEHOLDERS)]
    body: Annotated[str | None, body_template(REVOKE_PLACEHOLDERS)] = None
    ok_status: Annotated[tuple[int, ...], STATUSES] = OK_STATUS

    def build(self) -> HttpCall:
        return HttpCall(self.path, self.method, self.body, ok_status=self.ok_status)

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        if "key_id" not in placeholders(self.path) + placeholders(self.body or ""):
            message = (
                "names no key; expected {key_id} in revoke's path or body (the id of the key "
                "to revoke)"
            )
            yield "path", message


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class HttpFind(Table):
    """`find`: how an `http` rotator lists keys: `items` points to the array in the answer,
    `name` and `id` into one item (JSON pointers)."""

    NAMED_IN_PROBLEMS = True
    method: Annotated[HttpMethod, ONE_OF] = "GET"
    path: Annotated[str, path_template(REQUEST_PLACEHOLDERS)]
    items: Annotated[str, json_pointer('to the array of keys, e.g. "/api_keys"', allow_root=True)]
    name: Annotated[str, json_pointer('to a key\'s name inside one item, e.g. "/name"')]
    id: Annotated[str, json_pointer('to a key\'s id inside one item, e.g. "/key_id"')]


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class HttpRotatorConfig(Table):
    """`type = "http"`: a provider's key-management API, through the `[[providers]]` entry
    `provider`. auth: sent as `Authorization: <auth_scheme> <value>` (None: no header)."""

    name: Annotated[str, ENTRY_NAME]
    type: Literal["http"] = "http"
    provider: Annotated[str, NAME, PROVIDER]
    auth: Annotated[SecretRef | None, secret_reference('auth = "env:SANDBOX_ADMIN_TOKEN"')] = None
    auth_scheme: Annotated[
        str,
        text(
            'an HTTP auth scheme, e.g. "Bearer" or "Token"',
            re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}"),
        ),
    ] = "Bearer"
    create: Annotated[
        HttpCall,
        Via(CreateTable),
        described(
            'a table, e.g. create = { path = "/keys", body = \'{"name": "{key_name}"}\', '
            'value = "/key", id = "/key_id" }'
        ),
    ]
    revoke: Annotated[
        HttpCall, Via(RevokeTable), described('a table, e.g. revoke = { path = "/keys/{key_id}" }')
    ]
    find: Annotated[
        HttpFind | None, described('a table, e.g. find = { path = "/keys", items = "/keys", ... }')
    ] = None


@dataclass(frozen=True, slots=True, config=TABLE)
class ExecRotatorConfig(Table):
    """`type = "exec"`: an operator's command (argv; not run at load), parameters on stdin."""

    name: Annotated[str, ENTRY_NAME]
    type: Literal["exec"] = dataclasses.field(default="exec", kw_only=True)
    command: Annotated[tuple[str, ...], EXEC_COMMAND]
    timeout: Annotated[float, TIMEOUT] = 30.0


@dataclass(frozen=True, slots=True, config=TABLE)
class ManualRotatorConfig(Table):
    """`type = "manual"`: a person creates the key; `keyturn import-key` hands it over."""

    name: Annotated[str, ENTRY_NAME]
    type: Literal["manual"] = dataclasses.field(default="manual", kw_only=True)


RotatorConfig = HttpRotatorConfig | ExecRotatorConfig | ManualRotatorConfig


# -- [usage] --------------------------------------------------------------------------------

UsageSource = Literal["file", "socket"]
DEFAULT_POSITION_FILE = Path("/var/lib/keyturn/audit-position.json")
AUDIT_NETWORKS = ("127.0.0.0/8", "::1/128")
MAX_CONSUMER_NAME = 128  # a consumer's name is at most this long (keyturn.usage.audit)
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


def _listing(value: object, from_env: bool, expected: str) -> list[object]:
    """A non-empty array, or in the environment a JSON array or "a,b"."""
    if from_env and isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                value = json.loads(stripped)
            except ValueError:
                raise Invalid(f"got {describe(value)}; expected {expected}") from None
        else:
            value = [part.strip() for part in stripped.split(",") if part.strip()]
    if not isinstance(value, list) or not value:
        raise Invalid(f"got {describe(value)}; expected {expected}")
    return value


_CONSUMERS_EXPECTED = (
    "a non-empty array of consumer names, fnmatch patterns or entity ids, e.g. "
    '["approle/reporting", "kubernetes-prod-*"] (each at most 128 characters; in the '
    'environment a JSON array or "a,b")'
)


def _consumers(value: object, from_env: bool) -> tuple[str, ...]:
    names = []
    for item in _listing(value, from_env, _CONSUMERS_EXPECTED):
        if (
            not isinstance(item, str)
            or not item.strip()
            or len(item) > MAX_CONSUMER_NAME
            or _CONTROL_CHARACTER.search(item)
        ):
            raise Invalid(f"got {describe(item)} in the array; expected {_CONSUMERS_EXPECTED}")
        names.append(item)
    return tuple(dict.fromkeys(names))


CONSUMERS = Check(_CONSUMERS_EXPECTED, _consumers)

_NETWORKS_EXPECTED = (
    'a non-empty array of networks, e.g. ["127.0.0.0/8", "10.0.4.0/24", "::1/128"] (in the '
    'environment a JSON array or "a,b")'
)


def _networks(value: object, from_env: bool) -> tuple[str, ...]:
    networks = []
    for item in _listing(value, from_env, _NETWORKS_EXPECTED):
        try:
            network = ipaddress.ip_network(item, strict=False) if isinstance(item, str) else None
        except ValueError:
            network = None
        if network is None:
            raise Invalid(f"got {describe(item)} in the array; expected {_NETWORKS_EXPECTED}")
        networks.append(str(network))
    return tuple(dict.fromkeys(networks))


NETWORKS = Check(_NETWORKS_EXPECTED, _networks)

_AUDIT_ADDRESS_EXPECTED = (
    'where keyturn listens for Vault\'s socket audit device: "host:port" (e.g. '
    '"127.0.0.1:9090" or "[::1]:9090") or "unix:/absolute/path"'
)


def _audit_address(value: object, from_env: bool) -> str:
    if isinstance(value, str) and value.startswith("unix:"):
        path = value[len("unix:") :]
        if not path.startswith("/") or _CONTROL_CHARACTER.search(path) or len(path) > 107:
            raise Invalid(f"got {describe(value)}; expected {_AUDIT_ADDRESS_EXPECTED}")
        return value
    try:
        LISTEN.value(value)
    except Invalid:
        raise Invalid(f"got {describe(value)}; expected {_AUDIT_ADDRESS_EXPECTED}") from None
    assert isinstance(value, str)
    return value


AUDIT_ADDRESS = Check(_AUDIT_ADDRESS_EXPECTED, _audit_address)
_ONLY_FOR = {"file": ("file", "prefix"), "socket": ("socket",)}


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class UsageSettings(Table):
    """`[usage]`: who reads the published credentials, from Vault's audit log (keyturn.usage,
    docs/usage.md). source: "file" (keyturn tails `file`, Vault's file audit device, and
    remembers where it stopped in `position_file`) or "socket" (keyturn listens on `socket`
    for Vault's socket audit device, connecting from `allowed_networks`). prefix: the device's
    `prefix` option. The detectors' rules (keyturn.usage.DetectorSettings): learning,
    rate_window, rate_factor, rate_floor, repeat. max_consumers: identities kept by name per
    credential (the rest count as `other`); consumer_labels: how many of those have a
    `consumer` label of their own in metrics."""

    source: Annotated[UsageSource, ONE_OF]
    file: Annotated[Path | None, FS_PATH] = None
    prefix: Annotated[
        str | None, text('the audit device\'s prefix option, e.g. "vault-audit:"')
    ] = None
    position_file: Annotated[Path, FS_PATH] = DEFAULT_POSITION_FILE
    socket: Annotated[str | None, AUDIT_ADDRESS] = None
    allowed_networks: Annotated[tuple[str, ...], NETWORKS] = AUDIT_NETWORKS
    learning: Annotated[float, MARGIN] = DAY
    rate_window: Annotated[float, duration(minimum=1.0, maximum=DAY)] = 300.0
    rate_factor: Annotated[
        float, number("a number between 1 and 1000", lambda x: 1 <= x <= 1000)
    ] = 10.0
    rate_floor: Annotated[int, integer(1, 1_000_000)] = 100
    repeat: Annotated[float, duration(positive=True)] = HOUR
    max_consumers: Annotated[int, integer(1, 10_000)] = 100
    consumer_labels: Annotated[int, integer(0, 1_000)] = 20

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        needed = "file" if self.source == "file" else "socket"
        if getattr(self, needed) is None:
            what = "the audit file's path" if needed == "file" else "the address to listen on"
            yield needed, f'missing for source = "{self.source}"; expected {what}'
        for other, keys in _ONLY_FOR.items():
            for key in keys if other != self.source else ():
                if getattr(self, key) is not None:
                    message = (
                        f'is set for source = "{self.source}"; expected it only with '
                        f'source = "{other}"'
                    )
                    yield key, message
        if self.consumer_labels > self.max_consumers:
            message = (
                f"is more than max_consumers ({self.max_consumers}); expected at most "
                "max_consumers (only consumers kept by name can have a label)"
            )
            yield "consumer_labels", message


# -- [[credentials]] ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class RotationPolicy(Table):
    """`rotation`: a key (or client secret) is used `max_age` seconds, then replaced by the
    `[[rotators]]` entry `rotator`; the old one stays valid `grace` seconds after the new one
    is published. verify_attempts: failed verifications of one new key before another.
    wait_for_consumers (api_key, with `[usage]`): after `grace`, the old key is revoked only
    once no consumer that read it within `consumer_window` still reads it, and at the latest
    `max_grace` after the new one was published (None: `DEFAULT_MAX_GRACE`, at least
    `grace`; see `longest_grace`)."""

    # A key may live up to ten years; the old one stays valid for at most a year after.
    max_age: Annotated[float, duration(minimum=1.0, maximum=3650 * DAY)]
    grace: Annotated[float, MARGIN] = 3600.0
    rotator: Annotated[str, NAME, refers_to("rotators", "rotator")]
    verify_attempts: Annotated[int, integer(1, 100)] = 5
    wait_for_consumers: Annotated[bool, BOOLEAN] = False
    consumer_window: Annotated[float, duration(positive=True)] = DAY
    max_grace: Annotated[float | None, MARGIN] = None

    def longest_grace(self) -> float:
        """How long after the new key is published the old one is revoked at the latest when
        waiting for consumers: `max_grace`, or by default a day (never less than `grace`)."""
        return self.max_grace if self.max_grace is not None else max(self.grace, DEFAULT_MAX_GRACE)

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        if self.grace >= self.max_age:
            message = (
                f"is not shorter than max_age ({self.max_age:g}s); expected a grace shorter "
                "than max_age, so that at most two keys are live at once"
            )
            yield "grace", message
        if self.max_grace is not None and self.max_grace < self.grace:
            message = (
                f"is shorter than grace ({self.grace:g}s); expected max_grace >= grace (the "
                "old key is never revoked before grace has passed)"
            )
            yield "max_grace", message
        longest = self.longest_grace()
        if self.wait_for_consumers and longest >= self.max_age > self.grace:
            if self.max_grace is None:
                message = (
                    f"waits up to max_grace's default ({longest:g}s), which is not shorter than "
                    f"max_age ({self.max_age:g}s); expected a max_grace shorter than max_age"
                )
                yield "wait_for_consumers", message
            else:
                message = (
                    f"is not shorter than max_age ({self.max_age:g}s); expected a max_grace "
                    "shorter than max_age, so that at most two keys are live at once"
                )
                yield "max_grace", message


def _present(table: Any) -> dict[str, Any]:
    """The keys a table sets; one it leaves out takes the built object's default."""
    values = {f.name: getattr(table, f.name) for f in dataclasses.fields(table)}
    return {name: value for name, value in values.items() if value is not None}


@dataclass(frozen=True, slots=True, config=TABLE)
class RefreshTable(Table):
    """`refresh`: a keyturn.policy.RefreshPolicy."""

    at: Annotated[float | None, FRACTION] = None
    jitter: Annotated[float | None, JITTER] = None
    margin: Annotated[float | None, MARGIN] = None
    min_interval: Annotated[float | None, LIFETIME] = None

    def build(self) -> RefreshPolicy:
        return RefreshPolicy(**_present(self))

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        policy = self.build()
        low, high = policy.at - policy.jitter, policy.at + policy.jitter
        if low <= 0 or high >= 1:
            message = (
                f"at ± jitter spans {low:.2f} to {high:.2f} of the lifetime; "
                "expected both ends strictly between 0 and 1"
            )
            yield "jitter", message


@dataclass(frozen=True, slots=True, config=TABLE)
class BackoffTable(Table):
    """`backoff`: a keyturn.policy.BackoffPolicy (`max` is its `maximum`)."""

    initial: Annotated[float | None, WAIT] = None
    maximum: Annotated[float | None, WAIT] = Field(default=None, alias="max")
    multiplier: Annotated[float | None, MULTIPLIER] = None
    after_expiry: Annotated[float | None, AFTER_EXPIRY] = None

    def build(self) -> BackoffPolicy:
        return BackoffPolicy(**_present(self))

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        policy = self.build()
        if policy.maximum < policy.initial:
            yield "max", f"is shorter than initial; expected max >= initial ({policy.initial:g}s)"


@dataclasses.dataclass(frozen=True)
class Unique:
    """A key whose value no other table of its kind in the file may have."""

    expected: str


@dataclass(frozen=True, slots=True, config=TABLE)
class HookConfig(Table):
    """A sink's `on_publish`: a command (argv, no shell; not run at load) run after each write
    of the sink's file, told what was written as JSON on its stdin."""

    NAMED_IN_PROBLEMS = True
    command: Annotated[tuple[str, ...], HOOK_COMMAND]
    timeout: Annotated[float, TIMEOUT] = 10.0


@dataclass(frozen=True, slots=True, config=TABLE)
class SinkConfig(Table):
    """One of a credential's `sinks`: a file on keyturn's host kept equal to what is published
    (see keyturn.sinks). No name: named by position, and not overridden. format: "raw" (the
    value), "json" (the published fields, `credential`, `version`), "env" (`<env_prefix>
    <FIELD>=value` lines). mode: permission bits (owner-readable, nothing for others)."""

    path: Annotated[Path, SINK_PATH, Unique("each sink to write its own file")]
    format: Annotated[SinkFormat, ONE_OF]
    mode: Annotated[int, MODE] = 0o600
    env_prefix: Annotated[
        str,
        text(
            'a prefix of letters, digits and "_", not starting with a digit (at most 64 '
            'characters), e.g. "REPORTING_"',
            re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}"),
        ),
    ] = "KEYTURN_"
    on_publish: Annotated[
        HookConfig | None,
        described(
            'a table, e.g. on_publish = { command = ["/usr/bin/systemctl", "try-restart", '
            '"app"], timeout = "10s" }'
        ),
    ] = None

    @model_validator(mode="wrap")
    @classmethod
    def _env_prefix_only_for_env(
        cls, data: Any, handler: core_schema.ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        sink = handler(data)
        given = context_of(info) and isinstance(data, dict) and "env_prefix" in data
        if given and sink.format != "env":
            message = f'is set for format "{sink.format}", which has no variables; expected '
            raise report([("env_prefix", message + 'env_prefix only with format = "env"')])
        return sink


@dataclasses.dataclass(frozen=True)
class ForKind:
    """A credential key that only one kind takes (`only`), or that one kind needs."""

    only: CredentialKind | None = None
    required: CredentialKind | None = None


OAUTH = ForKind(only="oauth_client")
_NOT_FOR = {
    "api_key": ", which has no OAuth client and no token to refresh",
    "oauth_client": " (its secret is client_secret)",
}


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class CredentialConfig(Table):
    """`[[credentials]]`: one credential keyturn keeps fresh; its keys depend on its `kind`
    (`ForKind`). "oauth_client": client_id (a reference, or `SecretRef.inline`) and
    client_secret; `rotation` rotates the client secret; `refresh_token` seeds keyturn's
    state once. "api_key": no client_id or client_secret; `probe` and `rotation` are set;
    `initial_key` and `initial_key_id` adopt an existing key. publish_to: the KV path apps
    read. probe: a path on the provider called with each new token or key before it is
    published. sinks: files on keyturn's host kept equal to what is published."""

    name: Annotated[str, ENTRY_NAME]
    provider: Annotated[str, NAME, PROVIDER]
    kind: Annotated[CredentialKind, ONE_OF] = "oauth_client"  # a file must say it
    client_id: Annotated[
        SecretRef | None, REFERENCE_OR_INLINE, ForKind("oauth_client", "oauth_client")
    ] = None
    client_secret: Annotated[
        SecretRef | None,
        secret_reference('client_secret = "vault:secret/keyturn/inputs/<name>#client_secret"'),
        ForKind("oauth_client", "oauth_client"),
    ] = None
    scope: Annotated[str | None, text('space-separated scopes, e.g. "read write"'), OAUTH] = None
    refresh_token: Annotated[
        SecretRef | None,
        secret_reference('refresh_token = "vault:secret/keyturn/inputs/<name>#refresh_token"'),
        OAUTH,
    ] = None
    publish_to: Annotated[
        str, KV_PATH, OUTSIDE_STATE_PREFIX, Unique("each credential to publish to its own path")
    ]
    probe: Annotated[str | None, HTTP_PATH, ForKind(required="api_key")] = None
    refresh: Annotated[
        RefreshPolicy, Via(RefreshTable), OAUTH, described("a table ([credentials.refresh])")
    ] = dataclasses.field(default_factory=RefreshPolicy)
    backoff: Annotated[
        BackoffPolicy, Via(BackoffTable), described("a table ([credentials.backoff])")
    ] = dataclasses.field(default_factory=BackoffPolicy)
    rotation: Annotated[
        RotationPolicy | None,
        ForKind(required="api_key"),
        described('a table, e.g. rotation = { max_age = "30d", rotator = "acme-keys" }'),
    ] = None
    initial_key: Annotated[
        SecretRef | None,
        secret_reference('initial_key = "vault:secret/keyturn/inputs/<name>#api_key"'),
        ForKind(only="api_key"),
    ] = None
    initial_key_id: Annotated[
        str | None, text('the provider\'s id of initial_key, e.g. "key_0123"'), ForKind("api_key")
    ] = None
    sinks: Annotated[
        tuple[SinkConfig, ...],
        described(
            "an array of tables, e.g. [[credentials.sinks]] or sinks = [{ path = "
            '"/run/keyturn/app.env", format = "env" }]'
        ),
    ] = ()
    consumers: Annotated[tuple[str, ...] | None, CONSUMERS] = None

    @model_validator(mode="wrap")
    @classmethod
    def _kind_rules(
        cls, data: Any, handler: core_schema.ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        """A file names the kind; a key of the other kind is refused, and one this kind needs
        is required. Every problem of the entry is reported, in the order of its keys."""
        context = context_of(info)
        if context is None or not isinstance(data, dict):
            return handler(data)
        kind, found, refused = data.get("kind"), list[InitErrorDetails](), set[str]()
        if kind is None:
            found.append(InitErrorDetails(type="missing", loc=("kind",), input=data))
        fields, rules = _kind_rules_of_credentials()
        for key, rule in rules if kind in CREDENTIAL_KINDS else []:
            if rule.only not in (None, kind) and key in data:
                why = f'not allowed for kind "{kind}"{_NOT_FOR[str(kind)]}'
                found.append(_problem(key, f'{why}; expected it only with kind = "{rule.only}"'))
                refused.add(key)
            elif rule.required == kind and key not in data:
                found.append(InitErrorDetails(type="missing", loc=(key,), input=data))
        try:
            credential = handler({k: v for k, v in data.items() if k not in refused})
        except ValidationError as exc:
            found += [_again(e) for e in exc.errors()]
        else:
            found += [_problem(*p) for p in credential.across(context)] if kind else []
        if not found:
            return credential
        # In the order of the keys; those of the other kind together, where that kind's begin.
        order = {key: i for i, key in enumerate(fields)}
        begins = {rule.only: order[key] for key, rule in reversed(rules)}
        order |= {key: begins[rule.only] for key, rule in rules if key in refused}
        found.sort(key=lambda e: order.get(str(e["loc"][0]), len(order)) if e["loc"] else -1)
        raise ValidationError.from_exception_data("keyturn", found)

    def across(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        """Rules across keys (once the kind is known: a default kind judges nothing)."""
        if self.initial_key_id is not None and self.initial_key is None:
            message = (
                "is set without initial_key; expected initial_key (a reference to the key "
                "whose id this is) as well"
            )
            yield "initial_key_id", message
        waits = self.rotation is not None and self.rotation.wait_for_consumers
        if waits and self.kind == "oauth_client":
            message = (
                "is true for an oauth_client, whose client secret is never published, so no "
                "consumer reads it; expected wait_for_consumers only for an api_key"
            )
            yield ("rotation", "wait_for_consumers"), message
        if self.rotation is None or context.rotators is None:
            return
        name = self.rotation.rotator
        rotator_type, needs_client_id = context.rotators.get(name, (None, False))
        if self.kind == "oauth_client" and rotator_type == "manual":
            message = (
                f'"{name}" is a manual rotator, which cannot rotate an oauth_client\'s secret; '
                'expected an "http" or "exec" rotator'
            )
            yield ("rotation", "rotator"), message
        if self.kind == "api_key" and needs_client_id:
            message = (
                f'"{name}" uses {{client_id}}, which an api_key credential does not have; '
                "expected a rotator whose templates do not use {client_id}"
            )
            yield ("rotation", "rotator"), message


@functools.cache
def _kind_rules_of_credentials() -> tuple[dict[str, FieldInfo], list[tuple[str, ForKind]]]:
    """A credential's fields and the `ForKind` rule of each key that has one (made once:
    `_kind_rules` runs for every credential)."""
    # (not `cls`: with slots=True, that is the class before dataclass() replaced it)
    fields = fields_of(CredentialConfig)
    rules = [(k, m) for k, i in fields.items() for m in i.metadata if isinstance(m, ForKind)]
    return fields, rules


def _again(error: ErrorDetails) -> InitErrorDetails:
    """One of pydantic's errors, to be raised again with others."""
    if error["type"] == "keyturn":
        return _problem(error["loc"], str(error["msg"]))
    again = InitErrorDetails(type=error["type"], loc=error["loc"], input=error["input"])
    if "ctx" in error:
        again["ctx"] = error["ctx"]
    return again


# -- [[alerts]] -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class AlertHookConfig(Table):
    """`[[alerts]]`: one alert hook (see keyturn.alerts). The file's tables are its types below,
    each with its own `url` and without the keys it does not take. url: a reference, or
    `SecretRef.inline(url)` for a plain URL (never for slack); None: PagerDuty's own endpoint.
    routing_key: PagerDuty's integration key. detectors / credentials: the only ones this hook
    takes (None: all). rate_limit: firing alerts per minute. repeat_interval: seconds before a
    still-firing alert is sent again. runbook_base: None for keyturn's own runbook."""

    name: Annotated[str, ENTRY_NAME]
    type: AlertHookType
    url: SecretRef | None = None
    routing_key: SecretRef | None = None
    min_severity: Annotated[AlertSeverity, ONE_OF] = "warning"
    detectors: Annotated[
        tuple[str, ...] | None,
        Names(
            'a non-empty array of detector names, e.g. ["refresh_token_rejected", '
            '"client_rejected"] (in the environment a JSON array or "a,b")',
            "detector",
            known=DETECTORS,
        ),
    ] = None
    credentials: Annotated[
        tuple[str, ...] | None,
        Names(
            'a non-empty array of credential names, e.g. ["reporting"] (in the environment a '
            'JSON array or "a,b")',
            "credential",
            section="credentials",
        ),
    ] = None
    rate_limit: Annotated[
        float, number(f"a number of alerts per minute {RATE}", lambda x: 0 < x <= 1e4)
    ] = 30.0
    repeat_interval: Annotated[float, duration(minimum=60.0)] = 4 * HOUR
    timeout: Annotated[float, TIMEOUT] = 10.0
    max_retries: Annotated[int, integer(0, 100)] = 5
    runbook_base: Annotated[str | None, RUNBOOK] = None


class NotAKey:
    """A key of the base table that a variant does not take (it stays None): a file that sets
    it gets "unknown key", and listings leave it out."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def refuse(value: Any, info: ValidationInfo) -> Any:
            if context_of(info) is not None:
                raise PydanticKnownError("unexpected_keyword_argument")
            return value

        return core_schema.with_info_plain_validator_function(refuse)


NOT_A_KEY = NotAKey()


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class WebhookHookConfig(AlertHookConfig):
    type: Literal["webhook"]
    url: Annotated[SecretRef, url_or_reference("the URL alerts are POSTed to")]
    routing_key: Annotated[None, NOT_A_KEY] = None


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class SlackHookConfig(AlertHookConfig):
    """A Slack webhook URL is a secret (whoever has it can post): a reference only."""

    type: Literal["slack"]
    url: Annotated[
        SecretRef,
        secret_reference(
            'url = "vault:secret/keyturn/inputs/slack#webhook_url" (a Slack webhook URL '
            "is a secret)"
        ),
    ]
    routing_key: Annotated[None, NOT_A_KEY] = None


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class PagerDutyHookConfig(AlertHookConfig):
    type: Literal["pagerduty"]
    url: Annotated[SecretRef | None, url_or_reference("the Events API v2 endpoint")] = None
    routing_key: Annotated[SecretRef, secret_reference('routing_key = "env:PAGERDUTY_ROUTING_KEY"')]


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class AlertmanagerHookConfig(AlertHookConfig):
    type: Literal["alertmanager"]
    url: Annotated[
        SecretRef,
        url_or_reference('Alertmanager\'s base URL, e.g. "https://alertmanager.example.com:9093"'),
    ]
    routing_key: Annotated[None, NOT_A_KEY] = None


AlertHookVariant = (
    WebhookHookConfig | SlackHookConfig | PagerDutyHookConfig | AlertmanagerHookConfig
)


# -- the whole file -------------------------------------------------------------------------


def _no_entries() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True, config=TABLE)
class Config:
    """The whole configuration, validated. `source` is the file it came from."""

    keyturn: Annotated[DaemonSettings, described("a table ([keyturn])")] = dataclasses.field(
        default_factory=DaemonSettings
    )
    vault: Annotated[VaultSettings, described("a table ([vault])")]
    metrics: Annotated[MetricsSettings, Via(MetricsTable), described("a table ([metrics])")] = (
        dataclasses.field(default_factory=MetricsSettings)
    )
    providers: Annotated[
        Mapping[str, ProviderConfig],
        Entries("provider"),
        described("an array of tables ([[providers]])"),
    ] = dataclasses.field(default_factory=_no_entries)
    rotators: Annotated[
        Mapping[str, Annotated[RotatorConfig, Field(discriminator="type")]],
        Entries("rotator"),
        described("an array of tables ([[rotators]])"),
    ] = dataclasses.field(default_factory=_no_entries)
    credentials: Annotated[
        tuple[CredentialConfig, ...],
        Entries("credential"),
        described("an array of tables ([[credentials]])"),
    ] = ()
    alerts: Annotated[
        tuple[Annotated[AlertHookVariant, Field(discriminator="type")], ...],
        Entries("alert hook"),
        described("an array of tables ([[alerts]])"),
    ] = ()
    usage: Annotated[UsageSettings | None, described("a table ([usage])")] = None
    source: Path = dataclasses.field(default=Path(), init=False)

    @model_validator(mode="after")
    def _from_file(self, info: ValidationInfo) -> Self:
        context = context_of(info)
        if context is not None:
            object.__setattr__(self, "source", Path(context.source))
            found = list(self._needs_usage())
            if found:
                raise report(found)
        return self

    def _needs_usage(self) -> Iterator[tuple[Where, str]]:
        """Keys that work from Vault's audit log need a `[usage]` table."""
        if self.usage is not None:
            return
        why = "expected a [usage] table as well (keyturn learns who reads from Vault's audit log)"
        for index, credential in enumerate(self.credentials):
            if credential.consumers is not None:
                yield ("credentials", index, "consumers"), f"is set without [usage]; {why}"
            if credential.rotation is not None and credential.rotation.wait_for_consumers:
                where: Where = ("credentials", index, "rotation", "wait_for_consumers")
                yield where, f"is true without [usage]; {why}"

    def credential(self, name: str) -> CredentialConfig:
        """The credential called `name`; KeyError if there is none."""
        for credential in self.credentials:
            if credential.name == name:
                return credential
        raise KeyError(name)

    def provider_of(self, credential: CredentialConfig) -> ProviderConfig:
        """The provider a credential uses (always present in a validated Config)."""
        return self.providers[credential.provider]

    def rotator_of(self, credential: CredentialConfig) -> RotatorConfig | None:
        """The rotator a credential's rotation uses; None if it has no rotation policy."""
        if credential.rotation is None:
            return None
        return self.rotators[credential.rotation.rotator]
