"""The keyturn configuration the sandbox's dashboard shows: names made from what a person
typed, the probe a scope allows, and TOML that keyturn's loader accepts as it is."""

from __future__ import annotations

import pytest

from keyturn.config.load import parse_config
from keyturn_devkit.sandbox import snippets

VAULT = '[vault]\naddress = "http://127.0.0.1:8200"\nauth = { method = "token", token = "env:T" }\n'


@pytest.mark.parametrize(
    ("typed", "name"),
    [
        ("Reporting (EU)", "reporting-eu"),
        ('<script>"x"\n</script>', "script-x-script"),
        ("ÄÖÜ", "api-key"),
        ("---", "api-key"),
        ("a" * 70 + " b", "a" * 63),
        ("x" * 62 + " y", "x" * 62),
    ],
)
def test_a_typed_name_becomes_a_keyturn_name(typed: str, name: str) -> None:
    assert snippets.credential_name(typed, "api-key") == name


@pytest.mark.parametrize(
    ("scope", "probe"),
    [(None, "/v1/projects"), ("users:read", "/v1/users"), ("projects:read", "/v1/projects")],
)
def test_each_snippet_loads_and_probes_a_path_its_scope_allows(
    scope: str | None, probe: str
) -> None:
    key = {"name": 'a "quoted"\nname', "key_id": "key_1", "scope": scope}
    app = {"name": "app", "client_id": "client_1", "scope": scope}
    for text in (
        snippets.api_key("https://sandbox.example", key),
        snippets.oauth_app("http://127.0.0.1:8787", app),
    ):
        config = parse_config(VAULT + text, "dashboard.toml", {})
        (credential,) = config.credentials
        assert credential.probe == probe
        assert config.rotators[credential.rotation.rotator].type == "http"
    assert "allow_insecure_http" not in snippets.api_key("https://sandbox.example", key)
