"""Reading raw TOML tables with `KEYTURN_…` overrides, collecting every problem.

A `Table` is a view of one TOML table at a key path (`vault.auth`, `credentials["app"]`).
Builders in `keyturn.config.load` ask it for typed fields (`get`, `optional`, `require`);
each field may be overridden by the environment variable named after its path
(`KEYTURN_VAULT_TIMEOUT`, `KEYTURN_CREDENTIALS_APP_REFRESH_AT`), read by the field's type.
A wrong value records one problem line and the builder carries on with a fallback, so one
run reports every problem. Keys no builder asked for are reported as unknown, with the
closest known key suggested; so are override variables (`KEYTURN_<SECTION>_…`) that no
field consumed.

Problem lines read `<file>: <where>: <what was wrong>; expected <what>`, where `<where>` is
a key path or `environment KEYTURN_X: <key path>`. They never contain a secret value.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from keyturn.config.fields import Field, Invalid, describe, entry_name_problem

T = TypeVar("T")

ENV_PREFIX = "KEYTURN"
# `KEYTURN_<SECTION>_…` variables are overrides; other `KEYTURN_…` variables (such as the
# CLI's KEYTURN_CONFIG) belong to someone else, unless their section is a near-miss typo.
OVERRIDE_SECTIONS = (
    "KEYTURN",
    "VAULT",
    "METRICS",
    "PROVIDERS",
    "ROTATORS",
    "CREDENTIALS",
    "ALERTS",
)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_GENERIC_OVERRIDE = (
    "expected KEYTURN_<SECTION>_<KEY> for a key of [keyturn], [vault] or [metrics], "
    "KEYTURN_VAULT_AUTH_<KEY>, KEYTURN_PROVIDERS_<NAME>_<KEY>, KEYTURN_ROTATORS_<NAME>_<KEY>, "
    "KEYTURN_CREDENTIALS_<NAME>_<KEY> or KEYTURN_ALERTS_<NAME>_<KEY>"
)


def is_override(var: str) -> bool:
    """Whether `var` is in the override namespace (or a near miss of it)."""
    head, sep, rest = var.partition("_")
    if head != ENV_PREFIX or not sep:
        return False
    section = rest.partition("_")[0]
    return section in OVERRIDE_SECTIONS or bool(
        difflib.get_close_matches(section, OVERRIDE_SECTIONS, n=1, cutoff=0.75)
    )


class Context:
    """What one load shares: the source name, the environment, and the problems so far."""

    def __init__(self, source: str, environ: Mapping[str, str], base_dir: Path) -> None:
        self.source = source
        self.environ = environ
        self.base_dir = base_dir
        self.problems: list[str] = []
        self.consumed: dict[str, str] = {}  # variable -> the key path it overrode
        self.known_vars: set[str] = set()  # every variable some field would have read
        self.prefixes: dict[str, str] = {}  # KEYTURN_PROVIDERS_ACME -> providers["acme"]
        self.entry_names: dict[str, list[str]] = {}  # KEYTURN_PROVIDERS_ -> ["ACME"]

    def problem(self, where: str, message: str) -> None:
        self.problems.append(f"{self.source}: {where}: {message}")


def _join(path: str, key: str) -> str:
    shown = key if _BARE_KEY.fullmatch(key) else f"[{json.dumps(key)}]"
    if not path:
        return shown
    return f"{path}{shown}" if shown.startswith("[") else f"{path}.{shown}"


def env_name(key: str) -> str:
    """The part of a variable name a key or entry name contributes: upper case, '-' → '_'."""
    return key.upper().replace("-", "_")


class Table:
    """One TOML table at `path`, whose scalars `env_prefix + "_" + KEY` may override."""

    def __init__(
        self,
        ctx: Context,
        data: Mapping[str, object],
        path: str,
        env_prefix: str | None,
        *,
        name: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.data = data
        self.path = path
        self.env_prefix = env_prefix
        self.name = name  # for an array entry: its valid, unique name
        self.declared_name: str | None = name  # a valid name, even if a duplicate
        self._known: list[str] = []
        self._forbidden: set[str] = set()
        self._origin: dict[str, str] = {}
        if env_prefix is not None and path:
            ctx.prefixes[env_prefix] = path

    # -- locations ---------------------------------------------------------------------

    def key_path(self, key: str) -> str:
        return _join(self.path, key)

    def where(self, key: str) -> str:
        """Where a problem with `key` is: its key path, or the variable that overrode it."""
        var = self._origin.get(key)
        return f"environment {var}: {self.key_path(key)}" if var else self.key_path(key)

    def problem(self, key: str, message: str) -> None:
        self.ctx.problem(self.where(key), message)

    # -- fields ------------------------------------------------------------------------

    def _know(self, key: str) -> None:
        if key not in self._known:
            self._known.append(key)

    def _raw(self, key: str) -> tuple[object, bool] | None:
        """The value for `key` and whether it came from the environment; None if absent."""
        self._know(key)
        if self.env_prefix is not None:
            var = f"{self.env_prefix}_{env_name(key)}"
            self.ctx.known_vars.add(var)
            if var in self.ctx.environ:
                here = self.key_path(key)
                earlier = self.ctx.consumed.setdefault(var, here)
                if earlier != here:
                    self.ctx.problem(
                        f"environment {var}",
                        f"ambiguous: it overrides both {earlier} and {here}; expected entry "
                        "names that still differ when upper-cased with '-' read as '_'",
                    )
                self._origin[key] = var
                return self.ctx.environ[var], True
        if key in self.data:
            return self.data[key], False
        return None

    def _convert(self, key: str, field: Field[T], raw: tuple[object, bool]) -> T | None:
        try:
            return field.convert(*raw)
        except Invalid as exc:
            self.problem(key, str(exc))
            return None

    def get(self, key: str, field: Field[T], default: T) -> T:
        """The field's value, or `default` if it is absent (or wrong: a problem is recorded)."""
        raw = self._raw(key)
        value = None if raw is None else self._convert(key, field, raw)
        return default if value is None else value

    def optional(self, key: str, field: Field[T]) -> T | None:
        """The field's value, or None if it is absent (or wrong: a problem is recorded)."""
        raw = self._raw(key)
        return None if raw is None else self._convert(key, field, raw)

    def require(self, key: str, field: Field[T]) -> T | None:
        """The field's value; None (with a problem recorded) if it is absent or wrong."""
        raw = self._raw(key)
        if raw is None:
            self.problem(key, f"missing; expected {field.expected}")
            return None
        return self._convert(key, field, raw)

    def present(self, key: str) -> bool:
        """Whether the sub-table `key` is in the file or some override variable targets it."""
        if key in self.data:
            return True
        if self.env_prefix is None:
            return False
        head = f"{self.env_prefix}_{env_name(key)}_"
        return any(var.startswith(head) for var in self.ctx.environ)

    def forbid(self, key: str, message: str) -> None:
        """Record `message` as a problem if `key` is set, in the file or by an override (which
        is then reported here, not as unknown). The key is not listed among the known ones."""
        self._forbidden.add(key)
        var = f"{self.env_prefix}_{env_name(key)}" if self.env_prefix is not None else None
        if var is not None and var in self.ctx.environ:
            self.ctx.consumed.setdefault(var, self.key_path(key))
            self._origin[key] = var
            self.problem(key, message)
        elif key in self.data:
            self.problem(key, message)

    # -- nested tables and arrays --------------------------------------------------------

    def table(self, key: str, expected: str) -> Table | None:
        """The sub-table `key` (empty if absent, so overrides still apply); None if not a table."""
        self._know(key)
        prefix = f"{self.env_prefix}_{env_name(key)}" if self.env_prefix else None
        value = self.data.get(key)
        if value is None:
            return Table(self.ctx, {}, self.key_path(key), prefix)
        if not isinstance(value, dict):
            self.problem(key, f"got {describe(value)}; expected {expected}")
            return None
        return Table(self.ctx, value, self.key_path(key), prefix)

    def entries(self, key: str, singular: str) -> list[Table] | None:
        """The tables of the array `key` (`[[key]]`) by `name`; None if `key` is not an array.

        An entry with a valid, unique name gets the path `key["name"]` and the override
        prefix `<prefix>_<KEY>_<NAME>`; any other entry gets `key[index]` and no overrides.
        """
        self._know(key)
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.problem(key, f"got {describe(value)}; expected an array of tables ([[{key}]])")
            return None
        tables: list[Table] = []
        first: dict[str, str] = {}
        for index, item in enumerate(value):
            at_index = f"{self.key_path(key)}[{index}]"
            if not isinstance(item, dict):
                self.ctx.problem(at_index, f"got {describe(item)}; expected a table")
                continue
            name = item.get("name")
            problem = entry_name_problem(name)
            if problem is None and isinstance(name, str) and name in first:
                problem = (
                    f'duplicate {singular} name "{name}" (also {first[name]}); '
                    f"expected each {singular} name once"
                )
            if problem is not None or not isinstance(name, str):
                self.ctx.problem(f"{at_index}.name", problem or "missing")
                entry = Table(self.ctx, item, at_index, None)
                if entry_name_problem(name) is None and isinstance(name, str):
                    entry.declared_name = name
            else:
                first[name] = at_index
                path = f"{self.key_path(key)}[{json.dumps(name)}]"
                prefix = f"{self.env_prefix}_{env_name(key)}_{env_name(name)}"
                head = f"{self.env_prefix}_{env_name(key)}_"
                self.ctx.entry_names.setdefault(head, []).append(env_name(name))
                entry = Table(self.ctx, item, path, prefix, name=name)
            entry._know("name")
            tables.append(entry)
        return tables

    def positional(self, key: str, expected: str) -> list[Table]:
        """The tables of the array `key`, whose entries have no name: each is `key[index]`, and
        none takes overrides (an override cannot say which entry it means). [] if absent; a
        value that is not an array, or an item that is not a table, is a problem."""
        self._know(key)
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.problem(key, f"got {describe(value)}; expected {expected}")
            return []
        tables: list[Table] = []
        for index, item in enumerate(value):
            at_index = f"{self.key_path(key)}[{index}]"
            if not isinstance(item, dict):
                self.ctx.problem(at_index, f"got {describe(item)}; expected a table")
                continue
            tables.append(Table(self.ctx, item, at_index, None))
        return tables

    # -- unknown keys ----------------------------------------------------------------------

    def finish(self, context: str = "") -> None:
        """Report every key of this table that no builder asked for."""
        for key in self.data:
            if key in self._known or key in self._forbidden:
                continue
            close = difflib.get_close_matches(key, self._known, n=1, cutoff=0.6)
            hint = f'did you mean "{close[0]}"?' if close else _one_of(self._known)
            self.ctx.problem(self.key_path(key), f"unknown key{context}; {hint}")


def _one_of(keys: list[str]) -> str:
    return "expected one of: " + ", ".join(keys) if keys else "expected no keys here"


def report_unknown_overrides(ctx: Context) -> None:
    """One problem per override variable (`KEYTURN_<SECTION>_…`) that no field consumed."""
    known = sorted(ctx.known_vars)
    for var in sorted(ctx.environ):
        if is_override(var) and var not in ctx.consumed:
            ctx.problem(f"environment {var}", _unknown_override(ctx, var, known))


def _unknown_override(ctx: Context, var: str, known: list[str]) -> str:
    owners = [prefix for prefix in ctx.prefixes if var.startswith(prefix + "_")]
    if owners:
        # The variable names a table: say which keys it has.
        owner = max(owners, key=len)
        keys = sorted({v[len(owner) + 1 :] for v in known if v.startswith(owner + "_")})
        close = difflib.get_close_matches(var[len(owner) + 1 :], keys, n=1, cutoff=0.6)
        if close:
            return f"not a key of {ctx.prefixes[owner]}; did you mean {owner}_{close[0]}?"
        return (
            f"not a key of {ctx.prefixes[owner]}; "
            f"expected {owner}_<KEY> with <KEY> one of: {', '.join(keys)}"
        )
    close = difflib.get_close_matches(var, known, n=1, cutoff=0.9)
    if close:
        return f"not a known override; did you mean {close[0]}?"
    sections = (
        ("PROVIDERS", "provider"),
        ("ROTATORS", "rotator"),
        ("CREDENTIALS", "credential"),
        ("ALERTS", "alert hook"),
    )
    for section, singular in sections:
        head = f"{ENV_PREFIX}_{section}_"
        if var.startswith(head):
            names = sorted(ctx.entry_names.get(head, []))
            listing = ", ".join(names) if names else f"(no {singular}s are configured)"
            return (
                f"names no configured {singular}; "
                f"expected {head}<NAME>_<KEY> with <NAME> one of: {listing}"
            )
    return f"not a known override; {_GENERIC_OVERRIDE}"
