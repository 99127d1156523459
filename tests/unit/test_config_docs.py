"""The documentation and the shipped example keep up with the schema: every key of every table
of the file, read from the schema's models, is documented in docs/configuration.md and set in
deploy/keyturn.example.toml."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from keyturn.config.keys import keys, tables

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "docs" / "configuration.md").read_text()
EXAMPLE = (REPO / "deploy" / "keyturn.example.toml").read_text()

# Every table but the file itself, each variant of a union once ("vault.auth[method=token]").
TABLES = {
    path + (f"[{tag[0]}={tag[1]}]" if tag else ""): model for path, model, tag in tables() if path
}


def test_the_schema_has_every_table_of_the_file() -> None:
    assert set(TABLES) == {
        "keyturn",
        "vault",
        "vault.auth[method=token]",
        "vault.auth[method=token_file]",
        "vault.auth[method=approle]",
        "vault.auth[method=kubernetes]",
        "metrics",
        "providers[]",
        "rotators[][type=http]",
        "rotators[].create",
        "rotators[].revoke",
        "rotators[].find",
        "rotators[][type=exec]",
        "rotators[][type=manual]",
        "credentials[][kind=oauth_client]",
        "credentials[][kind=api_key]",
        "credentials[][kind=signing_key]",
        "credentials[].registration[method=rfc7592]",
        "credentials[].registration[method=jwks]",
        "credentials[].registration[method=rotator]",
        "credentials[].refresh",
        "credentials[].backoff",
        "credentials[].rotation",
        "credentials[].sinks[]",
        "credentials[].sinks[].on_publish",
        "alerts[][type=webhook]",
        "alerts[][type=slack]",
        "alerts[][type=pagerduty]",
        "alerts[][type=alertmanager]",
        "usage",
    }


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_key_is_documented_and_in_the_example(table: str) -> None:
    for key in keys(TABLES[table]):
        assert f"`{key}`" in DOCS, f"{table}.{key} is not documented"
        # a key, or a [table.key] or [[table.key]] header
        pattern = rf"(^|[ {{,]){key} = |^\[\[?\w+\.{key}\]\]?$"
        assert re.search(pattern, EXAMPLE, re.M), f"{table}.{key} is not in the example"
