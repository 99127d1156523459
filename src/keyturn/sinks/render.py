"""What a sink writes: the published record, checked before anything is written from it, and
each format's file content (`raw`, `json`, `env`), rendered deterministically so that an
unchanged file is recognised by its bytes."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from keyturn.clock import parse_rfc3339
from keyturn.config.credentials import SinkConfig
from keyturn.errors import KeyturnError
from keyturn.kinds import KINDS, REGISTERED
from keyturn.secret import Secret

# Published fields that hold a secret, for any kind (kept as `Secret`; cut out of a command's
# output). Which field is a kind's value, its expiry and its plan: `KINDS[kind]`.
SECRET_FIELDS = frozenset().union(*(kind.secret_fields for kind in REGISTERED))

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_SAFE = re.compile(r"[A-Za-z0-9_./:@%+=,-]*")
_ENV_ESCAPE = re.compile(r'([\\"$`])')


class SinkError(KeyturnError):
    """A sink could not be brought up to date. The message names the credential and the sink
    (its path), never a value."""

    def __init__(self, message: str, *, credential: str, sink: Path | None = None) -> None:
        self.sink = sink
        where = f"sink {sink}: " if sink is not None else ""
        super().__init__(where + message, credential=credential)


@dataclass(frozen=True, slots=True)
class PublishedRecord:
    """The latest version at a credential's `publish_to`, as sinks use it: every field (the
    secret ones as `Secret`), the version, and when the value expires and will be replaced
    (RFC 3339 text, as published)."""

    credential: str
    kind: str
    version: int
    fields: Mapping[str, str | Secret]
    expires_at: str
    refresh_at: str | None

    @property
    def value(self) -> Secret:
        value = self.fields[KINDS[self.kind].value_field]
        return value if isinstance(value, Secret) else Secret(value)

    def secrets(self) -> list[str]:
        """The secret values, longest first (to cut them out of text)."""
        found = {v.reveal() for v in self.fields.values() if isinstance(v, Secret)}
        return sorted((s for s in found if s), key=len, reverse=True)


def parse_record(
    data: Mapping[str, object], version: int, *, credential: str, kind: str
) -> PublishedRecord:
    """Check a published record before anything is written from it: the value and its expiry
    are there, every field is text without control characters (a newline would add lines to
    an env file), the expiry is an RFC 3339 time. Errors name the field, never a value."""

    def bad(message: str) -> SinkError:
        return SinkError(
            f"the published record (version {version}) {message}", credential=credential
        )

    fields: dict[str, str | Secret] = {}
    for name, raw in data.items():
        if not isinstance(raw, str):
            raise bad(f"has a field {name!r} that is not text")
        if _CONTROL.search(raw):
            raise bad(f"has a field {name!r} with a control character (e.g. a newline)")
        fields[name] = Secret(raw) if name in SECRET_FIELDS else raw
    declared = KINDS[kind]
    for required in (declared.value_field, declared.expiry_field):
        value = fields.get(required)
        if value is None or not (value.reveal() if isinstance(value, Secret) else value):
            raise bad(f"has no {required}")
    expires_at = str(fields[declared.expiry_field])
    try:
        parse_rfc3339(expires_at)
    except ValueError:
        raise bad(f"has an {declared.expiry_field} that is not an RFC 3339 time") from None
    plan = fields.get(declared.plan_field)
    return PublishedRecord(
        credential=credential,
        kind=kind,
        version=version,
        fields=fields,
        expires_at=expires_at,
        refresh_at=plan if isinstance(plan, str) and plan else None,
    )


def render(record: PublishedRecord, sink: SinkConfig) -> bytes:
    """The file's content for `sink`: `raw` the bare value (no newline); `json` every published
    field plus `credential` and `version`; `env` one `<prefix><FIELD>=value` line per field
    plus `<prefix>VERSION`. Deterministic, so an unchanged file is recognised by its bytes."""
    revealed = {
        name: value.reveal() if isinstance(value, Secret) else value
        for name, value in record.fields.items()
    }
    if sink.format == "raw":
        return record.value.reveal().encode()
    if sink.format == "json":
        document: dict[str, object] = dict(revealed)
        document["credential"] = record.credential
        document["version"] = record.version
        return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
    lines = [
        f"{sink.env_prefix}{_env_name(name)}={_env_value(value)}"
        for name, value in sorted(revealed.items())
    ]
    lines.append(f"{sink.env_prefix}VERSION={record.version}")
    return ("\n".join(lines) + "\n").encode()


def _env_name(field_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", field_name).upper()


def _env_value(value: str) -> str:
    """As is when it holds only safe characters; otherwise in double quotes with `\\ " $ ``
    escaped, which systemd's EnvironmentFile=, POSIX shells and dotenv all read back."""
    if _ENV_SAFE.fullmatch(value):
        return value
    return '"' + _ENV_ESCAPE.sub(r"\\\1", value) + '"'
