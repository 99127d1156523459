"""The value types of the configuration: pydantic's own (strict, with their ranges) where they
say it, and `Check`s for the project's own (durations, paths, URLs, secret references), each
with the words its problem lines say after "expected". A type that may hold a secret never
echoes the value.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import ipaddress
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import (
    Any,
    ClassVar,
    Self,
    TypeVar,
    dataclass_transform,
    get_args,
    get_origin,
    get_type_hints,
)
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ValidationError,
    ValidationInfo,
    model_validator,
    with_config,
)
from pydantic.fields import FieldInfo
from pydantic_core import (
    CoreSchema,
    InitErrorDetails,
    PydanticCustomError,
    PydanticKnownError,
    core_schema,
)

from keyturn.config.durations import DURATION_HELP, format_duration, parse_duration
from keyturn.config.templates import body_problem, placeholders, pointer_tokens, stray_brace
from keyturn.references import (
    KV_SEGMENT,
    REFERENCE_FORMS,
    SecretRef,
    looks_like_reference,
    parse_reference,
)

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
MAX_TIMEOUT = HOUR


class Invalid(Exception):
    """A value is wrong; the message is `<what was wrong>; expected <what>`, secret-free."""


@dataclass(frozen=True, slots=True)
class LoadContext:
    """What validation knows beyond one table (pydantic's validation context). The declared
    entry names (rotators: with their type and whether they use {client_id}) are None when
    some entry has no valid name: "no such entry" would then be a guess."""

    source: str
    base_dir: Path
    state_prefix: str
    providers: list[str] | None
    rotators: Mapping[str, tuple[str | None, bool]] | None
    credentials: list[str] | None


def context_of(info: ValidationInfo) -> LoadContext | None:
    return info.context if isinstance(info.context, LoadContext) else None


def problem(message: str) -> PydanticCustomError:
    """A problem line's message as a pydantic error (its text is never formatted again)."""
    return PydanticCustomError("keyturn", "{msg}", {"msg": message})


class Check:
    """One of the project's value types: what it `expected`s, how it `read`s a TOML value,
    and how an override's text becomes one (`env`)."""

    def __init__(
        self,
        expected: str,
        read: Callable[..., Any],
        env: Callable[[str], object] = str,
        *,
        contextual: bool = False,  # `read(value, context)`: it needs what validation knows
    ) -> None:
        self.expected, self._read, self.from_env = expected, read, env
        self._contextual = contextual

    def read(self, value: Any, context: LoadContext | None) -> Any:
        return self._read(value, context) if self._contextual else self._read(value)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.with_info_plain_validator_function(self._validate)

    def value(self, value: Any) -> Any:
        """The typed value; Invalid if it is wrong."""
        return self.read(value, None)

    def valid(self, value: Any) -> Any:
        """The typed value, or None if it is absent or wrong (a look at unvalidated data)."""
        try:
            return None if value is None else self.value(value)
        except Invalid:
            return None

    def _validate(self, value: Any, info: ValidationInfo) -> Any:
        try:
            return self.read(value, context_of(info))
        except Invalid as exc:
            raise problem(str(exc)) from None


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


_TOML_TYPES = (
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a float"),
    (str, "a string"),
    (dict, "a table"),
    (list, "an array"),
)


def kind_of(value: object) -> str:
    """The TOML type of a value, without the value (for fields that may hold a secret)."""
    return next((name for kind, name in _TOML_TYPES if isinstance(value, kind)), "a date/time")


def split(text: str) -> list[str]:
    """An override's "a,b" as an array."""
    return [part.strip() for part in text.split(",") if part.strip()]


def json_array(text: str) -> object:
    """An override's JSON array (other text stays text, for the type to refuse)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def json_or_split(text: str) -> object:
    """An override's JSON array, or "a,b"."""
    return json_array(text) if text.strip().startswith("[") else split(text)


def nonempty(value: object, expected: str) -> list[object]:
    """A non-empty array."""
    if not isinstance(value, list) or not value:
        raise Invalid(f"got {describe(value)}; expected {expected}")
    return value


def array(value: object, expected: str, item: Callable[[Any], Any]) -> tuple[Any, ...]:
    """A non-empty array, each item read by `item` (None: "got <item> in the array"), repeats
    dropped."""
    found = []
    for each in nonempty(value, expected):
        read = item(each)
        if read is None:
            raise Invalid(f"got {describe(each)} in the array; expected {expected}")
        found.append(read)
    return tuple(dict.fromkeys(found))


def array_of(expected: str, item: Callable[[Any], Any], env: Callable[[str], object]) -> Check:
    """A non-empty array of `item`s (see `array`); `env` reads an override's text."""
    return Check(expected, lambda value: array(value, expected, item), env)


def _text(value: object, expected: str, *, secret: bool = False) -> str:
    """A string that is not blank; a `secret` one's wrong value is named by its type only."""
    if not isinstance(value, str):
        raise Invalid(f"got {kind_of(value) if secret else describe(value)}; expected {expected}")
    if not value.strip():
        raise Invalid(f"got an empty string; expected {expected}")
    return value


def text(expected: str, pattern: str = r"\S") -> Any:
    """A string (pydantic's, strict) that is not blank, or that matches `pattern`."""
    return Field(strict=True, pattern=pattern, description=expected)


NAME = text(NAME_EXPECTED, f"^{NAME_RULE.pattern}$")
BOOLEAN = Field(strict=True)
BOOLEAN_EXPECTED = "true or false (in the environment also 1 or 0)"


def integer(minimum: int, maximum: int, unit: str = "") -> Any:
    """An integer (pydantic's, strict: not 1.0, not true) from `minimum` to `maximum`, both
    included; `unit` follows the range in problem lines, e.g. " (1 KiB to 64 MiB)"."""
    expected = f"an integer between {minimum} and {maximum}{unit}"
    return Field(strict=True, ge=minimum, le=maximum, description=expected)


def number(
    expected: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> Any:
    """A finite number, an integer or a float (pydantic's, strict: not true), within the
    bounds given, which `expected` states."""
    return Field(strict=True, allow_inf_nan=False, description=expected, gt=gt, ge=ge, lt=lt, le=le)


def _entry_name(value: object) -> str:
    if not isinstance(value, str) or not NAME_RULE.fullmatch(value):
        raise Invalid(f"got {describe(value)}; expected {NAME_EXPECTED}")
    return value


ENTRY_NAME = Check(NAME_EXPECTED, _entry_name)  # an entry's own name (blank shown as "")


def duration(
    *,
    maximum: float = 365 * DAY,
    minimum: float = 0.0,
    positive: bool = False,
    off: bool = False,
) -> Check:
    """A duration in seconds (number or text such as "5m") of at most `maximum` seconds and at
    least `minimum`; greater than zero if `positive`. With `off`, 0 is also accepted (it
    turns the feature off) and `minimum` applies to any other value."""
    low, high = format_duration(minimum), format_duration(maximum)
    if off:
        bound = f"0 (off), or a duration between {low} and {high}"
    elif positive and minimum == 0:
        bound = f"a duration greater than zero, at most {high}"
    else:
        bound = f"a duration between {low} and {high}"
    expected = f"{bound}: {DURATION_HELP}"

    def read(value: object) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise Invalid(f"got {describe(value)} ({exc}); expected {expected}") from None
        if off and seconds == 0:
            return seconds
        if seconds > maximum or seconds < minimum or (positive and seconds == 0):
            raise Invalid(f"got {describe(value)}, which is out of range; expected {bound}")
        return seconds

    return Check(expected, read)


def _parsed(value: str) -> SecretRef:
    try:
        return parse_reference(value)
    except ValueError as exc:
        raise Invalid(f"malformed reference ({exc})") from None


def secret_reference(example: str) -> Check:
    """A `vault:`/`env:`/`file:` reference; an inline value is refused and never echoed."""
    expected = f"a reference: {REFERENCE_FORMS} (e.g. {example})"

    def read(value: object) -> SecretRef:
        reference = _text(value, expected, secret=True)
        if not looks_like_reference(reference):
            raise Invalid(
                "got an inline secret, which is not allowed (its value is not shown); "
                f"expected {expected}"
            )
        return _parsed(reference)

    return Check(expected, read)


def _reference_or_inline(value: object) -> SecretRef:
    result = _text(value, REFERENCE_OR_INLINE.expected)
    if not looks_like_reference(result):
        if _CONTROL.search(result):
            raise Invalid(f"got {describe(result)}; expected a value without spaces or controls")
        return SecretRef.inline(result)
    return _parsed(result)


REFERENCE_OR_INLINE = Check(f"a value or a reference: {REFERENCE_FORMS}", _reference_or_inline)


def _url(value: object) -> str:
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


URL = Check("an https:// URL without ?query or #fragment", _url)


URLS = array_of(
    'a non-empty array of https:// URLs, e.g. ["https://vault-1:8200", "https://vault-2:8200"]',
    _url,
    split,  # KEYTURN_VAULT_NODES="https://a,https://b"
)


def is_loopback(host: str) -> bool:
    """Whether `host` is 127.0.0.0/8, ::1 or localhost."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _listen(value: object) -> tuple[str, int]:
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


LISTEN = Check('host:port with a port 0-65535, e.g. "127.0.0.1:9797" or "[::1]:9797"', _listen)


def kv_path(expected: str) -> Check:
    """A Vault path relative to a mount: segments joined by single '/', no '.'/'..'."""

    def read(value: object) -> str:
        result = _text(value, expected)
        if result.startswith("/"):
            raise Invalid(f'got {describe(result)}, which starts with "/"; expected {expected}')
        for segment in result.split("/"):
            if segment in (".", "..") or not KV_SEGMENT.fullmatch(segment):
                raise Invalid(f"got {describe(result)}; expected {expected}")
        return result

    return Check(expected, read)


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


HTTP_PATH_EXPECTED = (
    'a path starting with "/", relative to the provider\'s base_url, e.g. "/oauth/token": '
    'no scheme or "//host", no "." or ".." segment, no backslash, spaces, control characters '
    "or #fragment"
)


def _http_path(value: object) -> str:
    result = _text(value, HTTP_PATH_EXPECTED)
    reason = http_path_problem(result)
    if reason is not None:
        raise Invalid(f"got {describe(result)}{reason}; expected {HTTP_PATH_EXPECTED}")
    return result


HTTP_PATH = Check(HTTP_PATH_EXPECTED, _http_path)


def _listing(names: tuple[str, ...]) -> str:
    return ", ".join(f"{{{n}}}" for n in names)


def _placeholder_problem(template: str, allowed: tuple[str, ...]) -> str | None:
    for name in placeholders(template):
        if name in allowed:
            continue
        if name == "key_id":
            return (
                f"{{key_id}} is known only to revoke; expected placeholders among "
                f"{_listing(allowed)}"
            )
        return f"unknown placeholder {{{name}}}; expected placeholders among {_listing(allowed)}"
    return None


def path_template(allowed: tuple[str, ...]) -> Check:
    """An HTTP path whose `{placeholders}` are among `allowed`."""
    expected = f"{HTTP_PATH_EXPECTED}; it may use {_listing(allowed)}"

    def read(value: Any) -> str:
        reason = http_path_problem(value) if isinstance(value, str) else ""
        if reason is not None or not value.strip():
            raise Invalid(f"got {describe(value)}{reason or ''}; expected {expected}")
        path: str = value
        if stray_brace(path):
            raise Invalid(
                f'got {describe(path)}, which has a "{{" or "}}" outside a {{placeholder}}; '
                f"expected {expected}"
            )
        reason = _placeholder_problem(path, allowed)
        if reason is not None:
            raise Invalid(reason)
        return path

    return Check(expected, read)


def body_template(allowed: tuple[str, ...]) -> Check:
    """A JSON text with `{placeholders}` among `allowed` inside its strings (never echoed)."""
    expected = f'a JSON text, e.g. \'{{"name": "{{key_name}}"}}\'; it may use {_listing(allowed)}'

    def read(value: object) -> str:
        template = _text(value, expected, secret=True)
        reason = _placeholder_problem(template, allowed)
        if reason is not None:
            raise Invalid(reason)
        reason = body_problem(template)
        if reason is not None:
            raise Invalid(f"{reason}; expected {expected}")
        return template

    return Check(expected, read)


def json_pointer(to: str, *, allow_root: bool = False) -> Check:
    """An RFC 6901 JSON pointer; "" (the whole response) only if `allow_root`."""
    root = ', or "" for the whole response' if allow_root else ""
    expected = f"a JSON pointer (RFC 6901) {to}{root}"

    def read(value: object) -> str:
        if not isinstance(value, str) or (value == "" and not allow_root):
            shown = "an empty string" if value == "" else describe(value)
            raise Invalid(f"got {shown}; expected {expected}")
        try:
            pointer_tokens(value)
        except ValueError as exc:
            raise Invalid(f"got {describe(value)} ({exc}); expected {expected}") from None
        return value

    return Check(expected, read)


def _status(item: object) -> int | None:
    return item if type(item) is int and 100 <= item <= 599 else None


def _statuses_env(text: str) -> object:  # "200,201", or a JSON array
    return [int(n) for n in split(text)] if re.fullmatch(r"[\d\s,]+", text) else json_array(text)


STATUSES = array_of(
    'a non-empty array of HTTP statuses (100-599), e.g. [200, 201] (in the environment "200,201")',
    _status,
    _statuses_env,
)


def command(example: str, *, from_env: bool = True) -> Check:
    """A command as argv (run without a shell): a non-empty array of strings, the program an
    absolute path or a name looked up in PATH. `from_env`: it can be overridden, with a JSON
    array."""
    expected = (
        "a non-empty array of strings, the program first: an absolute path or a name looked up "
        f"in PATH, e.g. {example}" + (" (in the environment a JSON array)" if from_env else "")
    )

    def read(value: object) -> tuple[str, ...]:
        for item in nonempty(value, expected):
            if not isinstance(item, str) or not item or "\x00" in item:
                shown = describe(item)
                if item == "":
                    shown = "an empty string"
                elif isinstance(item, str):
                    shown = "a string with a NUL character"
                raise Invalid(f"got {shown} in the array; expected {expected}")
        assert isinstance(value, list)
        program = value[0]
        if "/" in program and not program.startswith("/"):
            raise Invalid(
                f"got {describe(program)} as the program, a relative path; expected {expected}"
            )
        return tuple(value)

    return Check(expected, read, json_array if from_env else str)


def _fs_path(value: object, context: LoadContext | None) -> Path:
    result = _text(value, FS_PATH.expected)
    if looks_like_reference(result):
        raise Invalid(f"got a reference; expected {FS_PATH.expected}, not a reference")
    if "\x00" in result:
        raise Invalid(f"got a path with a NUL character; expected {FS_PATH.expected}")
    return (context.base_dir if context else Path()) / result


# A filesystem path (not a reference); a relative one starts at the file's directory.
FS_PATH = Check(
    "a filesystem path (relative paths start at the configuration file's directory)",
    _fs_path,
    contextual=True,
)

_SINK_PATH_EXPECTED = (
    'an absolute path of a file, e.g. "/run/keyturn/reporting/token.env": no "." or ".." '
    'segment, no "//", not ending in "/", no control characters'
)


def _sink_path(value: object) -> Path:
    expected = _SINK_PATH_EXPECTED
    value = _text(value, expected)
    if looks_like_reference(value):
        raise Invalid(f"got a reference; expected {expected}, not a reference")
    shown = describe(value)
    if re.search(r"[\x00-\x1f\x7f]", value):
        raise Invalid(f"got a path with control characters; expected {expected}")
    if not value.startswith("/"):
        raise Invalid(f"got {shown}, a relative path; expected {expected}")
    if value.endswith("/"):
        raise Invalid(f'got {shown}, which ends in "/" (a directory); expected {expected}')
    if any(segment in ("", ".", "..") for segment in value.split("/")[1:]):
        reason = 'which has a "//", "." or ".." segment'
        raise Invalid(f"got {shown}, {reason}; expected {expected}")
    return Path(value)


SINK_PATH = Check(_SINK_PATH_EXPECTED, _sink_path)

_MODE_EXPECTED = (
    'a file mode as a string of octal digits, e.g. "0600" or "0640": at most 0777, readable by '
    "its owner (keyturn reads the file back), and no permission for others"
)


def _mode(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        raise Invalid(
            f"got the number {describe(value)}; expected {_MODE_EXPECTED} (in quotes: a TOML "
            "number is read in decimal)"
        )
    if not isinstance(value, str) or not re.fullmatch(r"(?:0o|0)?[0-7]{3}", value.strip()):
        raise Invalid(f"got {describe(value)}; expected {_MODE_EXPECTED}")
    mode = int(value.strip().removeprefix("0o"), 8)
    if mode & 0o007:
        raise Invalid(
            f"got {describe(value)}, which gives others access to the secret; expected "
            f"{_MODE_EXPECTED}"
        )
    if not mode & 0o400:
        raise Invalid(
            f"got {describe(value)}, which the owner cannot read; expected {_MODE_EXPECTED}"
        )
    return mode


MODE = Check(_MODE_EXPECTED, _mode)


def url_or_reference(what: str) -> Check:
    """A reference, or a plain URL kept as `SecretRef.inline` (https, or http to a loopback
    host). A refused URL is never echoed: it may hold a token."""
    expected = f"{what}: a reference ({REFERENCE_FORMS}) or an {URL.expected}"

    def read(value: object) -> SecretRef:
        if not isinstance(value, str):
            raise Invalid(f"got {kind_of(value)}; expected {expected}")
        if looks_like_reference(value):
            return _parsed(value)
        try:
            url = _url(value)
        except Invalid:
            raise Invalid(
                "got a string that is not a plain URL without user info, ?query or #fragment "
                f"(not shown: it may hold a secret); expected {expected}"
            ) from None
        parts = urlsplit(url)
        if parts.scheme == "http" and not is_loopback(parts.hostname or ""):
            raise Invalid(
                "plain http to a host that is not a loopback host (the URL is not shown); "
                f"expected https://, or a loopback host ({LOOPBACK_HOSTS})"
            )
        return SecretRef.inline(url)

    return Check(expected, read)


def names(expected: str, what: str, known: tuple[str, ...] = (), section: str = "") -> Check:
    """A non-empty array of names (in the environment a JSON array or "a,b"), each among
    `known`, or among the declared entries of `section` when validation knows them."""

    def read(value: object, context: LoadContext | None) -> tuple[str, ...]:
        among = (getattr(context, section) if context else None) if section else known

        def name(item: object) -> str | None:
            if not isinstance(item, str) or not NAME_RULE.fullmatch(item):
                return None
            if among is not None and item not in among:
                close = difflib.get_close_matches(item, among, n=1, cutoff=0.6)
                listing = "expected one of: " + ", ".join(among)
                hint = f'did you mean "{close[0]}"?' if close else listing
                raise Invalid(f'no {what} is named "{item}"; {hint}')
            return item

        return array(value, expected, name)

    return Check(expected, read, json_or_split, contextual=True)


def rule(judge: Callable[[Any, LoadContext], str | None]) -> AfterValidator:
    """After a key's own check, a rule that needs what validation knows beyond one table:
    `judge(value, context)` says what is wrong (or None). Only a file is judged."""

    def validate(value: Any, info: ValidationInfo) -> Any:
        context = context_of(info)
        wrong = context and judge(value, context)
        if wrong:
            raise problem(wrong)
        return value

    return AfterValidator(validate)


def refers_to(section: str, what: str) -> AfterValidator:
    """The name of an entry of `section` (when every entry there has a valid name)."""

    def judge(name: str | None, context: LoadContext) -> str | None:
        declared = getattr(context, section)
        if declared is None or name is None or name in declared:
            return None
        known = ", ".join(f'"{n}"' for n in declared) or f"none (add a [[{section}]] entry)"
        return f'no {what} is named "{name}"; expected one of: {known}'

    return rule(judge)


def state_prefix_overlap(publish_to: str, state_prefix: str) -> str | None:
    """Why apps reading `publish_to` could read keyturn's private records under
    `state_prefix` (None if they could not). Paths compare by "/" segments."""
    published, private = publish_to.split("/"), state_prefix.split("/")
    if published == private:
        where = "is keyturn.state_prefix"
    elif published[: len(private)] == private:
        where = f'is under keyturn.state_prefix "{state_prefix}"'
    elif private[: len(published)] == published:
        where = f'is above keyturn.state_prefix "{state_prefix}" (a prefix of it)'
    else:
        return None
    return (
        f'"{publish_to}" {where}, keyturn\'s private records, which no app may read; '
        "expected a path outside keyturn.state_prefix and not a prefix of it (paths compare "
        'by "/" segments)'
    )


OUTSIDE_STATE_PREFIX = rule(lambda path, context: state_prefix_overlap(path, context.state_prefix))


def _runbook(value: object) -> str:
    expected = RUNBOOK.expected
    try:
        url = _url(value)
    except Invalid as exc:
        raise Invalid(str(exc).replace(URL.expected, expected)) from None
    if urlsplit(url).scheme != "https" and not is_loopback(urlsplit(url).hostname or ""):
        raise Invalid(f"got {describe(url)}; expected {expected}")
    return url


RUNBOOK = Check(
    "an https:// URL of a copy of docs/runbook.md (alerts link to <url>#<alertname>), "
    "without ?query or #fragment",
    _runbook,
)


# -- tables -------------------------------------------------------------------------------

TABLE = ConfigDict(extra="forbid")
T = TypeVar("T")
Where = str | tuple[str | int, ...]  # a key of a table, or a key path below it


def report(found: list[tuple[Where, str]]) -> ValidationError:
    """Problems in one table, as pydantic's error (one line each)."""
    errors = [
        InitErrorDetails(type=problem(message), loc=(w,) if isinstance(w, str) else w, input=None)
        for w, message in found
    ]
    return ValidationError.from_exception_data("keyturn", errors)


@functools.cache
def fields_of(model: type) -> dict[str, FieldInfo]:
    """A table's fields as pydantic reads them, in order."""
    hints = get_type_hints(model, include_extras=True)
    fields = dataclasses.fields(model)
    return {f.name: FieldInfo.from_annotated_attribute(hints[f.name], f) for f in fields}


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def table(*, kw_only: bool = False) -> Callable[[type[T]], type[T]]:
    """A TOML table: a frozen dataclass that pydantic validates when it reads the file (its
    unknown keys refused), and nothing else does: an object the code makes is taken as it is."""

    def make(cls: type[T]) -> type[T]:
        made = dataclasses.dataclass(frozen=True, slots=True, kw_only=kw_only)(cls)
        return with_config(TABLE)(made)

    return make


def described(text: str) -> Any:
    """What a table key expects, as problem lines say it ("got 5; expected <text>")."""
    return Field(description=text)


@table()
class Table:
    """A TOML table. Its keys' types check what a file says, and `problems` (rules across
    keys, run once each key is valid) what a whole table says. `NAMED_IN_PROBLEMS`: an unknown
    key is reported "for <the table's key>"."""

    NAMED_IN_PROBLEMS: ClassVar[bool] = False

    @model_validator(mode="after")
    def _across_keys(self, info: ValidationInfo) -> Self:
        context = context_of(info)
        found = [] if context is None else list(self.problems(context))
        if found:
            raise report(found)
        return self

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        return iter(())


class Via:
    """The file holds `table` (a model with `build()`) where the code reads another object
    (the annotated type)."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        schema = handler.generate_schema(self.table)
        return core_schema.no_info_after_validator_function(lambda t: t.build(), schema)


class Entries:
    """An array of named tables (`[[providers]]`): a read-only mapping by name, or a tuple."""

    def __init__(self, singular: str) -> None:
        self.singular = singular

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        keyed = get_origin(source) is Mapping
        items = core_schema.list_schema(handler.generate_schema(get_args(source)[int(keyed)]))

        def collect(values: list[Any]) -> Any:
            return MappingProxyType({v.name: v for v in values}) if keyed else tuple(values)

        return core_schema.no_info_after_validator_function(collect, items)


@dataclasses.dataclass(frozen=True)
class Unique:
    """A key whose value no other table of its kind in the file may have."""

    expected: str


@dataclasses.dataclass(frozen=True)
class NotAKey:
    """A key of the base table that a variant does not take (it keeps its default): a file
    that sets it gets "unknown key", or with `named` the variant's `refusal(key)` (an override
    may set it, to be refused so), and listings leave it out."""

    named: bool = False

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def refuse(value: Any) -> Any:
            raise PydanticKnownError("unexpected_keyword_argument")

        return core_schema.no_info_plain_validator_function(refuse)


NOT_A_KEY = NotAKey()
