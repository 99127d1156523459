"""HTTP details shared by the handlers: bounded bodies, parameters, auth headers, JSON answers.

Everything here turns bad input into an exception carrying a 4xx status and a clear message,
never a crash: malformed JSON, wrong content types, oversized or badly encoded bodies,
repeated parameters, broken Authorization headers.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote

from aiohttp import web

from keyturn.secret import Secret
from keyturn_devkit.sandbox.model import OAuthFailure

NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
REALM = "keyturn-sandbox"
# RFC 6750 §2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_FORM = "application/x-www-form-urlencoded"


def json_response(
    body: Mapping[str, Any], status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def oauth_error(failure: OAuthFailure, *, basic_challenge: bool = False) -> web.Response:
    """RFC 6749 §5.2: JSON error body, never cached; 401 answers carry a Basic challenge."""
    headers = dict(NO_STORE)
    if failure.status == 401 or basic_challenge:
        headers["WWW-Authenticate"] = f'Basic realm="{REALM}"'
    body = {"error": failure.error, "error_description": failure.description}
    return json_response(body, failure.status, headers)


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, refusing (413) anything longer than `limit` before reading it all."""
    if request.content_length is not None and request.content_length > limit:
        raise OAuthFailure("invalid_request", f"request body exceeds {limit} bytes", status=413)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise OAuthFailure("invalid_request", f"request body exceeds {limit} bytes", status=413)
        chunks.append(chunk)


def _decode(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise OAuthFailure("invalid_request", "request body is not valid UTF-8") from None


def parse_json_object(body: bytes) -> dict[str, Any]:
    """A JSON object, or invalid_request naming what is wrong with the body."""
    try:
        data = json.loads(_decode(body))
    except json.JSONDecodeError as exc:
        raise OAuthFailure(
            "invalid_request", f"body is not valid JSON (line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise OAuthFailure("invalid_request", "body is nested too deeply") from None
    if not isinstance(data, dict):
        raise OAuthFailure("invalid_request", "body must be a JSON object")
    return data


def parse_params(body: bytes, content_type: str) -> dict[str, str]:
    """OAuth parameters from a JSON (the spec) or form (RFC 6749) body.

    The spec sends JSON "as the request data" and does not show a content type, so a body
    without one (or `text/plain`) is JSON if it starts with `{`, else a form.
    """
    return _single(_pairs(body, content_type))


def parse_token_params(body: bytes, content_type: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """A token request's parameters and its RFC 8707 `resource` values: the one parameter
    that may repeat in a form (§2), or be a JSON array of strings."""
    pairs = _pairs(body, content_type)
    resources: list[str] = []
    for name, value in pairs:
        if name != "resource":
            continue
        values = value if isinstance(value, list) else [value]
        uris = [v for v in values if isinstance(v, str) and v]
        if not values or len(uris) != len(values):
            raise OAuthFailure("invalid_request", "resource must be a URI or an array of URIs")
        resources.extend(uris)
    return _single([(n, v) for n, v in pairs if n != "resource"]), tuple(resources)


def _single(pairs: list[tuple[str, object]]) -> dict[str, str]:
    """Each parameter once (RFC 6749 §3.2: parameters MUST NOT repeat), a string."""
    bad = sorted({name for name, value in pairs if not isinstance(value, str)})
    if bad:
        raise OAuthFailure("invalid_request", f"parameters must be strings: {', '.join(bad)}")
    params: dict[str, str] = {}
    for name, value in pairs:
        if name in params:
            raise OAuthFailure("invalid_request", f"parameter {name} is repeated")
        params[name] = str(value)
    return params


def _pairs(body: bytes, content_type: str) -> list[tuple[str, object]]:
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind in ("", "text/plain"):
        kind = "application/json" if body.lstrip().startswith(b"{") else _FORM
    if kind == "application/json":
        return list(parse_json_object(body).items())
    if kind == _FORM:
        try:
            pairs = parse_qsl(_decode(body), keep_blank_values=True, strict_parsing=bool(body))
        except ValueError:
            raise OAuthFailure("invalid_request", "body is not a valid form encoding") from None
        return list(pairs)
    raise OAuthFailure(
        "invalid_request",
        f"unsupported content type {kind!r}: send application/json or {_FORM}",
        status=415,
    )


def basic_credentials(header: str) -> tuple[str, Secret] | None:
    """client_id and secret from `Authorization: Basic` (RFC 6749 §2.3.1), None if not Basic."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(rest.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise OAuthFailure("invalid_client", "malformed Basic credentials", status=401) from None
    user, colon, password = decoded.partition(":")
    if not colon or not user:
        raise OAuthFailure("invalid_client", "malformed Basic credentials", status=401)
    # The client id and secret are form-urlencoded before base64 (RFC 6749 §2.3.1).
    return unquote(user.replace("+", " ")), Secret(unquote(password.replace("+", " ")))


def bearer_value(header: str | None) -> tuple[str | None, str]:
    """(`token`, "") for a well-formed Bearer header, else (None, why) — "" reason if absent."""
    if header is None or not header.strip():
        return None, ""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None, ""  # RFC 6750 §3.1: another scheme is "no authentication information"
    value = rest.strip()
    if not value:
        return None, "the Bearer credential is empty"
    if not _B64TOKEN.fullmatch(value):
        return None, "the Bearer credential is malformed"
    return value, ""


def bearer_challenge(error: str | None, description: str, scope: str | None = None) -> str:
    """An RFC 6750 §3 `WWW-Authenticate` value."""
    parts = [f'realm="{REALM}"']
    if error:
        parts.append(f'error="{error}"')
        parts.append(f'error_description="{description}"')
    if scope:
        parts.append(f'scope="{scope}"')
    return "Bearer " + ", ".join(parts)
