"""What a credential adds to its token requests: `audience`, `resource` (RFC 8707) and
`token_params` (docs/configuration.md#token-request-parameters); a name keyturn sets itself is
refused, since the request would carry it twice.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from keyturn.config.fields import (
    REFERENCE_OR_INLINE,
    Check,
    Invalid,
    describe,
    json_array,
    json_or_split,
)
from keyturn.references import SecretRef

# Parameters keyturn itself sets in a token request (RFC 6749, RFC 7521/7523 assertions,
# RFC 8707), or that have a key of their own (`scope`, `audience`, `resource`).
RESERVED_TOKEN_PARAMS = frozenset(
    {
        "grant_type",
        "client_id",
        "client_secret",
        "client_assertion",
        "client_assertion_type",
        "assertion",
        "refresh_token",
        "scope",
        "audience",
        "resource",
        "code",
        "code_verifier",
        "redirect_uri",
        "username",
        "password",
    }
)
# RFC 6749 Appendix A.1-style parameter names: ASCII letters, digits, "_", "-", ".", ":".
_PARAM_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_SPACE_OR_CONTROL = re.compile(r"[\x00-\x20\x7f]")

_AUDIENCE_EXPECTED = (
    'the audience the token is for, without spaces, e.g. "https://api.example.com" (sent as '
    "`audience`, as Auth0 expects)"
)
_RESOURCE_EXPECTED = (
    'an absolute URI without a #fragment, or an array of them, e.g. "https://api.example.com/" '
    'or ["https://a.example/", "https://b.example/"] (RFC 8707; in the environment a JSON '
    'array or "a,b")'
)
_TOKEN_PARAMS_EXPECTED = (
    'a table of parameter names to values, e.g. token_params = { organization = "org_42" } '
    "(values are never secrets; a reference is resolved; in the environment a JSON object)"
)


def _one_value(value: object, expected: str) -> str:
    if not isinstance(value, str) or not value.strip() or _SPACE_OR_CONTROL.search(value):
        raise Invalid(f"got {describe(value)}; expected {expected}")
    return value


def _resource(value: object) -> str:
    text = _one_value(value, _RESOURCE_EXPECTED)
    try:
        parts = urlsplit(text)
    except ValueError:
        parts = None
    if parts is None or not parts.scheme or "#" in text:
        raise Invalid(f"got {describe(text)}; expected {_RESOURCE_EXPECTED}")
    return text


def _resources(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise Invalid(f"got an empty array; expected {_RESOURCE_EXPECTED}")
    return tuple(dict.fromkeys(_resource(item) for item in items))


def _token_params(value: object) -> tuple[tuple[str, SecretRef], ...]:
    if not isinstance(value, dict):
        raise Invalid(f"got {describe(value)}; expected {_TOKEN_PARAMS_EXPECTED}")
    params = []
    for name, item in value.items():
        if name in RESERVED_TOKEN_PARAMS:
            reserved = ", ".join(sorted(RESERVED_TOKEN_PARAMS))
            raise Invalid(
                f'has "{name}", a parameter keyturn sets itself or has a key of its own for; '
                f"expected names other than {reserved}"
            )
        if not _PARAM_NAME.fullmatch(name):
            raise Invalid(
                f"has the name {describe(name)}; expected parameter names of letters, digits "
                "and _ - . : (at most 64 characters)"
            )
        try:
            params.append((name, REFERENCE_OR_INLINE.value(item)))
        except Invalid as problem:
            raise Invalid(f"{name}: {problem}") from None
    return tuple(params)


AUDIENCE = Check(_AUDIENCE_EXPECTED, lambda value: _one_value(value, _AUDIENCE_EXPECTED))
RESOURCE = Check(_RESOURCE_EXPECTED, _resources, json_or_split)
TOKEN_PARAMS = Check(_TOKEN_PARAMS_EXPECTED, _token_params, json_array)
