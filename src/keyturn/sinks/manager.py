"""The sinks' manager: one worker task per credential with sinks, woken by an observer after a
publish, which reads the published path, writes the files that differ and runs their commands,
off the refresh path (see docs/architecture.md#local-sinks)."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from keyturn.clock import Clock
from keyturn.config.credentials import CredentialConfig, SinkConfig
from keyturn.config.schema import Config
from keyturn.errors import KeyturnError
from keyturn.events import Event, Published, Restored
from keyturn.logs import get_logger
from keyturn.policy import BackoffPolicy, backoff_delay
from keyturn.sinks.files import file_is_current, remove_leftovers, write_file
from keyturn.sinks.hook import hook_params, run_hook
from keyturn.sinks.render import PublishedRecord, SinkError, parse_record, render
from keyturn.vault.store import KvStore

log = get_logger("keyturn.sinks")

SinkResult = Literal[
    "written", "unchanged", "write_failed", "hook_failed", "invalid_record", "read_failed"
]
# The results counted by `on_result` (the `result` label of keyturn_sink_writes_total).
COUNTED_RESULTS = ("written", "write_failed", "hook_failed", "invalid_record", "read_failed")

RETRY = BackoffPolicy(initial=1.0, maximum=60.0, multiplier=2.0)
MAX_CONCURRENCY = 16
FILE_THREADS = 4


@dataclass(frozen=True, slots=True)
class SinkReport:
    """What one pass did for one sink."""

    sink: Path
    result: SinkResult
    version: int | None = None
    error: str | None = None


@dataclass(eq=False)
class _Worker:
    credential: CredentialConfig
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    failures: int = 0
    seen: tuple[float | None, float | None] | None = None
    swept: bool = False


OnResult = Callable[[str, str], None]


class SinkManager:
    """Every credential's sinks: one worker task each, woken by `notify`.

    `start()` starts the workers and syncs each once; `configure(config)` (a reload) keeps
    unchanged workers, stops removed ones and starts new or changed ones; `stop(timeout)` lets
    passes under way (and one that was asked for) finish, then cancels. `sync(name)` runs one
    pass directly (tests); `settled()` waits until no worker has a pass to do.
    """

    def __init__(
        self,
        config: Config,
        *,
        store: KvStore,
        clock: Clock,
        environ: Mapping[str, str] | None = None,
        on_result: OnResult | None = None,
        rng: random.Random | None = None,
        max_concurrency: int = MAX_CONCURRENCY,
    ) -> None:
        self._store = store
        self._clock = clock
        self._environ = os.environ if environ is None else environ
        self._on_result = on_result
        self._rng = rng or random.Random()  # jitter, not cryptography
        self._limit = asyncio.Semaphore(max_concurrency)
        self._executor = ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="keyturn-sink")
        self._workers: dict[str, _Worker] = {}
        self._started = False
        self._stopping = False
        self.configure(config)

    def __repr__(self) -> str:
        return f"SinkManager(credentials={sorted(self._workers)})"

    @property
    def credentials(self) -> list[str]:
        """The credentials that have sinks."""
        return sorted(self._workers)

    def observer(self) -> SinkObserver:
        return SinkObserver(self)

    # -- life ------------------------------------------------------------------------------

    def configure(self, config: Config) -> None:
        """Follow `config`: a credential whose sinks, path, kind or provider changed gets a new
        worker (which syncs at once when started); one without sinks loses its worker."""
        wanted = {c.name: c for c in config.credentials if c.sinks}
        for name in list(self._workers):
            if wanted.get(name) != self._workers[name].credential:
                worker = self._workers.pop(name)
                if worker.task is not None:
                    worker.task.cancel()
        for name, credential in wanted.items():
            if name not in self._workers:
                worker = self._workers[name] = _Worker(credential)
                if self._started:
                    self._launch(worker)

    def start(self) -> None:
        """Start every worker; each syncs its sinks once at once."""
        self._started = True
        for worker in self._workers.values():
            if worker.task is None:
                self._launch(worker)

    def _launch(self, worker: _Worker) -> None:
        worker.task = asyncio.get_running_loop().create_task(
            self._work(worker), name=f"keyturn-sinks-{worker.credential.name}"
        )
        self._wake(worker)

    async def stop(self, timeout: float) -> None:
        """Let passes under way or asked for finish (up to `timeout` seconds), then cancel."""
        self._stopping = True
        tasks = []
        for worker in self._workers.values():
            if worker.task is None:
                continue
            if not worker.wake.is_set() and worker.idle.is_set():
                worker.task.cancel()
            tasks.append(worker.task)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def settled(self) -> None:
        """Return once no worker has a pass under way or asked for."""
        while True:
            busy = [
                w
                for w in self._workers.values()
                if w.task is not None and not w.task.done() and not w.idle.is_set()
            ]
            if not busy:
                return
            await asyncio.gather(*(w.idle.wait() for w in busy))

    # -- events ----------------------------------------------------------------------------

    def notify(self, name: str) -> None:
        """Bring `name`'s sinks up to date soon (no-op without sinks). Never blocks."""
        worker = self._workers.get(name)
        if worker is not None and worker.task is not None:
            self._wake(worker)

    def _wake(self, worker: _Worker) -> None:
        worker.idle.clear()
        worker.wake.set()

    def saw(self, name: str, issued_at: float | None, expires_at: float | None) -> None:
        """A run read these times from the journal: if they are new to this process, another
        writer published, and the sinks follow."""
        worker = self._workers.get(name)
        if worker is None or worker.seen == (issued_at, expires_at):
            return
        worker.seen = (issued_at, expires_at)
        self.notify(name)

    def published(self, name: str, issued_at: float, expires_at: float) -> None:
        worker = self._workers.get(name)
        if worker is not None:
            worker.seen = (issued_at, expires_at)
        self.notify(name)

    # -- the worker ------------------------------------------------------------------------

    async def _work(self, worker: _Worker) -> None:
        name = worker.credential.name
        while True:
            await worker.wake.wait()
            worker.wake.clear()
            try:
                async with self._limit:
                    reports = await self._pass(worker)
            except Exception as exc:  # a bug must cost one pass, never the worker
                log.error("sink.pass_failed", credential=name, error_type=type(exc).__name__)
                reports = [SinkReport(s.path, "write_failed") for s in worker.credential.sinks]
            if self._stopping:
                return
            if any(r.result in ("write_failed", "read_failed") for r in reports):
                worker.failures += 1
                delay = backoff_delay(worker.failures, RETRY, self._rng)
                log.info("sink.retry_planned", credential=name, retry_in=round(delay, 3))
                if not worker.wake.is_set():
                    worker.idle.set()
                await self._wait(worker, delay)
                self._wake(worker)
                continue
            worker.failures = 0
            if not worker.wake.is_set():
                worker.idle.set()

    async def _wait(self, worker: _Worker, delay: float) -> None:
        """Until `delay` has passed or the worker is woken (a new publish retries at once)."""
        sleeper = asyncio.ensure_future(self._clock.sleep(delay))
        woken = asyncio.ensure_future(worker.wake.wait())
        try:
            await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (sleeper, woken):
                pending.cancel()
            await asyncio.gather(sleeper, woken, return_exceptions=True)

    async def sync(self, name: str) -> list[SinkReport]:
        """One pass over `name`'s sinks now (KeyError if it has none)."""
        return await self._pass(self._workers[name])

    async def _pass(self, worker: _Worker) -> list[SinkReport]:
        credential = worker.credential
        name = credential.name
        loop = asyncio.get_running_loop()
        if not worker.swept:
            worker.swept = True
            for sink in credential.sinks:
                removed = await loop.run_in_executor(self._executor, remove_leftovers, sink.path)
                if removed:
                    log.info("sink.leftovers_removed", credential=name, sink=str(sink.path))
        try:
            entry = await self._store.read(credential.publish_to, consistent=True)
        except KeyturnError as error:
            log.warning(
                "sink.read_failed",
                credential=name,
                sinks=[str(s.path) for s in credential.sinks],
                error=str(error),
                error_type=type(error).__name__,
            )
            return [self._count(name, SinkReport(s.path, "read_failed")) for s in credential.sinks]
        if entry is None:
            log.debug("sink.nothing_published", credential=name, publish_to=credential.publish_to)
            return []
        try:
            record = parse_record(entry.data, entry.version, credential=name, kind=credential.kind)
        except SinkError as error:
            reports = []
            for sink in credential.sinks:
                named = SinkError(
                    f"{error.message}; the file is left as it was", credential=name, sink=sink.path
                )
                log.error(
                    "sink.invalid_record",
                    credential=name,
                    sink=str(sink.path),
                    version=entry.version,
                    error=str(named),
                )
                reports.append(
                    self._count(
                        name, SinkReport(sink.path, "invalid_record", entry.version, str(named))
                    )
                )
            return reports
        # Every file first, then the commands side by side: a slow command never holds up
        # another file.
        written = [await self._write(credential, sink, record) for sink in credential.sinks]
        return list(
            await asyncio.gather(
                *(self._after_write(credential, sink, record, report) for sink, report in written)
            )
        )

    async def _write(
        self, credential: CredentialConfig, sink: SinkConfig, record: PublishedRecord
    ) -> tuple[SinkConfig, SinkReport]:
        name, path = credential.name, sink.path
        loop = asyncio.get_running_loop()
        content = render(record, sink)
        if await loop.run_in_executor(self._executor, file_is_current, path, content, sink.mode):
            log.debug("sink.unchanged", credential=name, sink=str(path), version=record.version)
            return sink, SinkReport(path, "unchanged", record.version)
        problem = await loop.run_in_executor(self._executor, write_file, path, content, sink.mode)
        if problem is not None:
            error = SinkError(problem, credential=name, sink=path)
            log.error(
                "sink.write_failed",
                credential=name,
                sink=str(path),
                version=record.version,
                error=str(error),
            )
            return sink, SinkReport(path, "write_failed", record.version, str(error))
        log.info(
            "sink.written",
            credential=name,
            sink=str(path),
            format=sink.format,
            version=record.version,
        )
        return sink, SinkReport(path, "written", record.version)

    async def _after_write(
        self,
        credential: CredentialConfig,
        sink: SinkConfig,
        record: PublishedRecord,
        report: SinkReport,
    ) -> SinkReport:
        """Run the sink's command if its file was just written; count the outcome."""
        name, path = credential.name, sink.path
        if report.result != "written" or sink.on_publish is None:
            return self._count(name, report)
        try:
            run = await run_hook(
                sink.on_publish,
                hook_params(record, sink, credential.provider),
                environ=self._environ,
                secrets=record.secrets(),
                credential=name,
                sink=path,
            )
        except SinkError as error:
            log.warning(
                "sink.hook_failed",
                credential=name,
                sink=str(path),
                version=record.version,
                error=str(error),
            )
            return self._count(name, SinkReport(path, "hook_failed", record.version, str(error)))
        output = {
            key: line for key, line in (("stdout", run.stdout), ("stderr", run.stderr)) if line
        }
        log.info(
            "sink.hook_ran",
            credential=name,
            sink=str(path),
            version=record.version,
            seconds=round(run.seconds, 3),
            **output,
        )
        return self._count(name, report)

    def _count(self, name: str, report: SinkReport) -> SinkReport:
        if self._on_result is not None and report.result in COUNTED_RESULTS:
            try:
                self._on_result(name, report.result)
            except Exception as exc:  # a metrics bug must not stop a sink
                log.error("sink.count_failed", error_type=type(exc).__name__)
        return report


class SinkObserver:
    """The runtime observer that wakes sinks: `Published` always, `Restored` when the journal
    holds times this process has not seen (someone else published). No other event matters
    to sinks; every event returns at once."""

    def __init__(self, manager: SinkManager) -> None:
        self._manager = manager

    def __call__(self, event: Event) -> None:
        match event:
            case Published(credential=name, issued_at=issued_at, expires_at=expires_at):
                self._manager.published(name, issued_at, expires_at)
            case Restored(credential=name, issued_at=issued_at, expires_at=expires_at):
                self._manager.saw(name, issued_at, expires_at)
