"""One line of Vault's (or OpenBao's) JSON audit log → one small record, or why it was skipped.

A read is counted from its *response* entry, the only one that says whether the reader got a
value and which version. Request entries and unwatched mounts are skipped by substring tests
before `json.loads`. The log is the default HMAC'd one: keyturn needs no value and keeps only
the record. What is counted: docs/usage.md#what-is-counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from keyturn.usage.layout import Layout, Target

# A line longer than this is skipped (`too_long`) and never held whole: audit entries of KV
# reads are a few kilobytes; a megabyte is a huge response or garbage.
MAX_LINE = 1 << 20

# Why a line was not counted: the `reason` label of `keyturn_usage_lines_skipped_total`.
NOT_JSON = "not_json"  # not a JSON object (or not UTF-8)
TRUNCATED = "truncated"  # a line cut short: JSON that ends early, or left unfinished
TOO_LONG = "too_long"  # longer than MAX_LINE
NOT_AN_ENTRY = "not_an_entry"  # JSON, but not an audit entry (no type, time or request)
REQUEST = "request"  # the request half of a pair: each operation is counted from its response
OTHER_MOUNT = "other_mount"  # a mount (or namespace, or engine) keyturn does not watch
NOT_WATCHED = "not_watched"  # a watched mount, but neither a published nor a private path
NOT_A_READ = "not_a_read"  # a watched path, an operation that is neither a read nor a write
INTERNAL_ERROR = "internal_error"  # handling a parsed entry failed (a bug; logged)
SKIP_REASONS: tuple[str, ...] = (
    NOT_JSON,
    TRUNCATED,
    TOO_LONG,
    NOT_AN_ENTRY,
    REQUEST,
    OTHER_MOUNT,
    NOT_WATCHED,
    NOT_A_READ,
    INTERNAL_ERROR,
)

# Keys of `auth.metadata` that name the role a reader logged in with, first match wins.
ROLE_KEYS = ("role_name", "role")
MAX_LABEL = 128
_CONTROL = {i: "?" for i in (*range(32), 127)}
_KV2_WRITES = {
    "data": {"create": "write", "update": "write", "patch": "patch", "delete": "delete"},
    "delete": {"create": "delete", "update": "delete"},
    "undelete": {"create": "undelete", "update": "undelete"},
    "destroy": {"create": "destroy", "update": "destroy"},
    "metadata": {"create": "metadata", "update": "metadata", "patch": "metadata",
                 "delete": "destroy"},
}  # fmt: skip
_KV1_WRITES = {"create": "write", "update": "write", "delete": "delete"}


@dataclass(frozen=True, slots=True)
class AuditRead:
    """A read of a watched path's value. `ok`: the reader got the value (False: refused, not
    found, or a deleted version). `version`: the KV version it got, when the log shows it.
    `path` is relative to `mount`, without KV v2's `data/`."""

    time: float
    target: Target
    credential: str
    mount: str
    path: str
    consumer: str
    entity_id: str
    remote_address: str
    version: int | None
    ok: bool


@dataclass(frozen=True, slots=True)
class AuditWrite:
    """A change of a published path: `action` is `write`, `patch`, `delete`, `undelete`,
    `destroy` or `metadata`; `version` the KV version written, when the log shows it; `ok`:
    Vault carried it out."""

    time: float
    credential: str
    mount: str
    path: str
    consumer: str
    entity_id: str
    remote_address: str
    action: str
    version: int | None
    ok: bool


AuditEntry = AuditRead | AuditWrite


def consumer_label(display_name: object, metadata: object, entity_id: object = "") -> str:
    """A stable, readable name for a Vault identity: `display_name`, plus `/<role>` when it
    logged in through a role (`approle/reporting`, `kubernetes-prod-api/reader`); the entity
    id when there is no display name. Clipped to MAX_LABEL characters, control characters
    replaced (it becomes a metric label and alert text)."""
    role = ""
    if isinstance(metadata, Mapping):
        for key in ROLE_KEYS:
            value = metadata.get(key)
            if isinstance(value, str) and value:
                role = value
                break
    name = display_name if isinstance(display_name, str) else ""
    if not name:
        name = entity_id if isinstance(entity_id, str) and entity_id else "unknown"
    label = f"{name}/{role}" if role else name
    if not label.isprintable():
        label = label.translate(_CONTROL)
    return label[:MAX_LABEL]


@dataclass(frozen=True, slots=True)
class Identity:
    """keyturn's own identity in the audit log (its reads and writes are not consumers'): any
    of `labels` (as `consumer_label` builds them) or `entity_ids`."""

    labels: frozenset[str] = frozenset()
    entity_ids: frozenset[str] = frozenset()

    def matches(self, consumer: str, entity_id: str) -> bool:
        return consumer in self.labels or (bool(entity_id) and entity_id in self.entity_ids)

    @classmethod
    def from_lookup(cls, data: Mapping[str, Any]) -> Identity:
        """From the `data` of keyturn's `auth/token/lookup-self`: the same display name, role
        (`meta`) and entity id the audit log shows for its requests."""
        entity_id = data.get("entity_id")
        entity = entity_id if isinstance(entity_id, str) else ""
        label = consumer_label(data.get("display_name"), data.get("meta"), entity)
        return cls(frozenset({label}), frozenset({entity} - {""}))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class AuditParser:
    """Turns audit lines into `AuditRead`/`AuditWrite` records for the paths of a `Layout`.

    `prefix`: the audit device's `prefix` option, if one is set (stripped from each line).
    `raw_values`: how many reads showed a value that is not HMAC'd (a device with
    `log_raw=true`: the log then holds secrets in clear; keyturn still keeps none of them).
    """

    def __init__(self, layout: Layout, *, prefix: bytes = b"", max_line: int = MAX_LINE) -> None:
        self.raw_values = 0
        self._prefix = prefix
        self._max_line = max_line
        self.use_layout(layout)

    def use_layout(self, layout: Layout) -> None:
        """Watch the paths of another configuration (a reload)."""
        self.layout = layout
        self._needles = tuple(f'"mount_point":"{m}/"'.encode() for m in layout.mounts)

    def parse(self, line: bytes) -> AuditEntry | str:
        """The record of one line, or the reason (one of SKIP_REASONS) it is skipped."""
        if self._prefix and line.startswith(self._prefix):
            line = line[len(self._prefix) :]
        if len(line) > self._max_line:
            return TOO_LONG
        if b'"type":"request"' in line[:96]:
            return REQUEST
        if b'"mount_point":"' in line and not any(n in line for n in self._needles):
            return OTHER_MOUNT
        try:
            entry = json.loads(line)
        except RecursionError:  # `[[[[…`: nested deeper than the decoder goes
            return NOT_JSON
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            stripped = line.strip()
            if stripped.startswith(b'{"') and not stripped.endswith(b"}"):
                return TRUNCATED
            return NOT_JSON
        if not isinstance(entry, dict):
            return NOT_JSON
        kind = entry.get("type")
        if kind != "response":
            return REQUEST if kind == "request" else NOT_AN_ENTRY
        return self._response(entry)

    def _response(self, entry: dict[str, Any]) -> AuditEntry | str:
        request = entry.get("request")
        stamp = entry.get("time")
        if not isinstance(request, dict) or not isinstance(stamp, str):
            return NOT_AN_ENTRY
        mount_point = request.get("mount_point")
        path = request.get("path")
        if not isinstance(mount_point, str) or not isinstance(path, str):
            return OTHER_MOUNT
        mount = mount_point.rstrip("/")
        version = self.layout.mounts.get(mount)
        if version is None or not path.startswith(mount_point):
            return OTHER_MOUNT
        if request.get("mount_type", "kv") != "kv":
            return OTHER_MOUNT
        namespace = request.get("namespace")
        ns_path = namespace.get("path", "") if isinstance(namespace, dict) else ""
        if (ns_path or "") != self.layout.namespace:
            return OTHER_MOUNT
        relative = path[len(mount_point) :]
        if version == 2:
            section, _, relative = relative.partition("/")
        else:
            section = ""
        relative = relative.strip("/")
        where = self.layout.classify(mount, relative)
        if where is None:
            return NOT_WATCHED
        target, credential = where
        when = self._time(stamp)
        if when is None:
            return NOT_AN_ENTRY
        operation = request.get("operation")
        response = entry.get("response")
        data = response.get("data") if isinstance(response, dict) else None
        if not isinstance(data, dict):
            data = None
        failed = "error" in entry
        is_read = operation == "read" and section == ("data" if version == 2 else "")
        if is_read:
            read_version, ok = None, False
            if data is not None and not failed:
                if version == 2:
                    values = data.get("data")
                    metadata = data.get("metadata")
                    if isinstance(metadata, dict):
                        read_version = _int(metadata.get("version"))
                else:
                    values = data
                ok = isinstance(values, dict)
                if isinstance(values, dict) and not _looks_hmaced(values):
                    self.raw_values += 1
            consumer, entity_id = self._who(entry)
            return AuditRead(
                when,
                target,
                credential,
                mount,
                relative,
                consumer,
                entity_id,
                _address(request),
                read_version,
                ok,
            )
        actions = _KV2_WRITES.get(section, {}) if version == 2 else _KV1_WRITES
        action = actions.get(operation) if isinstance(operation, str) else None
        if action is None or target != "published":
            return NOT_A_READ
        written = _int(data.get("version")) if data is not None and section == "data" else None
        consumer, entity_id = self._who(entry)
        return AuditWrite(
            when,
            credential,
            mount,
            relative,
            consumer,
            entity_id,
            _address(request),
            action,
            written,
            not failed,
        )

    @staticmethod
    def _who(entry: dict[str, Any]) -> tuple[str, str]:
        auth = entry.get("auth")
        if not isinstance(auth, dict):
            return "unknown", ""
        entity_id = auth.get("entity_id")
        entity = entity_id if isinstance(entity_id, str) else ""
        return consumer_label(auth.get("display_name"), auth.get("metadata"), entity), entity

    @staticmethod
    def _time(stamp: str) -> float | None:
        """Epoch seconds of Vault's RFC 3339 UTC time (`2026-11-24T01:27:08.54566651Z`; the
        digits past microseconds are dropped)."""
        try:
            parsed = datetime.fromisoformat(stamp)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()


def _looks_hmaced(values: dict[str, Any]) -> bool:
    """Whether the string values of a read look HMAC'd, as in Vault's default log."""
    for value in values.values():
        if isinstance(value, str):
            return value.startswith("hmac-sha256:")
    return True


def _address(request: dict[str, Any]) -> str:
    address = request.get("remote_address")
    return address[:64] if isinstance(address, str) else ""
