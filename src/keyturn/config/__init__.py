"""keyturn's configuration: one TOML file, validated into frozen objects, `KEYTURN_…` overrides.

`load_config(path)` returns a `Config` or raises ConfigError; docs/configuration.md has every
key, docs/architecture.md the modules.
"""

from keyturn.config.credentials import (
    CredentialConfig,
    CredentialKind,
    OAuthClientCredential,
    RotationPolicy,
)
from keyturn.config.durations import format_duration
from keyturn.config.load import load_config, parse_config
from keyturn.config.schema import (
    AlertHookConfig,
    AlertHookType,
    AppRoleAuth,
    AuthMethod,
    Config,
    DaemonSettings,
    HttpRotatorConfig,
    KubernetesAuth,
    MetricsSettings,
    ProviderConfig,
    RotatorConfig,
    RotatorType,
    TokenAuth,
    TokenFileAuth,
    VaultAuth,
)

__all__ = [
    "AlertHookConfig",
    "AlertHookType",
    "AppRoleAuth",
    "AuthMethod",
    "Config",
    "CredentialConfig",
    "CredentialKind",
    "DaemonSettings",
    "HttpRotatorConfig",
    "KubernetesAuth",
    "MetricsSettings",
    "OAuthClientCredential",
    "ProviderConfig",
    "RotationPolicy",
    "RotatorConfig",
    "RotatorType",
    "TokenAuth",
    "TokenFileAuth",
    "VaultAuth",
    "format_duration",
    "load_config",
    "parse_config",
]
