"""`keyturn status -c FILE [--json]`: one row per credential, read from Vault.

Status comes from keyturn's private state and the published paths, not from a running
process, so it shows the truth whichever instance (or none) is running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

from keyturn.clock import Clock, SystemClock, rfc3339
from keyturn.commands import add_config_argument, load_or_report
from keyturn.config import Config, CredentialConfig
from keyturn.errors import KeyturnError
from keyturn.layout import CredentialState, state_path
from keyturn.vault.store import KvStore


@dataclass(frozen=True, slots=True)
class StatusRow:
    credential: str
    kind: str
    provider: str
    phase: str
    expires_at: str | None
    next_refresh: str | None
    last_success: str | None
    last_error: str | None
    consecutive_failures: int
    refreshing: bool
    owner: str | None
    published_version: int | None
    key_id: str | None
    rotation_phase: str | None
    rotates_at: str | None
    rotation_error: str | None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per credential")


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None:
        return 1
    from keyturn.vault.open import open_vault_store  # noqa: PLC0415 - only when needed

    async def collect() -> list[StatusRow]:
        clock = SystemClock()
        store = await open_vault_store(config, clock=clock)
        try:
            return await status_rows(config, store, clock)
        finally:
            await store.close()

    try:
        rows = asyncio.run(collect())
    except KeyturnError as error:
        print(f"keyturn status: {error}", file=sys.stderr)
        return 1
    print(render_json(rows) if args.json else render_table(rows))
    return 0 if all(row.phase == "ok" for row in rows) else 2


async def status_rows(config: Config, store: KvStore, clock: Clock) -> list[StatusRow]:
    async def one(credential: CredentialConfig) -> StatusRow:
        name = credential.name
        try:
            entry = await store.read(state_path(config.keyturn.state_prefix, name))
            state = CredentialState.from_data(entry.data, name) if entry else CredentialState()
        except KeyturnError as error:
            state = CredentialState(phase="unknown", last_error=str(error))
        phase = state.phase
        # An access token expires; an API key past its rotation date still works.
        expired = state.expires_at is not None and state.expires_at <= clock.time()
        if expired and credential.kind == "oauth_client":
            phase = "expired"
        rotation = credential.rotation
        rotates_at: float | None = None
        if rotation is not None:
            if state.rotation_phase == "retiring":
                rotates_at = state.previous_retire_at
            elif state.rotation_phase == "idle" and state.key_created_at is not None:
                rotates_at = state.key_created_at + rotation.max_age
            else:
                rotates_at = state.rotation_retry_at
        return StatusRow(
            credential=name,
            kind=credential.kind,
            provider=credential.provider,
            phase=phase,
            expires_at=_time(state.expires_at),
            next_refresh=_time(state.next_due),
            last_success=_time(state.last_success),
            last_error=state.last_error or (state.rotation_error if rotation else None),
            consecutive_failures=state.consecutive_failures,
            refreshing=state.lease_until is not None and state.lease_until > clock.time(),
            owner=state.lease_owner or state.writer,
            published_version=state.published_version,
            key_id=state.key_id if credential.kind == "api_key" else None,
            rotation_phase=state.rotation_phase if rotation is not None else None,
            rotates_at=_time(rotates_at),
            rotation_error=state.rotation_error if rotation is not None else None,
        )

    return list(await asyncio.gather(*(one(c) for c in config.credentials)))


def _time(value: float | None) -> str | None:
    return rfc3339(value) if value is not None else None


def render_json(rows: list[StatusRow]) -> str:
    return "\n".join(json.dumps(asdict(row)) for row in rows)


def render_table(rows: list[StatusRow]) -> str:
    columns = (
        "credential",
        "kind",
        "phase",
        "expires_at",
        "next_refresh",
        "rotation_phase",
        "rotates_at",
        "owner",
        "last_error",
    )
    table: list[list[str]] = [[c.upper() for c in columns]]
    for row in rows:
        values: dict[str, Any] = asdict(row)
        table.append(["-" if values[c] is None else str(values[c]) for c in columns])
    widths = [max(len(line[i]) for line in table) for i in range(len(columns) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True))
        + "  "
        + line[-1]
        for line in table
    )
