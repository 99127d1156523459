"""Strict parsing of RFC 6749 token responses (§5.1 success, §5.2 error).

Anything keyturn cannot trust is a `MalformedResponse` naming the field, and nothing is
published: a body that is not a JSON object (or is nested too deeply to parse), a success body
that also carries `error`, a missing access_token, a token or token type with a character
outside RFC 6749's VSCHAR (%x20-7E), a token type other than Bearer, an expires_in that is not
a positive number of seconds of at most ten years (a string of ASCII digits counts as a
number: some providers send one). See docs/provider-responses.md.
"""

from __future__ import annotations

import json
import math
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
# RFC 6749 Appendix A: access_token, refresh_token and token_type are 1*VSCHAR.
_VSCHAR = re.compile(r"[\x20-\x7e]+")
# Ten years: a longer lifetime is not a lifetime (and would overflow date arithmetic later).
MAX_EXPIRES_IN = 315_360_000


@dataclass(frozen=True, slots=True)
class TokenResponse:
    """A parsed token response; `expires_in` is None when the server sent none.
    `refresh_expires_in`: the refresh token's lifetime where the server says it (Keycloak),
    None when it sent none, 0 (Keycloak's "does not expire") or a value keyturn cannot read."""

    access_token: Secret
    token_type: str
    expires_in: float | None
    refresh_token: Secret | None
    scope: str | None
    refresh_expires_in: float | None = None


def _load_json(body: bytes) -> Any:
    """json.loads; ValueError (incl. UnicodeDecodeError) or RecursionError for hostile bodies."""
    return json.loads(body)


def _json_object(body: bytes, credential: str) -> dict[str, Any]:
    try:
        parsed = _load_json(body)
    except RecursionError as exc:
        raise MalformedResponse(
            "body is nested too deeply", field="body", credential=credential
        ) from exc
    except ValueError as exc:
        raise MalformedResponse("body is not JSON", field="body", credential=credential) from exc
    if not isinstance(parsed, dict):
        raise MalformedResponse("body is not a JSON object", field="body", credential=credential)
    return parsed


def _token(data: dict[str, Any], field: str, credential: str, *, required: bool) -> str | None:
    """A string member of VSCHARs, not only spaces; the value never reaches the message."""
    value = data.get(field)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        missing = "missing or not" if required else "not"
        raise MalformedResponse(f"{missing} a non-empty string", field=field, credential=credential)
    if not _VSCHAR.fullmatch(value):
        raise MalformedResponse(
            "contains a character outside %x20-7E (RFC 6749 VSCHAR)",
            field=field,
            credential=credential,
        )
    return value


def _refresh_lifetime(value: object, credential: str) -> float | None:
    """refresh_expires_in, read as expires_in is; only informational (when a person must
    consent again), so a value that cannot be read is ignored rather than costing the refresh
    token that came with it."""
    try:
        return _lifetime(value, credential, "refresh_expires_in")
    except MalformedResponse:
        return None


def _lifetime(
    expires_in: object, credential: str, field: str = "expires_in"
) -> float | None:
    """expires_in: a JSON number, or a string of ASCII digits; positive, at most ten years."""
    if expires_in is None:
        return None
    if isinstance(expires_in, str) and expires_in.isascii() and expires_in.isdigit():
        digits = expires_in.lstrip("0") or "0"
        # More than 10 digits is above the maximum; int() of thousands of digits would raise.
        expires_in = int(digits) if len(digits) <= 10 else MAX_EXPIRES_IN + 1
    if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)):
        raise MalformedResponse("not a number", field=field, credential=credential)
    # Compare before converting: float() of a huge int raises OverflowError.
    if not expires_in > 0 or (isinstance(expires_in, float) and math.isinf(expires_in)):
        raise MalformedResponse(
            "must be a positive number of seconds", field=field, credential=credential
        )
    if expires_in > MAX_EXPIRES_IN:
        raise MalformedResponse(
            f"must be at most {MAX_EXPIRES_IN} seconds", field=field, credential=credential
        )
    return float(expires_in)


def parse_token_response(body: bytes, credential: str) -> TokenResponse:
    """Parse a 2xx token response body."""
    data = _json_object(body, credential)

    if data.get("error") is not None:
        # RFC 6749 §5.1/§5.2: a success and an error at once; trust neither.
        raise MalformedResponse(
            "a success response that also carries an error", field="error", credential=credential
        )

    access_token = _token(data, "access_token", credential, required=True)
    assert access_token is not None  # required=True

    token_type = data.get("token_type")
    if isinstance(token_type, str) and token_type and not _VSCHAR.fullmatch(token_type):
        raise MalformedResponse(
            "contains a character outside %x20-7E (RFC 6749 VSCHAR)",
            field="token_type",
            credential=credential,
        )
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        shown = token_type if isinstance(token_type, str) and len(token_type) <= 20 else "?"
        raise MalformedResponse(
            f"expected 'Bearer', got {shown!r}", field="token_type", credential=credential
        )

    lifetime = _lifetime(data.get("expires_in"), credential)
    refresh_token = _token(data, "refresh_token", credential, required=False)

    scope = data.get("scope")
    if scope is not None and not isinstance(scope, str):
        raise MalformedResponse("not a string", field="scope", credential=credential)

    return TokenResponse(
        access_token=Secret(access_token),
        token_type="Bearer",
        expires_in=lifetime,
        refresh_token=Secret(refresh_token) if refresh_token else None,
        scope=scope,
        refresh_expires_in=_refresh_lifetime(data.get("refresh_expires_in"), credential),
    )


def parse_error_response(
    body: bytes,
    status: int,
    credential: str,
    sent: tuple[Secret | None, ...] = (),
    *,
    endpoint: str = "token endpoint",
) -> OAuthError | None:
    """An RFC 6749 §5.2 error from a 4xx body, or None when the body is not one.

    A description that echoes one of the secrets `sent` in the request is withheld: the
    server's text ends up in logs and alerts.
    """
    try:
        data = _load_json(body)
    except (ValueError, RecursionError):
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
        code,
        credential=credential,
        description=description and description[:200],
        status=status,
        endpoint=endpoint,
    )


def error_label(code: str) -> str:
    """A bounded metric label for an OAuth error code."""
    return code if code in KNOWN_OAUTH_ERRORS else "other"
