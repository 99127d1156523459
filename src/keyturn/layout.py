"""What every kind publishes beside its data, and where keyturn's private records live.

Published at a credential's `publish_to`: the kind's `published_fields` and custom metadata
(managed-by, credential, writer: written only when it differs). Private, at
`state_path(<state_prefix>, <name>)`: one `keyturn.state.CredentialState` per credential.
docs/vault.md lists every field.
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
