"""Reading the schema: each table's keys, what each key expects, where an error's `loc` leads
(the loader and the overrides ask the schema, never a list of their own).
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from keyturn.config.fields import BOOLEAN_EXPECTED, Check, Entries, NotAKey, Via, fields_of
from keyturn.config.schema import Config


@dataclass(frozen=True)
class Node:
    """What a key holds: a table (`model`), a union of tables chosen by `discriminator`, an
    array (`item`), or a value: one of the project's types (`check`) or pydantic's (its
    `annotation`). `expected`: what a value must be, as problem lines say it."""

    model: type | None = None
    discriminator: str = ""
    members: Mapping[str, type] = field(default_factory=dict)
    item: Node | None = None
    check: Check | None = None
    annotation: Any = None
    entries: Entries | None = None
    expected: str | None = None


@functools.cache
def keys(model: type, *, refused: bool = False) -> Mapping[str, FieldInfo]:
    """A table's keys (a field's alias or name) in the schema's order; with `refused`, the
    keys of other variants it refuses by name instead (other credential kinds' keys)."""
    found = {}
    for name, info in fields_of(model).items():
        marker = next((m for m in info.metadata if isinstance(m, NotAKey)), None)
        wanted = bool(marker and marker.named) if refused else marker is None
        if info.init is not False and wanted:
            found[info.alias or name] = info
    return MappingProxyType(found)


def tag_of(member: type, discriminator: str) -> str:
    tag: str = get_args(keys(member)[discriminator].annotation)[0]
    return tag


def node(annotation: Any, metadata: list[Any] | None = None) -> Node:
    """What a type annotation (with its `Annotated` metadata) holds in the file."""
    metadata = list(metadata or [])
    while True:
        if get_origin(annotation) is Annotated:
            annotation, *more = get_args(annotation)
            metadata += more
        elif get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(
            annotation
        ):
            # `T | None` is T's node; `T | U | None` the union's (its Check reads it).
            present = [a for a in get_args(annotation) if a is not type(None)]
            annotation = present[0] if len(present) == 1 else Union[tuple(present)]  # noqa: UP007
        else:
            break
    for meta in metadata:
        if isinstance(meta, Via):
            return node(meta.table)
        if isinstance(meta, Check):
            return Node(check=meta, annotation=annotation, expected=meta.expected)
    discriminator = next(
        (m.discriminator for m in metadata if isinstance(m, FieldInfo) and m.discriminator), None
    )
    if isinstance(discriminator, str):
        members = {tag_of(m, discriminator): m for m in get_args(annotation)}
        return Node(discriminator=discriminator, members=members)
    if hasattr(annotation, "__pydantic_config__"):  # a `fields.table`
        return Node(model=annotation)
    entries = next((m for m in metadata if isinstance(m, Entries)), None)
    if get_origin(annotation) is Mapping:
        return Node(item=node(get_args(annotation)[1]), entries=entries)
    if get_origin(annotation) is tuple:
        return Node(item=node(get_args(annotation)[0]), entries=entries)
    expected: str | None = None
    if get_origin(annotation) is Literal:
        expected = "one of " + ", ".join(json.dumps(o) for o in get_args(annotation))
    elif annotation is bool:
        expected = BOOLEAN_EXPECTED
    else:  # the words of `fields.text`, `integer` or `number`
        described = (m.description for m in metadata if isinstance(m, FieldInfo))
        expected = next((text for text in described if text), None)
    return Node(annotation=annotation, expected=expected)


@functools.cache
def field_node(info: FieldInfo) -> Node:
    return node(info.annotation, [*info.metadata, info])


@dataclass
class Spot:
    """Where a pydantic error's `loc` leads. `loc`: the key path in the file (array indices
    as ints, union tags left out). `owner`: the table holding the last key, chosen by `tag`
    (discriminator, value) or held at key `owner_key`. `info` / `node`: the last key's field
    and what it holds (None for a key the table does not have)."""

    loc: tuple[str | int, ...] = ()
    owner: type | None = None
    tag: tuple[str, str] | None = None
    owner_key: str = ""
    info: FieldInfo | None = None
    node: Node | None = field(default_factory=lambda: Node(model=Config))


def locate(loc: tuple[str | int, ...]) -> Spot:
    """Follow a pydantic error's `loc` through the schema from `Config`."""
    spot = Spot()
    tag: tuple[str, str] | None = None
    for step in loc:
        here = spot.node
        if here is not None and here.members and isinstance(step, str) and step in here.members:
            tag = (here.discriminator, step)
            spot.node = Node(model=here.members[step])
            continue
        if here is not None and here.item is not None and isinstance(step, int):
            spot.node = here.item
        elif here is not None and here.model is not None and isinstance(step, str):
            previous = spot.loc[-1] if spot.loc else ""
            spot.owner, spot.tag = here.model, tag
            spot.owner_key = previous if isinstance(previous, str) else ""
            spot.info = keys(here.model).get(step)
            spot.node = None if spot.info is None else field_node(spot.info)
            tag = None
        else:
            spot.node = None
        spot.loc += (step,)
    return spot


def tables(
    at: str = "", here: Node | None = None
) -> Iterator[tuple[str, type, tuple[str, str] | None]]:
    """Every table of the file: its key path (`[]` for an array's items), its model, and the
    (discriminator, value) that chose it, if any."""
    here = here or Node(model=Config)
    if here.item is not None:
        yield from tables(at + "[]", here.item)
    chosen: list[tuple[type, tuple[str, str] | None]] = [
        (model, (here.discriminator, tag)) for tag, model in here.members.items()
    ]
    for model, tag in chosen or ([(here.model, None)] if here.model else []):
        yield at, model, tag
        for key, info in keys(model).items():
            yield from tables(f"{at}.{key}" if at else key, field_node(info))


def walk(
    table: object, here: Node | None = None, loc: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], type, dict[str, Any]]]:
    """Every table in the file's data, with its key path and model (a union's by its tag)."""
    here = here or Node(model=Config)
    if here.item is not None:
        for index, item in enumerate(table if isinstance(table, list) else []):
            yield from walk(item, here.item, (*loc, index))
        return
    if not isinstance(table, dict):
        return
    model = here.model
    if here.members:
        tag = table.get(here.discriminator)
        model = here.members.get(tag) if isinstance(tag, str) else None
    if model is None:
        return
    yield loc, model, table
    for key, info in keys(model).items():
        if key in table:
            yield from walk(table[key], field_node(info), (*loc, key))
