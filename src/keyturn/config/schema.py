"""The configuration's schema: one frozen dataclass per TOML table (`fields.table`), the single
source of the file's keys, types, ranges and defaults. pydantic validates a file against
`Config` (`load`); an object the code makes is taken as it is. `Via(<table>)` marks a key whose
table `build()`s the object the code reads.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, model_validator

from keyturn.alerts.model import DETECTORS
from keyturn.config.credential_auth import (
    AUTH,
    CredentialAuth,
    auth_problems,
    unknown_credential,
)
from keyturn.config.credentials import (
    KV_PATH,
    LIFETIME,
    MARGIN,
    PROVIDER,
    TIMEOUT,
    AnyCredential,
    CredentialConfig,
)
from keyturn.config.fields import (
    BOOLEAN,
    DAY,
    ENTRY_NAME,
    FS_PATH,
    HOUR,
    HTTP_PATH,
    LISTEN,
    LOOPBACK_HOSTS,
    NAME,
    NOT_A_KEY,
    RUNBOOK,
    STATUSES,
    URL,
    URLS,
    Check,
    Entries,
    Invalid,
    LoadContext,
    Table,
    Via,
    Where,
    array,
    array_of,
    body_template,
    command,
    context_of,
    describe,
    described,
    duration,
    integer,
    is_loopback,
    json_or_split,
    json_pointer,
    kv_path,
    names,
    number,
    path_template,
    report,
    secret_reference,
    split,
    table,
    text,
    url_or_reference,
)
from keyturn.config.templates import REQUEST_PLACEHOLDERS, REVOKE_PLACEHOLDERS, placeholders
from keyturn.config.webconfig import WebConfig, load_web_config, read_web_config
from keyturn.references import SecretRef

RotatorType = Literal["http", "exec", "manual"]
HttpMethod = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
AuthMethod = Literal["token", "token_file", "approle", "kubernetes"]
AlertHookType = Literal["webhook", "slack", "pagerduty", "alertmanager"]

KUBERNETES_JWT_PATH = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
OK_STATUS = (200, 201, 202, 204)

# Key types of several tables. Ranges (docs/configuration.md lists them): time-outs up to an
# hour, other durations up to a year unless said otherwise, counts one process can use.
CONCURRENCY = integer(1, 10_000)
MOUNT = kv_path('a mount path, e.g. "secret" (no leading or trailing "/")')
RATE = "greater than zero, at most 10000"
# (a field called `command` hides the function in its class)
EXEC_COMMAND = command('["/usr/local/bin/rotate-key", "--vendor", "acme"]')


def transport(
    key: str, url: str, allow: bool, *, loopback_needs_flag: bool
) -> Iterator[tuple[Where, str]]:
    """https, or http to a loopback host; `allow_insecure_http` is for loopback hosts only."""
    scheme, host = urlsplit(url).scheme, urlsplit(url).hostname or ""
    loopback = is_loopback(host)
    if allow and not loopback:
        message = f'true is accepted only for loopback hosts ({LOOPBACK_HOSTS}), not "{host}"; '
        yield "allow_insecure_http", message + f"expected false with an https:// {key}"
    elif scheme == "http" and not loopback:
        yield key, f'plain http to "{host}", which is not a loopback host; expected https://'
    elif scheme == "http" and loopback_needs_flag and not allow:
        message = "plain http; expected https://, or allow_insecure_http = true (accepted for "
        yield key, message + f"loopback hosts only: {LOOPBACK_HOSTS})"


# -- [keyturn], [vault], [metrics] ---------------------------------------------------------


@table()
class DaemonSettings(Table):
    """`[keyturn]`: daemon-wide settings (docs/configuration.md; takeover: `keyturn.members`)."""

    instance_id: Annotated[
        str, text("an identifier without spaces, at most 253 characters", r"^\S{1,253}$")
    ] = dataclasses.field(default_factory=lambda: socket.gethostname() or "keyturn")
    state_prefix: Annotated[str, KV_PATH] = "keyturn/state"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    max_concurrency: Annotated[int, CONCURRENCY] = 64
    vault_concurrency: Annotated[int, integer(1, 1_000)] = 16
    shutdown_timeout: Annotated[float, TIMEOUT] = 30.0
    watch_interval: Annotated[float, duration(off=True, minimum=1.0, maximum=7 * DAY)] = 300.0
    on_external_change: Literal["republish", "alert"] = "republish"
    takeover_after: Annotated[float, duration(minimum=3.0, maximum=HOUR)] = 30.0


@table()
class TokenAuth(Table):
    """`method = "token"`: a Vault token from a reference."""

    method: Literal["token"] = dataclasses.field(default="token", kw_only=True)
    token: Annotated[SecretRef, secret_reference('token = "env:VAULT_TOKEN"')]


@table()
class TokenFileAuth(Table):
    """`method = "token_file"`: a token file kept current by someone else (e.g. Vault Agent)."""

    method: Literal["token_file"] = dataclasses.field(default="token_file", kw_only=True)
    path: Annotated[Path, FS_PATH]


@table()
class AppRoleAuth(Table):
    """`method = "approle"`: AppRole login at `auth/<mount>/login`."""

    method: Literal["approle"] = dataclasses.field(default="approle", kw_only=True)
    role_id: Annotated[SecretRef, secret_reference('role_id = "file:/etc/keyturn/role_id"')]
    secret_id: Annotated[SecretRef, secret_reference('secret_id = "file:/etc/keyturn/secret_id"')]
    mount: Annotated[str, MOUNT] = "approle"


@table()
class KubernetesAuth(Table):
    """`method = "kubernetes"`: log in with the pod's service-account JWT."""

    method: Literal["kubernetes"] = dataclasses.field(default="kubernetes", kw_only=True)
    role: Annotated[str, text('the Vault role to log in as, e.g. "keyturn"')]
    jwt_path: Annotated[Path, FS_PATH] = KUBERNETES_JWT_PATH
    mount: Annotated[str, MOUNT] = "kubernetes"


VaultAuth = TokenAuth | TokenFileAuth | AppRoleAuth | KubernetesAuth


@table(kw_only=True)
class VaultSettings(Table):
    """`[vault]`: where keyturn stores and publishes, and how it logs in."""

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
    """Where /metrics, /healthz, /readyz and /usage listen (`host` without brackets), and how
    (web_config None: plain HTTP without authentication)."""

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


def _open_paths(value: object) -> tuple[str, ...]:
    def open_path(item: object) -> object:
        return item if item in OPEN_PATHS else None

    return () if value == [] else array(value, _OPEN_PATHS_EXPECTED, open_path)


@table()
class MetricsTable(Table):
    """`[metrics]`, as the file has it."""

    listen: Annotated[tuple[str, int] | None, LISTEN] = None
    web_config: Annotated[Path | None, FS_PATH] = None
    open_paths: Annotated[tuple[str, ...], Check(_OPEN_PATHS_EXPECTED, _open_paths, split)] = ()

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


@table(kw_only=True)
class ProviderConfig(Table):
    """`[[providers]]`: one OAuth 2.0 authorization server / API (`base_url` without a trailing
    slash)."""

    name: Annotated[str, ENTRY_NAME]
    base_url: Annotated[str, URL]
    allow_insecure_http: Annotated[bool, BOOLEAN] = False
    token_path: Annotated[str, HTTP_PATH] = "/oauth/token"
    revoke_path: Annotated[str | None, HTTP_PATH] = None
    token_request: Literal["json", "form"] = "json"
    client_auth: Literal["body", "basic"] = "body"
    timeout: Annotated[float, TIMEOUT] = 10.0
    max_connections: Annotated[int, CONCURRENCY] = 100
    rate_limit: Annotated[
        float | None, number(f"a number of requests per second {RATE}", gt=0, le=1e4)
    ] = None
    default_lifetime: Annotated[float, LIFETIME] = 3600.0
    refresh_token_max_lifetime: Annotated[float | None, LIFETIME] = None
    max_response_bytes: Annotated[int, integer(1024, 64 << 20, " (1 KiB to 64 MiB)")] = 65536
    # The `aud` of a private_key_jwt client assertion: the token endpoint's URL (RFC 7523 §3)
    # or the issuer identifier (OpenID Connect Core §9 allows either; some servers take one).
    client_assertion_audience: Literal["token_endpoint", "issuer"] = "token_endpoint"
    issuer: Annotated[str | None, URL] = None

    @property
    def token_url(self) -> str:
        return self.base_url + self.token_path

    @property
    def assertion_audience(self) -> str:
        """The `aud` of a client assertion sent to this provider."""
        if self.client_assertion_audience == "issuer" and self.issuer is not None:
            return self.issuer
        return self.token_url

    @property
    def revoke_url(self) -> str | None:
        return None if self.revoke_path is None else self.base_url + self.revoke_path

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        allow = self.allow_insecure_http
        yield from transport("base_url", self.base_url, allow, loopback_needs_flag=True)
        if self.client_assertion_audience == "issuer" and self.issuer is None:
            message = 'is "issuer" but issuer is not set; expected issuer = "<the issuer URL>"'
            yield "client_assertion_audience", message


@dataclasses.dataclass(frozen=True, slots=True)
class HttpCall:
    """One call of an `http` rotator to the provider's key API (`create` or `revoke`)."""

    path: str
    method: HttpMethod = "POST"
    body: str | None = None
    value: str | None = None
    id: str | None = None
    ok_status: tuple[int, ...] = OK_STATUS


@table(kw_only=True)
class CreateTable(Table):
    """`create`: the call that makes a key, and where the key's value and id are."""

    NAMED_IN_PROBLEMS = True
    method: HttpMethod = "POST"
    path: Annotated[str, path_template(REQUEST_PLACEHOLDERS)]
    body: Annotated[str | None, body_template(REQUEST_PLACEHOLDERS)] = None
    value: Annotated[str, json_pointer('to the new key\'s value, e.g. "/key"')]
    id: Annotated[str, json_pointer('to the new key\'s id, e.g. "/key_id" (revoke needs it)')]
    ok_status: Annotated[tuple[int, ...], STATUSES] = OK_STATUS

    def build(self) -> HttpCall:
        return HttpCall(self.path, self.method, self.body, self.value, self.id, self.ok_status)


@table(kw_only=True)
class RevokeTable(Table):
    """`revoke`: the call that revokes the key `{key_id}`."""

    NAMED_IN_PROBLEMS = True
    method: HttpMethod = "DELETE"
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


@table(kw_only=True)
class HttpFind(Table):
    """`find`: how an `http` rotator lists keys: `items` points to the array in the answer,
    `name` and `id` into one item (JSON pointers)."""

    NAMED_IN_PROBLEMS = True
    method: HttpMethod = "GET"
    path: Annotated[str, path_template(REQUEST_PLACEHOLDERS)]
    items: Annotated[str, json_pointer('to the array of keys, e.g. "/api_keys"', allow_root=True)]
    name: Annotated[str, json_pointer('to a key\'s name inside one item, e.g. "/name"')]
    id: Annotated[str, json_pointer('to a key\'s id inside one item, e.g. "/key_id"')]


@table(kw_only=True)
class HttpRotatorConfig(Table):
    """`type = "http"`: a provider's key-management API, through the `[[providers]]` entry
    `provider`. auth: sent as `Authorization: <auth_scheme> <value>` (None: no header); a
    reference, or another credential's published token (`CredentialAuth`, read at each call)."""

    name: Annotated[str, ENTRY_NAME]
    type: Literal["http"] = "http"
    provider: Annotated[str, NAME, PROVIDER]
    auth: Annotated[SecretRef | CredentialAuth | None, AUTH] = None
    auth_scheme: Annotated[
        str,
        text(
            'an HTTP auth scheme, e.g. "Bearer" or "Token"',
            r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$",
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

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        unknown = unknown_credential(self.auth, context.credentials)
        if unknown is not None:
            yield "auth", unknown


@table()
class ExecRotatorConfig(Table):
    """`type = "exec"`: an operator's command (argv; not run at load), parameters on stdin."""

    name: Annotated[str, ENTRY_NAME]
    type: Literal["exec"] = dataclasses.field(default="exec", kw_only=True)
    command: Annotated[tuple[str, ...], EXEC_COMMAND]
    timeout: Annotated[float, TIMEOUT] = 30.0


@table()
class ManualRotatorConfig(Table):
    """`type = "manual"`: a person creates the key; `keyturn import-key` hands it over."""

    name: Annotated[str, ENTRY_NAME]
    type: Literal["manual"] = dataclasses.field(default="manual", kw_only=True)


RotatorConfig = HttpRotatorConfig | ExecRotatorConfig | ManualRotatorConfig


# -- [usage] --------------------------------------------------------------------------------

DEFAULT_POSITION_FILE = Path("/var/lib/keyturn/audit-position.json")
AUDIT_NETWORKS = ("127.0.0.0/8", "::1/128")
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


_NETWORKS_EXPECTED = (
    'a non-empty array of networks, e.g. ["127.0.0.0/8", "10.0.4.0/24", "::1/128"] (in the '
    'environment a JSON array or "a,b")'
)


def _network(item: object) -> str | None:
    try:
        return str(ipaddress.ip_network(item, strict=False)) if isinstance(item, str) else None
    except ValueError:
        return None


NETWORKS = array_of(_NETWORKS_EXPECTED, _network, json_or_split)

_AUDIT_ADDRESS_EXPECTED = (
    'where keyturn listens for Vault\'s socket audit device: "host:port" (e.g. '
    '"127.0.0.1:9090" or "[::1]:9090") or "unix:/absolute/path"'
)


def _audit_address(value: object) -> str:
    if isinstance(value, str) and value.startswith("unix:"):
        path = value[len("unix:") :]
        if path.startswith("/") and not _CONTROL_CHARACTER.search(path) and len(path) <= 107:
            return value
    elif LISTEN.valid(value) is not None:
        return str(value)
    raise Invalid(f"got {describe(value)}; expected {_AUDIT_ADDRESS_EXPECTED}")


AUDIT_ADDRESS = Check(_AUDIT_ADDRESS_EXPECTED, _audit_address)
_ONLY_FOR = {"file": ("file", "prefix"), "socket": ("socket",)}


@table(kw_only=True)
class UsageSettings(Table):
    """`[usage]`: who reads the published credentials, from Vault's audit log (docs/usage.md)."""

    source: Literal["file", "socket"]
    file: Annotated[Path | None, FS_PATH] = None
    prefix: Annotated[
        str | None, text('the audit device\'s prefix option, e.g. "vault-audit:"')
    ] = None
    position_file: Annotated[Path, FS_PATH] = DEFAULT_POSITION_FILE
    socket: Annotated[str | None, AUDIT_ADDRESS] = None
    allowed_networks: Annotated[tuple[str, ...], NETWORKS] = AUDIT_NETWORKS
    learning: Annotated[float, MARGIN] = DAY
    rate_window: Annotated[float, duration(minimum=1.0, maximum=DAY)] = 300.0
    rate_factor: Annotated[float, number("a number between 1 and 1000", ge=1, le=1000)] = 10.0
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


# -- [[alerts]] -----------------------------------------------------------------------------


@table(kw_only=True)
class AlertHookConfig(Table):
    """`[[alerts]]`: one alert hook (keyturn.alerts), as the code reads it; the file's tables
    are its types below, each with its own `url` and without the keys it does not take."""

    name: Annotated[str, ENTRY_NAME]
    type: AlertHookType
    url: SecretRef | None = None
    routing_key: Annotated[SecretRef | None, NOT_A_KEY] = None  # pagerduty's only
    min_severity: Literal["info", "warning", "critical"] = "warning"
    detectors: Annotated[
        tuple[str, ...] | None,
        names(
            'a non-empty array of detector names, e.g. ["refresh_token_rejected", '
            '"client_rejected"] (in the environment a JSON array or "a,b")',
            "detector",
            known=DETECTORS,
        ),
    ] = None
    credentials: Annotated[
        tuple[str, ...] | None,
        names(
            'a non-empty array of credential names, e.g. ["reporting"] (in the environment a '
            'JSON array or "a,b")',
            "credential",
            section="credentials",
        ),
    ] = None
    rate_limit: Annotated[float, number(f"a number of alerts per minute {RATE}", gt=0, le=1e4)] = (
        30.0
    )
    repeat_interval: Annotated[float, duration(minimum=60.0)] = 4 * HOUR
    timeout: Annotated[float, TIMEOUT] = 10.0
    max_retries: Annotated[int, integer(0, 100)] = 5
    runbook_base: Annotated[str | None, RUNBOOK] = None


@table(kw_only=True)
class WebhookHookConfig(AlertHookConfig):
    type: Literal["webhook"]
    url: Annotated[SecretRef, url_or_reference("the URL alerts are POSTed to")]


@table(kw_only=True)
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


@table(kw_only=True)
class PagerDutyHookConfig(AlertHookConfig):
    type: Literal["pagerduty"]
    url: Annotated[SecretRef | None, url_or_reference("the Events API v2 endpoint")] = None
    routing_key: Annotated[SecretRef, secret_reference('routing_key = "env:PAGERDUTY_ROUTING_KEY"')]


@table(kw_only=True)
class AlertmanagerHookConfig(AlertHookConfig):
    type: Literal["alertmanager"]
    url: Annotated[
        SecretRef,
        url_or_reference('Alertmanager\'s base URL, e.g. "https://alertmanager.example.com:9093"'),
    ]


AlertHookVariant = (
    WebhookHookConfig | SlackHookConfig | PagerDutyHookConfig | AlertmanagerHookConfig
)


# -- the whole file -------------------------------------------------------------------------


@table(kw_only=True)
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
    ] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    rotators: Annotated[
        Mapping[str, Annotated[RotatorConfig, Field(discriminator="type")]],
        Entries("rotator"),
        described("an array of tables ([[rotators]])"),
    ] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    credentials: Annotated[
        tuple[AnyCredential, ...],
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
            found = [*self._needs_usage(), *auth_problems(self.credentials, self.rotators)]
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
        if credential.rotation is None or credential.rotation.rotator is None:
            return None
        return self.rotators[credential.rotation.rotator]
