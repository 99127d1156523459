"""keyturn.toml pieces the tests share, so a test module writes only what it is about."""

from __future__ import annotations

from pathlib import Path

# The `[vault]` table unit tests' configurations start with: a token from the environment's
# VAULT_TOKEN, no server behind the address.
VAULT = """\
[vault]
address = "https://vault.example.com"
auth = { method = "token", token = "env:VAULT_TOKEN" }
"""


def write_signing_key_and_client(
    workdir: Path,
    *,
    issuer: str,
    vault: str,
    root_token: str,
    prefix: str,
    client_id: str,
    key: str,
    app: str,
    rotation: str,
    registration: str,
) -> Path:
    """`workdir/keyturn.toml` (returned), and the Vault token it reads: a daemon against an
    OpenID provider at `issuer` (panva/oidc-provider's test server) keeping `key`, a signing key
    registered as `registration` says (a TOML inline table), and `app`, an oauth_client of the
    same client that signs its token requests with the key `key` publishes (private_key_jwt);
    state and publications under `prefix`."""
    token_file = workdir / "vault-token"
    token_file.write_text(root_token)
    config = workdir / "keyturn.toml"
    config.write_text(f"""
[keyturn]
instance_id = "{prefix}-test"
state_prefix = "{prefix}/keyturn/state"

[vault]
address = "{vault}"
auth = {{ method = "token_file", path = "{token_file}" }}

[metrics]
listen = "127.0.0.1:0"

[[providers]]
name = "op"
base_url = "{issuer}"
token_path = "/token"
token_request = "form"
timeout = "3s"
allow_insecure_http = true

[[credentials]]
name = "{key}"
provider = "op"
kind = "signing_key"
client_id = "{client_id}"
algorithm = "ES256"
publish_to = "{prefix}/apps/{key}"
rotation = {rotation}
registration = {registration}
backoff = {{ initial = "1s", max = "4s" }}

[[credentials]]
name = "{app}"
provider = "op"
kind = "oauth_client"
client_id = "{client_id}"
client_auth = "private_key_jwt"
client_key = "vault:secret/{prefix}/apps/{key}#private_key"
client_key_alg = "ES256"
publish_to = "{prefix}/apps/{app}"
backoff = {{ initial = "1s", max = "4s" }}
""")
    return config
