"""Strict parsing of RFC 6749 token responses (§5.1 success, §5.2 error).

Anything keyturn cannot trust is a `MalformedResponse` naming the field, and nothing is
published: a missing access_token, a non-numeric, zero or negative expires_in, a token type
other than Bearer, a body that is not a JSON object.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from keyturn.errors import MalformedResponse, OAuthError
from keyturn.secret import Secret

# RFC 6749 §5.2 codes plus RFC 6750/8707 ones; anything else is reported as "other" in
# metrics so a hostile server cannot create unbounded label values.
KNOWN_OAUTH_ERRORS = frozenset(
    {
        "invalid_request",
        "invalid_client",
        "invalid_grant",
        "unauthorized_client",
        "unsupported_grant_type",
        "invalid_scope",
        "access_denied",
        "server_error",
        "temporarily_unavailable",
        "invalid_token",
        "insufficient_scope",
        "invalid_target",
    }
)
_ERROR_CODE = re.compile(r"^[\x20-\x21\x23-\x5b\x5d-\x7e]{1,64}$")  # RFC 6749 §5.2 charset


@dataclass(frozen=True, slots=True)
class TokenResponse:
    """A parsed token response; `expires_in` is None when the server sent none."""

    access_token: Secret
    token_type: str
    expires_in: float | None
    refresh_token: Secret | None
    scope: str | None


def _json_object(body: bytes, credential: str) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedResponse("body is not JSON", field="body", credential=credential) from exc
    if not isinstance(parsed, dict):
        raise MalformedResponse("body is not a JSON object", field="body", credential=credential)
    return parsed


def parse_token_response(body: bytes, credential: str) -> TokenResponse:
    """Parse a 2xx token response body."""
    data = _json_object(body, credential)

    access_token = data.get("access_token")
    if not isinstance(access_token, str) or not access_token.strip():
        raise MalformedResponse(
            "missing or not a non-empty string", field="access_token", credential=credential
        )

    token_type = data.get("token_type")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        shown = token_type if isinstance(token_type, str) and len(token_type) <= 20 else "?"
        raise MalformedResponse(
            f"expected 'Bearer', got {shown!r}", field="token_type", credential=credential
        )

    expires_in = data.get("expires_in")
    lifetime: float | None = None
    if expires_in is not None:
        if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float, str)):
            raise MalformedResponse("not a number", field="expires_in", credential=credential)
        try:
            lifetime = float(expires_in)
        except ValueError as exc:
            raise MalformedResponse(
                "not a number", field="expires_in", credential=credential
            ) from exc
        if not lifetime > 0 or lifetime == float("inf"):
            raise MalformedResponse(
                "must be a positive number of seconds", field="expires_in", credential=credential
            )

    refresh_token = data.get("refresh_token")
    if refresh_token is not None and (not isinstance(refresh_token, str) or not refresh_token):
        raise MalformedResponse(
            "not a non-empty string", field="refresh_token", credential=credential
        )

    scope = data.get("scope")
    if scope is not None and not isinstance(scope, str):
        raise MalformedResponse("not a string", field="scope", credential=credential)

    return TokenResponse(
        access_token=Secret(access_token),
        token_type="Bearer",
        expires_in=lifetime,
        refresh_token=Secret(refresh_token) if refresh_token else None,
        scope=scope,
    )


def parse_error_response(
    body: bytes, status: int, credential: str, sent: tuple[Secret | None, ...] = ()
) -> OAuthError | None:
    """An RFC 6749 §5.2 error from a 4xx body, or None when the body is not one.

    A description that echoes one of the secrets `sent` in the request is withheld: the
    server's text ends up in logs and alerts.
    """
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    code = data.get("error")
    if not isinstance(code, str) or not _ERROR_CODE.match(code):
        return None
    description = data.get("error_description")
    if not isinstance(description, str) or not _ERROR_CODE.match(description[:200] or "x"):
        description = None
    if description and any(s and s.reveal() in description for s in sent):
        description = "[description withheld: it echoed a secret]"
    return OAuthError(
        code, credential=credential, description=description and description[:200], status=status
    )


def error_label(code: str) -> str:
    """A bounded metric label for an OAuth error code."""
    return code if code in KNOWN_OAUTH_ERRORS else "other"
