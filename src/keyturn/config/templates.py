"""Templates and JSON pointers of `http` rotators, shared by the loader and the rotator: a
placeholder is URL-quoted in a path and JSON-string-escaped in a body (docs/configuration.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from urllib.parse import quote

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Placeholders every call may use; `key_id` (the key being revoked) only revoke.
REQUEST_PLACEHOLDERS: tuple[str, ...] = ("credential", "rotation_id", "key_name", "client_id")
REVOKE_PLACEHOLDERS: tuple[str, ...] = (*REQUEST_PLACEHOLDERS, "key_id")
_POINTER_ESCAPE = re.compile(r"~(?![01])")


def placeholders(template: str) -> list[str]:
    """The placeholder names in `template`, in order (with repeats)."""
    return PLACEHOLDER.findall(template)


def stray_brace(path: str) -> bool:
    """Whether a path template has a `{` or `}` that is not part of a placeholder."""
    rest = PLACEHOLDER.sub("", path)
    return "{" in rest or "}" in rest


def _fill(template: str, values: Mapping[str, str], *, body: bool) -> str:
    def one(match: re.Match[str]) -> str:
        value = values[match[1]]  # KeyError: the caller checks the names first
        if body:
            return json.dumps(value)[1:-1]
        quoted = quote(value, safe="")
        # "." and ".." are left as they are by quoting, and would be dot segments.
        return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted

    return PLACEHOLDER.sub(one, template)


def render_path(template: str, values: Mapping[str, str]) -> str:
    """The path with each placeholder replaced by its URL-quoted value."""
    return _fill(template, values, body=False)


def render_body(template: str, values: Mapping[str, str]) -> str:
    """The body with each placeholder replaced by its JSON-string-escaped value."""
    return _fill(template, values, body=True)


def body_problem(template: str) -> str | None:
    """Why a body template is not JSON once its placeholders are filled (None if it is)."""
    dummy = {name: "placeholder-value" for name in placeholders(template)}
    try:
        json.loads(render_body(template, dummy))
    except ValueError as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        return f"not JSON once its placeholders are filled with a string ({reason})"
    return None


def pointer_tokens(pointer: str) -> list[str]:
    """The reference tokens of an RFC 6901 JSON pointer; ValueError if it is malformed."""
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError('a JSON pointer is "" or starts with "/"')
    if _POINTER_ESCAPE.search(pointer):
        raise ValueError('"~" must be followed by 0 or 1 in a JSON pointer')
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


_MISSING = object()


def resolve_pointer(document: object, tokens: list[str]) -> object:
    """The value at `tokens` in a parsed JSON document; KeyError if there is none."""
    here = document
    for token in tokens:
        if isinstance(here, dict):
            here = here.get(token, _MISSING)
        elif isinstance(here, list) and re.fullmatch(r"0|[1-9][0-9]*", token):
            index = int(token)
            here = here[index] if index < len(here) else _MISSING
        else:
            here = _MISSING
        if here is _MISSING:
            raise KeyError(token)
    return here
