"""The documentation and the shipped example keep up with the loader: every key the loader
knows (read back from its own "unknown key; expected one of: …" message) is documented in
docs/configuration.md and set in deploy/keyturn.example.toml."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from keyturn.config import parse_config
from keyturn.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "docs" / "configuration.md").read_text()
EXAMPLE = (REPO / "deploy" / "keyturn.example.toml").read_text()

BASE = """\
[keyturn]
{keyturn}
[metrics]
{metrics}
[vault]
address = "https://vault.example.com"
auth = {{ method = "{method}", {auth}zzzzzz = 1 }}
{vault}
[[providers]]
name = "acme"
base_url = "https://acme.example.com"
{providers}
[[credentials]]
name = "reporting"
provider = "acme"
kind = "oauth_client"
client_id = "id"
client_secret = "env:S"
publish_to = "apps/x"
refresh = {{ {refresh} }}
backoff = {{ {backoff} }}
rotation = {{ max_age = "90d", rotator = "script", {rotation} }}
sinks = [
  {{ path = "/x", format = "raw", on_publish = {{ command = ["/r"], {on_publish} }}, {sink} }},
]
{credentials}
[[credentials]]
name = "key"
provider = "acme"
kind = "api_key"
publish_to = "apps/y"
probe = "/v1/users"
rotation = {{ max_age = "30d", rotator = "api" }}
{api_key}
[[rotators]]
name = "api"
type = "http"
provider = "acme"
create = {{ path = "/keys", value = "/key", id = "/id", {create} }}
revoke = {{ path = "/keys/{{key_id}}", {revoke} }}
find = {{ path = "/keys", items = "/keys", name = "/name", id = "/id", {find} }}
{http}
[[rotators]]
name = "script"
type = "exec"
command = ["rotate"]
{exec}
[[rotators]]
name = "person"
type = "manual"
{manual}
"""

AUTH = {
    "token": 'token = "env:T", ',
    "token_file": 'path = "/t", ',
    "approle": 'role_id = "env:R", secret_id = "env:S", ',
    "kubernetes": 'role = "r", ',
}
INLINE = ["refresh", "backoff", "rotation", "create", "revoke", "find", "sink", "on_publish"]
TABLES = ["keyturn", "metrics", "vault", "providers", "credentials", "api_key"]
TABLES += ["http", "exec", "manual"]


def known_keys(method: str) -> dict[str, list[str]]:
    """{table: keys} as the loader lists them when it meets the unknown key `zzzzzz`."""
    fields = {table: "zzzzzz = 1" for table in TABLES}
    fields.update({table: "zzzzzz = 1" for table in INLINE})
    text = BASE.format(method=method, auth=AUTH[method], **fields)
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "k.toml", {})
    found: dict[str, list[str]] = {}
    for line in caught.value.problems:
        match = re.fullmatch(r"k\.toml: (.+)\.zzzzzz: unknown key.*; expected one of: (.+)", line)
        assert match, line
        found[match[1]] = match[2].split(", ")
    return found


@pytest.mark.parametrize("method", list(AUTH))
def test_every_key_is_documented_and_in_the_example(method: str) -> None:
    tables = known_keys(method)
    # keyturn, metrics, vault, vault.auth, providers, two credentials, refresh, backoff,
    # rotation, a sink and its on_publish, three rotators and the http rotator's create,
    # revoke and find
    assert len(tables) == 18, sorted(tables)
    for table, keys in tables.items():
        for key in keys:
            assert f"`{key}`" in DOCS, f"{table}.{key} is not documented"
            # a key, or a [table.key] or [[table.key]] header
            pattern = rf"(^|[ {{,]){key} = |^\[\[?\w+\.{key}\]\]?$"
            assert re.search(pattern, EXAMPLE, re.M), f"{table}.{key} is not in the example"
