"""Which credentials a reload must rebuild: those whose own settings, provider or rotator
changed; new and removed ones are handled apart."""

from __future__ import annotations

from keyturn.config import Config, parse_config
from keyturn.daemon import changed_credentials
from keyturn_devkit.harness.configs import VAULT

HEAD = VAULT + """
[[providers]]
name = "acme"
base_url = "https://acme.example.com"
timeout = "TIMEOUT"

[[providers]]
name = "other"
base_url = "https://other.example.com"
"""

CREDENTIAL = """
[[credentials]]
name = "NAME"
provider = "PROVIDER"
kind = "oauth_client"
client_id = "vault:secret/keyturn/inputs/NAME#client_id"
client_secret = "vault:secret/keyturn/inputs/NAME#client_secret"
publish_to = "apps/NAME/acme"
scope = "SCOPE"
"""


def config(credentials: list[tuple[str, str, str]], timeout: str = "10s") -> Config:
    text = HEAD.replace("TIMEOUT", timeout) + "".join(
        CREDENTIAL.replace("NAME", name).replace("PROVIDER", provider).replace("SCOPE", scope)
        for name, provider, scope in credentials
    )
    return parse_config(text, "keyturn.toml", {"VAULT_TOKEN": "unused"})


def test_own_settings_and_the_provider_s_settings_count_new_and_removed_do_not() -> None:
    old = config([("a", "acme", "read"), ("b", "acme", "read"), ("c", "other", "read")])
    new = config(
        [
            ("a", "acme", "write"),
            ("b", "other", "read"),
            ("c", "other", "read"),
            ("d", "acme", "read"),
        ]
    )
    assert changed_credentials(old, new) == {"a", "b"}
    slower = config([("a", "acme", "read"), ("c", "other", "read")], timeout="20s")
    assert changed_credentials(old, slower) == {"a"}
    assert changed_credentials(old, old) == set()


def test_at_ten_thousand_credentials_only_the_changed_one_is_rebuilt() -> None:
    many = [(f"c{i:05d}", "acme", "read") for i in range(10_000)]
    old = config(many)
    new = config([*many[:-1], ("c09999", "acme", "write")])
    assert changed_credentials(old, new) == {"c09999"}
