"""keyturn.toml pieces the tests share, so a test module writes only what it is about."""

from __future__ import annotations

# The `[vault]` table every unit test's configuration starts with: a token from the
# environment (`ENVIRON` gives it), no server behind the address.
VAULT = """\
[vault]
address = "https://vault.example.com"
auth = { method = "token", token = "env:VAULT_TOKEN" }
"""
ENVIRON = {"VAULT_TOKEN": "x"}

# One provider, `acme`, as most configurations name it.
ACME = """
[[providers]]
name = "acme"
base_url = "https://acme.example.com"
"""
