"""Sandbox settings: defaults, the TOML file and their validation.

One validator serves both the `--config` file and `PUT /admin/settings`, so a setting that
can be written in the file can be changed on a running sandbox, and a bad value gets the same
message naming the key either way. `Settings` is frozen: an update builds a new object and
swaps it in, so a request never sees half an update.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from keyturn.errors import ConfigError

# Endpoints that rate limits and faults can target; a group or "*" targets several.
ENDPOINTS = ("token", "revoke", "users", "projects")
GROUPS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"oauth": ("token", "revoke"), "resources": ("users", "projects")}
)
SELECTORS = (*ENDPOINTS, *GROUPS, "*")

# RFC 6749 §3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E ), separated by single spaces.
_SCOPE = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]+( [\x21\x23-\x5b\x5d-\x7e]+)*$")


def selectors_for(endpoint: str) -> tuple[str, ...]:
    """The selectors that match `endpoint`, most specific first."""
    groups = tuple(name for name, members in GROUPS.items() if endpoint in members)
    return (endpoint, *groups, "*")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most `requests` per fixed window of `per_seconds`."""

    requests: int
    per_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "per_seconds": self.per_seconds}


@dataclass(frozen=True)
class Settings:
    """Everything about the sandbox's behaviour that a test or an operator may want to change."""

    access_token_lifetime: int = 3600
    refresh_token_lifetime: int = 30 * 86400
    issue_refresh_token_for_client_credentials: bool = True
    include_expires_in: bool = True
    token_type: str = "Bearer"
    default_scope: str = "users:read projects:read"
    scope_override: str | None = None
    client_secret_overlap: int = 86400
    max_body_bytes: int = 16384
    access_log: bool = True
    # Behaviours of some real providers (django-oauth-toolkit, for one), off by default.
    revoke_previous_access_token_on_refresh: bool = False
    invalid_token_status: int = 401
    # The token endpoint as identity servers other than the spec's have it (RFC 8707 and
    # Keycloak's answers), off by default: the `audience`/`resource` values it accepts (empty:
    # any), unknown parameters refused, access tokens shaped as JWTs carrying `aud`,
    # `refresh_expires_in` in answers, and an absolute refresh-token family lifetime.
    allowed_targets: tuple[str, ...] = ()
    refuse_unknown_parameters: bool = False
    jwt_access_tokens: bool = False
    include_refresh_expires_in: bool = False
    refresh_token_family_lifetime: int | None = None
    # An access token carrying this scope may call the admin API as the admin token does (as
    # a Keycloak client with realm-management roles may manage other clients). None: only the
    # admin token.
    admin_scope: str | None = None
    rate_limits: Mapping[str, RateLimit] = field(default_factory=lambda: MappingProxyType({}))

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["rate_limits"] = {k: v.to_json() for k, v in self.rate_limits.items()}
        return data


class Problems:
    """Collects one line per bad key, so a file with three mistakes reports all three."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = []

    def add(self, key: str, expected: str, value: Any) -> None:
        shown = repr(value) if len(repr(value)) <= 60 else type(value).__name__
        self.lines.append(f"{self.source}: {key}: expected {expected}, got {shown}")


def check_int(problems: Problems, key: str, value: Any, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        problems.add(key, f"an integer from {low} to {high}", value)
        return None
    return value


def check_number(problems: Problems, key: str, value: Any, low: float, high: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        problems.add(key, f"a number from {low} to {high}", value)
        return None
    return float(value)


def check_bool(problems: Problems, key: str, value: Any) -> bool | None:
    if not isinstance(value, bool):
        problems.add(key, "true or false", value)
        return None
    return value


def check_scope(problems: Problems, key: str, value: Any) -> str | None:
    if not isinstance(value, str) or (value and not _SCOPE.match(value)):
        problems.add(key, "a space-separated list of scope tokens (RFC 6749 §3.3)", value)
        return None
    return value


def _invalid_token_status(problems: Problems, key: str, value: Any) -> int | None:
    if isinstance(value, bool) or value not in (401, 403):
        problems.add(key, "401 or 403", value)
        return None
    return int(value)


def _token_type(problems: Problems, key: str, value: Any) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,31}", value):
        problems.add(key, "a token type word such as 'Bearer'", value)
        return None
    return value


def _targets(problems: Problems, key: str, value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.add(key, "an array of audience or resource URIs", value)
        return None
    return tuple(value)


_Checker = Callable[[Problems, str, Any], Any]
_YEAR = 366 * 86400
_CHECKS: Mapping[str, _Checker] = MappingProxyType(
    {
        "access_token_lifetime": lambda p, k, v: check_int(p, k, v, 1, _YEAR),
        "refresh_token_lifetime": lambda p, k, v: check_int(p, k, v, 1, 10 * _YEAR),
        "issue_refresh_token_for_client_credentials": check_bool,
        "include_expires_in": check_bool,
        "token_type": _token_type,
        "default_scope": check_scope,
        "scope_override": check_scope,
        "client_secret_overlap": lambda p, k, v: check_int(p, k, v, 0, _YEAR),
        "max_body_bytes": lambda p, k, v: check_int(p, k, v, 256, 10 * 1024 * 1024),
        "access_log": check_bool,
        "revoke_previous_access_token_on_refresh": check_bool,
        "invalid_token_status": _invalid_token_status,
        "allowed_targets": _targets,
        "refuse_unknown_parameters": check_bool,
        "jwt_access_tokens": check_bool,
        "include_refresh_expires_in": check_bool,
        "refresh_token_family_lifetime": lambda p, k, v: check_int(p, k, v, 1, 10 * _YEAR),
        "admin_scope": check_scope,
    }
)
_NULLABLE = frozenset({"scope_override", "refresh_token_family_lifetime", "admin_scope"})


def _rate_limits(
    problems: Problems, current: Mapping[str, RateLimit], value: Any
) -> Mapping[str, RateLimit]:
    """Merge a `rate_limits` table into `current`; a null entry removes that endpoint's limit."""
    if not isinstance(value, Mapping):
        problems.add("rate_limits", "a table of endpoint = {requests, per_seconds}", value)
        return current
    merged = dict(current)
    for selector, rule in value.items():
        key = f"rate_limits.{selector}"
        if selector not in SELECTORS:
            problems.add(key, f"an endpoint among {', '.join(SELECTORS)}", selector)
        elif rule is None:
            merged.pop(selector, None)
        elif not isinstance(rule, Mapping) or set(rule) != {"requests", "per_seconds"}:
            problems.add(key, "a table with exactly requests and per_seconds", rule)
        else:
            requests = check_int(problems, f"{key}.requests", rule["requests"], 1, 10**9)
            per = check_number(problems, f"{key}.per_seconds", rule["per_seconds"], 0.001, 86400)
            if requests is not None and per is not None:
                merged[selector] = RateLimit(requests, per)
    return MappingProxyType(merged)


def apply_settings(base: Settings, data: Mapping[str, Any], source: str) -> Settings:
    """`base` with the keys of `data` changed; raises ConfigError naming every bad key."""
    problems = Problems(source)
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if key == "rate_limits":
            changes[key] = _rate_limits(problems, base.rate_limits, value)
        elif key not in _CHECKS:
            problems.lines.append(f"{source}: {key}: unknown setting")
        elif value is None and key in _NULLABLE:
            changes[key] = None
        else:
            checked = _CHECKS[key](problems, key, value)
            if checked is not None:
                changes[key] = checked
    if problems.lines:
        raise ConfigError(problems.lines)
    return dataclasses.replace(base, **changes)


def load_settings(path: Path) -> Settings:
    """Settings from a TOML file: defaults for every key it leaves out."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return apply_settings(Settings(), data, str(path))
