"""What every kind publishes beside its data, and where keyturn's private records live.

Published (at a credential's `publish_to`, readable by the app):
    the kind's data, from its `Kind.published_fields` (`keyturn.kinds`):
        oauth_client (`kinds/oauth_client/refresh.py`): access_token, token_type, expires_at,
            issued_at, refresh_at, authorization
        api_key (`kinds/api_key.py`): api_key, key_id, created_at, rotate_after, authorization
    custom_metadata: managed-by=keyturn, credential, writer (what does not change from one
        publish to the next: written when it differs from what is there, not with every
        version; the times are in the data. Before 0.2.0 it also held expires_at and
        refresh_at)

Private (at `state_path(<state_prefix>, <name>)`, readable only by keyturn's policy): one
record per credential, `keyturn.state.CredentialState`.
"""

from __future__ import annotations

MANAGED_BY = "keyturn"


def custom_metadata(credential: str, writer: str) -> dict[str, str]:
    """KV custom_metadata on every published path: who manages it, for which credential, and
    which instance wrote it, so audits and the change-detection sweep can tell keyturn's
    writes from others'. Nothing in it changes from one refresh to the next (`writer` changes
    when another instance publishes), so a publish writes it only when it differs from what
    is at the path (one Vault call fewer per refresh). When a value expires, or when keyturn
    replaces it, is in the published data (`expires_at`, `refresh_at`, `rotate_after`)."""
    return {"managed-by": MANAGED_BY, "credential": credential, "writer": writer}


def state_path(prefix: str, credential: str) -> str:
    return f"{prefix.strip('/')}/{credential}"
