"""Loading valid configurations: the documented example, defaults, auth methods, transport
rules, environment overrides, and that no secret value ever reaches a ConfigError."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path
from typing import Union, get_args

import pytest

from keyturn.config import (
    AlertHookType,
    AppRoleAuth,
    AuthMethod,
    CredentialConfig,
    CredentialKind,
    DaemonSettings,
    KubernetesAuth,
    MetricsSettings,
    OAuthClientCredential,
    ProviderConfig,
    RotatorConfig,
    RotatorType,
    TokenAuth,
    TokenFileAuth,
    VaultAuth,
    load_config,
    parse_config,
)
from keyturn.config.credentials import KINDS
from keyturn.config.keys import keys, tag_of
from keyturn.config.schema import AlertHookVariant
from keyturn.errors import ConfigError
from keyturn.policy import BackoffPolicy, RefreshPolicy
from keyturn.references import SecretRef
from keyturn_devkit.harness.configs import VAULT

REPO = Path(__file__).resolve().parents[2]

# The example from the configuration contract, verbatim: it must load as written.
EXAMPLE = """\
[vault]
address = "http://127.0.0.1:8200"
auth = { method = "token", token = "env:VAULT_TOKEN" }
mount = "secret"

[metrics]
listen = "127.0.0.1:9797"

[[providers]]
name = "acme"
base_url = "http://127.0.0.1:8400"
allow_insecure_http = true        # loopback trials only
token_path = "/oauth/token"
token_request = "json"            # "json" as in the spec, or "form" (RFC 6749)
client_auth = "body"              # "body" (client_secret_post) or "basic"

[[credentials]]
name = "reporting"
provider = "acme"
kind = "oauth_client"
client_id = "vault:secret/keyturn/inputs/reporting#client_id"
client_secret = "vault:secret/keyturn/inputs/reporting#client_secret"
publish_to = "apps/reporting/acme"
probe = "/v1/projects"
"""

MINIMAL = VAULT + """
[[providers]]
name = "acme"
base_url = "https://acme.example.com/"

[[credentials]]
name = "reporting"
provider = "acme"
kind = "oauth_client"
client_id = "reporting-app"
client_secret = "env:REPORTING_SECRET"
publish_to = "apps/reporting/acme"
"""


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "k.toml", environ or {})
    return caught.value.problems


def test_the_contract_example_loads_as_written(tmp_path: Path) -> None:
    path = tmp_path / "keyturn.toml"
    path.write_text(EXAMPLE)
    config = load_config(path, environ={})
    assert config.source == path
    assert config.vault.address == "http://127.0.0.1:8200"
    assert config.vault.auth == TokenAuth(SecretRef.env("VAULT_TOKEN"))
    assert config.vault.mount == "secret"
    assert config.metrics == MetricsSettings(host="127.0.0.1", port=9797)
    assert list(config.providers) == ["acme"]
    assert config.providers["acme"] == ProviderConfig(
        name="acme",
        base_url="http://127.0.0.1:8400",
        allow_insecure_http=True,
        token_path="/oauth/token",
        token_request="json",
        client_auth="body",
    )
    [credential] = config.credentials
    assert credential == OAuthClientCredential(
        name="reporting",
        provider="acme",
        kind="oauth_client",
        client_id=SecretRef.vault("secret", "keyturn/inputs/reporting", "client_id"),
        client_secret=SecretRef.vault("secret", "keyturn/inputs/reporting", "client_secret"),
        publish_to="apps/reporting/acme",
        probe="/v1/projects",
    )
    assert config.credential("reporting") is credential
    assert config.provider_of(credential) is config.providers["acme"]
    assert config.providers["acme"].token_url == "http://127.0.0.1:8400/oauth/token"


def test_shipped_example_file_loads() -> None:
    config = load_config(REPO / "deploy" / "keyturn.example.toml", environ={})
    assert config.credentials
    assert config.providers


def test_defaults_match_the_documented_schema() -> None:
    config = parse_config(MINIMAL, "k.toml", {})
    assert config.keyturn == DaemonSettings(
        instance_id=socket.gethostname() or "keyturn",
        state_prefix="keyturn/state",
        log_level="info",
        max_concurrency=64,
        vault_concurrency=16,
        shutdown_timeout=30.0,
    )
    vault = config.vault
    assert (vault.mount, vault.namespace, vault.ca_cert) == ("secret", None, None)
    assert (vault.timeout, vault.renew_margin) == (10.0, 300.0)
    assert config.metrics.listen == "127.0.0.1:9797"
    provider = config.providers["acme"]
    assert provider.base_url == "https://acme.example.com"  # trailing slash dropped
    assert provider == ProviderConfig(
        name="acme",
        base_url="https://acme.example.com",
        allow_insecure_http=False,
        token_path="/oauth/token",
        revoke_path=None,
        token_request="json",
        client_auth="body",
        timeout=10.0,
        max_connections=100,
        rate_limit=None,
        default_lifetime=3600.0,
        max_response_bytes=65536,
    )
    credential = config.credentials[0]
    assert credential.client_id == SecretRef.inline("reporting-app")
    assert credential.refresh == RefreshPolicy(at=0.66, jitter=0.1, margin=60.0, min_interval=1.0)
    assert credential.backoff == BackoffPolicy(initial=1.0, maximum=300.0, multiplier=2.0)
    assert (credential.scope, credential.probe) == (None, None)


def test_every_key_can_be_set() -> None:
    text = MINIMAL.replace(
        "[vault]",
        """\
[keyturn]
instance_id = "kt-1"
state_prefix = "ops/keyturn"
log_level = "debug"
max_concurrency = 8
vault_concurrency = 4
shutdown_timeout = "1m"

[metrics]
listen = "[::1]:9000"

[vault]
namespace = "admin/team"
ca_cert = "ca.pem"
timeout = 2.5
renew_margin = "10m"
mount = "kv"
""",
    ).replace(
        'base_url = "https://acme.example.com/"',
        """\
base_url = "https://acme.example.com/api"
revoke_path = "/oauth/revoke"
token_request = "form"
client_auth = "basic"
timeout = "500ms"
max_connections = 10
rate_limit = 2
default_lifetime = "1h30m"
max_response_bytes = 4096
""",
    ) + (
        'scope = "read write"\n'
        'probe = "/v1/users?limit=1"\n'
        'refresh = { at = 0.5, jitter = 0, margin = "2m", min_interval = "5s" }\n'
        'backoff = { initial = "2s", max = "1h", multiplier = 3 }\n'
    )
    config = parse_config(text, "/etc/keyturn/k.toml", {})
    assert config.keyturn == DaemonSettings("kt-1", "ops/keyturn", "debug", 8, 4, 60.0)
    assert config.metrics.host == "::1"
    assert config.metrics.listen == "[::1]:9000"
    assert config.vault.namespace == "admin/team"
    assert config.vault.ca_cert == Path("/etc/keyturn/ca.pem")  # relative to the file
    assert (config.vault.timeout, config.vault.renew_margin, config.vault.mount) == (
        2.5,
        600.0,
        "kv",
    )
    provider = config.providers["acme"]
    assert provider.revoke_url == "https://acme.example.com/api/oauth/revoke"
    assert (provider.token_request, provider.client_auth) == ("form", "basic")
    assert (provider.timeout, provider.max_connections, provider.rate_limit) == (0.5, 10, 2.0)
    assert (provider.default_lifetime, provider.max_response_bytes) == (5400.0, 4096)
    credential = config.credentials[0]
    assert (credential.scope, credential.probe) == ("read write", "/v1/users?limit=1")
    assert credential.refresh == RefreshPolicy(0.5, 0.0, 120.0, 5.0)
    assert credential.backoff == BackoffPolicy(2.0, 3600.0, 3.0)


AUTH_CASES = [
    ('{ method = "token", token = "file:/run/t" }', TokenAuth(SecretRef.file("/run/t"))),
    (
        '{ method = "token_file", path = "/run/agent/token" }',
        TokenFileAuth(Path("/run/agent/token")),
    ),
    (
        '{ method = "approle", role_id = "env:ROLE_ID", secret_id = "file:/run/sid" }',
        AppRoleAuth(SecretRef.env("ROLE_ID"), SecretRef.file("/run/sid"), "approle"),
    ),
    (
        '{ method = "approle", role_id = "env:R", secret_id = "env:S", mount = "ar" }',
        AppRoleAuth(SecretRef.env("R"), SecretRef.env("S"), "ar"),
    ),
    (
        '{ method = "kubernetes", role = "keyturn" }',
        KubernetesAuth(
            "keyturn", Path("/var/run/secrets/kubernetes.io/serviceaccount/token"), "kubernetes"
        ),
    ),
    (
        '{ method = "kubernetes", role = "kt", jwt_path = "/jwt", mount = "k8s" }',
        KubernetesAuth("kt", Path("/jwt"), "k8s"),
    ),
]


@pytest.mark.parametrize(("literal", "expected"), AUTH_CASES)
def test_vault_auth_methods(literal: str, expected: object) -> None:
    text = MINIMAL.replace('{ method = "token", token = "env:VAULT_TOKEN" }', literal)
    config = parse_config(text, "k.toml", {})
    assert config.vault.auth == expected
    assert config.vault.auth.method == literal.split('"')[1]


# -- https unless allow_insecure_http, and that only for loopback ----------------------------

TRANSPORT = [
    # (base_url, allow_insecure_http, accepted)
    ("https://acme.example.com", False, True),
    ("http://acme.example.com", False, False),
    ("http://acme.example.com", True, False),
    ("https://acme.example.com", True, False),
    ("http://127.0.0.1:8400", False, False),
    ("http://127.0.0.1:8400", True, True),
    ("http://127.1.2.3:8400", True, True),
    ("http://[::1]:8400", True, True),
    ("http://localhost:8400", True, True),
    ("http://LOCALHOST:8400", True, True),
    ("http://localhost.evil.example.com", True, False),
    ("http://128.0.0.1", True, False),
    ("http://0.0.0.0:8400", True, False),
    ("https://127.0.0.1:8443", True, True),
]


@pytest.mark.parametrize(("url", "allow", "accepted"), TRANSPORT)
def test_provider_transport_rule(url: str, allow: bool, accepted: bool) -> None:
    text = MINIMAL.replace(
        'base_url = "https://acme.example.com/"',
        f'base_url = "{url}"\nallow_insecure_http = {str(allow).lower()}',
    )
    if accepted:
        assert parse_config(text, "k.toml", {}).providers["acme"].allow_insecure_http is allow
    else:
        [line] = problems(text)
        assert "allow_insecure_http" in line or "https://" in line


@pytest.mark.parametrize(
    ("address", "allow", "accepted"),
    [
        ("http://127.0.0.1:8200", False, True),  # a loopback dev server needs no flag
        ("http://[::1]:8200", False, True),
        ("http://localhost:8200", True, True),
        ("http://vault.internal:8200", False, False),
        ("http://vault.internal:8200", True, False),  # the flag is for loopback hosts only
        ("https://vault.internal:8200", False, True),
    ],
)
def test_vault_transport_rule(address: str, allow: bool, accepted: bool) -> None:
    text = MINIMAL.replace(
        'address = "https://vault.example.com"',
        f'address = "{address}"\nallow_insecure_http = {str(allow).lower()}',
    )
    if accepted:
        assert parse_config(text, "k.toml", {}).vault.address == address
    else:
        assert len(problems(text)) == 1


# -- environment overrides ----------------------------------------------------------------


OVERRIDES = [
    ("KEYTURN_VAULT_ADDRESS", "https://vault2.example.com", "vault.address", None),
    ("KEYTURN_VAULT_NAMESPACE", "ops", "vault.namespace", None),  # absent from the file
    ("KEYTURN_VAULT_TIMEOUT", "1m30s", "vault.timeout", 90.0),
    ("KEYTURN_VAULT_TIMEOUT", "2.5", "vault.timeout", 2.5),
    ("KEYTURN_VAULT_AUTH_TOKEN", "file:/run/t", "vault.auth.token", SecretRef.file("/run/t")),
    ("KEYTURN_METRICS_LISTEN", "[::1]:9000", "metrics.listen", None),
    ("KEYTURN_KEYTURN_LOG_LEVEL", "debug", "keyturn.log_level", None),
    ("KEYTURN_KEYTURN_MAX_CONCURRENCY", "8", "keyturn.max_concurrency", 8),
    ("KEYTURN_KEYTURN_INSTANCE_ID", "pod-7", "keyturn.instance_id", None),
    ("KEYTURN_PROVIDERS_ACME_TIMEOUT", "2m", "providers.acme.timeout", 120.0),
    ("KEYTURN_PROVIDERS_ACME_RATE_LIMIT", "2.5", "providers.acme.rate_limit", 2.5),
    ("KEYTURN_PROVIDERS_ACME_TOKEN_REQUEST", "form", "providers.acme.token_request", None),
    ("KEYTURN_CREDENTIALS_REPORTING_SCOPE", "read", "credentials.0.scope", None),
    (
        "KEYTURN_CREDENTIALS_REPORTING_CLIENT_SECRET",
        "env:OTHER",
        "credentials.0.client_secret",
        SecretRef.env("OTHER"),
    ),
    ("KEYTURN_CREDENTIALS_REPORTING_REFRESH_MARGIN", "90s", "credentials.0.refresh.margin", 90.0),
    ("KEYTURN_CREDENTIALS_REPORTING_BACKOFF_MAX", "1h", "credentials.0.backoff.maximum", 3600.0),
]


@pytest.mark.parametrize(("var", "value", "dotted", "expected"), OVERRIDES)
def test_environment_overrides_a_scalar(
    var: str, value: str, dotted: str, expected: object
) -> None:
    config = parse_config(MINIMAL, "k.toml", {var: value})
    head, _, rest = dotted.partition(".")
    target: object = getattr(config, head)
    for part in rest.split("."):
        if isinstance(target, tuple):
            target = target[int(part)]
        elif head == "providers" and target is config.providers:
            target = config.providers[part]
        else:
            target = getattr(target, part)
    assert target == (value if expected is None else expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("false", False), ("0", False)],
)
def test_boolean_overrides(value: str, expected: bool) -> None:
    text = MINIMAL.replace("https://acme.example.com/", "http://127.0.0.1:8400")
    if not expected:
        text = text.replace("http://127.0.0.1:8400", "https://127.0.0.1:8400")
    config = parse_config(text, "k.toml", {"KEYTURN_PROVIDERS_ACME_ALLOW_INSECURE_HTTP": value})
    assert config.providers["acme"].allow_insecure_http is expected


def test_entry_names_with_dashes_map_to_underscores() -> None:
    text = MINIMAL.replace('name = "acme"', 'name = "my-api"').replace(
        'provider = "acme"', 'provider = "my-api"'
    )
    config = parse_config(text, "k.toml", {"KEYTURN_PROVIDERS_MY_API_MAX_CONNECTIONS": "3"})
    assert config.providers["my-api"].max_connections == 3


def test_other_environment_variables_are_ignored() -> None:
    environ = {
        "VAULT_ADDR": "x",
        "KEYTURNX": "y",
        "HOME": "/",
        "KEYTURN_CONFIG": "/etc/keyturn/keyturn.toml",  # the CLI's, not an override
    }
    config = parse_config(MINIMAL, "k.toml", environ)
    assert config.vault.address == "https://vault.example.com"


BAD_OVERRIDES = [
    (
        {"KEYTURN_VAULT_TIMEOUT": "10x"},
        'k.toml: environment KEYTURN_VAULT_TIMEOUT: vault.timeout: got "10x" (not a duration); '
        "expected a duration greater than zero",
    ),
    (
        {"KEYTURN_KEYTURN_MAX_CONCURRENCY": "many"},
        'k.toml: environment KEYTURN_KEYTURN_MAX_CONCURRENCY: keyturn.max_concurrency: got "many"; '
        "expected an integer between 1 and 10000",
    ),
    (
        {"KEYTURN_PROVIDERS_ACME_ALLOW_INSECURE_HTTP": "yes"},
        "k.toml: environment KEYTURN_PROVIDERS_ACME_ALLOW_INSECURE_HTTP: "
        'providers["acme"].allow_insecure_http: got "yes"; expected true or false',
    ),
    (
        {"KEYTURN_PROVIDERS_ACME_ALLOW_INSECURE_HTTP": "true"},
        "k.toml: environment KEYTURN_PROVIDERS_ACME_ALLOW_INSECURE_HTTP: "
        'providers["acme"].allow_insecure_http: true is accepted only for loopback hosts',
    ),
    (
        {"KEYTURN_VAULT_ADRESS": "https://x"},
        "k.toml: environment KEYTURN_VAULT_ADRESS: not a key of vault; "
        "did you mean KEYTURN_VAULT_ADDRESS?",
    ),
    (
        {"KEYTURN_PROVIDERS_ACEM_TIMEOUT": "1s"},
        "k.toml: environment KEYTURN_PROVIDERS_ACEM_TIMEOUT: not a known override; "
        "did you mean KEYTURN_PROVIDERS_ACME_TIMEOUT?",
    ),
    (
        {"KEYTURN_PROVIDERS_BILLING_TIMEOUT": "1s"},
        "k.toml: environment KEYTURN_PROVIDERS_BILLING_TIMEOUT: names no configured provider; "
        "expected KEYTURN_PROVIDERS_<NAME>_<KEY> with <NAME> one of: ACME",
    ),
    (
        {"KEYTURN_CREDENTIALS_REPORTING_COLOUR": "blue"},
        "k.toml: environment KEYTURN_CREDENTIALS_REPORTING_COLOUR: not a key of "
        'credentials["reporting"]; expected KEYTURN_CREDENTIALS_REPORTING_<KEY> with <KEY> one '
        "of: ASSERTION_AUDIENCE, ASSERTION_SUBJECT, AUDIENCE, BACKOFF_AFTER_EXPIRY, "
        "BACKOFF_INITIAL, BACKOFF_MAX, BACKOFF_MULTIPLIER, CLIENT_AUTH, CLIENT_CERTIFICATE, "
        "CLIENT_ID, CLIENT_KEY, CLIENT_KEY_ALG, CLIENT_KEY_ID, CLIENT_SECRET, CONSUMERS, GRANT, "
        "KIND, PROBE, PROBE_AUTH, PROBE_HEADER, PROVIDER, PUBLISH_TO, REFRESH_AT, "
        "REFRESH_JITTER, REFRESH_MARGIN, REFRESH_MIN_INTERVAL, REFRESH_TOKEN, RESOURCE, SCOPE, "
        "SERVICE_ACCOUNT, TOKEN_PARAMS",
    ),
    (
        # The entry no variable names is walked after all, to find the name meant.
        {"KEYTURN_CREDENTIALS_REPORTNG_SCOPE": "read"},
        "k.toml: environment KEYTURN_CREDENTIALS_REPORTNG_SCOPE: not a known override; "
        "did you mean KEYTURN_CREDENTIALS_REPORTING_SCOPE?",
    ),
    (
        {"KEYTURN_CREDENTIALS_REPORTING_NAME": "other"},
        'k.toml: environment KEYTURN_CREDENTIALS_REPORTING_NAME: not a key of credentials["re',
    ),
    (
        {"KEYTURN_VAULT_AUTH_ROLE_ID": "env:R"},  # a key of another auth method
        "k.toml: environment KEYTURN_VAULT_AUTH_ROLE_ID: not a key of vault.auth; "
        "expected KEYTURN_VAULT_AUTH_<KEY> with <KEY> one of: METHOD, TOKEN",
    ),
    (
        {"KEYTURN_VALT_ADDRESS": "https://v.example.com"},  # a near miss of a section
        "k.toml: environment KEYTURN_VALT_ADDRESS: not a known override; "
        "did you mean KEYTURN_VAULT_ADDRESS?",
    ),
    (
        {"KEYTURN_CREDENTIAL_X": "1"},
        "k.toml: environment KEYTURN_CREDENTIAL_X: not a known override; expected KEYTURN_<SE",
    ),
]


@pytest.mark.parametrize(("environ", "line"), BAD_OVERRIDES)
def test_bad_overrides_name_the_variable(environ: dict[str, str], line: str) -> None:
    [problem] = problems(MINIMAL, environ)
    assert problem.startswith(line), problem


def test_override_matching_two_entries_is_ambiguous() -> None:
    text = MINIMAL + '\n[[providers]]\nname = "acme_2"\nbase_url = "https://b.example.com"\n'
    text = text.replace('name = "acme"', 'name = "acme-2"').replace(
        'provider = "acme"', 'provider = "acme-2"'
    )
    [problem] = problems(text, {"KEYTURN_PROVIDERS_ACME_2_TIMEOUT": "1s"})
    assert problem == (
        "k.toml: environment KEYTURN_PROVIDERS_ACME_2_TIMEOUT: ambiguous: it overrides both "
        'providers["acme-2"].timeout and providers["acme_2"].timeout; expected entry names '
        "that still differ when upper-cased with '-' read as '_'"
    )


# -- secrets never appear in errors -------------------------------------------------------

SECRET = "hunter2-Sup3r-S3cret-value"

LEAKS = [
    ("client_secret", MINIMAL.replace('"env:REPORTING_SECRET"', f'"{SECRET}"'), {}),
    ("vault token", MINIMAL.replace('"env:VAULT_TOKEN"', f'"{SECRET}"'), {}),
    (
        "approle secret_id",
        MINIMAL.replace(
            '{ method = "token", token = "env:VAULT_TOKEN" }',
            f'{{ method = "approle", role_id = "env:R", secret_id = "{SECRET}" }}',
        ),
        {},
    ),
    ("malformed reference", MINIMAL.replace('"env:REPORTING_SECRET"', f'"vault:{SECRET}"'), {}),
    ("env reference", MINIMAL.replace('"env:REPORTING_SECRET"', f'"env:{SECRET}!"'), {}),
    ("secret as a number", MINIMAL.replace('"env:REPORTING_SECRET"', "123456789"), {}),
    ("misspelt key", MINIMAL.replace("client_secret", "client_secrt"), {}),
    ("misspelt key, inline", MINIMAL + f'client_secrt = "{SECRET}"\n', {}),
    (
        "password in a URL",
        MINIMAL.replace("https://acme.example.com/", f"https://app:{SECRET}@acme.example.com"),
        {},
    ),
    (
        "password in a URL with a bad port",
        MINIMAL.replace("https://acme.example.com/", f"https://app:{SECRET}@acme:99999"),
        {},
    ),
    ("override of client_secret", MINIMAL, {"KEYTURN_CREDENTIALS_REPORTING_CLIENT_SECRET": SECRET}),
    ("override of the vault token", MINIMAL, {"KEYTURN_VAULT_AUTH_TOKEN": SECRET}),
    ("unknown override", MINIMAL, {"KEYTURN_VAULT_TOKEN": SECRET}),
    ("invalid TOML", MINIMAL + f"client_secret = {SECRET}\n", {}),
]


@pytest.mark.parametrize(("case", "text", "environ"), LEAKS, ids=[c[0] for c in LEAKS])
def test_no_secret_value_in_any_config_error(case: str, text: str, environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "k.toml", environ)
    error = caught.value
    rendered = "\n".join([str(error), repr(error), *error.problems, repr(error.args)])
    assert SECRET not in rendered
    assert "hunter2" not in rendered
    assert error.__cause__ is None


def test_inline_secret_message_says_how_to_reference_it() -> None:
    [line] = problems(MINIMAL.replace('"env:REPORTING_SECRET"', f'"{SECRET}"'))
    assert line == (
        'k.toml: credentials["reporting"].client_secret: got an inline secret, which is not '
        "allowed (its value is not shown); expected a reference: vault:<mount>/<path>#<field>, "
        "env:NAME or file:/absolute/path "
        '(e.g. client_secret = "vault:secret/keyturn/inputs/<name>#client_secret")'
    )


# -- files and the Config object ------------------------------------------------------------


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert caught.value.problems == [
        f"{path}: cannot read the configuration: No such file or directory"
    ]


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "k.toml"
    path.write_bytes(b"\xff\xfe[vault]")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert caught.value.problems == [f"{path}: not UTF-8 text; expected a UTF-8 TOML file"]


def test_errors_name_the_file_they_came_from(tmp_path: Path) -> None:
    path = tmp_path / "keyturn.toml"
    path.write_text(MINIMAL.replace('"apps/reporting/acme"', '"/apps"'))
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    [line] = caught.value.problems
    assert line.startswith(f'{path}: credentials["reporting"].publish_to: got "/apps"')


def test_relative_paths_start_at_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keyturn.toml"
    path.write_text(
        MINIMAL.replace(
            '{ method = "token", token = "env:VAULT_TOKEN" }',
            '{ method = "token_file", path = "secrets/token" }',
        )
    )
    config = load_config(path, environ={})
    assert config.vault.auth == TokenFileAuth(tmp_path / "secrets" / "token")


def test_config_objects_are_frozen() -> None:
    config = parse_config(MINIMAL, "k.toml", {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.vault = config.vault  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.credentials[0].publish_to = "elsewhere"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.providers["other"] = config.providers["acme"]  # type: ignore[index]
    with pytest.raises(KeyError):
        config.credential("nope")


# -- the schema ------------------------------------------------------------------------------


def test_objects_the_code_makes_are_taken_as_they_are() -> None:
    """The file's rules judge a file: other modules (and their tests) make config objects
    with values no file may hold (plain http without the flag, a tiny limit, no kind)."""
    provider = ProviderConfig(name="p", base_url="http://127.0.0.1:1", max_response_bytes=10)
    assert (provider.base_url, provider.max_response_bytes) == ("http://127.0.0.1:1", 10)
    credential = CredentialConfig(
        name="c", provider="p", client_id=None, client_secret=None, publish_to="x"
    )
    assert credential.kind == "oauth_client"
    with pytest.raises(dataclasses.FrozenInstanceError):
        credential.kind = "api_key"  # type: ignore[misc]


def test_each_literal_is_the_tags_of_its_union() -> None:
    unions = [(AuthMethod, VaultAuth, "method"), (RotatorType, RotatorConfig, "type")]
    unions.append((AlertHookType, AlertHookVariant, "type"))
    unions.append((CredentialKind, Union[KINDS], "kind"))  # noqa: UP007
    for literal, union, discriminator in unions:
        tags = tuple(tag_of(member, discriminator) for member in get_args(union))
        assert tags == get_args(literal)


def test_a_kind_s_own_key_is_taken_by_its_kinds_and_refused_by_name_by_the_others() -> None:
    """The base marks a kind's keys once; no kind lists the others' keys."""
    for key in keys(CredentialConfig, refused=True):
        takes = [kind for kind in KINDS if key in keys(kind)]
        assert takes, key  # some kind declares it
        for kind in KINDS:
            assert (key in keys(kind, refused=True)) == (kind not in takes)
            refused = f'not allowed for kind "{tag_of(kind, "kind")}"'
            assert kind in takes or kind.refusal(key).startswith(refused)


def test_a_file_must_name_each_credential_s_kind() -> None:
    [line] = problems(MINIMAL.replace('kind = "oauth_client"\n', ""))
    assert line == (
        'k.toml: credentials["reporting"].kind: missing; expected one of "oauth_client", '
        '"api_key", "signing_key"'
    )
