"""The daemon's plan, saved in Vault (no secret), so a restart needs no read per credential.

The plan is never trusted beyond the record: a restored credential runs at its saved time or
within VERIFY_WINDOW, if sooner, so a stale plan costs an early run, never a late one; what a
command touched beside the daemon (`_plan/touched`) runs at once. See docs/vault.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from keyturn.config import Config
from keyturn.errors import KeyturnError, VaultCasConflict
from keyturn.logs import get_logger
from keyturn.state import CredentialState, LeaseRecord, RefreshTokenRecord
from keyturn.vault.store import KvStore

TOUCHED = "_plan/touched"  # under the state prefix: shared by every instance and command
TOUCH_SLACK = 300.0  # seconds: a mark this much older than the daemon's last run still counts
# (clocks of different hosts; a needless early run is the only cost)
TOUCH_KEEP = 7 * 86400.0  # marks older than this are dropped when a command writes the record
if TYPE_CHECKING:  # the scheduler (APScheduler) is the daemon's, not the commands'
    from keyturn.scheduler import JobView

SHARD_SIZE = 500  # credentials per record: ~200 KB, well under a raft entry's 1 MiB
SAVE_INTERVAL = 300.0  # seconds between saves while runs keep finishing
VERIFY_WINDOW = 900.0  # a restored credential's record is read within this many seconds

log = get_logger("keyturn.saved_plan")


@dataclass(frozen=True, slots=True)
class RestoredPlan:
    """One credential from a saved plan: when to run it, and what the scheduler may know of it
    until then (the record without any secret)."""

    due: float
    state: CredentialState
    finished_at: float  # when the run that left `state` ended (the saving process's clock)


def without_secrets(state: CredentialState) -> CredentialState:
    """The record as the plan keeps it: no refresh token, no key, no lease."""
    rotation = replace(state.rotation, key=None, pending_key=None)
    return CredentialState(
        lease=LeaseRecord(), refresh=RefreshTokenRecord(), token=state.token, rotation=rotation
    )


def settings_fingerprints(config: Config) -> dict[str, str]:
    """Each credential's settings fingerprint, by name: it changes when the credential's own
    settings, its provider or its rotator change (the same inputs as a reload's
    `changed_credentials`); a hash, so the plan holds no setting."""
    # The settings are frozen dataclasses: their repr shows every field (references, never a
    # secret value). The hash is of `repr((credential, provider, rotator))`; a provider's and a
    # rotator's repr are made once, not once per credential.
    providers = {name: repr(provider) for name, provider in config.providers.items()}
    rotators: dict[str | None, str] = {None: repr(None)}
    rotators.update((name, repr(rotator)) for name, rotator in config.rotators.items())
    fingerprints = {}
    for credential in config.credentials:
        rotator = credential.rotation.rotator if credential.rotation is not None else None
        parts = f"({credential!r}, {providers[credential.provider]}, {rotators[rotator]})"
        fingerprints[credential.name] = hashlib.sha256(parts.encode()).hexdigest()[:24]
    return fingerprints


class PlanStore:
    """Saves and restores one instance's plan (see the module docstring)."""

    def __init__(self, store: KvStore, *, state_prefix: str, instance_id: str) -> None:
        self._store = store
        self._prefix = state_prefix.strip("/")
        self._base = f"{self._prefix}/_plan/{instance_id}"
        self._saved_runs: int | None = None  # the run count the last save reflected

    def _shard(self, number: int) -> str:
        return f"{self._base}/{number}"

    async def restore(
        self, config: Config, *, now: float, rng: random.Random
    ) -> dict[str, RestoredPlan]:
        """The saved plan for the credentials of `config` whose settings did not change; {}
        when there is none or it cannot be read (every credential then runs at once)."""
        fingerprints = settings_fingerprints(config)
        restored: dict[str, RestoredPlan] = {}
        touched: dict[str, float] | None = None
        try:
            # Shard by shard, so one shard's decoded entries are held at a time.
            async for entries in self._shards():
                if touched is None:
                    touched = await read_touched(self._store, self._prefix)
                for name, entry in entries.items():
                    fingerprint, due, finished_at, data = entry
                    if touched.get(name, -math.inf) >= finished_at - TOUCH_SLACK:
                        continue  # a command worked on it since: its record says more
                    state = _saved(name, data) if fingerprint == fingerprints.get(name) else None
                    if state is not None:
                        verify_by = now + rng.uniform(0.0, VERIFY_WINDOW)
                        restored[name] = RestoredPlan(min(due, verify_by), state, finished_at)
        except (KeyturnError, ValueError) as error:
            log.warning("plan.unreadable", error=str(error))
            return {}
        return restored

    async def _shards(self) -> AsyncIterator[dict[str, Entry]]:
        """Each shard's entries, shard 0 first; nothing when there is no plan. A shard of
        another generation (a save cut short) raises ValueError: trust none of it."""
        first = await self._store.read(self._shard(0), consistent=True)
        if first is None:
            return
        generation, shards = first.data.get("generation"), int(first.data.get("shards", "0"))
        yield _entries(first.data)
        for number in range(1, shards):
            shard = await self._store.read(self._shard(number), consistent=True)
            if shard is None or shard.data.get("generation") != generation:
                raise ValueError(f"shard {number} of the saved plan is from another save")
            yield _entries(shard.data)

    async def save(self, config: Config, jobs: Iterable[JobView], *, runs: int) -> bool:
        """Write the plan if `runs` (the scheduler's count of finished runs) moved since the
        last save. Shard 0 is written last: it names the generation every shard must carry."""
        if runs == self._saved_runs:
            return False
        fingerprints = settings_fingerprints(config)
        saved = [
            job
            for job in jobs
            if job.name in fingerprints
            and job.state is not None
            and job.next_due is not None
            and job.finished_at is not None
        ]
        count = max(1, math.ceil(len(saved) / SHARD_SIZE))
        generation = uuid.uuid4().hex[:16]
        header = {"generation": generation, "shards": str(count)}
        for number in [*range(1, count), 0]:
            # One shard's rows at a time: at 10,000 credentials all of them cost 9 MiB.
            rows = {
                job.name: [
                    fingerprints[job.name],
                    job.next_due,
                    job.finished_at,
                    without_secrets(job.state).to_data(),  # type: ignore[arg-type]
                ]
                for job in saved[number * SHARD_SIZE : (number + 1) * SHARD_SIZE]
            }
            entries = json.dumps(rows, separators=(",", ":"))
            await self._store.write(self._shard(number), {**header, "entries": entries}, cas=None)
        # Shards past the count (a plan that shrank) stay, unread: keyturn's policy has no
        # delete, and shard 0's count and generation say which ones belong.
        self._saved_runs = runs
        return True


# One credential in a saved plan: settings fingerprint, due, finished_at, record without secrets.
Entry = tuple[str, float, float, dict[str, str]]


def _saved(name: str, data: dict[str, str]) -> CredentialState | None:
    """A saved record (its settings did not change), if this version can parse it."""
    try:
        return CredentialState.from_data(data, name)
    except KeyturnError:
        return None  # an entry this version cannot parse: the record is read instead


def _entries(data: Mapping[str, str]) -> dict[str, Entry]:
    raw = json.loads(data.get("entries", "{}"))
    if not isinstance(raw, dict):
        raise ValueError("the saved plan's entries are not an object")
    entries = {}
    for name, entry in raw.items():
        match entry:
            case [
                str(fingerprint),
                int() | float() as due,
                int() | float() as finished_at,
                dict() as fields,
            ] if all(isinstance(v, str) for v in fields.values()):
                entries[name] = (fingerprint, float(due), float(finished_at), fields)
            case _:
                raise ValueError(f"the saved plan's entry for {name!r} is malformed")
    return entries


async def read_touched(store: KvStore, state_prefix: str) -> dict[str, float]:
    """The commands' marks: credential -> when a command last worked on it."""
    entry = await store.read(f"{state_prefix.strip('/')}/{TOUCHED}", consistent=True)
    marks: dict[str, float] = {}
    for name, text in (entry.data if entry else {}).items():
        with contextlib.suppress(ValueError):
            marks[name] = float(text)
    return marks


async def touch(store: KvStore, state_prefix: str, credential: str, now: float) -> None:
    """Mark `credential` as worked on by a command (see the module docstring): a daemon that
    starts later reads its record at once instead of trusting its saved plan. Best effort: a
    failure is logged, never the command's failure."""
    path = f"{state_prefix.strip('/')}/{TOUCHED}"
    for _attempt in range(5):
        try:
            entry = await store.read(path, consistent=True)
            marks = {
                name: text
                for name, text in (entry.data if entry else {}).items()
                if _recent(text, now)
            }
            marks[credential] = repr(now)
            await store.write(path, marks, cas=entry.version if entry else 0)
            return
        except VaultCasConflict:
            continue  # another command marked at the same moment: read again
        except KeyturnError as error:
            log.warning("plan.touch_failed", credential=credential, error=str(error))
            return
    log.warning("plan.touch_failed", credential=credential, error="check-and-set kept failing")


def _recent(text: str, now: float) -> bool:
    try:
        return now - float(text) < TOUCH_KEEP
    except ValueError:
        return False
