"""Detector 1: a published secret changed by someone other than keyturn.

A periodic sweep reads the KV metadata of every published path (one read per credential, a few
at a time) and compares it with what keyturn last wrote (re-reading the journal before
reporting, as another instance may have written since): a newer version (a write by someone
else), deleted or destroyed versions, or custom metadata that no longer says keyturn wrote it.
Each finding is reported once per version seen. The response is configurable: `republish` puts
keyturn's value back (apps get a working credential again), `alert` leaves the path alone for a
person to look at. (Conflicts keyturn meets while writing are reported by the writers
themselves.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from keyturn.errors import KeyturnError
from keyturn.events import Observer, Suspicious
from keyturn.layout import MANAGED_BY
from keyturn.logs import get_logger
from keyturn.scheduler import JobView
from keyturn.vault.store import KvMetadata, KvStore

Response = Literal["republish", "alert"]
DETECTOR = "published_secret_changed"


@dataclass(frozen=True, slots=True)
class WatchTarget:
    name: str
    provider: str
    publish_to: str


def findings(metadata: KvMetadata | None, known_version: int, credential: str) -> list[str]:
    """What is wrong with a published path, given the version keyturn last wrote there."""
    if metadata is None:
        return ["the published path was deleted (metadata and all versions)"]
    found = []
    if metadata.current_version != known_version:
        found.append(
            f"version {metadata.current_version} is current; keyturn last wrote {known_version}"
        )
    for number, version in sorted(metadata.versions.items()):
        if number < known_version:
            continue
        if version.destroyed:
            found.append(f"version {number} was destroyed")
        elif version.deletion_time is not None:
            found.append(f"version {number} was deleted")
    meta = metadata.custom_metadata
    if meta.get("managed-by") != MANAGED_BY or meta.get("credential") != credential:
        found.append("custom_metadata no longer says keyturn wrote it")
    return found


class JobLookup(Protocol):
    """Where the watcher reads what this process last published (the scheduler)."""

    def status_of(self, name: str) -> JobView | None: ...


class PublishedWatcher:
    """Sweeps published paths; `sweep` is a periodic job returning the delay to the next.
    What keyturn last wrote is the published version in the record its job's last run left
    (`jobs.status_of`)."""

    def __init__(
        self,
        targets: Callable[[], Iterable[WatchTarget]],
        *,
        store: KvStore,
        observer: Observer,
        jobs: JobLookup,
        journal_version: Callable[[str], Awaitable[tuple[int | None, bool]]],
        republish: Callable[[str], Awaitable[object]],
        response: Response,
        interval: float,
        concurrency: int = 4,
    ) -> None:
        self._targets = targets  # read at every sweep: a reload changes them
        self._store = store
        self._observer = observer
        self._jobs = jobs
        self._journal_version = journal_version
        self._republish = republish
        self._response = response
        self._interval = interval
        self._concurrency = max(1, concurrency)
        self._reported: dict[str, tuple[int | None, tuple[str, ...]]] = {}
        self._log = get_logger("keyturn.watch")

    async def sweep(self) -> float:
        """Check every target, `concurrency` reads at a time: Vault answers reads in parallel,
        and one at a time a sweep of 10,000 paths is 10,000 round trips end to end."""
        pending = iter(list(self._targets()))

        async def worker() -> None:
            for target in pending:  # shared: each target is taken by one worker
                try:
                    await self.check(target)
                except KeyturnError as error:  # Vault trouble is reported by the jobs themselves
                    self._log.warning("watch.failed", credential=target.name, error=str(error))

        async with asyncio.TaskGroup() as group:
            for _ in range(self._concurrency):
                group.create_task(worker())
        return self._interval

    async def check(self, target: WatchTarget) -> list[str]:
        status = self._jobs.status_of(target.name)
        known = status.state.token.published_version if status and status.state else None
        if known is None:
            return []  # never published by this process yet: nothing to compare with
        metadata = await self._store.read_metadata(target.publish_to, consistent=True)
        found = findings(metadata, known, target.name)
        if found:
            # Another instance (or this one, since its last run) may have published: the
            # journal in Vault has the last word before anything is reported. A run that holds
            # the lease may be between publishing and recording it: judge at the next sweep.
            latest, in_progress = await self._journal_version(target.name)
            if in_progress:
                return []
            if latest is not None and latest != known:
                found = findings(metadata, latest, target.name)
        if not found:
            self._reported.pop(target.name, None)
            return []
        key = (metadata.current_version if metadata else None, tuple(found))
        if self._reported.get(target.name) == key:
            return found  # already reported for this version
        self._reported[target.name] = key
        severity = (
            "critical" if any("deleted" in f or "destroyed" in f for f in found) else "warning"
        )
        detail = "; ".join(found) + f"; response: {self._response}"
        self._observer(Suspicious(target.name, target.provider, DETECTOR, severity, detail))
        if self._response == "republish":
            await self._republish(target.name)
        return found
