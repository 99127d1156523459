"""`KEYTURN_…` overrides: a variable sets one scalar key of the file, read by the key's type;
a variable of the namespace that sets nothing is a problem (docs/configuration.md).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from keyturn.config.keys import Node, field_node, keys
from keyturn.config.schema import Config

ENV_PREFIX = "KEYTURN"
Loc = tuple[str | int, ...]
# `KEYTURN_<SECTION>_…` variables are overrides; other `KEYTURN_…` variables (such as the
# CLI's KEYTURN_CONFIG) belong to someone else, unless their section is a near-miss typo.
SECTIONS = tuple(key.upper() for key in keys(Config))
_GENERIC = (
    "expected KEYTURN_<SECTION>_<KEY> for a key of [keyturn], [vault] or [metrics], "
    "KEYTURN_VAULT_AUTH_<KEY>, KEYTURN_PROVIDERS_<NAME>_<KEY>, KEYTURN_ROTATORS_<NAME>_<KEY>, "
    "KEYTURN_CREDENTIALS_<NAME>_<KEY> or KEYTURN_ALERTS_<NAME>_<KEY>"
)


def env_name(key: str) -> str:
    """The part of a variable name a key or entry name contributes: upper case, '-' → '_'."""
    return key.upper().replace("-", "_")


def is_override(var: str) -> bool:
    """Whether `var` is in the override namespace (or a near miss of it)."""
    head, sep, rest = var.partition("_")
    if head != ENV_PREFIX or not sep:
        return False
    section = rest.partition("_")[0]
    return section in SECTIONS or bool(
        difflib.get_close_matches(section, SECTIONS, n=1, cutoff=0.75)
    )


def _reader(here: Node) -> Callable[[str], object]:
    """How an override's text is read: as the file's value would be, by its type (`true`/`1`,
    an integer, a finite number, an array as the type reads one); text that is not one stays
    text, for the key to refuse."""
    if here.check is not None:
        return here.check.from_env
    kind = here.annotation

    def read(text: str) -> object:
        lowered = text.strip().lower()
        if kind is bool and lowered in ("true", "1", "false", "0"):
            return lowered in ("true", "1")
        if kind is int and re.fullmatch(r"[+-]?\d{1,30}", lowered):
            return int(lowered)
        if kind is float:
            try:
                number = float(lowered)
            except ValueError:
                return text
            return number if math.isfinite(number) else text
        return text

    return read


class Overrides:
    """Applies the variables of `environ` to the file's data. `origin` maps a key path to
    the variable that set it; `problems` are `(variable, message)` pairs. `path` shows a key
    path, `entries(section)` the entries overrides can pick: (index, name)."""

    def __init__(
        self,
        environ: Mapping[str, str],
        path: Callable[[Loc], str],
        entries: Callable[[str], list[tuple[int, str]]],
    ) -> None:
        self.environ = environ
        self.path = path
        self.entries = entries
        self.origin: dict[Loc, str] = {}
        self.problems: list[tuple[str, str]] = []
        self._consumed: dict[str, str] = {}  # variable -> the key path it set
        self._known: set[str] = set()  # every variable some key would have read
        self._prefixes: dict[str, str] = {}  # KEYTURN_PROVIDERS_ACME -> providers["acme"]
        self._names: dict[str, list[str]] = {}  # KEYTURN_PROVIDERS_ -> ["ACME"]
        self._sections: dict[str, str] = {}  # KEYTURN_PROVIDERS_ -> "provider"
        # Entries no variable names: walked only to explain a variable that sets nothing.
        self._unnamed: list[tuple[dict[str, Any], Node, str, Loc]] = []
        self._ours = sorted(var for var in environ if var.startswith(f"{ENV_PREFIX}_"))

    def _named(self, prefix: str) -> bool:
        """Whether some variable sets a key under `prefix` (an entry or a table)."""
        return any(var.startswith(prefix + "_") for var in self._ours)

    def apply(self, data: dict[str, Any]) -> None:
        for key, info in keys(Config).items():
            here, prefix = field_node(info), f"{ENV_PREFIX}_{env_name(key)}"
            if here.entries is not None and here.item is not None:
                self._sections[prefix + "_"] = here.entries.singular
                names = self._names.setdefault(prefix + "_", [])
                for index, name in self.entries(key):
                    names.append(env_name(name))
                    item_prefix = f"{prefix}_{env_name(name)}"
                    loc: Loc = (key, index)
                    entry = (data[key][index], here.item, item_prefix, loc)
                    if self._named(item_prefix):
                        self._table(*entry, True)
                    else:  # 10,000 credentials and no variable: 1.5 s of every start saved
                        self._unnamed.append(entry)
            elif isinstance(data.get(key), dict):
                self._table(data[key], here, prefix, (key,))
        unknown = [v for v in self._ours if is_override(v) and v not in self._consumed]
        if unknown:
            for entry in self._unnamed:  # sets nothing: no variable names these entries
                self._table(*entry, True)
        self.problems += [(var, self._unknown(var)) for var in unknown]

    def where(self, loc: Loc) -> str:
        """Where a problem is: its key path, after the variable that set the key if one did."""
        var = self.origin.get(loc)
        return f"environment {var}: {self.path(loc)}" if var else self.path(loc)

    def _table(
        self, table: dict[str, Any], here: Node, prefix: str, loc: Loc, entry: bool = False
    ) -> None:
        self._prefixes[prefix] = self.path(loc)
        model = here.model
        if here.members:  # the discriminator first: it decides which keys there are
            self._scalar(table, here.discriminator, prefix, loc, text=str)
            tag = table.get(here.discriminator)
            model = here.members.get(tag) if isinstance(tag, str) else None
        if model is None:
            return
        for key, info in keys(model).items():
            if key == here.discriminator or (entry and key == "name"):
                continue
            sub = field_node(info)
            if sub.model is not None or sub.members:
                defaulted = info.default_factory is not None  # such as `refresh`
                self._sub_table(table, key, defaulted, sub, prefix, loc)
            elif sub.expected:  # a value (not an array of tables: sinks have no names)
                self._scalar(table, key, prefix, loc, text=_reader(sub))
        for key in keys(model, refused=True):  # set, to be refused by name; never suggested
            self._scalar(table, key, prefix, loc, known=False)

    def _sub_table(
        self, table: dict[str, Any], key: str, defaulted: bool, here: Node, prefix: str, loc: Loc
    ) -> None:
        """A table in a table: its keys are known if it is there (in the file or by some
        variable) or `defaulted` (a table of defaults, such as `refresh`)."""
        prefix = f"{prefix}_{env_name(key)}"
        value = table.get(key)
        if isinstance(value, dict):
            self._table(value, here, prefix, (*loc, key))
        elif value is None and (defaulted or self._named(prefix)):
            created: dict[str, Any] = {}
            self._table(created, here, prefix, (*loc, key))
            if created:
                table[key] = created

    def _scalar(
        self,
        table: dict[str, Any],
        key: str,
        prefix: str,
        loc: Loc,
        known: bool = True,
        text: Callable[[str], object] = str,
    ) -> None:
        var = f"{prefix}_{env_name(key)}"
        if known:
            self._known.add(var)
        if var not in self.environ:
            return
        here = self.path((*loc, key))
        earlier = self._consumed.setdefault(var, here)
        if earlier != here:
            self.problems.append(
                (
                    var,
                    f"ambiguous: it overrides both {earlier} and {here}; expected entry names "
                    "that still differ when upper-cased with '-' read as '_'",
                )
            )
        table[key] = text(self.environ[var])
        self.origin[(*loc, key)] = var

    def _unknown(self, var: str) -> str:
        known = sorted(self._known)
        owners = [prefix for prefix in self._prefixes if var.startswith(prefix + "_")]
        if owners:
            # The variable names a table: say which keys it has.
            owner = max(owners, key=len)
            names = sorted({v[len(owner) + 1 :] for v in known if v.startswith(owner + "_")})
            close = difflib.get_close_matches(var[len(owner) + 1 :], names, n=1, cutoff=0.6)
            if close:
                return f"not a key of {self._prefixes[owner]}; did you mean {owner}_{close[0]}?"
            return (
                f"not a key of {self._prefixes[owner]}; "
                f"expected {owner}_<KEY> with <KEY> one of: {', '.join(names)}"
            )
        close = difflib.get_close_matches(var, known, n=1, cutoff=0.9)
        if close:
            return f"not a known override; did you mean {close[0]}?"
        for head, singular in self._sections.items():
            if var.startswith(head):
                names = sorted(self._names[head])
                listing = ", ".join(names) if names else f"(no {singular}s are configured)"
                return (
                    f"names no configured {singular}; "
                    f"expected {head}<NAME>_<KEY> with <NAME> one of: {listing}"
                )
        return f"not a known override; {_GENERIC}"
