"""The sandbox's records and the errors its domain logic raises.

Secret values (API keys, client secrets, tokens) are never stored: a record keeps the SHA-256
digest of its value and a non-secret id (`key_…`, `client_…`, `sec_…`, `tok_…`) that admin
responses and logs may show. Values exist only as `Secret` on their way out, once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from keyturn.clock import rfc3339
from keyturn.secret import Secret

# Recognizable prefixes help a human tell what leaked; the random part carries 256 bits.
PREFIX_API_KEY = "ktsb_key_"
PREFIX_CLIENT_SECRET = "ktsb_cs_"
PREFIX_ACCESS_TOKEN = "ktsb_at_"
PREFIX_REFRESH_TOKEN = "ktsb_rt_"
PREFIX_ADMIN_TOKEN = "ktsb_admin_"


def new_secret(prefix: str) -> Secret:
    return Secret(prefix + secrets.token_urlsafe(32))


def jwt_shaped(
    value: Secret, client_id: str, aud: tuple[str, ...], now: float, lifetime: int
) -> Secret:
    """An access token shaped as an RFC 9068 JWT, unsigned, whose claims carry `aud` (so a
    client can learn what it was granted); its third part is the opaque `value`, so it is as
    hard to guess as an opaque token."""
    header = {"typ": "at+jwt", "alg": "none"}
    claims = {
        "iss": "keyturn-sandbox",
        "sub": client_id,
        "client_id": client_id,
        "aud": aud[0] if len(aud) == 1 else list(aud),
        "iat": int(now),
        "exp": int(now + lifetime),
    }
    parts = (json.dumps(part, separators=(",", ":")).encode() for part in (header, claims))
    encoded = [base64.urlsafe_b64encode(part).decode().rstrip("=") for part in parts]
    return Secret(f"{encoded[0]}.{encoded[1]}.{value.reveal()}")


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(8)


def digest(value: str) -> bytes:
    """What the sandbox keeps instead of a secret value."""
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def timestamp(epoch: float | None) -> str | None:
    return None if epoch is None else rfc3339(epoch)


class OAuthFailure(Exception):
    """An RFC 6749 §5.2 error: `error` is the code, `status` the HTTP status to answer with."""

    def __init__(self, error: str, description: str, status: int = 400) -> None:
        self.error = error
        self.description = description
        self.status = status
        super().__init__(f"{error}: {description}")


class BearerRejected(Exception):
    """An RFC 6750 §3 rejection of a resource request; `error` None means "no credential"."""

    def __init__(self, error: str | None, description: str, status: int = 401) -> None:
        self.error = error
        self.description = description
        self.status = status
        super().__init__(f"{error}: {description}")


class NotFound(Exception):
    """An admin request named an id the sandbox does not know."""


@dataclass(slots=True)
class Usage:
    """What the sandbox saw of one credential: accepted and rejected uses, last use."""

    request_count: int = 0
    rejected_count: int = 0
    last_used_at: float | None = None

    def accepted(self, now: float) -> None:
        self.request_count += 1
        self.last_used_at = now

    def to_json(self) -> dict[str, Any]:
        return {
            "request_count": self.request_count,
            "rejected_count": self.rejected_count,
            "last_used_at": timestamp(self.last_used_at),
        }


@dataclass(slots=True)
class ApiKey:
    key_id: str
    name: str
    description: str
    digest: bytes = field(repr=False)
    created_at: float
    scope: str | None  # None: every scope
    revoked_at: float | None = None
    usage: Usage = field(default_factory=Usage)

    @property
    def status(self) -> Literal["active", "revoked"]:
        return "active" if self.revoked_at is None else "revoked"

    def to_json(self) -> dict[str, Any]:
        return {
            "key_id": self.key_id,
            "name": self.name,
            "description": self.description,
            "scope": self.scope,
            "status": self.status,
            "created_at": timestamp(self.created_at),
            "revoked_at": timestamp(self.revoked_at),
            "usage": self.usage.to_json(),
        }


@dataclass(slots=True)
class ClientSecret:
    secret_id: str
    digest: bytes = field(repr=False)
    created_at: float
    expires_at: float | None = None  # set when a newer secret replaces it (the overlap)
    revoked_at: float | None = None

    def status(self, now: float) -> Literal["active", "expiring", "expired", "revoked"]:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is None:
            return "active"
        return "expiring" if now < self.expires_at else "expired"

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "secret_id": self.secret_id,
            "status": self.status(now),
            "created_at": timestamp(self.created_at),
            "expires_at": timestamp(self.expires_at),
            "revoked_at": timestamp(self.revoked_at),
        }


@dataclass(slots=True)
class OAuthApp:
    client_id: str
    name: str
    redirect_uri: str
    scope: str | None  # None: the current default_scope setting
    created_at: float
    secrets: list[ClientSecret] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    oauth_requests: int = 0
    resource_requests: int = 0
    refresh_token_reuses: int = 0  # used refresh tokens presented again (each revoked a family)

    def to_json(self, now: float) -> dict[str, Any]:
        usage = self.usage.to_json()
        usage.update(
            oauth_requests=self.oauth_requests,
            resource_requests=self.resource_requests,
            refresh_token_reuses=self.refresh_token_reuses,
        )
        return {
            "client_id": self.client_id,
            "name": self.name,
            "redirect_uri": self.redirect_uri,
            "scope": self.scope,
            "created_at": timestamp(self.created_at),
            "secrets": [s.to_json(now) for s in self.secrets],
            "usage": usage,
        }


@dataclass(slots=True)
class TokenFamily:
    """Every token descended from one grant; refresh-token reuse revokes all of them."""

    family_id: str
    client_id: str
    revoked_at: float | None = None
    revoke_reason: str | None = None
    # What the grant that began it asked for (`audience`, `resource`: a JWT access token's
    # `aud`), and when it began (the absolute lifetime counts from it).
    audience: tuple[str, ...] = ()
    started_at: float = 0.0
    # The access token issued last in this family: the one a refresh revokes when the
    # setting `revoke_previous_access_token_on_refresh` is on.
    latest_access: IssuedToken | None = field(default=None, repr=False)


@dataclass(slots=True)
class IssuedToken:
    token_id: str
    kind: Literal["access", "refresh"]
    digest: bytes = field(repr=False)
    client_id: str
    family: TokenFamily
    scope: str
    issued_at: float
    expires_at: float
    revoked_at: float | None = None
    used_at: float | None = None  # refresh tokens: when it was exchanged (once only)
    reason: str | None = None  # why this one token was revoked (None: "access token revoked")

    def status(self, now: float) -> Literal["active", "used", "revoked", "expired"]:
        if self.revoked_at is not None or self.family.revoked_at is not None:
            return "revoked"
        if self.used_at is not None:
            return "used"
        return "active" if now < self.expires_at else "expired"

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "token_id": self.token_id,
            "kind": self.kind,
            "client_id": self.client_id,
            "family_id": self.family.family_id,
            "scope": self.scope,
            "status": self.status(now),
            "issued_at": timestamp(self.issued_at),
            "expires_at": timestamp(self.expires_at),
            "used_at": timestamp(self.used_at),
            "revoked_at": timestamp(self.revoked_at or self.family.revoked_at),
            "revoke_reason": self.revoke_reason,
        }

    @property
    def revoke_reason(self) -> str | None:
        """Why the token is revoked: its family's reason ("refresh token reuse", "refresh
        token revoked", "revoked by admin"), "access token revoked" or "replaced at refresh";
        None if it is not."""
        if self.family.revoked_at is not None:
            return self.family.revoke_reason
        if self.revoked_at is None:
            return None
        return self.reason or "access token revoked"


@dataclass(frozen=True, slots=True)
class Grant:
    """A successful token response, before it becomes JSON (RFC 6749 §5.1)."""

    access_token: Secret
    token_type: str
    expires_in: int | None
    scope: str
    refresh_token: Secret | None
    family_id: str
    refresh_expires_in: int | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "access_token": self.access_token.reveal(),
            "token_type": self.token_type,
        }
        if self.expires_in is not None:
            body["expires_in"] = self.expires_in
        if self.refresh_token is not None:
            body["refresh_token"] = self.refresh_token.reveal()
            if self.refresh_expires_in is not None:
                body["refresh_expires_in"] = self.refresh_expires_in
        body["scope"] = self.scope
        return body


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a resource request authenticated as: an API key or an access token's client."""

    kind: Literal["api_key", "access_token"]
    credential_id: str  # key_id or client_id
    scope: str | None  # None: every scope

    def allows(self, scope: str) -> bool:
        return self.scope is None or scope in self.scope.split(" ")
