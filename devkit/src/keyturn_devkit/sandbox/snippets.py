"""The keyturn configuration that serves a key or application made in the dashboard.

Each dashboard page shows a `[[providers]]` entry for this sandbox, the `http` rotators that
drive its admin API (the worked example of docs/configuration.md, which the integration tests
run) and the `[[credentials]]` entry for that key or application. Together with a `[vault]`
table they are a file keyturn loads. Only generated ids and names go into the TOML: what a
person typed (a name, a description) could break it, so the credential's name is a slug of it.
"""

from __future__ import annotations

import json
import re
from typing import Any

PROVIDER = "sandbox"
ADMIN_TOKEN_VARIABLE = "SANDBOX_ADMIN_TOKEN"
INPUTS = "secret/keyturn/inputs"

KEY_ROTATOR = f"""
[[rotators]]
name = "sandbox-keys"
type = "http"
provider = "{PROVIDER}"
auth = "env:{ADMIN_TOKEN_VARIABLE}"
create = {{ method = "POST", path = "/admin/api-keys", body = '{{"name": "{{key_name}}", "description": "rotated by keyturn"}}', value = "/key", id = "/key_id" }}
revoke = {{ method = "DELETE", path = "/admin/api-keys/{{key_id}}" }}
find = {{ method = "GET", path = "/admin/api-keys", items = "/api_keys", name = "/name", id = "/key_id" }}
"""  # noqa: E501 - TOML inline tables are one line

CLIENT_SECRET_ROTATOR = f"""
[[rotators]]
name = "sandbox-client-secrets"
type = "http"
provider = "{PROVIDER}"
auth = "env:{ADMIN_TOKEN_VARIABLE}"
create = {{ method = "POST", path = "/admin/oauth-apps/{{client_id}}/rotate-secret", body = '{{"overlap_seconds": 86400}}', value = "/client_secret", id = "/secret_id" }}
revoke = {{ method = "DELETE", path = "/admin/oauth-apps/{{client_id}}/secrets/{{key_id}}" }}
"""  # noqa: E501 - TOML inline tables are one line

ROTATORS = KEY_ROTATOR + CLIENT_SECRET_ROTATOR


def credential_name(name: str, fallback: str) -> str:
    """A keyturn name (`[a-z0-9][a-z0-9_-]*`, at most 63) made from what a person typed."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:63].rstrip("-")
    return slug or fallback


def _string(value: str) -> str:
    return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes


def provider(base_url: str) -> str:
    insecure = base_url.startswith("http://")
    lines = [
        "[[providers]]",
        f"name = {_string(PROVIDER)}",
        f"base_url = {_string(base_url)}",
        *(["allow_insecure_http = true        # loopback trials only"] if insecure else []),
        'token_path = "/oauth/token"',
        'revoke_path = "/oauth/revoke"',
    ]
    return "\n".join(lines) + "\n"


def _probe(scope: str | None) -> str:
    """A resource path the credential's scope lets it call (None: every scope)."""
    granted = (scope or "users:read projects:read").split()
    return "/v1/projects" if "projects:read" in granted else "/v1/users"


def api_key(base_url: str, key: dict[str, Any]) -> str:
    """keyturn adopts the key (kept in Vault by hand once) and rotates it every 30 days."""
    name = credential_name(key["name"], "api-key")
    credential = f"""
[[credentials]]
name = {_string(name)}
provider = "{PROVIDER}"
kind = "api_key"
publish_to = {_string(f"apps/{name}/{PROVIDER}-key")}
probe = {_string(_probe(key.get("scope")))}
initial_key = {_string(f"vault:{INPUTS}/{name}#api_key")}
initial_key_id = {_string(key["key_id"])}
rotation = {{ max_age = "30d", grace = "1h", rotator = "sandbox-keys" }}
"""
    return provider(base_url) + KEY_ROTATOR + credential


def oauth_app(base_url: str, app: dict[str, Any]) -> str:
    """keyturn keeps the app's access token fresh and rotates its client secret every 90 days."""
    name = credential_name(app["name"], "oauth-app")
    scope = f"scope = {_string(app['scope'])}\n" if app.get("scope") else ""
    credential = f"""
[[credentials]]
name = {_string(name)}
provider = "{PROVIDER}"
kind = "oauth_client"
client_id = {_string(app["client_id"])}
client_secret = {_string(f"vault:{INPUTS}/{name}#client_secret")}
{scope}publish_to = {_string(f"apps/{name}/{PROVIDER}")}
probe = {_string(_probe(app.get("scope")))}
rotation = {{ max_age = "90d", grace = "1h", rotator = "sandbox-client-secrets" }}
"""
    return provider(base_url) + CLIENT_SECRET_ROTATOR + credential


def vault_command(name: str, field: str) -> str:
    """How to keep the value shown once where the snippet's reference reads it (from stdin)."""
    return f"bao kv put {INPUTS}/{name} {field}=-"
