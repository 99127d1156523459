"""Detector 1: a published secret changed by someone other than keyturn.

A periodic sweep compares every published path's KV metadata with what keyturn last wrote
(re-reading the journal first: another instance may have written since) and reports each
foreign version, deletion or metadata change once; `republish` puts keyturn's value back,
`alert` leaves it for a person. Folders of several paths are listed with OpenBao's
`detailed-metadata` LIST (one call per `LIST_PAGE` keys) instead of read path by path.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from keyturn.errors import KeyturnError, VaultPermissionDenied
from keyturn.events import Observer, Suspicious
from keyturn.layout import MANAGED_BY
from keyturn.logs import get_logger
from keyturn.scheduler import JobView
from keyturn.vault.store import KvMetadata, KvStore

Response = Literal["republish", "alert"]
DETECTOR = "published_secret_changed"
LIST_PAGE = 500  # keys per detailed-metadata LIST: about 300 KB of JSON a page
LIST_AT_LEAST = 2  # published paths in one folder for the sweep to list it rather than read


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


def folder_of(path: str) -> str:
    """The folder a published path sits in ("" for a path at the mount's root)."""
    return path.rpartition("/")[0]


def leaf(path: str) -> str:
    """A published path's name in its folder, as a folder listing shows it."""
    return path.rpartition("/")[2]


def listed_folders(paths: Iterable[str]) -> dict[str, list[str]]:
    """The folders the sweep lists, each with the published paths it holds (LIST_AT_LEAST or
    more); `keyturn check` asks for `list` on each."""
    folders: dict[str, list[str]] = {}
    for path in paths:
        folders.setdefault(folder_of(path), []).append(path)
    return {
        folder: held for folder, held in folders.items() if folder and len(held) >= LIST_AT_LEAST
    }


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
        list_page: int = LIST_PAGE,
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
        self._list_page = list_page
        self._reported: dict[str, tuple[int | None, tuple[str, ...]]] = {}
        self._unlistable: set[str] = set()  # folders whose LIST Vault refused (403)
        self._log = get_logger("keyturn.watch")

    async def sweep(self) -> float:
        """Check every target, `concurrency` Vault calls at a time: Vault answers in parallel,
        and one at a time a sweep of 10,000 paths is 10,000 round trips end to end. First the
        folders are listed, each page judged as it comes (so one page of metadata is held at a
        time); then the targets no listing showed are read path by path."""
        targets = list(self._targets())
        folders = listed_folders(target.publish_to for target in targets)
        by_path = {target.publish_to: target for target in targets}
        grouped = {path for paths in folders.values() for path in paths}
        unlisted = [target for target in targets if target.publish_to not in grouped]
        await self._pooled(
            functools.partial(
                self._sweep_folder, folder, [by_path[path] for path in paths], unlisted
            )
            for folder, paths in folders.items()
        )
        await self._pooled(functools.partial(self._check_logged, target) for target in unlisted)
        return self._interval

    async def _pooled(self, units: Iterable[Callable[[], Awaitable[None]]]) -> None:
        pending = iter(units)

        async def worker() -> None:
            for unit in pending:  # shared: each unit is taken by one worker
                await unit()

        async with asyncio.TaskGroup() as group:
            for _ in range(self._concurrency):
                group.create_task(worker())

    async def _sweep_folder(
        self, folder: str, targets: list[WatchTarget], unlisted: list[WatchTarget]
    ) -> None:
        """Judge `targets` (all in `folder`) page by page from as few LIST pages as cover them;
        those the listing does not show go to `unlisted`, to be read one by one."""
        waiting = {leaf(target.publish_to): target for target in targets}
        after, last = "", max(waiting)
        while folder not in self._unlistable:
            try:
                page = await self._store.list_metadata(
                    folder, after=after, limit=self._list_page, consistent=True
                )
            except VaultPermissionDenied as error:
                self._unlistable.add(folder)
                self._log.warning("watch.list_refused", folder=folder, error=str(error))
                break
            except KeyturnError as error:
                self._log.warning("watch.list_failed", folder=folder, error=str(error))
                break
            for name, metadata in page or ():
                target = waiting.get(name)
                if target is not None and metadata is not None:
                    del waiting[name]
                    await self._check_logged(target, metadata)
            if not page or len(page) < self._list_page or page[-1][0] >= last:
                break
            after = page[-1][0]
        unlisted.extend(waiting.values())

    async def _check_logged(self, target: WatchTarget, listed: KvMetadata | None = None) -> None:
        try:
            await self.check(target, listed)
        except KeyturnError as error:  # Vault trouble is reported by the jobs themselves
            self._log.warning("watch.failed", credential=target.name, error=str(error))

    async def check(self, target: WatchTarget, listed: KvMetadata | None = None) -> list[str]:
        """Judge `target` from `listed` (its metadata from a folder listing) or, without it,
        from a read of its path."""
        status = self._jobs.status_of(target.name)
        known = status.state.token.published_version if status and status.state else None
        if known is None:
            return []  # never published by this process yet: nothing to compare with
        metadata = listed or await self._store.read_metadata(target.publish_to, consistent=True)
        found = findings(metadata, known, target.name)
        if found and listed is not None and listed.current_version < known:
            # Older than keyturn's own last write: the listing's page was read before keyturn
            # published and recorded that version. Judge what the path holds now (a path
            # deleted and written again also starts below it, and a fresh read shows that).
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
