"""What keyturn publishes in Vault, and where its private records live.

Published (at a credential's `publish_to`, readable by the app):
    oauth_client: access_token, token_type, expires_at, issued_at, refresh_at, authorization
    api_key: api_key, key_id, created_at, rotate_after, authorization
    custom_metadata: managed-by=keyturn, credential, writer (what does not change from one
        publish to the next: written when it differs from what is there, not with every
        version; the times are in the data. Before 0.2.0 it also held expires_at and
        refresh_at)

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


def custom_metadata(credential: str, writer: str) -> dict[str, str]:
    """KV custom_metadata on every published path: who manages it, for which credential, and
    which instance wrote it, so audits and the change-detection sweep can tell keyturn's
    writes from others'. Nothing in it changes from one refresh to the next (`writer` changes
    when another instance publishes), so a publish writes it only when it differs from what
    is at the path (one Vault call fewer per refresh). When a value expires, or when keyturn
    replaces it, is in the published data (`expires_at`, `refresh_at`, `rotate_after`)."""
    return {"managed-by": MANAGED_BY, "credential": credential, "writer": writer}


def published_metadata(
    credential: str, expires_at: float, writer: str, *, refresh_at: float | None = None
) -> dict[str, str]:
    """`custom_metadata(credential, writer)` under its pre-0.2.0 signature, for callers not yet
    moved to it: `expires_at` and `refresh_at` are no longer put in custom_metadata (they are
    in the published data)."""
    del expires_at, refresh_at
    return custom_metadata(credential, writer)


def state_path(prefix: str, credential: str) -> str:
    return f"{prefix.strip('/')}/{credential}"
