"""What keyturn publishes in Vault, and where its private records live.

Published (at a credential's `publish_to`, readable by the app):
    oauth_client: access_token, token_type, expires_at, issued_at, refresh_at, authorization
    api_key: api_key, key_id, created_at, rotate_after, authorization
    custom_metadata: managed-by=keyturn, credential, expires_at, writer (refresh_at: tokens)

Private (at `state_path(<state_prefix>, <name>)`, readable only by keyturn's policy): one
record per credential, `keyturn.state.CredentialState`.
"""

from __future__ import annotations

import math

from keyturn.clock import rfc3339
from keyturn.secret import Secret

MANAGED_BY = "keyturn"


def oauth_published_fields(
    access_token: Secret, issued_at: float, expires_at: float, refresh_at: float
) -> dict[str, str | Secret]:
    """The KV data an app reads for an OAuth credential. `refresh_at` is when keyturn plans
    to replace the token (rounded up to whole seconds: a reader that waits until then finds
    the new one or the refresh under way), so consumers can plan their re-reads."""
    return {
        "access_token": access_token,
        "token_type": "Bearer",
        "expires_at": rfc3339(expires_at),
        "issued_at": rfc3339(issued_at),
        "refresh_at": rfc3339(math.ceil(refresh_at)),
        "authorization": Secret(f"Bearer {access_token.reveal()}"),
    }


def api_key_published_fields(
    key: Secret, key_id: str | None, created_at: float, rotate_after: float
) -> dict[str, str | Secret]:
    """The KV data an app reads for an API key."""
    return {
        "api_key": key,
        "key_id": key_id or "",
        "created_at": rfc3339(created_at),
        "rotate_after": rfc3339(rotate_after),
        "authorization": Secret(f"Bearer {key.reveal()}"),
    }


def published_metadata(
    credential: str, expires_at: float, writer: str, *, refresh_at: float | None = None
) -> dict[str, str]:
    """KV custom_metadata on every published path, so readers can schedule and audits can see."""
    metadata = {
        "managed-by": MANAGED_BY,
        "credential": credential,
        "expires_at": rfc3339(expires_at),
        "writer": writer,
    }
    if refresh_at is not None:
        metadata["refresh_at"] = rfc3339(math.ceil(refresh_at))
    return metadata


def state_path(prefix: str, credential: str) -> str:
    return f"{prefix.strip('/')}/{credential}"
