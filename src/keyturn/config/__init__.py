"""keyturn's configuration: one TOML file, validated into frozen objects, `KEYTURN_…` overrides.

    from keyturn.config import load_config
    config = load_config(Path("/etc/keyturn/keyturn.toml"))   # raises ConfigError

See docs/configuration.md for every key. Modules: `schema` (the objects), `load` (parsing and
validation), `rotators` (`[[rotators]]` and `rotation`), `sinks` (a credential's `sinks`),
`alerts` (`[[alerts]]`), `reader`
and `fields` (how raw values and overrides are read), `templates` (an http rotator's
templates and JSON pointers), `durations`.
"""

from keyturn.config.durations import format_duration, parse_duration
from keyturn.config.load import load_config, parse_config
from keyturn.config.schema import (
    AlertHookConfig,
    AlertHookType,
    AlertSeverity,
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
