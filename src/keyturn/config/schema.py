"""The validated configuration: frozen, typed value objects.

`keyturn.config.load` builds these from the TOML file and `KEYTURN_…` overrides; nothing
else should construct them from raw input. Durations are float seconds. Secret inputs are
`SecretRef`s (never values): resolve them with `keyturn.references.ReferenceResolver`.

    Config
    ├── keyturn: DaemonSettings
    ├── vault: VaultSettings ── auth: TokenAuth | TokenFileAuth | AppRoleAuth | KubernetesAuth
    ├── metrics: MetricsSettings
    ├── providers: Mapping[name, ProviderConfig]
    ├── rotators: Mapping[name, HttpRotatorConfig | ExecRotatorConfig | ManualRotatorConfig]
    │             (http: create/revoke: HttpCall, find: HttpFind)
    ├── credentials: tuple[CredentialConfig, ...] ── refresh: RefreshPolicy, backoff: BackoffPolicy,
    │                                                rotation: RotationPolicy,
    │                                                sinks: tuple[SinkConfig, ...]
    │                                                (each with on_publish: HookConfig)
    └── alerts: tuple[AlertHookConfig, ...]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from keyturn.policy import BackoffPolicy, RefreshPolicy
from keyturn.references import SecretRef

LogLevel = Literal["debug", "info", "warning", "error"]
ExternalChangeResponse = Literal["republish", "alert"]
TokenRequest = Literal["json", "form"]
ClientAuth = Literal["body", "basic"]
CredentialKind = Literal["oauth_client", "api_key"]
RotatorType = Literal["http", "exec", "manual"]
HttpMethod = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
AuthMethod = Literal["token", "token_file", "approle", "kubernetes"]
AlertHookType = Literal["webhook", "slack", "pagerduty", "alertmanager"]
AlertSeverity = Literal["info", "warning", "critical"]
SinkFormat = Literal["raw", "json", "env"]

KUBERNETES_JWT_PATH = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """`[keyturn]`: daemon-wide settings.

    instance_id: this instance's name in Vault metadata and locks (default: the hostname).
    state_prefix: keyturn's private KV prefix under the mount; apps must not read it.
    max_concurrency: credential jobs running at once.
    vault_concurrency: threads for (blocking) hvac calls.
    shutdown_timeout: seconds to let running jobs finish on SIGTERM.
    watch_interval: seconds between sweeps of published paths for changes made outside
    keyturn (0: no sweeps). on_external_change: "republish" puts keyturn's value back,
    "alert" only reports it.
    """

    instance_id: str
    state_prefix: str = "keyturn/state"
    log_level: LogLevel = "info"
    max_concurrency: int = 64
    vault_concurrency: int = 16
    shutdown_timeout: float = 30.0
    watch_interval: float = 300.0
    on_external_change: ExternalChangeResponse = "republish"


@dataclass(frozen=True, slots=True)
class TokenAuth:
    """`method = "token"`: a Vault token from a reference."""

    token: SecretRef
    method: Literal["token"] = field(default="token", init=False)


@dataclass(frozen=True, slots=True)
class TokenFileAuth:
    """`method = "token_file"`: a token file kept current by someone else (e.g. Vault Agent)."""

    path: Path
    method: Literal["token_file"] = field(default="token_file", init=False)


@dataclass(frozen=True, slots=True)
class AppRoleAuth:
    """`method = "approle"`: AppRole login at `auth/<mount>/login`."""

    role_id: SecretRef
    secret_id: SecretRef
    mount: str = "approle"
    method: Literal["approle"] = field(default="approle", init=False)


@dataclass(frozen=True, slots=True)
class KubernetesAuth:
    """`method = "kubernetes"`: log in with the pod's service-account JWT."""

    role: str
    jwt_path: Path = KUBERNETES_JWT_PATH
    mount: str = "kubernetes"
    method: Literal["kubernetes"] = field(default="kubernetes", init=False)


VaultAuth = TokenAuth | TokenFileAuth | AppRoleAuth | KubernetesAuth


@dataclass(frozen=True, slots=True)
class VaultSettings:
    """`[vault]`: where keyturn stores and publishes, and how it logs in.

    address: URL without a trailing slash (https, or http for a loopback host).
    mount: the KV v2 mount that holds published paths and `state_prefix`.
    renew_margin: renew keyturn's own token at 2/3 of its TTL, and no later than this many
        seconds before it expires.
    nodes: more addresses of the same cluster, tried when `address` cannot be reached.
    """

    address: str
    auth: VaultAuth
    mount: str = "secret"
    namespace: str | None = None
    ca_cert: Path | None = None
    timeout: float = 10.0
    renew_margin: float = 300.0
    allow_insecure_http: bool = False
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """`[metrics]`: where /metrics, /healthz and /readyz listen. `host` has no brackets."""

    host: str = "127.0.0.1"
    port: int = 9797

    @property
    def listen(self) -> str:
        """`host:port`, with an IPv6 host in brackets."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """`[[providers]]`: one OAuth 2.0 authorization server / API.

    base_url: URL without a trailing slash. rate_limit: requests per second for keyturn's own
    calls (None: unlimited). default_lifetime: seconds, when a token response has no
    expires_in. The field names match `keyturn.providers.client.ProviderSettings`.
    """

    name: str
    base_url: str
    allow_insecure_http: bool = False
    token_path: str = "/oauth/token"
    revoke_path: str | None = None
    token_request: TokenRequest = "json"
    client_auth: ClientAuth = "body"
    timeout: float = 10.0
    max_connections: int = 100
    rate_limit: float | None = None
    default_lifetime: float = 3600.0
    max_response_bytes: int = 65536

    @property
    def token_url(self) -> str:
        return self.base_url + self.token_path

    @property
    def revoke_url(self) -> str | None:
        return None if self.revoke_path is None else self.base_url + self.revoke_path


@dataclass(frozen=True, slots=True)
class HttpCall:
    """One call of an `http` rotator (`create` or `revoke`) to the provider's key API.

    path: starts with "/", relative to the provider's base_url; may hold `{placeholders}`.
    body: a JSON text template (placeholders are filled JSON-string-escaped), or None.
    value / id: RFC 6901 JSON pointers to the new key's value and id in the response.
    ok_status: the statuses that mean success (for revoke, 404 and 410 also do).
    """

    path: str
    method: HttpMethod = "POST"
    body: str | None = None
    value: str | None = None
    id: str | None = None
    ok_status: tuple[int, ...] = (200, 201, 202, 204)


@dataclass(frozen=True, slots=True)
class HttpFind:
    """How an `http` rotator lists keys: `items` points to the array in the response, `name`
    and `id` point into one item (all RFC 6901 JSON pointers)."""

    path: str
    items: str
    name: str
    id: str
    method: HttpMethod = "GET"


@dataclass(frozen=True, slots=True)
class HttpRotatorConfig:
    """`type = "http"`: a provider's key-management API.

    provider: the `[[providers]]` entry whose base_url, timeout and TLS rules the calls use.
    auth: sent as `Authorization: <auth_scheme> <value>` (None: no Authorization header).
    """

    name: str
    provider: str
    create: HttpCall
    revoke: HttpCall
    auth: SecretRef | None = None
    auth_scheme: str = "Bearer"
    find: HttpFind | None = None
    type: Literal["http"] = field(default="http", init=False)


@dataclass(frozen=True, slots=True)
class ExecRotatorConfig:
    """`type = "exec"`: an operator's command (argv; not run at load), parameters on stdin."""

    name: str
    command: tuple[str, ...]
    timeout: float = 30.0
    type: Literal["exec"] = field(default="exec", init=False)


@dataclass(frozen=True, slots=True)
class ManualRotatorConfig:
    """`type = "manual"`: a person creates the key; `keyturn import-key` hands it over."""

    name: str
    type: Literal["manual"] = field(default="manual", init=False)


RotatorConfig = HttpRotatorConfig | ExecRotatorConfig | ManualRotatorConfig


@dataclass(frozen=True, slots=True)
class RotationPolicy:
    """`[credentials.rotation]`: when and how a key (or a client secret) is replaced.

    max_age: seconds a key is used before it is rotated. grace: seconds the old key stays
    valid after the new one is published. rotator: a `[[rotators]]` entry's name.
    verify_attempts: verification failures of one pending key before it is revoked and
    a new one created.
    """

    max_age: float
    rotator: str
    grace: float = 3600.0
    verify_attempts: int = 5


@dataclass(frozen=True, slots=True)
class HookConfig:
    """A sink's `on_publish`: a command (argv, no shell; not run at load) run after each write
    of the sink's file, told what was written as JSON on its stdin. `timeout` in seconds."""

    command: tuple[str, ...]
    timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class SinkConfig:
    """One of a credential's `sinks`: a file on keyturn's host that keyturn keeps equal to the
    published value (see `keyturn.sinks`).

    path: absolute, normalized. format: "raw" (the bare token or key), "json" (the published
    fields, `credential` and `version`), "env" (`<env_prefix><FIELD>=value` lines).
    mode: permission bits (at most 0o777, owner-readable, nothing for others).
    """

    path: Path
    format: SinkFormat
    mode: int = 0o600
    env_prefix: str = "KEYTURN_"
    on_publish: HookConfig | None = None


@dataclass(frozen=True, slots=True)
class CredentialConfig:
    """`[[credentials]]`: one credential keyturn keeps fresh.

    kind "oauth_client": client_id (a reference or an inline value, `SecretRef.inline`) and
    client_secret (a reference) are set; `rotation`, if set, rotates the client secret;
    `refresh_token` (a reference), if set, is a refresh token the provider issued earlier
    (e.g. through a consent flow) that seeds keyturn's private state once.
    kind "api_key": client_id and client_secret are None; `probe` and `rotation` are set;
    `initial_key` (a reference) and `initial_key_id` adopt an existing key at first start.
    publish_to: the KV path (relative to the mount) apps read.
    probe: a path on the provider to call with a new token or key before publishing it.
    sinks: files on keyturn's host kept equal to what is published (none by default).
    """

    name: str
    provider: str
    client_id: SecretRef | None
    client_secret: SecretRef | None
    publish_to: str
    kind: CredentialKind = "oauth_client"
    scope: str | None = None
    probe: str | None = None
    refresh: RefreshPolicy = field(default_factory=RefreshPolicy)
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    rotation: RotationPolicy | None = None
    initial_key: SecretRef | None = None
    initial_key_id: str | None = None
    refresh_token: SecretRef | None = None
    sinks: tuple[SinkConfig, ...] = ()


@dataclass(frozen=True, slots=True)
class AlertHookConfig:
    """`[[alerts]]`: one alert hook (see `keyturn.alerts`).

    url: the receiver (webhook, slack), Alertmanager's base URL, or the PagerDuty Events API
    endpoint (None: PagerDuty's own). A reference, or `SecretRef.inline(url)` for a plain URL
    (never for slack). routing_key: the PagerDuty integration key (pagerduty only).
    detectors / credentials: the only ones this hook takes (None: all).
    rate_limit: firing alerts per minute. repeat_interval: seconds before a still-firing
    alert is sent again. runbook_base: None for keyturn's own runbook.
    """

    name: str
    type: AlertHookType
    url: SecretRef | None = None
    routing_key: SecretRef | None = None
    min_severity: AlertSeverity = "warning"
    detectors: tuple[str, ...] | None = None
    credentials: tuple[str, ...] | None = None
    rate_limit: float = 30.0
    repeat_interval: float = 4 * 3600.0
    timeout: float = 10.0
    max_retries: int = 5
    runbook_base: str | None = None


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration, validated. `source` is the file it came from."""

    keyturn: DaemonSettings
    vault: VaultSettings
    metrics: MetricsSettings
    providers: Mapping[str, ProviderConfig]
    credentials: tuple[CredentialConfig, ...]
    source: Path
    rotators: Mapping[str, RotatorConfig] = field(default_factory=dict)
    alerts: tuple[AlertHookConfig, ...] = ()
    _by_name: Mapping[str, CredentialConfig] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "providers", MappingProxyType(dict(self.providers)))
        object.__setattr__(self, "rotators", MappingProxyType(dict(self.rotators)))
        by_name = MappingProxyType({c.name: c for c in self.credentials})
        object.__setattr__(self, "_by_name", by_name)

    def credential(self, name: str) -> CredentialConfig:
        """The credential called `name`; KeyError if there is none."""
        return self._by_name[name]

    def provider_of(self, credential: CredentialConfig) -> ProviderConfig:
        """The provider a credential uses (always present in a validated Config)."""
        return self.providers[credential.provider]

    def rotator_of(self, credential: CredentialConfig) -> RotatorConfig | None:
        """The rotator a credential's rotation uses; None if it has no rotation policy."""
        if credential.rotation is None:
            return None
        return self.rotators[credential.rotation.rotator]
