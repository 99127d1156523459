"""What keyturn keeps in Vault: the fields apps read, and keyturn's private state.

Published (at a credential's `publish_to`, readable by the app):
    access_token, token_type, expires_at, issued_at, authorization
    custom_metadata: managed-by=keyturn, credential, expires_at, writer

Private (at `<state_prefix>/<name>`, readable only by keyturn's policy): the refresh token,
what was last issued and published, the lease that makes one instance at a time use the
refresh token, and the last outcome for `keyturn status`.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from keyturn.clock import rfc3339
from keyturn.errors import VaultDataError
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


@dataclass(frozen=True, slots=True)
class CredentialState:
    """keyturn's private record for one credential. Times are epoch seconds."""

    refresh_token: Secret | None = None
    # Set (to a random attempt id) before the refresh token is presented, cleared once the
    # answer is stored: a record found with it set means the answer was lost (crash, time-out),
    # the provider may have rotated the token, and it must never be presented again.
    refresh_in_flight: str | None = None
    # A refresh token burned that way, kept only to be revoked (RFC 7009) once the replacement
    # is published: revoking a grant also kills the access token apps read until then.
    burned_refresh_token: Secret | None = None
    # A fingerprint (salted HMAC-SHA256, never the value) of the credential's `refresh_token`
    # input as it was when keyturn last seeded from it: the input is read again only after the
    # provider refused the refresh token keyturn held, and used only if it has changed since.
    refresh_token_input_fingerprint: str | None = None
    # When the provider last refused (invalid_grant) the refresh token keyturn held; cleared
    # once keyturn holds a refresh token again.
    refresh_token_refused_at: float | None = None
    issued_at: float | None = None
    expires_at: float | None = None
    scope: str | None = None
    published_version: int | None = None
    writer: str | None = None
    lease_owner: str | None = None
    lease_until: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    next_due: float | None = None
    phase: str = "pending"
    # The rotation journal (api_key: the key apps read; oauth_client: the client secret).
    key: Secret | None = None
    key_id: str | None = None
    key_created_at: float | None = None
    rotation_phase: str = "idle"
    rotation_id: str | None = None
    rotation_started: float | None = None
    pending_key: Secret | None = None
    pending_key_id: str | None = None
    previous_key_id: str | None = None
    previous_retire_at: float | None = None
    rotation_failures: int = 0
    verify_failures: int = 0
    rotation_error: str | None = None
    rotation_retry_at: float | None = None

    def with_(self, **changes: Any) -> CredentialState:
        return replace(self, **changes)

    def lease_held_by_other(self, instance: str, now: float) -> bool:
        return (
            self.lease_owner is not None
            and self.lease_owner != instance
            and self.lease_until is not None
            and self.lease_until > now
        )

    def to_data(self) -> dict[str, str | Secret]:
        """KV data: every value a string (times in RFC 3339), absent values left out."""
        data: dict[str, str | Secret] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if field.name in _TIME_FIELDS:
                data[field.name] = repr(float(value))
            elif isinstance(value, Secret):
                data[field.name] = value
            else:
                data[field.name] = str(value)
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any], credential: str) -> CredentialState:
        """Parse a stored record; a malformed field is a VaultDataError naming it."""
        values: dict[str, Any] = {}
        known = {f.name for f in fields(cls)}
        for name, raw in data.items():
            if name not in known:
                continue  # written by a newer keyturn: keep going
            if not isinstance(raw, str):
                raise _bad(credential, name, "is not a string")
            values[name] = _parse_field(name, raw, credential)
        return cls(**values)


# Times are stored as epoch seconds (exact, so a resumed job plans exactly what was planned).
_TIME_FIELDS = frozenset(
    {
        "issued_at",
        "expires_at",
        "lease_until",
        "last_success",
        "next_due",
        "key_created_at",
        "rotation_started",
        "previous_retire_at",
        "rotation_retry_at",
        "refresh_token_refused_at",
    }
)
_SECRET_FIELDS = frozenset({"refresh_token", "burned_refresh_token", "key", "pending_key"})
_INT_FIELDS = frozenset(
    {"published_version", "consecutive_failures", "rotation_failures", "verify_failures"}
)


# A fingerprint: "hmac-sha256:<16-byte salt, hex>:<HMAC-SHA256 of the value under the salt, hex>".
_FINGERPRINT = re.compile(r"hmac-sha256:[0-9a-f]{32}:[0-9a-f]{64}")


def fingerprint(value: Secret, salt: bytes | None = None) -> str:
    """A salted HMAC-SHA256 of `value`: tells whether a value changed without keeping it (a
    fresh random salt each time unless given, so equal values do not look equal across
    records)."""
    salt = secrets.token_bytes(16) if salt is None else salt
    digest = hmac.new(salt, value.reveal().encode(), hashlib.sha256).hexdigest()
    return f"hmac-sha256:{salt.hex()}:{digest}"


def fingerprint_matches(stored: str, value: Secret) -> bool:
    """Whether `value` is the value `stored` (a `fingerprint`) was made from."""
    if not _FINGERPRINT.fullmatch(stored):
        return False
    salt = bytes.fromhex(stored.split(":")[1])
    return hmac.compare_digest(fingerprint(value, salt), stored)


def _bad(credential: str, field: str, what: str) -> VaultDataError:
    return VaultDataError(f"private state field {field!r} {what}", credential=credential)


def _parse_field(name: str, raw: str, credential: str) -> Any:
    if name in _SECRET_FIELDS:
        return Secret(raw) if raw else None
    if name in _TIME_FIELDS:
        try:
            value = float(raw)
        except ValueError as exc:
            raise _bad(credential, name, "is not a timestamp") from exc
        if not math.isfinite(value):
            raise _bad(credential, name, "is not a finite timestamp")
        return value
    if name in _INT_FIELDS:
        if not raw.isdigit():
            raise _bad(credential, name, "is not a whole number")
        return int(raw)
    if name == "refresh_token_input_fingerprint" and not _FINGERPRINT.fullmatch(raw):
        raise _bad(credential, name, "is not a fingerprint (hmac-sha256:<salt>:<digest>)")
    return raw
