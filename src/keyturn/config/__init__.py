"""keyturn's configuration: one TOML file, validated into frozen objects, `KEYTURN_…` overrides.

    from keyturn.config import load_config
    config = load_config(Path("/etc/keyturn/keyturn.toml"))   # raises ConfigError

See docs/configuration.md for every key. Modules: `schema` (the models: every key, type,
default and Literal, and the objects the code reads), `credentials` (`[[credentials]]`, one
model per kind), `fields` (the value types: how one
value is read and what a problem line says), `load` (the file, entry names, pydantic's errors
as problem lines), `overrides` (`KEYTURN_…` variables), `keys` (reading the schema: each
table's keys), `templates` (an http rotator's templates and JSON pointers), `durations`, `webconfig`
(`[metrics] web_config`, the exporter toolkit's web configuration file).
"""

from keyturn.config.durations import format_duration, parse_duration
from keyturn.config.load import load_config, parse_config
from keyturn.config.schema import (
    AlertHookConfig,
    AlertHookType,
    AlertSeverity,
    ApiKeyCredential,
    AppRoleAuth,
    AuthMethod,
    ClientAuth,
    Config,
    CredentialConfig,
    CredentialKind,
    DaemonSettings,
    ExecRotatorConfig,
    ExternalChangeResponse,
    HookConfig,
    HttpCall,
    HttpFind,
    HttpMethod,
    HttpRotatorConfig,
    KubernetesAuth,
    LogLevel,
    ManualRotatorConfig,
    MetricsSettings,
    OAuthClientCredential,
    ProviderConfig,
    RotationPolicy,
    RotatorConfig,
    RotatorType,
    SinkConfig,
    SinkFormat,
    TokenAuth,
    TokenFileAuth,
    TokenRequest,
    VaultAuth,
    VaultSettings,
)

__all__ = [
    "AlertHookConfig",
    "AlertHookType",
    "AlertSeverity",
    "ApiKeyCredential",
    "AppRoleAuth",
    "AuthMethod",
    "ClientAuth",
    "Config",
    "CredentialConfig",
    "CredentialKind",
    "DaemonSettings",
    "ExecRotatorConfig",
    "ExternalChangeResponse",
    "HookConfig",
    "HttpCall",
    "HttpFind",
    "HttpMethod",
    "HttpRotatorConfig",
    "KubernetesAuth",
    "LogLevel",
    "ManualRotatorConfig",
    "MetricsSettings",
    "OAuthClientCredential",
    "ProviderConfig",
    "RotationPolicy",
    "RotatorConfig",
    "RotatorType",
    "SinkConfig",
    "SinkFormat",
    "TokenAuth",
    "TokenFileAuth",
    "TokenRequest",
    "VaultAuth",
    "VaultSettings",
    "format_duration",
    "load_config",
    "parse_config",
    "parse_duration",
]
