"""Loading the configuration: TOML and `KEYTURN_…` overrides, validated into a `Config`, every
problem at once as one line naming the file and the key path (docs/configuration.md#errors);
no line holds a secret: pydantic's own messages and inputs are never shown.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

import tomli
from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from keyturn.config.credentials import KV_PATH
from keyturn.config.fields import (
    ENTRY_NAME,
    NAME_EXPECTED,
    NAME_RULE,
    Check,
    Invalid,
    LoadContext,
    Unique,
    describe,
)
from keyturn.config.keys import Spot, field_node, keys, locate, walk
from keyturn.config.overrides import Loc, Overrides
from keyturn.config.schema import Config, DaemonSettings, RotatorType
from keyturn.config.templates import placeholders
from keyturn.errors import ConfigError

_CONFIG = TypeAdapter(Config)
# pydantic's errors of a value outside its key's range (`Field(gt=…, le=…)`)
_OUT_OF_RANGE = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SECTIONS = list(keys(Config))  # the file's top-level keys, in order
# The sections that are arrays of named entries, with what one entry is called.
_ENTRIES = {
    key: entries.singular
    for key, info in keys(Config).items()
    if (entries := field_node(info).entries) is not None
}


def load_config(path: Path, environ: Mapping[str, str] = os.environ) -> Config:
    """Read and validate the configuration file at `path`; raises ConfigError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError([f"{path}: cannot read the configuration: {reason}"]) from exc
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: not UTF-8 text; expected a UTF-8 TOML file"]) from None
    return parse_config(content, str(path), environ, base_dir=path.parent)


def parse_config(
    text: str,
    source: str,
    environ: Mapping[str, str] = os.environ,
    *,
    base_dir: Path | None = None,
) -> Config:
    """Validate TOML `text` (named `source` in messages); raises ConfigError with every problem.

    Relative filesystem paths are taken from `base_dir` (default: the directory of `source`).
    """
    try:
        data = tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        # tomli's messages give the position and never the offending value.
        raise ConfigError([f"{source}: invalid TOML: {exc}; expected a TOML document"]) from None
    except ValueError:  # an integer too long for Python to read (more than 4300 digits)
        raise ConfigError(
            [f"{source}: invalid TOML: a number too long to read; expected a TOML document"]
        ) from None
    document = Document(data)
    overrides = Overrides(environ, document.path, document.named)
    overrides.apply(data)
    context = LoadContext(
        source=str(source),
        base_dir=base_dir if base_dir is not None else Path(source).parent,
        state_prefix=document.state_prefix(),
        providers=document.declared("providers"),
        rotators=document.rotators(),
        credentials=document.declared("credentials"),
    )
    found = list(document.problems)
    config: Config | None = None
    try:
        config = _CONFIG.validate_python(data, context=context)
    except ValidationError as exc:
        found += [document.translate(error) for error in exc.errors(include_url=False)]
        found = list(dict.fromkeys(found))  # an entry's name: found by the document already
    found += document.repeats()
    found.sort(key=lambda problem: _rank(problem[0]))
    lines = [f"{source}: {overrides.where(loc)}: {what}" for loc, what in found]
    lines += [f"{source}: environment {var}: {what}" for var, what in overrides.problems]
    if lines or config is None:
        raise ConfigError(lines or [f"{source}: invalid configuration"])
    return config


def _rank(loc: Loc) -> tuple[int, bool, int]:
    """Problems in the order of the file's sections; in an array of entries, the entries'
    names first, then each entry's other keys in turn."""
    section = _SECTIONS.index(loc[0]) if loc and loc[0] in _SECTIONS else len(_SECTIONS)
    index = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else -1
    return section, index < 0 or loc[2:] != ("name",), index


def _marker(info: FieldInfo, kind: type[Any]) -> Any:
    return next((m for m in info.metadata if isinstance(m, kind)), None)


@functools.cache
def _unique_keys(model: type) -> tuple[tuple[str, Unique, Check], ...]:
    """A table's keys whose value must not repeat across entries, with the rule and the check
    that reads the value (looked up once per model: `repeats` walks every table)."""
    found = (
        (key, _marker(info, Unique), _marker(info, Check)) for key, info in keys(model).items()
    )
    return tuple((key, rule, check) for key, rule, check in found if rule and check)


class Document:
    """The file's data and the names of its entries: how a key path is shown, which entries
    overrides pick, what the tables may refer to, and the problems pydantic cannot see (names
    and `Unique` values repeated across entries)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.names: dict[str, list[str | None]] = {}  # each entry's name, if it goes by one
        self.problems: list[tuple[Loc, str]] = []
        for section in _SECTIONS:
            if section not in _ENTRIES:
                if keys(Config)[section].default is not None:  # [usage]: absent stays absent
                    data.setdefault(section, {})  # [keyturn], [vault], [metrics]: absent is empty
                continue
            singular, first = _ENTRIES[section], dict[str, int]()
            names = self.names.setdefault(section, [])
            for index, item in enumerate(self._items(section)):
                name = self._name(section, index, item)
                if name in first:
                    also = f"also {section}[{first[name]}]"
                    message = f'duplicate {singular} name "{name}" ({also}); expected each '
                    self.problems.append(
                        ((section, index, "name"), f"{message}{singular} name once")
                    )
                    name = None
                elif name is not None:
                    first[name] = index
                names.append(name)

    def _name(self, section: str, index: int, item: object) -> str | None:
        """An entry's valid name. Its problems are found here, for every entry: validation
        does not reach the name of one whose `type` is wrong."""
        if not isinstance(item, dict):
            return None
        try:
            name: str = ENTRY_NAME.value(item["name"])
        except KeyError:
            self.problems.append(((section, index, "name"), f"missing; expected {NAME_EXPECTED}"))
        except Invalid as exc:
            self.problems.append(((section, index, "name"), str(exc)))
        else:
            return name
        return None

    def _items(self, section: str) -> list[Any]:
        items = self.data.get(section)
        return items if isinstance(items, list) else []

    def named(self, section: str) -> list[tuple[int, str]]:
        """The entries of `section` that go by a name: (index, name)."""
        return [(i, name) for i, name in enumerate(self.names[section]) if name is not None]

    def path(self, loc: Loc) -> str:
        """A key path as problem lines show it: `credentials["app"].sinks[0].mode`."""
        shown = ""
        for depth, step in enumerate(loc):
            names = self.names.get(str(loc[0]), []) if depth == 1 else []
            name = names[step] if isinstance(step, int) and step < len(names) else None
            if name is not None:
                shown += f"[{json.dumps(name)}]"
            elif isinstance(step, int):
                shown += f"[{step}]"
            elif not _BARE_KEY.fullmatch(step):
                shown += f"[{json.dumps(step)}]"
            else:
                shown += f".{step}" if shown else step
        return shown

    def declared(self, section: str) -> list[str] | None:
        """The names a section's entries declare, even if repeated; None if the section is
        not an array or some entry has no valid name (then "no such entry" would be a guess)."""
        if not isinstance(self.data.get(section, []), list):
            return None
        names = [i.get("name") for i in self._items(section) if isinstance(i, dict)]
        valid = [name for name in names if isinstance(name, str) and NAME_RULE.fullmatch(name)]
        return valid if len(valid) == len(names) else None

    def rotators(self) -> dict[str, tuple[str | None, bool]] | None:
        """Each declared rotator's type (None if invalid) and whether its templates use
        {client_id}; None if some rotator has no valid name."""
        if self.declared("rotators") is None:
            return None
        found: dict[str, tuple[str | None, bool]] = {}
        for item in self._items("rotators"):
            if isinstance(item, dict):
                kind = item.get("type") if item.get("type") in get_args(RotatorType) else None
                calls = [item.get(key) for key in ("create", "revoke", "find")]
                texts = [c.get(k) for c in calls if isinstance(c, dict) for k in ("path", "body")]
                uses = any("client_id" in placeholders(t) for t in texts if isinstance(t, str))
                found.setdefault(item["name"], (kind, kind == "http" and uses))
        return found

    def state_prefix(self) -> str:
        keyturn = self.data.get("keyturn")
        given = keyturn.get("state_prefix") if isinstance(keyturn, dict) else None
        default: str = keys(DaemonSettings)["state_prefix"].default
        return KV_PATH.valid(given) or default

    def repeats(self) -> list[tuple[Loc, str]]:
        """A `Unique` key's value that an earlier table already has (entries without a name
        of their own are left out: they are wrong already)."""
        found: list[tuple[Loc, str]] = []
        seen: dict[Unique, dict[Any, Loc]] = {}
        for loc, model, table in walk(self.data):
            for key, rule, check in _unique_keys(model) if self._named(loc) else ():
                value = check.valid(table.get(key))
                first = loc if value is None else seen.setdefault(rule, {}).setdefault(value, loc)
                if first != loc:
                    what = f'"{value}" is also the {key} of {self.path(first)}'
                    found.append(((*loc, key), f"{what}; expected {rule.expected}"))
        return found

    def _named(self, loc: Loc) -> bool:
        """Whether `loc` is not inside an entry that goes by no name."""
        section, index = (*loc, "", "")[:2]
        if not isinstance(index, int) or str(section) not in self.names:
            return True
        return self.names[str(section)][index] is not None

    def translate(self, error: ErrorDetails) -> tuple[Loc, str]:
        """One of pydantic's errors as a problem: where it is in the file, what is wrong."""
        spot = locate(error["loc"])
        kind, here = error["type"], spot.node
        if kind == "keyturn":  # the schema's own words
            return spot.loc, str(error["msg"])
        if here is not None and here.members and kind in ("missing", "union_tag_not_found"):
            return (*spot.loc, here.discriminator), f"missing; expected {_tags(spot)}"
        if here is not None and here.members and kind == "union_tag_invalid":
            loc = (*spot.loc, here.discriminator)
            return loc, f"got {describe(self._raw(loc))}; expected {_tags(spot)}"
        if kind == "missing":
            return spot.loc, f"missing; expected {_expected(spot)}"
        if kind in ("unexpected_keyword_argument", "extra_forbidden"):
            return spot.loc, self._unknown_key(spot)
        # Not a table, not an array: the value is not a secret (a secret key has its type).
        value = error["input"]
        what = "a table" if isinstance(spot.loc[-1], int) else _expected(spot)
        if kind in _OUT_OF_RANGE:
            return spot.loc, f"got {describe(value)}, which is out of range; expected {what}"
        blank = isinstance(value, str) and not value.strip()
        shown = "an empty string" if blank else describe(value)
        return spot.loc, f"got {shown}; expected {what}"

    def _raw(self, loc: Loc) -> Any:
        here: Any = self.data
        for step in loc:
            if isinstance(here, dict):
                here = here.get(step)
            else:
                here = here[step] if isinstance(here, list) and isinstance(step, int) else None
        return here

    def _unknown_key(self, spot: Spot) -> str:
        assert spot.owner is not None
        variant: Any = spot.owner
        if spot.loc[-1] in keys(variant, refused=True):  # another variant's key, named
            return str(variant.refusal(spot.loc[-1]))
        known = list(keys(spot.owner))
        context = ""
        if spot.tag is not None:
            context = f' for {spot.tag[0]} "{spot.tag[1]}"'
        elif getattr(spot.owner, "NAMED_IN_PROBLEMS", False):
            context = f" for {spot.owner_key}"
        close = difflib.get_close_matches(str(spot.loc[-1]), known, n=1, cutoff=0.6)
        if close:
            return f'unknown key{context}; did you mean "{close[0]}"?'
        listing = "expected one of: " + ", ".join(known) if known else "expected no keys here"
        return f"unknown key{context}; {listing}"


def _tags(spot: Spot) -> str:
    assert spot.node is not None
    return "one of " + ", ".join(json.dumps(tag) for tag in spot.node.members)


def _expected(spot: Spot) -> str:
    """What a key expects: its type's words, or its table's description."""
    if spot.node is not None and spot.node.expected:
        return spot.node.expected
    return (spot.info.description if spot.info else None) or "a table"
