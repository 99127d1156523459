"""Field types of the configuration: how a raw TOML value (or an override's text) is read.

A `Field` pairs a description of what is expected with a `convert(value, from_env)` that
returns the typed value or raises `Invalid("<what was wrong>; expected <what>")`. Values
from the environment are text and are read by the field's type (`true`/`false`/`1`/`0`,
numbers, durations). Fields that may hold a secret never put the value in a message.

Every number has a range, and the message of a value outside it states the range: a
duration is at most `maximum` seconds, an integer at most `maximum`, so that a typo such as
`"100000000000d"` or `1e308` is refused at load rather than overflowing a timer later.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar
from urllib.parse import urlsplit

from keyturn.config.durations import DURATION_HELP, format_duration, parse_duration
from keyturn.references import (
    KV_SEGMENT,
    REFERENCE_FORMS,
    SecretRef,
    looks_like_reference,
    parse_reference,
)

T = TypeVar("T")
S = TypeVar("S", bound=str)

NAME_RULE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
NAME_EXPECTED = (
    'a name of lowercase letters, digits, "_" and "-", starting with a letter or digit '
    "(at most 63 characters)"
)
LOOPBACK_HOSTS = "127.0.0.0/8, ::1, localhost"
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
# In an HTTP path also the C1 controls and Unicode's line and paragraph separators.
_PATH_CONTROL = re.compile(r"[\x00-\x20\x7f-\x9f\u2028\u2029]")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_DOT_SEGMENT = re.compile(r"\.|\.\.|%2e|\.%2e|%2e\.|%2e%2e", re.IGNORECASE)

DAY = 86400.0
HOUR = 3600.0
# The longest duration most keys take, and the longest time-out.
MAX_DURATION = 365 * DAY
MAX_TIMEOUT = HOUR


class Invalid(Exception):
    """A value is wrong; the message is `<what was wrong>; expected <what>`, secret-free."""


@dataclass(frozen=True, slots=True)
class Field(Generic[T]):
    expected: str
    convert: Callable[[object, bool], T]


def describe(value: object) -> str:
    """A short rendering of a (non-secret) value for a problem line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) >= 10**20:  # not a wall of digits
        return "an integer of more than 20 digits"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value if len(value) <= 60 else value[:57] + "...")
    return kind_of(value)


def kind_of(value: object) -> str:
    """The TOML type of a value, without the value (for fields that may hold a secret)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return "a date/time"


def _text(value: object, expected: str) -> str:
    if not isinstance(value, str):
        raise Invalid(f"got {describe(value)}; expected {expected}")
    if not value.strip():
        raise Invalid(f"got an empty string; expected {expected}")
    return value


def text(expected: str, rule: re.Pattern[str] | None = None) -> Field[str]:
    """A non-empty string, optionally matching `rule`."""

    def convert(value: object, _env: bool) -> str:
        result = _text(value, expected)
        if rule is not None and not rule.fullmatch(result):
            raise Invalid(f"got {describe(result)}; expected {expected}")
        return result

    return Field(expected, convert)


def choice(options: tuple[S, ...], expected: str | None = None) -> Field[S]:
    """One of `options`, exactly."""
    expected = expected or "one of " + ", ".join(json.dumps(o) for o in options)

    def convert(value: object, _env: bool) -> S:
        for option in options:
            if value == option:
                return option
        raise Invalid(f"got {describe(value)}; expected {expected}")

    return Field(expected, convert)


def _boolean(value: object, from_env: bool) -> bool:
    if from_env and isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0"):
            return False
    elif isinstance(value, bool):
        return value
    raise Invalid(f"got {describe(value)}; expected {BOOLEAN.expected}")


BOOLEAN: Field[bool] = Field("true or false (in the environment also 1 or 0)", _boolean)


def integer(minimum: int, maximum: int, unit: str = "") -> Field[int]:
    """An integer from `minimum` to `maximum` (both included); `unit` follows the range in
    messages, e.g. " (1 KiB to 64 MiB)"."""
    expected = f"an integer between {minimum} and {maximum}{unit}"

    def convert(value: object, from_env: bool) -> int:
        if from_env and isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d{1,30}\s*", value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"got {describe(value)}; expected {expected}")
        if not minimum <= value <= maximum:
            raise Invalid(f"got {describe(value)}, which is out of range; expected {expected}")
        return value

    return Field(expected, convert)


def number(expected: str, check: Callable[[float], bool]) -> Field[float]:
    """A finite number (int or float) for which `check` holds; `expected` states the range."""

    def convert(value: object, from_env: bool) -> float:
        readable: str | float | None = None
        if isinstance(value, str):
            readable = value if from_env else None
        elif isinstance(value, int | float) and not isinstance(value, bool):
            readable = value
        result: float | None = None
        if readable is not None:
            try:
                result = float(readable)
            except (ValueError, OverflowError):  # not a number, or an int beyond any float
                result = None
        if result is None or not math.isfinite(result):
            raise Invalid(f"got {describe(value)}; expected {expected}")
        if not check(result):
            raise Invalid(f"got {describe(value)}, which is out of range; expected {expected}")
        return result

    return Field(expected, convert)


def duration_range(
    *, maximum: float, minimum: float = 0.0, positive: bool = False, off: bool = False
) -> str:
    """The words for a duration's range, e.g. "a duration between 1s and 365d"."""
    if off:
        return (
            f"0 (off), or a duration between {format_duration(minimum)} and "
            f"{format_duration(maximum)}"
        )
    if positive and minimum == 0:
        return f"a duration greater than zero, at most {format_duration(maximum)}"
    return f"a duration between {format_duration(minimum)} and {format_duration(maximum)}"


def duration(
    *,
    maximum: float = MAX_DURATION,
    minimum: float = 0.0,
    positive: bool = False,
    off: bool = False,
) -> Field[float]:
    """A duration in seconds (number or text such as "5m") of at most `maximum` seconds and at
    least `minimum`; greater than zero if `positive`. With `off`, 0 is also accepted (it
    turns the feature off) and `minimum` applies to any other value."""
    bound = duration_range(maximum=maximum, minimum=minimum, positive=positive, off=off)
    expected = f"{bound}: {DURATION_HELP}"

    def convert(value: object, _env: bool) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise Invalid(f"got {describe(value)} ({exc}); expected {expected}") from None
        if off and seconds == 0:
            return seconds
        if seconds > maximum or seconds < minimum or (positive and seconds == 0):
            raise Invalid(f"got {describe(value)}, which is out of range; expected {bound}")
        return seconds

    return Field(expected, convert)


def secret_reference(example: str) -> Field[SecretRef]:
    """A `vault:`/`env:`/`file:` reference; an inline value is refused and never echoed."""
    expected = f"a reference: {REFERENCE_FORMS} (e.g. {example})"

    def convert(value: object, _env: bool) -> SecretRef:
        if not isinstance(value, str):
            raise Invalid(f"got {kind_of(value)}; expected {expected}")
        if not value.strip():
            raise Invalid(f"got an empty string; expected {expected}")
        if not looks_like_reference(value):
            raise Invalid(
                "got an inline secret, which is not allowed (its value is not shown); "
                f"expected {expected}"
            )
        try:
            return parse_reference(value)
        except ValueError as exc:
            raise Invalid(f"malformed reference ({exc})") from None

    return Field(expected, convert)


def _reference_or_inline(value: object, _env: bool) -> SecretRef:
    result = _text(value, REFERENCE_OR_INLINE.expected)
    if not looks_like_reference(result):
        if _CONTROL.search(result):
            raise Invalid(f"got {describe(result)}; expected a value without spaces or controls")
        return SecretRef.inline(result)
    try:
        return parse_reference(result)
    except ValueError as exc:
        raise Invalid(f"malformed reference ({exc})") from None


REFERENCE_OR_INLINE: Field[SecretRef] = Field(
    f"a value or a reference: {REFERENCE_FORMS}", _reference_or_inline
)


def _url(value: object, _env: bool) -> str:
    expected = URL.expected
    result = _text(value, expected)
    # A URL with user info may carry a password: never echo it.
    shown = "a URL with user info" if "@" in result else describe(result)
    try:
        parts = urlsplit(result)
        _ = parts.port
    except ValueError:
        raise Invalid(f"got {shown}, which is not a valid URL; expected {expected}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise Invalid(f"got {shown}; expected {expected}")
    if "@" in parts.netloc:
        raise Invalid(
            f"got {shown} (not shown: it may hold a password); expected {expected}, "
            "with credentials given as references, not in the URL"
        )
    if not parts.hostname:
        raise Invalid(f"got {shown}, which has no host; expected {expected}")
    if parts.query or parts.fragment or "?" in result or "#" in result:
        raise Invalid(f"got {shown}, which has a query or fragment; expected {expected}")
    if _CONTROL.search(result):
        raise Invalid(f"got {shown}, which has spaces or control characters; expected {expected}")
    return result.rstrip("/")


URL: Field[str] = Field("an https:// URL without ?query or #fragment", _url)


def _urls(value: object, from_env: bool) -> tuple[str, ...]:
    if from_env and isinstance(value, str):  # KEYTURN_VAULT_NODES="https://a,https://b"
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not value:
        raise Invalid(f"got {describe(value)}; expected {URLS.expected}")
    result: list[str] = []
    for item in value:
        url = _url(item, from_env)
        if url not in result:
            result.append(url)
    return tuple(result)


URLS: Field[tuple[str, ...]] = Field(
    'a non-empty array of https:// URLs, e.g. ["https://vault-1:8200", "https://vault-2:8200"]',
    _urls,
)


def is_loopback(host: str) -> bool:
    """Whether `host` is 127.0.0.0/8, ::1 or localhost."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _listen(value: object, _env: bool) -> tuple[str, int]:
    expected = LISTEN.expected
    result = _text(value, expected)
    host, sep, port_text = result.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise Invalid(
                f"got {describe(result)}, whose [host] is not IPv6; expected {expected}"
            ) from None
    elif ":" in host:
        raise Invalid(f"got {describe(result)}; expected {expected} (an IPv6 host in brackets)")
    if not sep or not host or _CONTROL.search(host):
        raise Invalid(f"got {describe(result)}; expected {expected}")
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise Invalid(f"got {describe(result)}, whose port is not 0-65535; expected {expected}")
    return host, int(port_text)


LISTEN: Field[tuple[str, int]] = Field(
    'host:port with a port 0-65535, e.g. "127.0.0.1:9797" or "[::1]:9797"', _listen
)


def kv_path(expected: str) -> Field[str]:
    """A Vault path relative to a mount: segments joined by single '/', no '.'/'..'."""

    def convert(value: object, _env: bool) -> str:
        result = _text(value, expected)
        if result.startswith("/"):
            raise Invalid(f'got {describe(result)}, which starts with "/"; expected {expected}')
        for segment in result.split("/"):
            if segment in (".", "..") or not KV_SEGMENT.fullmatch(segment):
                raise Invalid(f"got {describe(result)}; expected {expected}")
        return result

    return Field(expected, convert)


def http_path_problem(path: str) -> str | None:
    """Why `path` is not a path relative to a provider's base_url (None if it is): what
    follows "got <path>" in a problem line."""
    if _SCHEME.match(path):
        return ", which has a scheme (a full URL)"
    if path.startswith("//"):
        return ', which names a host ("//")'
    if "\\" in path:
        return ", which has a backslash"
    if _PATH_CONTROL.search(path):
        return ", which has spaces or control characters"
    if "#" in path:
        return ", which has a #fragment"
    if not path.startswith("/"):
        return ""
    segments = path.split("?", 1)[0].split("/")
    if any(_DOT_SEGMENT.fullmatch(segment) for segment in segments):
        return ', which has a "." or ".." segment'
    return None


def _http_path(value: object, _env: bool) -> str:
    expected = HTTP_PATH.expected
    result = _text(value, expected)
    problem = http_path_problem(result)
    if problem is not None:
        raise Invalid(f"got {describe(result)}{problem}; expected {expected}")
    return result


HTTP_PATH: Field[str] = Field(
    'a path starting with "/", relative to the provider\'s base_url, e.g. "/oauth/token": '
    'no scheme or "//host", no "." or ".." segment, no backslash, spaces, control characters '
    "or #fragment",
    _http_path,
)


def fs_path(base_dir: Path) -> Field[Path]:
    """A filesystem path (not a reference); a relative one is taken from `base_dir`."""
    expected = "a filesystem path (relative paths start at the configuration file's directory)"

    def convert(value: object, _env: bool) -> Path:
        result = _text(value, expected)
        if looks_like_reference(result):
            raise Invalid(f"got a reference; expected {expected}, not a reference")
        if "\x00" in result:
            raise Invalid(f"got a path with a NUL character; expected {expected}")
        return base_dir / result

    return Field(expected, convert)


def entry_name_problem(value: object) -> str | None:
    """Why `value` is not a valid provider/credential name (None if it is)."""
    if value is None:
        return f"missing; expected {NAME_EXPECTED}"
    if not isinstance(value, str) or not NAME_RULE.fullmatch(value):
        return f"got {describe(value)}; expected {NAME_EXPECTED}"
    return None


NAME: Field[str] = text(NAME_EXPECTED, NAME_RULE)
