"""Valid rotation configurations: `[[rotators]]` of each type, `api_key` credentials, a
credential's `rotation`, their defaults and overrides, the worked example in the docs, the
template and JSON-pointer helpers, and that no secret reaches a ConfigError.

Bad values, one problem each, are in test_config_errors.py."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import MappingProxyType

import pytest

from keyturn.config import load_config, parse_config
from keyturn.config.credentials import ApiKeyCredential, RotationPolicy
from keyturn.config.schema import (
    ExecRotatorConfig,
    HttpCall,
    HttpFind,
    HttpRotatorConfig,
    ManualRotatorConfig,
)
from keyturn.config.templates import (
    body_problem,
    pointer_tokens,
    render_body,
    render_path,
    resolve_pointer,
)
from keyturn.errors import ConfigError
from keyturn.references import SecretRef
from keyturn_devkit.harness.configs import VAULT

REPO = Path(__file__).resolve().parents[2]


MINIMAL = (
    VAULT
    + """
[[providers]]
name = "acme"
base_url = "https://acme.example.com"

[[rotators]]
name = "acme-keys"
type = "http"
provider = "acme"
create = { path = "/keys", value = "/key", id = "/id" }
revoke = { path = "/keys/{key_id}" }

[[rotators]]
name = "script"
type = "exec"
command = ["rotate-acme"]

[[rotators]]
name = "person"
type = "manual"

[[credentials]]
name = "reporting-key"
provider = "acme"
kind = "api_key"
publish_to = "apps/reporting/key"
probe = "/v1/users"
rotation = { max_age = "30d", rotator = "acme-keys" }
"""
)


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "k.toml", environ or {})
    return caught.value.problems


def docs_example() -> str:
    """The TOML block of the docs' worked example for the sandbox's admin API."""
    docs = (REPO / "docs" / "configuration.md").read_text()
    section = docs.split("### Worked example: the sandbox's admin API", 1)[1]
    match = re.search(r"```toml\n(.*?)```", section, re.S)
    assert match, "the worked example has no TOML block"
    return match[1]


SANDBOX_KEYS = HttpRotatorConfig(
    name="sandbox-keys",
    provider="sandbox",
    auth=SecretRef.env("SANDBOX_ADMIN_TOKEN"),
    create=HttpCall(
        method="POST",
        path="/admin/api-keys",
        body='{"name": "{key_name}", "description": "rotated by keyturn"}',
        value="/key",
        id="/key_id",
    ),
    revoke=HttpCall(method="DELETE", path="/admin/api-keys/{key_id}"),
    find=HttpFind(
        method="GET", path="/admin/api-keys", items="/api_keys", name="/name", id="/key_id"
    ),
)
SANDBOX_SECRETS = HttpRotatorConfig(
    name="sandbox-client-secrets",
    provider="sandbox",
    auth=SecretRef.env("SANDBOX_ADMIN_TOKEN"),
    create=HttpCall(
        method="POST",
        path="/admin/oauth-apps/{client_id}/rotate-secret",
        body='{"overlap_seconds": 86400}',
        value="/client_secret",
        id="/secret_id",
    ),
    revoke=HttpCall(method="DELETE", path="/admin/oauth-apps/{client_id}/secrets/{key_id}"),
)


def test_the_docs_worked_example_for_the_sandbox_loads_as_written() -> None:
    config = parse_config(VAULT + docs_example(), "k.toml", {})
    assert dict(config.rotators) == {
        "sandbox-keys": SANDBOX_KEYS,
        "sandbox-client-secrets": SANDBOX_SECRETS,
    }
    key, client = config.credentials
    assert key == ApiKeyCredential(
        name="reporting-key",
        provider="sandbox",
        kind="api_key",
        client_id=None,
        client_secret=None,
        publish_to="apps/reporting/sandbox-key",
        probe="/v1/users",
        rotation=RotationPolicy(max_age=30 * 86400.0, rotator="sandbox-keys", grace=3600.0),
        initial_key=SecretRef.env("SANDBOX_API_KEY"),
    )
    assert client.kind == "oauth_client"
    assert client.rotation == RotationPolicy(max_age=90 * 86400.0, rotator="sandbox-client-secrets")
    assert config.rotator_of(key) is config.rotators["sandbox-keys"]
    assert config.rotator_of(client) is config.rotators["sandbox-client-secrets"]


def test_defaults_of_rotators_and_rotation() -> None:
    config = parse_config(MINIMAL, "k.toml", {})
    assert config.rotators["acme-keys"] == HttpRotatorConfig(
        name="acme-keys",
        provider="acme",
        auth=None,
        auth_scheme="Bearer",
        create=HttpCall(
            path="/keys",
            method="POST",
            body=None,
            value="/key",
            id="/id",
            ok_status=(200, 201, 202, 204),
        ),
        revoke=HttpCall(
            path="/keys/{key_id}",
            method="DELETE",
            body=None,
            value=None,
            id=None,
            ok_status=(200, 201, 202, 204),
        ),
        find=None,
    )
    assert config.rotators["script"] == ExecRotatorConfig("script", ("rotate-acme",), 30.0)
    assert config.rotators["person"] == ManualRotatorConfig("person")
    assert [r.type for r in config.rotators.values()] == ["http", "exec", "manual"]
    [credential] = config.credentials
    assert credential.rotation == RotationPolicy(
        max_age=2592000.0, rotator="acme-keys", grace=3600.0, verify_attempts=5
    )
    assert (credential.client_id, credential.client_secret, credential.scope) == (None,) * 3
    assert (credential.initial_key, credential.initial_key_id) == (None, None)


def test_every_rotation_key_can_be_set() -> None:
    text = MINIMAL.replace(
        'revoke = { path = "/keys/{key_id}" }',
        'revoke = { method = "POST", path = "/keys/revoke", body = \'{"id": "{key_id}", '
        '"by": "{credential}/{rotation_id}"}\', ok_status = [200] }\n'
        'auth = "file:/run/credentials/keyturn.service/acme-admin"\nauth_scheme = "Token"\n'
        'find = { method = "POST", path = "/keys/search", items = "", name = "/meta/name", '
        'id = "/id" }',
    ).replace('command = ["rotate-acme"]', 'command = ["/opt/rotate", "--all"]\ntimeout = 2.5')
    text = text.replace(
        'rotation = { max_age = "30d", rotator = "acme-keys" }',
        'rotation = { max_age = 3600, grace = "10m", rotator = "script", verify_attempts = 2 }\n'
        'initial_key = "vault:secret/keyturn/inputs/reporting-key#api_key"\n'
        'initial_key_id = "key_42"',
    )
    config = parse_config(text, "k.toml", {})
    http = config.rotators["acme-keys"]
    assert isinstance(http, HttpRotatorConfig)
    assert http.revoke == HttpCall(
        path="/keys/revoke",
        method="POST",
        body='{"id": "{key_id}", "by": "{credential}/{rotation_id}"}',
        ok_status=(200,),
    )
    assert http.auth == SecretRef.file("/run/credentials/keyturn.service/acme-admin")
    assert http.auth_scheme == "Token"
    assert http.find == HttpFind(
        path="/keys/search", items="", name="/meta/name", id="/id", method="POST"
    )
    assert config.rotators["script"] == ExecRotatorConfig("script", ("/opt/rotate", "--all"), 2.5)
    [credential] = config.credentials
    assert credential.rotation == RotationPolicy(
        max_age=3600.0, rotator="script", grace=600.0, verify_attempts=2
    )
    assert credential.initial_key == SecretRef.vault(
        "secret", "keyturn/inputs/reporting-key", "api_key"
    )
    assert credential.initial_key_id == "key_42"


def test_an_oauth_client_may_rotate_its_secret_with_http_or_exec() -> None:
    text = MINIMAL.replace(
        '[[credentials]]\nname = "reporting-key"',
        '[[credentials]]\nname = "reporting"\nprovider = "acme"\nkind = "oauth_client"\n'
        'client_id = "app"\nclient_secret = "env:S"\npublish_to = "apps/reporting/acme"\n'
        'rotation = { max_age = "90d", rotator = "script" }\n\n'
        '[[credentials]]\nname = "reporting-key"',
    )
    config = parse_config(text, "k.toml", {})
    oauth = config.credential("reporting")
    assert oauth.rotation == RotationPolicy(max_age=90 * 86400.0, rotator="script")
    assert oauth.probe is None  # a client secret is verified with a token request
    plain = parse_config(
        text.replace('rotation = { max_age = "90d", rotator = "script" }\n', ""), "k.toml", {}
    )
    assert plain.credential("reporting").rotation is None
    assert plain.rotator_of(plain.credential("reporting")) is None


def test_rotators_no_credential_uses_are_fine() -> None:
    config = parse_config(MINIMAL, "k.toml", {})
    assert set(config.rotators) == {"acme-keys", "script", "person"}  # two are unused


def test_the_exec_command_is_not_run_or_looked_up_at_load(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    absent = parse_config(MINIMAL.replace('["rotate-acme"]', '["/no/such/program"]'), "k.toml", {})
    assert absent.rotators["script"] == ExecRotatorConfig("script", ("/no/such/program",))
    parse_config(MINIMAL.replace('["rotate-acme"]', f'["/bin/touch", "{marker}"]'), "k.toml", {})
    assert not marker.exists()


def test_rotation_objects_are_frozen_and_read_only() -> None:
    config = parse_config(MINIMAL, "k.toml", {})
    assert isinstance(config.rotators, MappingProxyType)
    with pytest.raises(TypeError):
        config.rotators["x"] = config.rotators["person"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.rotators["script"].timeout = 1.0  # type: ignore[misc]
    rotation = config.credentials[0].rotation
    assert rotation is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        rotation.max_age = 1.0  # type: ignore[misc]


def test_the_shipped_example_has_every_rotator_type_and_an_api_key() -> None:
    config = load_config(REPO / "deploy" / "keyturn.example.toml", environ={})
    assert {r.type for r in config.rotators.values()} == {"http", "exec", "manual"}
    assert {c.kind for c in config.credentials} == {"oauth_client", "api_key", "signing_key"}
    for credential in config.credentials:
        if credential.kind == "api_key":
            assert credential.client_id is None
            assert credential.rotation is not None
            assert credential.probe


# -- environment overrides -----------------------------------------------------------------

OVERRIDES = [
    ("KEYTURN_ROTATORS_ACME_KEYS_AUTH", "env:OTHER", ["acme-keys", "auth"], SecretRef.env("OTHER")),
    ("KEYTURN_ROTATORS_ACME_KEYS_AUTH_SCHEME", "Token", ["acme-keys", "auth_scheme"], "Token"),
    ("KEYTURN_ROTATORS_ACME_KEYS_PROVIDER", "acme", ["acme-keys", "provider"], "acme"),
    ("KEYTURN_ROTATORS_ACME_KEYS_CREATE_PATH", "/v2/keys", ["acme-keys", "create", "path"], None),
    ("KEYTURN_ROTATORS_ACME_KEYS_CREATE_METHOD", "PUT", ["acme-keys", "create", "method"], None),
    (
        "KEYTURN_ROTATORS_ACME_KEYS_CREATE_VALUE",
        "/data/key",
        ["acme-keys", "create", "value"],
        None,
    ),
    (
        "KEYTURN_ROTATORS_ACME_KEYS_CREATE_BODY",
        '{"n": "{key_name}"}',
        ["acme-keys", "create", "body"],
        None,
    ),
    (
        "KEYTURN_ROTATORS_ACME_KEYS_CREATE_OK_STATUS",
        "200, 201",
        ["acme-keys", "create", "ok_status"],
        (200, 201),
    ),
    (
        "KEYTURN_ROTATORS_ACME_KEYS_REVOKE_OK_STATUS",
        "[204]",
        ["acme-keys", "revoke", "ok_status"],
        (204,),
    ),
    ("KEYTURN_ROTATORS_SCRIPT_TIMEOUT", "1m", ["script", "timeout"], 60.0),
    (
        "KEYTURN_ROTATORS_SCRIPT_COMMAND",
        '["/opt/rotate", "--dry-run"]',
        ["script", "command"],
        ("/opt/rotate", "--dry-run"),
    ),
]


@pytest.mark.parametrize(("var", "value", "path", "expected"), OVERRIDES)
def test_environment_overrides_a_rotator_scalar(
    var: str, value: str, path: list[str], expected: object
) -> None:
    config = parse_config(MINIMAL, "k.toml", {var: value})
    target: object = config.rotators[path[0]]
    for part in path[1:]:
        target = getattr(target, part)
    assert target == (value if expected is None else expected)


CREDENTIAL_OVERRIDES = [
    (
        "ROTATION_MAX_AGE",
        "7d",
        "rotation",
        RotationPolicy(max_age=7 * 86400.0, rotator="acme-keys"),
    ),
    (
        "ROTATION_GRACE",
        "0",
        "rotation",
        RotationPolicy(max_age=30 * 86400.0, rotator="acme-keys", grace=0.0),
    ),
    (
        "ROTATION_ROTATOR",
        "person",
        "rotation",
        RotationPolicy(max_age=30 * 86400.0, rotator="person"),
    ),
    (
        "ROTATION_VERIFY_ATTEMPTS",
        "9",
        "rotation",
        RotationPolicy(max_age=30 * 86400.0, rotator="acme-keys", verify_attempts=9),
    ),
    ("INITIAL_KEY", "file:/run/key", "initial_key", SecretRef.file("/run/key")),
]


@pytest.mark.parametrize(("key", "value", "field", "expected"), CREDENTIAL_OVERRIDES)
def test_environment_overrides_an_api_key_scalar(
    key: str, value: str, field: str, expected: object
) -> None:
    config = parse_config(MINIMAL, "k.toml", {f"KEYTURN_CREDENTIALS_REPORTING_KEY_{key}": value})
    assert getattr(config.credentials[0], field) == expected


def test_overrides_can_give_an_oauth_client_a_rotation() -> None:
    text = MINIMAL.replace('kind = "api_key"', 'kind = "oauth_client"\nclient_id = "app"')
    text = text.replace(
        'probe = "/v1/users"\nrotation = { max_age = "30d", rotator = "acme-keys" }', ""
    )
    text += 'client_secret = "env:S"\n'
    assert parse_config(text, "k.toml", {}).credentials[0].rotation is None
    environ = {
        "KEYTURN_CREDENTIALS_REPORTING_KEY_ROTATION_MAX_AGE": "90d",
        "KEYTURN_CREDENTIALS_REPORTING_KEY_ROTATION_ROTATOR": "script",
    }
    assert parse_config(text, "k.toml", environ).credentials[0].rotation == RotationPolicy(
        max_age=90 * 86400.0, rotator="script"
    )
    [line] = problems(text, {"KEYTURN_CREDENTIALS_REPORTING_KEY_ROTATION_MAX_AGE": "90d"})
    assert line.startswith('k.toml: credentials["reporting-key"].rotation.rotator: missing')


BAD_OVERRIDES = [
    (
        {"KEYTURN_ROTATORS_ACME_KEYS_CREATE_PATH": "keys"},
        "k.toml: environment KEYTURN_ROTATORS_ACME_KEYS_CREATE_PATH: "
        'rotators["acme-keys"].create.path: got "keys"; expected a path starting with "/"',
    ),
    (
        {"KEYTURN_ROTATORS_SCRIPT_COMMAND": "/opt/rotate --all"},
        'k.toml: environment KEYTURN_ROTATORS_SCRIPT_COMMAND: rotators["script"].command: '
        'got "/opt/rotate --all"; expected a non-empty array of strings',
    ),
    (
        {"KEYTURN_ROTATORS_ACME_KEYS_CREATE_OK_STATUS": "ok"},
        "k.toml: environment KEYTURN_ROTATORS_ACME_KEYS_CREATE_OK_STATUS: "
        'rotators["acme-keys"].create.ok_status: got "ok"; expected a non-empty array',
    ),
    (
        {"KEYTURN_ROTATORS_NOPE_TIMEOUT": "1s"},
        "k.toml: environment KEYTURN_ROTATORS_NOPE_TIMEOUT: names no configured rotator; "
        "expected KEYTURN_ROTATORS_<NAME>_<KEY> with <NAME> one of: ACME_KEYS, PERSON, SCRIPT",
    ),
    (
        {"KEYTURN_ROTATORS_SCRIPT_TIMOUT": "1s"},
        "k.toml: environment KEYTURN_ROTATORS_SCRIPT_TIMOUT: not a key of "
        'rotators["script"]; did you mean KEYTURN_ROTATORS_SCRIPT_TIMEOUT?',
    ),
    (
        {"KEYTURN_ROTATORS_PERSON_COMMAND": '["/x"]'},  # a key of another type
        "k.toml: environment KEYTURN_ROTATORS_PERSON_COMMAND: not a key of "
        'rotators["person"]; expected KEYTURN_ROTATORS_PERSON_<KEY> with <KEY> one of: TYPE',
    ),
    (
        {"KEYTURN_CREDENTIALS_REPORTING_KEY_CLIENT_ID": "app"},
        "k.toml: environment KEYTURN_CREDENTIALS_REPORTING_KEY_CLIENT_ID: "
        'credentials["reporting-key"].client_id: not allowed for kind "api_key"',
    ),
    (
        {"KEYTURN_CREDENTIALS_REPORTING_KEY_ROTATION_GRACE": "31d"},
        "k.toml: environment KEYTURN_CREDENTIALS_REPORTING_KEY_ROTATION_GRACE: "
        'credentials["reporting-key"].rotation.grace: is not shorter than max_age',
    ),
    (
        {"KEYTURN_ROTATOR_SCRIPT_TIMEOUT": "1s"},  # a near miss of the section
        "k.toml: environment KEYTURN_ROTATOR_SCRIPT_TIMEOUT: not a known override; "
        "did you mean KEYTURN_ROTATORS_SCRIPT_TIMEOUT?",
    ),
]


@pytest.mark.parametrize(("environ", "line"), BAD_OVERRIDES)
def test_bad_rotation_overrides_name_the_variable(environ: dict[str, str], line: str) -> None:
    [problem] = problems(MINIMAL, environ)
    assert problem.startswith(line), problem


# -- secrets never appear in errors ---------------------------------------------------------

SECRET = "hunter2-Sup3r-S3cret-value"

LEAKS = [
    (
        "rotator auth",
        MINIMAL.replace(
            'provider = "acme"\ncreate', f'auth = "{SECRET}"\nprovider = "acme"\ncreate', 1
        ),
        {},
    ),
    (
        "rotator auth as a bad reference",
        MINIMAL.replace(
            'provider = "acme"\ncreate', f'auth = "env:{SECRET}!"\nprovider = "acme"\ncreate', 1
        ),
        {},
    ),
    ("initial_key", MINIMAL + f'initial_key = "{SECRET}"\n', {}),
    (
        "initial_key on an oauth client",
        MINIMAL.replace('kind = "api_key"', 'kind = "oauth_client"')
        + f'initial_key = "{SECRET}"\n',
        {},
    ),
    ("client_secret on an api key", MINIMAL + f'client_secret = "{SECRET}"\n', {}),
    (
        "a secret in a body that is not JSON",
        MINIMAL.replace(
            'create = { path = "/keys",',
            f'create = {{ body = \'{{"token": "{SECRET}", }}\', path = "/keys",',
        ),
        {},
    ),
    (
        "a secret in a body with an unknown placeholder",
        MINIMAL.replace(
            'create = { path = "/keys",',
            f'create = {{ body = \'{{"token": "{SECRET}", "n": "{{x}}"}}\', path = "/keys",',
        ),
        {},
    ),
    ("override of auth", MINIMAL, {"KEYTURN_ROTATORS_ACME_KEYS_AUTH": SECRET}),
    ("override of initial_key", MINIMAL, {"KEYTURN_CREDENTIALS_REPORTING_KEY_INITIAL_KEY": SECRET}),
    (
        "override of client_secret on an api key",
        MINIMAL,
        {"KEYTURN_CREDENTIALS_REPORTING_KEY_CLIENT_SECRET": SECRET},
    ),
    (
        "override of a body",
        MINIMAL,
        {"KEYTURN_ROTATORS_ACME_KEYS_CREATE_BODY": f'{{"t": "{SECRET}",}}'},
    ),
]


@pytest.mark.parametrize(("case", "text", "environ"), LEAKS, ids=[c[0] for c in LEAKS])
def test_no_secret_value_in_any_rotation_config_error(
    case: str, text: str, environ: dict[str, str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "k.toml", environ)
    error = caught.value
    rendered = "\n".join([str(error), repr(error), *error.problems, repr(error.args)])
    assert error.problems  # the case is a real error
    assert SECRET not in rendered
    assert "hunter2" not in rendered
    assert error.__cause__ is None


# -- templates and JSON pointers -------------------------------------------------------------

VALUES = {"credential": "a b", "key_name": 'x"y\\z/ü', "key_id": "k/1?x=2#f"}


def test_path_placeholders_are_url_quoted() -> None:
    path = render_path("/keys/{key_id}/of/{credential}", VALUES)
    assert path == "/keys/k%2F1%3Fx%3D2%23f/of/a%20b"


def test_body_placeholders_are_json_string_escaped() -> None:
    body = render_body('{"name": "{key_name}", "n": "{key_name}!"}', VALUES)
    assert json.loads(body) == {"name": 'x"y\\z/ü', "n": 'x"y\\z/ü!'}


@pytest.mark.parametrize(
    ("body", "valid"),
    [
        ('{"name": "{key_name}"}', True),
        ('["{key_name}", {"a": {"b": "{credential}"}}]', True),
        ("{}", True),
        ('{"name": {key_name}}', False),  # outside a string
        ('{"name": "{key_name}"', False),
        ("name={key_name}", False),
    ],
)
def test_a_body_must_be_json_once_filled(body: str, valid: bool) -> None:
    assert (body_problem(body) is None) is valid


@pytest.mark.parametrize(
    ("pointer", "tokens"),
    [("", []), ("/key", ["key"]), ("/a/0/b", ["a", "0", "b"]), ("/a~1b/c~0d", ["a/b", "c~d"])],
)
def test_pointer_tokens(pointer: str, tokens: list[str]) -> None:
    assert pointer_tokens(pointer) == tokens


@pytest.mark.parametrize("pointer", ["key", "/a~", "/a~2"])
def test_malformed_pointers(pointer: str) -> None:
    with pytest.raises(ValueError, match="JSON pointer"):
        pointer_tokens(pointer)


def test_resolve_pointer_follows_objects_and_arrays() -> None:
    document = {"data": [{"id": 7, "a/b": "slash"}], "": "empty"}
    assert resolve_pointer(document, pointer_tokens("/data/0/id")) == 7
    assert resolve_pointer(document, pointer_tokens("/data/0/a~1b")) == "slash"
    assert resolve_pointer(document, pointer_tokens("/")) == "empty"
    assert resolve_pointer(document, []) is document
    for missing in ("/data/1", "/data/01", "/data/-", "/data/0/nope", "/data/x", "/nope/a"):
        with pytest.raises(KeyError):
            resolve_pointer(document, pointer_tokens(missing))


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("..", "/keys/%2E%2E/x"),
        (".", "/keys/%2E/x"),
        ("...", "/keys/.../x"),
        ("a.b", "/keys/a.b/x"),
    ],
)
def test_a_dot_segment_value_is_encoded_in_a_path(value: str, rendered: str) -> None:
    """A provider's key id of ".." must not climb out of the templated path."""
    assert render_path("/keys/{key_id}/x", {"key_id": value}) == rendered
