"""keyturn.toml pieces the tests share, so a test module writes only what it is about."""

from __future__ import annotations

# The `[vault]` table unit tests' configurations start with: a token from the environment's
# VAULT_TOKEN, no server behind the address.
VAULT = """\
[vault]
address = "https://vault.example.com"
auth = { method = "token", token = "env:VAULT_TOKEN" }
"""
