"""`keyturn status -c FILE [--json] [NAME…]`: one row per credential, read from Vault;
`--instances`: one row per instance of the members record (`keyturn.members`).

Status comes from keyturn's private state and published paths, not from a process, so it is
true whichever instance (or none) runs; only CONSUMERS asks the daemon. Exit 0 all `ok`,
3 (`EXIT_NOT_OK`) some credential is not, 1 unreadable, 2 argparse's. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from keyturn.clock import Clock, SystemClock, rfc3339
from keyturn.commands import add_config_argument, load_or_report
from keyturn.config import Config, CredentialConfig
from keyturn.errors import KeyturnError
from keyturn.hardening import harden_process
from keyturn.jobs.job import lease_in_force
from keyturn.kinds import KINDS, kind_of
from keyturn.kinds.base import AnyKind
from keyturn.layout import state_path
from keyturn.members import gone_after, members_path, owner, read_members
from keyturn.state import CredentialState
from keyturn.vault.store import KvStore

Row = TypeVar("Row")

EXIT_OK = 0
EXIT_ERROR = 1  # the configuration, Vault, a record or a NAME: status could not be read
EXIT_NOT_OK = 3  # read fine, and some credential is not `ok` (2 is argparse's usage error)

# The phase of a row whose record could not be read.
UNKNOWN = "unknown"

# Fields of StatusRow that are times (epoch seconds in the row, RFC 3339 in JSON).
_TIME_FIELDS = (
    "expires_at",
    "next_refresh",
    "last_success",
    "rotates_at",
    "refresh_token_ends_at",
)


@dataclass(frozen=True, slots=True)
class StatusRow:
    """One credential's status. Times are epoch seconds; `as_json` renders them RFC 3339."""

    credential: str
    kind: str
    provider: str
    phase: str
    expires_at: float | None  # api_key: when the key is due for rotation (`rotate_after`)
    next_refresh: float | None
    last_success: float | None
    last_error: str | None
    consecutive_failures: int
    refreshing: bool
    owner: str | None
    published_version: int | None
    key_id: str | None
    rotation_phase: str | None
    rotates_at: float | None
    rotation_error: str | None
    # While the previous key waits for consumers to move: their names, and why keyturn cannot
    # rule out others, if it cannot (from the journal).
    waiting_for_consumers: tuple[str, ...] | None = None
    waiting_reason: str | None = None
    consumers: int | None = None  # identities reading it, from the daemon (with [usage])
    # False while the published token went out without its probe's answer (probed again
    # later, `keyturn.kinds.oauth_client.refresh.ProbeAgain`).
    verified: bool = True
    # What the kind adds from its record (`Kind.status_details`; a signing key: the key ids
    # the server holds).
    details: Mapping[str, str] | None = None
    # When the refresh token keyturn holds stops working at the latest, and a person must
    # consent again (`RefreshTokenRecord.family_ends_at`; None: none held, or not known).
    refresh_token_ends_at: float | None = None

    def as_json(self) -> dict[str, Any]:
        values = asdict(self)
        if self.waiting_for_consumers is not None:
            values["waiting_for_consumers"] = list(self.waiting_for_consumers)
        if self.details is not None:
            values["details"] = dict(self.details)
        for name in _TIME_FIELDS:
            if values[name] is not None:
                values[name] = rfc3339(values[name])
        return values


@dataclass(frozen=True, slots=True)
class InstanceRow:
    """One keyturn instance as the members record shows it. `live` is judged by the age of
    its last beat on this host's clock (a one-shot command sees the record once) against the
    takeover it advertises (an older keyturn's entry: the configured `takeover_after`)."""

    instance: str
    live: bool
    host: str
    pid: int
    address: str | None
    started: float
    last_beat: float
    credentials: int  # in its share, by the live instances of this record
    skew: float | None  # its clock minus Vault's, as it measured
    takeover: float | None = None  # the takeover it beats to (None: an older keyturn's entry)

    def as_json(self) -> dict[str, Any]:
        values = asdict(self)
        values["started"], values["last_beat"] = rfc3339(self.started), rfc3339(self.last_beat)
        return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    parser.add_argument(
        "--instances",
        action="store_true",
        help="the keyturn instances sharing this configuration, instead of the credentials",
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help="only these credentials (default: all)"
    )


def select(config: Config, names: Sequence[str]) -> tuple[list[CredentialConfig], list[str]]:
    """(the credentials named, in the order given and each once; the names `config` lacks).
    Without names, every credential."""
    if not names:
        return list(config.credentials), []
    known = {credential.name: credential for credential in config.credentials}
    wanted = list(dict.fromkeys(names))
    return [known[n] for n in wanted if n in known], [n for n in wanted if n not in known]


def selected_or_report(
    config: Config, names: Sequence[str], command: str
) -> list[CredentialConfig] | None:
    """`select`, or None after one line on stderr naming the credentials `config` lacks."""
    credentials, unknown = select(config, names)
    if unknown:
        missing = ", ".join(repr(name) for name in unknown)
        print(
            f"keyturn {command}: no credential named {missing} in {config.source}", file=sys.stderr
        )
        return None
    return credentials


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None:
        return EXIT_ERROR
    harden_process()  # before any secret is read: keyturn.hardening
    credentials = selected_or_report(config, args.names, "status")
    if credentials is None:
        return EXIT_ERROR
    from keyturn.commands.usage import consumer_counts  # noqa: PLC0415 - only when needed

    clock = SystemClock()
    if args.instances:
        return show_instances(config, clock, as_json=args.json)

    async def collect(store: KvStore) -> list[StatusRow]:
        counts = await asyncio.to_thread(consumer_counts, config)
        return await status_rows(config, store, clock, credentials, consumers=counts)

    rows = read_vault(config, clock, collect)
    if rows is None:
        return EXIT_ERROR
    print(render_json(rows) if args.json else render_table(rows, clock.time()))
    for row in rows:
        if row.phase == UNKNOWN:
            print(f"keyturn status: {row.last_error}", file=sys.stderr)
    return exit_code(rows)


def read_vault(
    config: Config, clock: Clock, read: Callable[[KvStore], Awaitable[list[Row]]]
) -> list[Row] | None:
    """`read(store)` with a store opened for it and closed after; None after one line on
    stderr if Vault could not be read."""
    from keyturn.vault.open import open_vault_store  # noqa: PLC0415 - only when needed

    async def opened() -> list[Row]:
        store = await open_vault_store(config, clock=clock)
        try:
            return await read(store)
        finally:
            await store.close()

    try:
        return asyncio.run(opened())
    except KeyturnError as error:
        print(f"keyturn status: {error}", file=sys.stderr)
        return None


def show_instances(config: Config, clock: Clock, *, as_json: bool) -> int:
    """`--instances`: print the members record; 0 once it could be read."""
    rows = read_vault(config, clock, lambda store: instance_rows(config, store, clock))
    if rows is None:
        return EXIT_ERROR
    if as_json:
        print("\n".join(json.dumps(row.as_json()) for row in rows))
    elif rows:
        print(render_columns(rows, clock.time(), _INSTANCE_COLUMNS))
    else:
        print(f"no keyturn instance has written a heartbeat under {config.keyturn.state_prefix}")
    return EXIT_OK


async def instance_rows(config: Config, store: KvStore, clock: Clock) -> list[InstanceRow]:
    """Every instance in the members record, live ones first, with its share's size."""
    path = members_path(config.keyturn.state_prefix)
    members = read_members(await store.read(path, consistent=True), path)
    now, configured = clock.time(), config.keyturn.takeover_after
    live = sorted(n for n, m in members.items() if now - m.beat_at < gone_after(m, configured))
    shares = Counter(owner(c.name, live) for c in config.credentials)
    rows = [
        InstanceRow(
            instance=name,
            live=name in live,
            host=m.host,
            pid=m.pid,
            address=m.address,
            started=m.started,
            last_beat=m.beat_at,
            credentials=shares.get(name, 0),
            skew=m.skew,
            takeover=m.takeover,
        )
        for name, m in members.items()
    ]
    return sorted(rows, key=lambda row: (not row.live, row.instance))


def exit_code(rows: Sequence[StatusRow]) -> int:
    """1 if some row could not be read, else 3 if some row is not `ok`, else 0."""
    if any(row.phase == UNKNOWN for row in rows):
        return EXIT_ERROR
    return EXIT_OK if all(row.phase == "ok" for row in rows) else EXIT_NOT_OK


async def status_rows(
    config: Config,
    store: KvStore,
    clock: Clock,
    credentials: Sequence[CredentialConfig] | None = None,
    *,
    consumers: Mapping[str, int] | None = None,
) -> list[StatusRow]:
    """The rows of `credentials` (default: every credential of `config`), in that order.
    `consumers`: how many identities read each credential, from the daemon (None: unknown)."""

    async def one(credential: CredentialConfig) -> StatusRow:
        name = credential.name
        unreadable: str | None = None
        try:
            entry = await store.read(state_path(config.keyturn.state_prefix, name))
            state = CredentialState.from_data(entry.data, name) if entry else CredentialState()
        except KeyturnError as error:
            state, unreadable = CredentialState(), str(error)
        token, journal, kind = state.token, state.rotation, kind_of(credential)
        phase: str = UNKNOWN if unreadable is not None else token.phase
        # An access token expires; an API key past its rotation date still works.
        expired = token.expires_at is not None and token.expires_at <= clock.time()
        if expired and kind.value_expires:
            phase = "expired"
        rotation = credential.rotation
        rotates_at: float | None = None
        if rotation is not None:
            if journal.phase == "retiring":
                rotates_at = journal.previous_retire_at
            elif journal.phase == "idle" and journal.key_created_at is not None:
                rotates_at = journal.key_created_at + rotation.max_age
            else:
                rotates_at = journal.retry_at
        refreshing = await lease_in_force(store, state, credential.publish_to, clock.time())
        return StatusRow(
            credential=name,
            kind=credential.kind,
            provider=credential.provider,
            phase=phase,
            expires_at=token.expires_at,
            next_refresh=token.next_due,
            last_success=token.last_success,
            last_error=unreadable or token.last_error or (journal.error if rotation else None),
            consecutive_failures=token.consecutive_failures,
            refreshing=refreshing,
            owner=state.lease.owner or token.writer,
            published_version=token.published_version,
            key_id=journal.key_id if kind.shows_key_id else None,
            rotation_phase=journal.phase if rotation is not None else None,
            rotates_at=rotates_at,
            rotation_error=journal.error if rotation is not None else None,
            waiting_for_consumers=journal.waiting_consumers if rotation is not None else None,
            waiting_reason=journal.waiting_reason if rotation is not None else None,
            consumers=consumers.get(name) if consumers is not None else None,
            verified=token.verify_at is None,
            details=_details(kind, state, name) if unreadable is None else None,
            refresh_token_ends_at=state.refresh.family_ends_at(
                config.provider_of(credential).refresh_token_max_lifetime
            ),
        )

    chosen = config.credentials if credentials is None else credentials
    return list(await asyncio.gather(*(one(c) for c in chosen)))


def _details(kind: AnyKind, state: CredentialState, name: str) -> Mapping[str, str] | None:
    """The kind's own words about its record (None when it has none)."""
    try:
        details = kind.status_details(state, name)
    except KeyturnError as error:
        return {"record": str(error)}
    return details or None


def render_json(rows: Sequence[StatusRow]) -> str:
    return "\n".join(json.dumps(row.as_json()) for row in rows)


def span(seconds: float) -> str:
    """A duration, short and rounded down: 42s, 4m, 5h, 29d (two of a unit before the next)."""
    whole = int(seconds)
    if whole < 120:
        return f"{whole}s"
    if whole < 2 * 3600:
        return f"{whole // 60}m"
    if whole < 2 * 86400:
        return f"{whole // 3600}h"
    return f"{whole // 86400}d"


def relative(when: float, now: float) -> str:
    """`in 4m`, `3m ago` or `now` (under a second either way)."""
    delta = when - now
    if abs(delta) < 1:
        return "now"
    return f"in {span(delta)}" if delta > 0 else f"{span(-delta)} ago"


def when(value: float | None, now: float) -> str:
    """A time as `in 4m (2025-06-01T10:04:05Z)`; `-` when there is none."""
    if value is None:
        return "-"
    return f"{relative(value, now)} ({rfc3339(value)})"


def expiry(row: StatusRow, now: float) -> str:
    """An access token `expires in …`/`expired … ago`; an API key does not expire, it
    `rotates in …` (and past that date, still working, its `rotation due … ago`)."""
    if row.expires_at is None:
        return "-"
    kind = KINDS.get(row.kind)
    if kind is not None:
        verb = kind.expiry_word(row.expires_at, now)
    else:  # a kind this keyturn does not know (a row from another version's daemon)
        verb = "expires" if row.expires_at > now else "expired"
    return f"{verb} {when(row.expires_at, now)}"


def rotation(row: StatusRow) -> str:
    """The rotation's phase, and while the old key waits for consumers, whom it waits for:
    `retiring (waiting for consumers: approle/batch)`."""
    phase = _text(row.rotation_phase)
    if row.details:
        phase += "; " + "; ".join(f"{label}: {words}" for label, words in row.details.items())
    names, reason = row.waiting_for_consumers, row.waiting_reason
    if not names and reason is None:
        return phase
    waiting = ", ".join(names or ()) or "unknown"
    if reason is not None:
        waiting += f"; {'others ' if names else ''}not ruled out: {reason}"
    return f"{phase} (waiting for consumers: {waiting})"


# (header, cell) for each column of the table, in order; the last one is not padded.
_COLUMNS: tuple[tuple[str, Callable[[StatusRow, float], str]], ...] = (
    ("CREDENTIAL", lambda row, now: row.credential),
    ("KIND", lambda row, now: row.kind),
    ("PROVIDER", lambda row, now: row.provider),
    ("PHASE", lambda row, now: row.phase if row.verified else f"{row.phase} (unverified)"),
    ("EXPIRY", expiry),
    ("NEXT RUN", lambda row, now: when(row.next_refresh, now)),
    ("LAST SUCCESS", lambda row, now: when(row.last_success, now)),
    ("FAILURES", lambda row, now: str(row.consecutive_failures)),
    ("REFRESHING", lambda row, now: "yes" if row.refreshing else "no"),
    ("VERSION", lambda row, now: _text(row.published_version)),
    ("ROTATION", lambda row, now: rotation(row)),
    ("ROTATES AT", lambda row, now: when(row.rotates_at, now)),
    ("REFRESH TOKEN ENDS", lambda row, now: when(row.refresh_token_ends_at, now)),
    ("OWNER", lambda row, now: _text(row.owner)),
    ("CONSUMERS", lambda row, now: _text(row.consumers)),
    ("LAST ERROR", lambda row, now: _text(row.last_error)),
)


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def printable(cell: str) -> str:
    """One line, no control or bidi characters: a provider's error text cannot reach the
    operator's terminal as escape sequences or reorder the line."""
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in cell)


_INSTANCE_COLUMNS: tuple[tuple[str, Callable[[InstanceRow, float], str]], ...] = (
    ("INSTANCE", lambda row, now: row.instance),
    ("STATE", lambda row, now: "live" if row.live else "gone"),
    ("HOST", lambda row, now: row.host),
    ("PID", lambda row, now: str(row.pid)),
    ("STARTED", lambda row, now: when(row.started, now)),
    ("LAST BEAT", lambda row, now: relative(row.last_beat, now)),
    ("CREDENTIALS", lambda row, now: str(row.credentials)),
    ("CLOCK SKEW", lambda row, now: "-" if row.skew is None else f"{row.skew:+.1f}s"),
    ("TAKEOVER", lambda row, now: "-" if row.takeover is None else f"{round(row.takeover, 1):g}s"),
    ("ADDRESS", lambda row, now: _text(row.address)),
)


def render_table(rows: Sequence[StatusRow], now: float) -> str:
    """Aligned columns, times relative to `now` and absolute (UTC)."""
    return render_columns(rows, now, _COLUMNS)


def render_columns(
    rows: Sequence[Row], now: float, columns: Sequence[tuple[str, Callable[[Row, float], str]]]
) -> str:
    """`rows` as aligned `columns` (header, cell); the last column is not padded."""
    table = [[header for header, _ in columns]]
    table += [[printable(cell(row, now)) for _, cell in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True))
        + "  "
        + line[-1]
        for line in table
    )
