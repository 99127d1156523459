"""Bad configurations: each case must give exactly one problem line, at the right key path,
saying what was expected. The base configuration is valid; each case changes one thing."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from keyturn.config import parse_config
from keyturn.config.durations import DURATION_HELP
from keyturn.errors import ConfigError

SOURCE = "/etc/keyturn/keyturn.toml"

Entry = dict[str, str]
Doc = dict[str, "Entry | list[Entry] | str"]


def base() -> Doc:
    """A valid configuration as {section: {key: TOML literal}} (arrays: a list of entries)."""
    return {
        "vault": {
            "address": '"https://vault.example.com:8200"',
            "auth": '{ method = "token", token = "env:VAULT_TOKEN" }',
        },
        "providers": [{"name": '"acme"', "base_url": '"https://acme.example.com"'}],
        "credentials": [
            {
                "name": '"reporting"',
                "provider": '"acme"',
                "kind": '"oauth_client"',
                "client_id": '"reporting-app"',
                "client_secret": '"env:REPORTING_SECRET"',
                "publish_to": '"apps/reporting/acme"',
            }
        ],
    }


def render(doc: Doc) -> str:
    lines = [f"{key} = {value}" for key, value in doc.items() if isinstance(value, str)]
    for section, body in doc.items():
        if isinstance(body, list):
            for entry in body:
                lines.append(f"[[{section}]]")
                lines.extend(f"{k} = {v}" for k, v in entry.items())
        elif isinstance(body, dict):
            lines.append(f"[{section}]")
            lines.extend(f"{k} = {v}" for k, v in body.items())
    return "\n".join(lines) + "\n"


def change(target: str, value: str | None, start: Callable[[], Doc] | None = None) -> Doc:
    """`target` is "section", "section.key" or "section[i].key"; None deletes it."""
    doc = (start or base)()
    section, _, key = target.partition(".")
    index: int | None = None
    if section.endswith("]"):
        section, _, rest = section.partition("[")
        index = int(rest[:-1])
    if not key:
        if value is None:
            del doc[section]
        else:
            doc[section] = value
        return doc
    body = doc.setdefault(section, {})
    if index is not None:
        assert isinstance(body, list)
        body = body[index]
    assert isinstance(body, dict)
    if value is None:
        del body[key]
    else:
        body[key] = value
    return doc


def problems_of(doc: Doc, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(render(doc), SOURCE, environ or {})
    assert str(caught.value) == "\n".join(caught.value.problems)
    return caught.value.problems


def test_base_is_valid() -> None:
    config = parse_config(render(base()), SOURCE, {})
    assert config.credentials[0].name == "reporting"


CRED = 'credentials["reporting"]'
ACME = 'providers["acme"]'

CASES: list[tuple[str, str | None, str, str]] = [
    # (what to change, new TOML literal or None to delete, where, what the message says)
    # [vault]
    ("vault", '"x"', "vault", 'got "x"; expected a table ([vault])'),
    ("vault.address", None, "vault.address", "missing; expected an https:// URL"),
    ("vault.address", '"ftp://vault"', "vault.address", 'got "ftp://vault"; expected an https://'),
    ("vault.address", '"https://v.example.com/?x=1"', "vault.address", "has a query or fragment"),
    ("vault.address", '"https://"', "vault.address", "expected an https:// URL"),
    ("vault.address", '"https://v.example.com:99999"', "vault.address", "not a valid URL"),
    (
        "vault.address",
        '"http://vault.example.com:8200"',
        "vault.address",
        'plain http to "vault.example.com", which is not a loopback host; expected https://',
    ),
    (
        "vault.allow_insecure_http",
        "true",
        "vault.allow_insecure_http",
        "true is accepted only for loopback hosts (127.0.0.0/8, ::1, localhost)",
    ),
    ("vault.auth", None, "vault.auth.method", 'missing; expected one of "token", "token_file"'),
    ("vault.auth", '"token"', "vault.auth", 'got "token"; expected a table, e.g. auth = {'),
    (
        "vault.auth",
        '{ method = "password" }',
        "vault.auth.method",
        'got "password"; expected one of "token", "token_file", "approle", "kubernetes"',
    ),
    ("vault.auth", '{ method = "token" }', "vault.auth.token", "missing; expected a reference"),
    (
        "vault.auth",
        '{ method = "token_file", path = "env:TOKEN_FILE" }',
        "vault.auth.path",
        "got a reference; expected a filesystem path",
    ),
    (
        "vault.auth",
        '{ method = "token_file" }',
        "vault.auth.path",
        "missing; expected a filesystem",
    ),
    (
        "vault.auth",
        '{ method = "approle", role_id = "env:ROLE_ID" }',
        "vault.auth.secret_id",
        "missing; expected a reference",
    ),
    (
        "vault.auth",
        '{ method = "kubernetes" }',
        "vault.auth.role",
        "missing; expected the Vault role",
    ),
    (
        "vault.auth",
        '{ method = "kubernetes", role = "keyturn", token = "env:X" }',
        "vault.auth.token",
        'unknown key for method "kubernetes"; expected one of: method, role, jwt_path, mount',
    ),
    (
        "vault.auth",
        '{ method = "approle", role_id = "env:R", secret_id = "env:S", mout = "ar" }',
        "vault.auth.mout",
        'unknown key for method "approle"; did you mean "mount"?',
    ),
    ("vault.timeout", '"-5s"', "vault.timeout", "must not be negative"),
    (
        "vault.timeout",
        "0",
        "vault.timeout",
        "got 0, which is out of range; expected a duration greater than zero, at most 1h",
    ),
    ("vault.timeout", '"30m1h"', "vault.timeout", "units must go from largest to smallest"),
    ("vault.timeout", '"ten seconds"', "vault.timeout", 'got "ten seconds" (not a duration)'),
    ("vault.renew_margin", "true", "vault.renew_margin", "got true (a boolean is not a duration)"),
    ("vault.mount", '"/secret"', "vault.mount", 'which starts with "/"; expected a mount path'),
    ("vault.namespace", '""', "vault.namespace", "got an empty string; expected a Vault namespace"),
    ("vault.ca_cert", "5", "vault.ca_cert", "got 5; expected a filesystem path"),
    ("vault.adress", '"https://x"', "vault.adress", 'unknown key; did you mean "address"?'),
    # [keyturn]
    ("keyturn", "[]", "keyturn", "got an array; expected a table ([keyturn])"),
    ("keyturn.log_level", '"loud"', "keyturn.log_level", 'got "loud"; expected one of "debug"'),
    (
        "keyturn.max_concurrency",
        "0",
        "keyturn.max_concurrency",
        "got 0, which is out of range; expected an integer between 1 and 10000",
    ),
    ("keyturn.max_concurrency", "true", "keyturn.max_concurrency", "got true; expected an integer"),
    (
        "keyturn.vault_concurrency",
        "1.5",
        "keyturn.vault_concurrency",
        "got 1.5; expected an integer",
    ),
    ("keyturn.state_prefix", '"keyturn/../x"', "keyturn.state_prefix", 'no "." or ".."'),
    ("keyturn.state_prefix", '"keyturn/"', "keyturn.state_prefix", "expected a path relative to"),
    (
        "keyturn.shutdown_timeout",
        '"soon"',
        "keyturn.shutdown_timeout",
        'got "soon" (not a duration)',
    ),
    (
        "keyturn.instance_id",
        '"a b"',
        "keyturn.instance_id",
        "expected an identifier without spaces",
    ),
    ("keyturn.colour", '"blue"', "keyturn.colour", "unknown key; expected one of: instance_id, "),
    # [metrics]
    ("metrics.listen", '"localhost"', "metrics.listen", 'got "localhost"; expected host:port'),
    ("metrics.listen", '"127.0.0.1:70000"', "metrics.listen", "whose port is not 0-65535"),
    ("metrics.listen", '"127.0.0.1:http"', "metrics.listen", "whose port is not 0-65535"),
    ("metrics.listen", '":9797"', "metrics.listen", 'got ":9797"; expected host:port'),
    ("metrics.listen", '"::1:9797"', "metrics.listen", "(an IPv6 host in brackets)"),
    ("metrics.listen", '"[nothost]:9797"', "metrics.listen", "whose [host] is not IPv6"),
    ("metrics.listen", "9797", "metrics.listen", "got 9797; expected host:port"),
    ("metrics.path", '"/m"', "metrics.path", "unknown key; expected one of: listen"),
    # [[providers]]
    ("providers", '{ name = "acme" }', "providers", "got a table; expected an array of tables"),
    ("providers[0].name", None, "providers[0].name", "missing; expected a name of lowercase"),
    (
        "providers[0].name",
        '"ACME"',
        "providers[0].name",
        'got "ACME"; expected a name of lowercase',
    ),
    ("providers[0].name", '"-acme"', "providers[0].name", "starting with a letter or digit"),
    ("providers[0].base_url", None, f"{ACME}.base_url", "missing; expected an https:// URL"),
    (
        "providers[0].base_url",
        '"http://acme.example.com"',
        f"{ACME}.base_url",
        'plain http to "acme.example.com", which is not a loopback host; expected https://',
    ),
    (
        "providers[0].base_url",
        '"http://127.0.0.1:8400"',
        f"{ACME}.base_url",
        "plain http; expected https://, or allow_insecure_http = true (accepted for loopback",
    ),
    (
        "providers[0].allow_insecure_http",
        "true",
        f"{ACME}.allow_insecure_http",
        'true is accepted only for loopback hosts (127.0.0.0/8, ::1, localhost), not "acme.example',
    ),
    ("providers[0].allow_insecure_http", '"yes"', f"{ACME}.allow_insecure_http", "true or false"),
    ("providers[0].base_url", '"https://acme.example.com/#x"', f"{ACME}.base_url", "fragment"),
    ("providers[0].token_path", '"oauth/token"', f"{ACME}.token_path", 'a path starting with "/"'),
    ("providers[0].revoke_path", '"//evil/revoke"', f"{ACME}.revoke_path", 'starting with "/"'),
    ("providers[0].token_request", '"xml"', f"{ACME}.token_request", 'one of "json", "form"'),
    ("providers[0].client_auth", '"jwt"', f"{ACME}.client_auth", 'one of "body", "basic"'),
    ("providers[0].max_connections", "0", f"{ACME}.max_connections", "integer between 1 and"),
    ("providers[0].rate_limit", "0", f"{ACME}.rate_limit", "requests per second greater than"),
    ("providers[0].rate_limit", '"fast"', f"{ACME}.rate_limit", 'got "fast"; expected a number'),
    ("providers[0].rate_limit", "nan", f"{ACME}.rate_limit", "got nan; expected a number"),
    ("providers[0].default_lifetime", '"0s"', f"{ACME}.default_lifetime", "greater than zero"),
    (
        "providers[0].max_response_bytes",
        "10",
        f"{ACME}.max_response_bytes",
        "got 10, which is out of range; expected an integer between 1024 and 67108864 (1 KiB to "
        "64 MiB)",
    ),
    (
        "providers[0].tokn_path",
        '"/t"',
        f"{ACME}.tokn_path",
        'unknown key; did you mean "token_path"',
    ),
    # [[credentials]]
    ("credentials", "[1]", "credentials[0]", "got 1; expected a table"),
    ("credentials[0].name", '"Reporting"', "credentials[0].name", 'got "Reporting"'),
    (
        "credentials[0].provider",
        '"acm"',
        f"{CRED}.provider",
        'no provider is named "acm"; expected one of: "acme"',
    ),
    ("credentials[0].provider", None, f"{CRED}.provider", "missing; expected a name"),
    (
        "credentials[0].kind",
        None,
        f"{CRED}.kind",
        'missing; expected one of "oauth_client", "api_key", "signing_key"',
    ),
    (
        "credentials[0].kind",
        '"apikey"',
        f"{CRED}.kind",
        'got "apikey"; expected one of "oauth_client", "api_key", "signing_key"',
    ),
    (
        "credentials[0].initial_key",
        '"env:KEY"',
        f"{CRED}.initial_key",
        'not allowed for kind "oauth_client" (its secret is client_secret); expected it only '
        'with kind = "api_key"',
    ),
    ("credentials[0].initial_key_id", '"key_1"', f"{CRED}.initial_key_id", "not allowed for"),
    (
        "credentials[0].client_id",
        '""',
        f"{CRED}.client_id",
        "got an empty string; expected a value",
    ),
    (
        "credentials[0].client_id",
        "12",
        f"{CRED}.client_id",
        "got 12; expected a value or a reference",
    ),
    ("credentials[0].client_id", '"env:"', f"{CRED}.client_id", "malformed reference (env: needs"),
    (
        "credentials[0].client_secret",
        None,
        f"{CRED}.client_secret",
        "missing; expected a reference",
    ),
    (
        "credentials[0].client_secret",
        "42",
        f"{CRED}.client_secret",
        "got an integer; expected a ref",
    ),
    (
        "credentials[0].client_secret",
        '"vault:secret/x"',
        f"{CRED}.client_secret",
        "malformed reference (vault: needs #<field> after the path",
    ),
    (
        "credentials[0].client_secret",
        '"file:relative/secret"',
        f"{CRED}.client_secret",
        "malformed reference (file: needs an absolute path",
    ),
    (
        "credentials[0].client_secret",
        '"vault:secret/../x#f"',
        f"{CRED}.client_secret",
        "not . or ..",
    ),
    ("credentials[0].publish_to", None, f"{CRED}.publish_to", "missing; expected a path relative"),
    ("credentials[0].publish_to", '"/apps/x"', f"{CRED}.publish_to", 'which starts with "/"'),
    ("credentials[0].publish_to", '"apps//x"', f"{CRED}.publish_to", 'got "apps//x"; expected'),
    ("credentials[0].publish_to", '"apps/../x"', f"{CRED}.publish_to", 'got "apps/../x"; expected'),
    (
        "credentials[0].publish_to",
        '"keyturn/state/reporting"',
        f"{CRED}.publish_to",
        '"keyturn/state/reporting" is under keyturn.state_prefix "keyturn/state", keyturn\'s '
        "private records, which no app may read; expected a path outside keyturn.state_prefix "
        'and not a prefix of it (paths compare by "/" segments)',
    ),
    (
        "credentials[0].publish_to",
        '"keyturn/state"',
        f"{CRED}.publish_to",
        '"keyturn/state" is keyturn.state_prefix, keyturn\'s private records',
    ),
    ("credentials[0].probe", '"v1/projects"', f"{CRED}.probe", 'a path starting with "/"'),
    ("credentials[0].scope", '"  "', f"{CRED}.scope", "got an empty string; expected space-sep"),
    ("credentials[0].refresh", "5", f"{CRED}.refresh", "got 5; expected a table"),
    (
        "credentials[0].refresh",
        "{ at = 1.0 }",
        f"{CRED}.refresh.at",
        "got 1.0, which is out of range; expected a fraction",
    ),
    ("credentials[0].refresh", "{ at = 0 }", f"{CRED}.refresh.at", "between 0 and 1 (exclusive)"),
    ("credentials[0].refresh", "{ jitter = 0.5 }", f"{CRED}.refresh.jitter", ">= 0 and < 0.5"),
    ("credentials[0].refresh", "{ jitter = -0.1 }", f"{CRED}.refresh.jitter", "got -0.1"),
    (
        "credentials[0].refresh",
        "{ at = 0.9, jitter = 0.2 }",
        f"{CRED}.refresh.jitter",
        "at ± jitter spans 0.70 to 1.10 of the lifetime; expected both ends strictly between",
    ),
    (
        "credentials[0].refresh",
        '{ margin = "1 minute" }',
        f"{CRED}.refresh.margin",
        'got "1 minute" (not a duration); expected a duration between 0s and 365d: seconds',
    ),
    ("credentials[0].refresh", "{ min_interval = 0 }", f"{CRED}.refresh.min_interval", "than zero"),
    (
        "credentials[0].refresh",
        '{ margn = "1m" }',
        f"{CRED}.refresh.margn",
        'unknown key; did you mean "margin"?',
    ),
    (
        "credentials[0].backoff",
        "{ multiplier = 0.5 }",
        f"{CRED}.backoff.multiplier",
        "got 0.5, which is out of range; expected a number between 1 and 10",
    ),
    (
        "credentials[0].backoff",
        '{ initial = "10m", max = "1m" }',
        f"{CRED}.backoff.max",
        "is shorter than initial; expected max >= initial (600s)",
    ),
    (
        "credentials[0].backoff",
        '{ maximum = "1m" }',
        f"{CRED}.backoff.maximum",
        'unknown key; did you mean "max"?',
    ),
    # top level: later features are unknown keys for now
    ("alert", "[]", "alert", 'unknown key; did you mean "alerts"?'),
    ("rotation", "{}", "rotation", 'unknown key; did you mean "rotators"?'),
    ("provider", "[]", "provider", 'unknown key; did you mean "providers"?'),
]


@pytest.mark.parametrize(
    ("target", "value", "where", "message"),
    CASES,
    ids=[f"{c[0]}={c[1]}" for c in CASES],
)
def test_one_bad_value_gives_one_problem(
    target: str, value: str | None, where: str, message: str
) -> None:
    problems = problems_of(change(target, value))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{SOURCE}: {where}: "), problems[0]
    assert message in problems[0], problems[0]


def test_a_missing_vault_table_reports_its_required_keys() -> None:
    assert problems_of(change("vault", None)) == [
        f"{SOURCE}: vault.address: missing; expected an https:// URL without ?query or #fragment",
        f'{SOURCE}: vault.auth.method: missing; expected one of "token", "token_file", '
        '"approle", "kubernetes"',
    ]


def test_duplicate_provider_names_are_reported_by_index() -> None:
    doc = base()
    providers = doc["providers"]
    assert isinstance(providers, list)
    providers.append({"name": '"acme"', "base_url": '"https://other.example.com"'})
    assert problems_of(doc) == [
        f'{SOURCE}: providers[1].name: duplicate provider name "acme" (also providers[0]); '
        "expected each provider name once"
    ]


def test_duplicate_credential_names_and_publish_to() -> None:
    doc = base()
    credentials = doc["credentials"]
    assert isinstance(credentials, list)
    credentials.append(dict(credentials[0]))  # same name, same publish_to
    twin = dict(credentials[0], name='"billing"')  # same publish_to only
    credentials.append(twin)
    problems = problems_of(doc)
    assert problems == [
        f'{SOURCE}: credentials[1].name: duplicate credential name "reporting" '
        "(also credentials[0]); expected each credential name once",
        f'{SOURCE}: credentials["billing"].publish_to: "apps/reporting/acme" is also the '
        f"publish_to of {CRED}; expected each credential to publish to its own path",
    ]


def test_a_provider_with_errors_still_counts_as_declared() -> None:
    """A credential naming a provider whose entry has a mistake gets no second, bogus error."""
    doc = change("providers[0].timeout", '"soon"')
    problems = problems_of(doc)
    assert len(problems) == 1
    assert f"{ACME}.timeout" in problems[0]


def test_every_problem_is_reported_at_once() -> None:
    doc = change("vault.timeout", '"x"')
    doc = {**doc, "keyturn": {"log_level": '"loud"', "max_concurrency": "0"}}
    providers = doc["providers"]
    assert isinstance(providers, list)
    providers[0]["token_request"] = '"xml"'
    credentials = doc["credentials"]
    assert isinstance(credentials, list)
    credentials[0]["refresh"] = "{ at = 2 }"
    credentials[0]["probe"] = '"nope"'
    problems = problems_of(doc)
    wheres = [line.split(": ")[1] for line in problems]
    assert sorted(wheres) == sorted(
        [
            "vault.timeout",
            "keyturn.log_level",
            "keyturn.max_concurrency",
            f"{ACME}.token_request",
            f"{CRED}.refresh.at",
            f"{CRED}.probe",
        ]
    )
    assert all(line.startswith(f"{SOURCE}: ") for line in problems)


def test_invalid_toml_is_one_line_with_the_position() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config('[vault\naddress = "x"', SOURCE, {})
    [line] = caught.value.problems
    assert line.startswith(f"{SOURCE}: invalid TOML: ")
    assert "line 1" in line


def test_quoted_unknown_keys_are_shown_quoted_in_the_path() -> None:
    doc = change("vault", None)
    text = render(doc) + '\n[vault]\naddress = "https://v.example.com"\n'
    text += 'auth = { method = "token", token = "env:T" }\n"odd key" = 1\n'
    with pytest.raises(ConfigError) as caught:
        parse_config(text, SOURCE, {})
    assert caught.value.problems == [
        f'{SOURCE}: vault["odd key"]: unknown key; expected one of: address, '
        "allow_insecure_http, auth, mount, namespace, ca_cert, timeout, renew_margin, nodes"
    ]


def test_duplicate_rotator_names_are_reported_by_index() -> None:
    doc = rotation_base()
    rotators = doc["rotators"]
    assert isinstance(rotators, list)
    rotators.append({"name": '"script"', "type": '"manual"'})
    assert problems_of(doc) == [
        f'{SOURCE}: rotators[4].name: duplicate rotator name "script" (also rotators[2]); '
        "expected each rotator name once"
    ]


def test_api_key_on_an_oauth_entry_lists_every_key_that_does_not_fit() -> None:
    doc = change("credentials[0].kind", '"api_key"')
    credentials = doc["credentials"]
    assert isinstance(credentials, list)
    credentials[0]["scope"] = '"read"'
    credentials[0]["refresh"] = "{ at = 0.5 }"
    not_allowed = (
        'not allowed for kind "api_key", which has no OAuth client and no token to refresh; '
        'expected it only with kind = "oauth_client"'
    )
    assert problems_of(doc) == [
        f"{SOURCE}: {CRED}.client_id: {not_allowed}",
        f"{SOURCE}: {CRED}.client_secret: {not_allowed}",
        f"{SOURCE}: {CRED}.scope: {not_allowed}",
        f"{SOURCE}: {CRED}.refresh: {not_allowed}",
        f'{SOURCE}: {CRED}.probe: missing; expected a path starting with "/", relative to the '
        'provider\'s base_url, e.g. "/oauth/token": no scheme or "//host", no "." or ".." '
        "segment, no backslash, spaces, control characters or #fragment",
        f"{SOURCE}: {CRED}.rotation: missing; expected a table, e.g. "
        'rotation = { max_age = "30d", rotator = "acme-keys" }',
    ]


# -- [[rotators]] and rotation: a second valid base, with one rotator of each type --------------


def rotation_base() -> Doc:
    doc = base()
    doc["rotators"] = [
        {
            "name": '"sandbox-keys"',
            "type": '"http"',
            "provider": '"acme"',
            "auth": '"env:ADMIN_TOKEN"',
            "create": '{ path = "/admin/api-keys", body = \'{"name": "{key_name}"}\', '
            'value = "/key", id = "/key_id" }',
            "revoke": '{ path = "/admin/api-keys/{key_id}" }',
            "find": '{ path = "/admin/api-keys", items = "/api_keys", name = "/name", '
            'id = "/key_id" }',
        },
        {
            "name": '"secrets"',
            "type": '"http"',
            "provider": '"acme"',
            "create": '{ path = "/apps/{client_id}/rotate", value = "/client_secret", '
            'id = "/secret_id" }',
            "revoke": '{ path = "/apps/{client_id}/secrets/{key_id}" }',
        },
        {"name": '"script"', "type": '"exec"', "command": '["/usr/local/bin/rotate", "-v"]'},
        {"name": '"person"', "type": '"manual"'},
    ]
    credentials = doc["credentials"]
    assert isinstance(credentials, list)
    credentials[0]["rotation"] = '{ max_age = "90d", rotator = "secrets" }'
    credentials.append(
        {
            "name": '"reporting-key"',
            "provider": '"acme"',
            "kind": '"api_key"',
            "publish_to": '"apps/reporting/key"',
            "probe": '"/v1/users"',
            "rotation": '{ max_age = "30d", rotator = "sandbox-keys" }',
        }
    )
    return doc


def test_rotation_base_is_valid() -> None:
    config = parse_config(render(rotation_base()), SOURCE, {})
    assert list(config.rotators) == ["sandbox-keys", "secrets", "script", "person"]
    assert [c.kind for c in config.credentials] == ["oauth_client", "api_key"]


R = 'rotators["sandbox-keys"]'
X = 'rotators["script"]'
KEY = 'credentials["reporting-key"]'
CREATE = 'value = "/key", id = "/key_id"'
ALLOWED = "{credential}, {rotation_id}, {key_name}, {client_id}"

ROTATION_CASES: list[tuple[str, str | None, str, str]] = [
    # [[rotators]]: every type
    ("rotators", '{ name = "x" }', "rotators", "got a table; expected an array of tables"),
    ("rotators[0].name", '"Keys"', "rotators[0].name", 'got "Keys"; expected a name of lowercase'),
    ("rotators[0].type", None, f"{R}.type", 'missing; expected one of "http", "exec", "manual"'),
    ("rotators[0].type", '"ftp"', f"{R}.type", 'got "ftp"; expected one of "http", "exec", "m'),
    # type = "http"
    (
        "rotators[0].provider",
        '"acm"',
        f"{R}.provider",
        'no provider is named "acm"; expected one of: "acme"',
    ),
    ("rotators[0].provider", None, f"{R}.provider", "missing; expected a name of lowercase"),
    ("rotators[0].auth", '"hunter2"', f"{R}.auth", "got an inline secret, which is not allowed"),
    ("rotators[0].auth", '"env:"', f"{R}.auth", "malformed reference (env: needs"),
    ("rotators[0].auth_scheme", '"Bear er"', f"{R}.auth_scheme", "expected an HTTP auth scheme"),
    (
        "rotators[0].command",
        '["x"]',
        f"{R}.command",
        'unknown key for type "http"; expected one of: name, type, provider, auth, auth_scheme, '
        "create, revoke, find",
    ),
    (
        "rotators[0].create",
        None,
        f"{R}.create",
        "missing; expected a table, e.g. create = { path = ",
    ),
    ("rotators[0].revoke", None, f"{R}.revoke", "missing; expected a table, e.g. revoke = {"),
    ("rotators[0].create", '"POST /keys"', f"{R}.create", 'got "POST /keys"; expected a table'),
    (
        "rotators[0].create",
        f"{{ {CREATE} }}",
        f"{R}.create.path",
        'missing; expected a path starting with "/"',
    ),
    (
        "rotators[0].create",
        f'{{ path = "keys", {CREATE} }}',
        f"{R}.create.path",
        'got "keys"; expected a path starting with "/"',
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys/{{name}}", {CREATE} }}',
        f"{R}.create.path",
        f"unknown placeholder {{name}}; expected placeholders among {ALLOWED}",
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys/{{key_id}}", {CREATE} }}',
        f"{R}.create.path",
        f"{{key_id}} is known only to revoke; expected placeholders among {ALLOWED}",
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys/{{", {CREATE} }}',
        f"{R}.create.path",
        'which has a "{" or "}" outside a {placeholder}',
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys", body = \'{{"n": "{{nme}}"}}\', {CREATE} }}',
        f"{R}.create.body",
        "unknown placeholder {nme}",
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys", body = \'{{"n": {{key_name}}}}\', {CREATE} }}',
        f"{R}.create.body",
        "not JSON once its placeholders are filled with a string (Expecting value); expected a "
        "JSON text",
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys", body = \'{{"n": "x",}}\', {CREATE} }}',
        f"{R}.create.body",
        "not JSON once its placeholders are filled",
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys", body = 5, {CREATE} }}',
        f"{R}.create.body",
        "got an integer; expected a JSON text",
    ),
    (
        "rotators[0].create",
        '{ path = "/keys", id = "/key_id" }',
        f"{R}.create.value",
        "missing; expected a JSON pointer (RFC 6901) to the new key's value",
    ),
    (
        "rotators[0].create",
        '{ path = "/keys", value = "key", id = "/key_id" }',
        f"{R}.create.value",
        'got "key" (a JSON pointer is "" or starts with "/"); expected a JSON pointer',
    ),
    (
        "rotators[0].create",
        '{ path = "/keys", value = "", id = "/key_id" }',
        f"{R}.create.value",
        "got an empty string; expected a JSON pointer",
    ),
    (
        "rotators[0].create",
        '{ path = "/keys", value = "/a~2", id = "/key_id" }',
        f"{R}.create.value",
        '"~" must be followed by 0 or 1',
    ),
    (
        "rotators[0].create",
        '{ path = "/keys", value = "/key" }',
        f"{R}.create.id",
        'missing; expected a JSON pointer (RFC 6901) to the new key\'s id, e.g. "/key_id" '
        "(revoke needs it)",
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys", method = "FETCH", {CREATE} }}',
        f"{R}.create.method",
        'got "FETCH"; expected one of "GET", "POST", "PUT", "PATCH", "DELETE"',
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys", ok_status = [], {CREATE} }}',
        f"{R}.create.ok_status",
        "got an array; expected a non-empty array of HTTP statuses",
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys", ok_status = [200, 99], {CREATE} }}',
        f"{R}.create.ok_status",
        "got 99 in the array; expected a non-empty array of HTTP statuses",
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys", ok_status = [true], {CREATE} }}',
        f"{R}.create.ok_status",
        "got true in the array",
    ),
    (
        "rotators[0].create",
        f'{{ path = "/keys", values = "/k", {CREATE} }}',
        f"{R}.create.values",
        'unknown key for create; did you mean "value"?',
    ),
    (
        "rotators[0].revoke",
        '{ path = "/admin/api-keys" }',
        f"{R}.revoke.path",
        "names no key; expected {key_id} in revoke's path or body",
    ),
    (
        "rotators[0].revoke",
        '{ path = "/keys/{key_id}", value = "/x" }',
        f"{R}.revoke.value",
        "unknown key for revoke; expected one of: method, path, body, ok_status",
    ),
    (
        "rotators[0].revoke",
        '{ path = "/keys/{key}" }',
        f"{R}.revoke.path",
        f"unknown placeholder {{key}}; expected placeholders among {ALLOWED}, {{key_id}}",
    ),
    (
        "rotators[0].find",
        '{ path = "/k", name = "/name", id = "/id" }',
        f"{R}.find.items",
        "missing; expected a JSON pointer (RFC 6901) to the array of keys",
    ),
    (
        "rotators[0].find",
        '{ path = "/k/{key_id}", items = "", name = "/name", id = "/id" }',
        f"{R}.find.path",
        "{key_id} is known only to revoke",
    ),
    (
        "rotators[0].find",
        '{ path = "/k", items = "/k", name = "", id = "/id" }',
        f"{R}.find.name",
        "got an empty string; expected a JSON pointer (RFC 6901) to a key's name",
    ),
    (
        "rotators[0].find",
        '{ path = "/k", items = "/k", name = "/n", id = "/id", body = "{}" }',
        f"{R}.find.body",
        "unknown key for find; expected one of: method, path, items, name, id",
    ),
    ("rotators[0].find", "[]", f"{R}.find", "got an array; expected a table"),
    # type = "exec"
    ("rotators[2].command", None, f"{X}.command", "missing; expected a non-empty array of str"),
    ("rotators[2].command", "[]", f"{X}.command", "got an array; expected a non-empty array"),
    ("rotators[2].command", '"rotate"', f"{X}.command", 'got "rotate"; expected a non-empty'),
    (
        "rotators[2].command",
        '["bin/rotate"]',
        f"{X}.command",
        'got "bin/rotate" as the program, a relative path; expected a non-empty array',
    ),
    ("rotators[2].command", '["/x", 3]', f"{X}.command", "got 3 in the array; expected"),
    ("rotators[2].command", '["/x", ""]', f"{X}.command", "got an empty string in the array"),
    ("rotators[2].timeout", "0", f"{X}.timeout", "out of range; expected a duration greater than"),
    (
        "rotators[2].provider",
        '"acme"',
        f"{X}.provider",
        'unknown key for type "exec"; expected one of: name, type, command, timeout',
    ),
    # type = "manual"
    (
        "rotators[3].command",
        '["/x"]',
        'rotators["person"].command',
        'unknown key for type "manual"; expected one of: name, type',
    ),
    # an api_key credential
    (
        "credentials[1].rotation",
        None,
        f"{KEY}.rotation",
        'missing; expected a table, e.g. rotation = { max_age = "30d", rotator = "acme-keys" }',
    ),
    ("credentials[1].rotation", "5", f"{KEY}.rotation", "got 5; expected a table, e.g. rotation"),
    ("credentials[1].probe", None, f"{KEY}.probe", 'missing; expected a path starting with "/"'),
    (
        "credentials[1].client_id",
        '"app"',
        f"{KEY}.client_id",
        'not allowed for kind "api_key", which has no OAuth client and no token to refresh; '
        'expected it only with kind = "oauth_client"',
    ),
    ("credentials[1].client_secret", '"env:S"', f"{KEY}.client_secret", "not allowed for kind"),
    ("credentials[1].scope", '"read"', f"{KEY}.scope", 'not allowed for kind "api_key"'),
    ("credentials[1].refresh", "{ at = 0.5 }", f"{KEY}.refresh", 'not allowed for kind "api_k'),
    ("credentials[1].initial_key", '"sk-live-1"', f"{KEY}.initial_key", "got an inline secret"),
    (
        "credentials[1].initial_key_id",
        '"key_1"',
        f"{KEY}.initial_key_id",
        "is set without initial_key; expected initial_key",
    ),
    ("credentials[1].initial_key_id", "7", f"{KEY}.initial_key_id", "got 7; expected the provid"),
    # rotation
    (
        "credentials[1].rotation",
        '{ rotator = "sandbox-keys" }',
        f"{KEY}.rotation.max_age",
        "missing; expected a duration between 1s and 3650d",
    ),
    (
        "credentials[1].rotation",
        '{ max_age = "500ms", rotator = "sandbox-keys" }',
        f"{KEY}.rotation.max_age",
        'got "500ms", which is out of range; expected a duration between 1s and 3650d',
    ),
    (
        "credentials[1].rotation",
        '{ max_age = "a month", rotator = "sandbox-keys" }',
        f"{KEY}.rotation.max_age",
        'got "a month" (not a duration)',
    ),
    (
        "credentials[1].rotation",
        '{ max_age = "30d", grace = "-1s", rotator = "sandbox-keys" }',
        f"{KEY}.rotation.grace",
        "must not be negative",
    ),
    (
        "credentials[1].rotation",
        '{ max_age = "1h", grace = "1h", rotator = "sandbox-keys" }',
        f"{KEY}.rotation.grace",
        "is not shorter than max_age (3600s); expected a grace shorter than max_age",
    ),
    (
        "credentials[1].rotation",
        '{ max_age = "30d" }',
        f"{KEY}.rotation.rotator",
        "missing; expected a name of lowercase",
    ),
    (
        "credentials[1].rotation",
        '{ max_age = "30d", rotator = "sandbox-key" }',
        f"{KEY}.rotation.rotator",
        'no rotator is named "sandbox-key"; expected one of: "sandbox-keys", "secrets", '
        '"script", "person"',
    ),
    (
        "credentials[1].rotation",
        '{ max_age = "30d", rotator = "sandbox-keys", verify_attempts = 0 }',
        f"{KEY}.rotation.verify_attempts",
        "got 0, which is out of range; expected an integer between 1 and 100",
    ),
    (
        "credentials[1].rotation",
        '{ max_age = "30d", rotator = "sandbox-keys", maxage = 1 }',
        f"{KEY}.rotation.maxage",
        'unknown key; did you mean "max_age"?',
    ),
    (
        "credentials[1].rotation",
        '{ max_age = "30d", rotator = "secrets" }',
        f"{KEY}.rotation.rotator",
        '"secrets" uses {client_id}, which an api_key credential does not have; expected a '
        "rotator whose templates do not use {client_id}",
    ),
    (
        "credentials[0].rotation",
        '{ max_age = "90d", rotator = "person" }',
        f"{CRED}.rotation.rotator",
        '"person" is a manual rotator, which cannot rotate an oauth_client\'s secret; expected '
        'an "http" or "exec" rotator',
    ),
    (
        "credentials[0].rotation",
        '{ max_age = "90d", rotator = "nobody" }',
        f"{CRED}.rotation.rotator",
        'no rotator is named "nobody"',
    ),
    # a kind that is not valid: only that is reported, whatever keys the entry has
    ("credentials[1].kind", '"key"', f"{KEY}.kind", 'got "key"; expected one of "oauth_client"'),
]


@pytest.mark.parametrize(
    ("target", "value", "where", "message"),
    ROTATION_CASES,
    ids=[f"{c[0]}={c[1]}" for c in ROTATION_CASES],
)
def test_one_bad_rotation_value_gives_one_problem(
    target: str, value: str | None, where: str, message: str
) -> None:
    problems = problems_of(change(target, value, rotation_base))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{SOURCE}: {where}: "), problems[0]
    assert message in problems[0], problems[0]


def test_a_rotator_with_a_bad_type_still_counts_as_declared() -> None:
    """A rotation naming a rotator whose entry has a mistake gets no second, bogus error."""
    problems = problems_of(change("rotators[0].type", '"htp"', rotation_base))
    assert len(problems) == 1
    assert f"{R}.type" in problems[0]


# -- publish_to and state_prefix: no app may read keyturn's private records ----------------------


def with_state_prefix(prefix: str, *publish_to: str) -> Doc:
    doc = change("keyturn.state_prefix", json.dumps(prefix))
    credentials = doc["credentials"]
    assert isinstance(credentials, list)
    template = credentials[0]
    credentials[:] = [
        dict(template, name=f'"app{i}"', publish_to=json.dumps(path))
        for i, path in enumerate(publish_to)
    ]
    return doc


PRIVATE = "keyturn's private records, which no app may read; expected a path outside"


@pytest.mark.parametrize(
    ("prefix", "publish_to", "relation"),
    [
        ("keyturn/state", "keyturn/state", "is keyturn.state_prefix, "),
        ("keyturn/state", "keyturn/state/app0", 'is under keyturn.state_prefix "keyturn/state", '),
        ("keyturn/state", "keyturn/state/a/b/c", 'is under keyturn.state_prefix "keyturn/state", '),
        (
            "keyturn/state",
            "keyturn",
            'is above keyturn.state_prefix "keyturn/state" (a prefix of it), ',
        ),
        (
            "ops/keyturn/private",
            "ops/keyturn",
            'is above keyturn.state_prefix "ops/keyturn/private" (a prefix of it), ',
        ),
        ("apps", "apps/reporting/acme", 'is under keyturn.state_prefix "apps", '),
    ],
)
def test_publish_to_may_not_overlap_state_prefix(
    prefix: str, publish_to: str, relation: str
) -> None:
    problems = problems_of(with_state_prefix(prefix, publish_to))
    assert problems == [
        f'{SOURCE}: credentials["app0"].publish_to: "{publish_to}" {relation}{PRIVATE} '
        'keyturn.state_prefix and not a prefix of it (paths compare by "/" segments)'
    ]


def test_paths_are_compared_by_segments_not_by_text() -> None:
    doc = with_state_prefix(
        "keyturn/state",
        "keyturn/statefoo",
        "keyturn/stat",
        "keyturn/state-app/x",
        "keyturnx/state",
        "apps/keyturn/state",
        "Keyturn/State",  # Vault paths are case-sensitive
    )
    config = parse_config(render(doc), SOURCE, {})
    assert len(config.credentials) == 6


def test_every_overlapping_publish_to_is_reported_at_once() -> None:
    doc = with_state_prefix("apps/team", "apps", "apps/team/a", "apps/other", "apps/team")
    problems = problems_of(doc)
    assert [line.split(": ")[1] for line in problems] == [
        'credentials["app0"].publish_to',
        'credentials["app1"].publish_to',
        'credentials["app3"].publish_to',
    ]


def test_a_state_prefix_override_is_checked_against_publish_to() -> None:
    problems = problems_of(base(), {"KEYTURN_KEYTURN_STATE_PREFIX": "apps/reporting"})
    assert problems == [
        f'{SOURCE}: {CRED}.publish_to: "apps/reporting/acme" is under keyturn.state_prefix '
        f'"apps/reporting", {PRIVATE} keyturn.state_prefix and not a prefix of it (paths '
        'compare by "/" segments)'
    ]


# -- HTTP paths stay on the provider's base_url --------------------------------------------------

PATH_EXPECTED = (
    'expected a path starting with "/", relative to the provider\'s base_url, e.g. '
    '"/oauth/token": no scheme or "//host", no "." or ".." segment, no backslash, spaces, '
    "control characters or #fragment"
)
BAD_PATHS: list[tuple[str, str]] = [
    ("/v1/../admin", ', which has a "." or ".." segment'),
    ("/v1/..", ', which has a "." or ".." segment'),
    ("/..", ', which has a "." or ".." segment'),
    ("/./oauth/token", ', which has a "." or ".." segment'),
    ("/v1/%2e%2e/admin", ', which has a "." or ".." segment'),
    ("/v1/.%2E/admin", ', which has a "." or ".." segment'),
    ("/v1/users/..?x=1", ', which has a "." or ".." segment'),
    ("http://evil.example/oauth/token", ", which has a scheme (a full URL)"),
    ("https://evil.example/oauth/token", ", which has a scheme (a full URL)"),
    ("javascript:alert(1)", ", which has a scheme (a full URL)"),
    ("//evil.example/oauth/token", ', which names a host ("//")'),
    ("/\\evil.example/oauth/token", ", which has a backslash"),
    ("/v1\\..\\admin", ", which has a backslash"),
    ("/v1/us ers", ", which has spaces or control characters"),
    ("/v1/users\u0000", ", which has spaces or control characters"),
    ("/v1/users\r\nX-Injected: 1", ", which has spaces or control characters"),
    ("/v1/users\u0085", ", which has spaces or control characters"),
    ("/v1/users\u2028", ", which has spaces or control characters"),
    ("/v1/users\u007f", ", which has spaces or control characters"),
    ("/v1/users#top", ", which has a #fragment"),
    ("v1/users", ""),
]
# (target, how to set the path, where the problem is, a rotation base or not)
PATH_KEYS: list[tuple[str, str, str, bool]] = [
    ("providers[0].token_path", "{}", f"{ACME}.token_path", False),
    ("providers[0].revoke_path", "{}", f"{ACME}.revoke_path", False),
    ("credentials[0].probe", "{}", f"{CRED}.probe", False),
    ("credentials[1].probe", "{}", f"{KEY}.probe", True),
    ("rotators[0].create", f"{{{{ path = {{}}, {CREATE} }}}}", f"{R}.create.path", True),
    ("rotators[0].revoke", "{{ path = {} }}", f"{R}.revoke.path", True),
    (
        "rotators[0].find",
        '{{ path = {}, items = "/api_keys", name = "/name", id = "/key_id" }}',
        f"{R}.find.path",
        True,
    ),
]


@pytest.mark.parametrize(("path", "reason"), BAD_PATHS, ids=[repr(p) for p, _ in BAD_PATHS])
@pytest.mark.parametrize(
    ("target", "literal", "where", "rotation"), PATH_KEYS, ids=[k[0] for k in PATH_KEYS]
)
def test_a_path_that_could_leave_the_base_url_is_refused(
    target: str, literal: str, where: str, rotation: bool, path: str, reason: str
) -> None:
    value = literal.format(json.dumps(path))
    problems = problems_of(change(target, value, rotation_base if rotation else base))
    assert len(problems) == 1, problems
    line = problems[0]
    assert line.startswith(f"{SOURCE}: {where}: got {json.dumps(path)}{reason}; expected "), line
    assert 'a path starting with "/"' in line
    assert "\n" not in line and "\r" not in line and "\x00" not in line


def test_the_path_rule_names_everything_it_refuses() -> None:
    problems = problems_of(change("providers[0].token_path", '"//evil.example/t"'))
    assert problems == [
        f'{SOURCE}: {ACME}.token_path: got "//evil.example/t", which names a host ("//"); '
        f"{PATH_EXPECTED}"
    ]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/users",
        "/oauth/token?api-version=2",
        "/.well-known/openid-configuration",
        "/v1/..x/y",
        "/v1/x../y",
        "/v1/.../y",
        "/v1/users/",
        "/api/v1/caf\u00e9",
        "/",
    ],
)
def test_ordinary_paths_are_accepted(path: str) -> None:
    doc = change("providers[0].token_path", json.dumps(path))
    credentials = doc["credentials"]
    assert isinstance(credentials, list)
    credentials[0]["probe"] = json.dumps(path)
    config = parse_config(render(doc), SOURCE, {})
    assert config.providers["acme"].token_path == path
    assert config.credentials[0].probe == path


def test_every_bad_path_is_reported_at_once() -> None:
    doc = change("providers[0].token_path", '"/a/../b"', rotation_base)
    doc = change("providers[0].revoke_path", '"http://x.example/r"', lambda: doc)
    doc = change("credentials[0].probe", '"/\\\\x"', lambda: doc)
    doc = change("rotators[0].revoke", '{ path = "/keys/../{key_id}" }', lambda: doc)
    wheres = [line.split(": ")[1] for line in problems_of(doc)]
    assert wheres == [
        f"{ACME}.token_path",
        f"{ACME}.revoke_path",
        f"{R}.revoke.path",
        f"{CRED}.probe",
    ]


def test_an_override_path_is_checked_like_the_file() -> None:
    environ = {"KEYTURN_PROVIDERS_ACME_TOKEN_PATH": "/oauth/../admin/token"}
    assert problems_of(base(), environ) == [
        f"{SOURCE}: environment KEYTURN_PROVIDERS_ACME_TOKEN_PATH: {ACME}.token_path: got "
        f'"/oauth/../admin/token", which has a "." or ".." segment; {PATH_EXPECTED}'
    ]


# -- every number has a range, and the message states it --------------------------------------

HUGE = "9" * 400  # a TOML integer beyond any float
RANGE_CASES: list[tuple[str, str, str, str]] = [
    # (what to change, new TOML literal, where, the end of the problem line)
    (
        "keyturn.max_concurrency",
        "10001",
        "keyturn.max_concurrency",
        "got 10001, which is out of range; expected an integer between 1 and 10000",
    ),
    (
        "keyturn.max_concurrency",
        "100000000000000000000000000000",
        "keyturn.max_concurrency",
        "got an integer of more than 20 digits, which is out of range; expected an integer between "
        "1 and 10000",
    ),
    (
        "keyturn.vault_concurrency",
        "1001",
        "keyturn.vault_concurrency",
        "got 1001, which is out of range; expected an integer between 1 and 1000",
    ),
    (
        "keyturn.shutdown_timeout",
        '"2h"',
        "keyturn.shutdown_timeout",
        'got "2h", which is out of range; expected a duration greater than zero, at most 1h',
    ),
    (
        "keyturn.watch_interval",
        '"500ms"',
        "keyturn.watch_interval",
        'got "500ms", which is out of range; expected 0 (off), or a duration between 1s and 7d',
    ),
    (
        "keyturn.watch_interval",
        '"8d"',
        "keyturn.watch_interval",
        'got "8d", which is out of range; expected 0 (off), or a duration between 1s and 7d',
    ),
    (
        "vault.timeout",
        '"100000000000d"',
        "vault.timeout",
        'got "100000000000d", which is out of '
        "range; expected a duration greater than zero, at most 1h",
    ),
    (
        "vault.timeout",
        HUGE,
        "vault.timeout",
        "got an integer of more than 20 digits (a duration "
        f"must be finite); expected a duration greater than zero, at most 1h: {DURATION_HELP}",
    ),
    (
        "vault.renew_margin",
        "1e308",
        "vault.renew_margin",
        "got 1e+308, which is out of range; expected a duration between 0s and 365d",
    ),
    (
        "vault.renew_margin",
        "inf",
        "vault.renew_margin",
        "got inf (a duration must be finite); "
        f"expected a duration between 0s and 365d: {DURATION_HELP}",
    ),
    (
        "vault.renew_margin",
        "nan",
        "vault.renew_margin",
        "got nan (a duration must be finite); "
        f"expected a duration between 0s and 365d: {DURATION_HELP}",
    ),
    (
        "providers[0].timeout",
        '"1h1s"',
        f"{ACME}.timeout",
        'got "1h1s", which is out of range; expected a duration greater than zero, at most 1h',
    ),
    (
        "providers[0].max_connections",
        "100000",
        f"{ACME}.max_connections",
        "got 100000, which is out of range; expected an integer between 1 and 10000",
    ),
    (
        "providers[0].rate_limit",
        "1e308",
        f"{ACME}.rate_limit",
        "got 1e+308, which is out of "
        "range; expected a number of requests per second greater than zero, at most 10000",
    ),
    (
        "providers[0].rate_limit",
        "inf",
        f"{ACME}.rate_limit",
        "got inf; expected a number of requests per second greater than zero, at most 10000",
    ),
    (
        "providers[0].rate_limit",
        HUGE,
        f"{ACME}.rate_limit",
        "got an integer of more than 20 "
        "digits; expected a number of requests per second greater than zero, at most 10000",
    ),
    (
        "providers[0].default_lifetime",
        '"366d"',
        f"{ACME}.default_lifetime",
        'got "366d", which is out of range; expected a duration greater than zero, at most 365d',
    ),
    (
        "providers[0].max_response_bytes",
        "1e14",
        f"{ACME}.max_response_bytes",
        "got 100000000000000.0; expected an integer between 1024 and 67108864 (1 KiB to 64 MiB)",
    ),
    (
        "providers[0].max_response_bytes",
        "67108865",
        f"{ACME}.max_response_bytes",
        "got 67108865, "
        "which is out of range; expected an integer between 1024 and 67108864 (1 KiB to 64 MiB)",
    ),
    (
        "credentials[0].refresh",
        "{ margin = 1e308 }",
        f"{CRED}.refresh.margin",
        "got 1e+308, which is out of range; expected a duration between 0s and 365d",
    ),
    (
        "credentials[0].refresh",
        '{ min_interval = "400d" }',
        f"{CRED}.refresh.min_interval",
        'got "400d", which is out of range; expected a duration greater than zero, at most 365d',
    ),
    (
        "credentials[0].refresh",
        "{ at = nan }",
        f"{CRED}.refresh.at",
        "got nan; expected a fraction between 0 and 1 (exclusive)",
    ),
    (
        "credentials[0].refresh",
        "{ jitter = inf }",
        f"{CRED}.refresh.jitter",
        "got inf; expected a fraction >= 0 and < 0.5",
    ),
    (
        "credentials[0].backoff",
        '{ max = "100000000000d" }',
        f"{CRED}.backoff.max",
        'got "100000000000d", which is out of range; expected a duration greater than zero, at '
        "most 1d",
    ),
    (
        "credentials[0].backoff",
        '{ initial = "2d", max = "1d" }',
        f"{CRED}.backoff.initial",
        'got "2d", which is out of range; expected a duration greater than zero, at most 1d',
    ),
    (
        "credentials[0].backoff",
        "{ multiplier = 1e308 }",
        f"{CRED}.backoff.multiplier",
        "got 1e+308, which is out of range; expected a number between 1 and 10",
    ),
    (
        "credentials[0].backoff",
        "{ multiplier = -inf }",
        f"{CRED}.backoff.multiplier",
        "got -inf; expected a number between 1 and 10",
    ),
]


@pytest.mark.parametrize(
    ("target", "value", "where", "line"),
    RANGE_CASES,
    ids=[f"{c[0]}={c[1][:20]}" for c in RANGE_CASES],
)
def test_a_value_out_of_range_is_refused_with_the_range(
    target: str, value: str, where: str, line: str
) -> None:
    assert problems_of(change(target, value)) == [f"{SOURCE}: {where}: {line}"]


ROTATION_RANGE_CASES: list[tuple[str, str, str, str]] = [
    (
        "credentials[1].rotation",
        '{ max_age = "3651d", rotator = "sandbox-keys" }',
        f"{KEY}.rotation.max_age",
        'got "3651d", which is out of range; expected a duration between 1s and 3650d',
    ),
    (
        "credentials[1].rotation",
        '{ max_age = 1e308, rotator = "sandbox-keys" }',
        f"{KEY}.rotation.max_age",
        "got 1e+308, which is out of range; expected a duration between 1s and 3650d",
    ),
    (
        "credentials[1].rotation",
        '{ max_age = "3650d", grace = "366d", rotator = "sandbox-keys" }',
        f"{KEY}.rotation.grace",
        'got "366d", which is out of range; expected a duration between 0s and 365d',
    ),
    (
        "credentials[1].rotation",
        '{ max_age = "30d", rotator = "sandbox-keys", verify_attempts = 101 }',
        f"{KEY}.rotation.verify_attempts",
        "got 101, which is out of range; expected an integer between 1 and 100",
    ),
    (
        "rotators[2].timeout",
        '"1h0m0s1ms"',
        f"{X}.timeout",
        'got "1h0m0s1ms", which is out of range; expected a duration greater than zero, at most 1h',
    ),
]


@pytest.mark.parametrize(
    ("target", "value", "where", "line"),
    ROTATION_RANGE_CASES,
    ids=[c[2] for c in ROTATION_RANGE_CASES],
)
def test_a_rotation_value_out_of_range_is_refused_with_the_range(
    target: str, value: str, where: str, line: str
) -> None:
    assert problems_of(change(target, value, rotation_base)) == [f"{SOURCE}: {where}: {line}"]


def test_every_value_out_of_range_is_reported_at_once() -> None:
    doc = change("vault.timeout", '"100000000000d"')
    doc = change("keyturn.max_concurrency", "0", lambda: doc)
    doc = change("providers[0].max_response_bytes", "1e14", lambda: doc)
    doc = change("credentials[0].refresh", "{ margin = 1e308 }", lambda: doc)
    doc = change(
        "credentials[0].backoff", '{ max = "100000000000d", multiplier = nan }', lambda: doc
    )
    wheres = sorted(line.split(": ")[1] for line in problems_of(doc))
    assert wheres == sorted(
        [
            "vault.timeout",
            "keyturn.max_concurrency",
            f"{ACME}.max_response_bytes",
            f"{CRED}.refresh.margin",
            f"{CRED}.backoff.max",
            f"{CRED}.backoff.multiplier",
        ]
    )


def test_the_bounds_themselves_are_accepted() -> None:
    doc = rotation_base()
    doc["keyturn"] = {
        "max_concurrency": "10000",
        "vault_concurrency": "1000",
        "shutdown_timeout": '"1h"',
        "watch_interval": '"7d"',
    }
    doc = change("vault.timeout", '"1h"', lambda: doc)
    doc = change("vault.renew_margin", '"365d"', lambda: doc)
    acme = {
        "timeout": '"1h"',
        "max_connections": "10000",
        "rate_limit": "10000",
        "default_lifetime": '"365d"',
        "max_response_bytes": "67108864",
    }
    providers = doc["providers"]
    assert isinstance(providers, list)
    providers[0].update(acme)
    credentials = doc["credentials"]
    assert isinstance(credentials, list)
    credentials[0]["refresh"] = '{ margin = "365d", min_interval = "365d" }'
    credentials[0]["backoff"] = '{ initial = "1d", max = "1d", multiplier = 10 }'
    credentials[1]["rotation"] = (
        '{ max_age = "3650d", grace = "365d", rotator = "sandbox-keys", verify_attempts = 100 }'
    )
    rotators = doc["rotators"]
    assert isinstance(rotators, list)
    rotators[2]["timeout"] = '"1h"'
    config = parse_config(render(doc), SOURCE, {})
    assert config.keyturn.watch_interval == 7 * 86400
    assert config.providers["acme"].max_response_bytes == 64 * 1024 * 1024
    assert config.credentials[1].rotation is not None
    assert config.credentials[1].rotation.max_age == 3650 * 86400
    # and the lower bounds
    doc = change("keyturn", None, lambda: doc)
    doc["keyturn"] = {"max_concurrency": "1", "vault_concurrency": "1", "watch_interval": "0"}
    providers[0].update({"max_connections": "1", "max_response_bytes": "1024"})
    credentials[0]["backoff"] = '{ initial = "1ms", max = "1ms", multiplier = 1 }'
    credentials[1]["rotation"] = '{ max_age = "1s", grace = 0, rotator = "sandbox-keys" }'
    config = parse_config(render(doc), SOURCE, {})
    assert config.keyturn.watch_interval == 0
    assert config.providers["acme"].max_response_bytes == 1024


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        (
            "KEYTURN_VAULT_TIMEOUT",
            "100000000000d",
            'vault.timeout: got "100000000000d", which is out of range; expected a duration '
            "greater than zero, at most 1h",
        ),
        (
            "KEYTURN_PROVIDERS_ACME_MAX_RESPONSE_BYTES",
            "99999999999999999999999999999",
            f"{ACME}.max_response_bytes: got an integer of more than 20 digits, which is out of "
            "range; expected an integer between 1024 and 67108864 (1 KiB to 64 MiB)",
        ),
        (
            "KEYTURN_PROVIDERS_ACME_MAX_RESPONSE_BYTES",
            "1e14",
            f'{ACME}.max_response_bytes: got "1e14"; expected an integer between 1024 and '
            "67108864 (1 KiB to 64 MiB)",
        ),
        (
            "KEYTURN_CREDENTIALS_REPORTING_BACKOFF_MULTIPLIER",
            "1e400",
            f'{CRED}.backoff.multiplier: got "1e400"; expected a number between 1 and 10',
        ),
    ],
)
def test_an_override_out_of_range_is_refused_with_the_range(
    variable: str, value: str, line: str
) -> None:
    assert problems_of(base(), {variable: value}) == [f"{SOURCE}: environment {variable}: {line}"]


def test_an_integer_too_long_to_read_is_one_line() -> None:
    text = render(change("keyturn.max_concurrency", "9" * 5000))
    with pytest.raises(ConfigError) as caught:
        parse_config(text, SOURCE, {})
    assert caught.value.problems == [
        f"{SOURCE}: invalid TOML: a number too long to read; expected a TOML document"
    ]
