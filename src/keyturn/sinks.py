"""Local sinks: files on keyturn's own host kept equal to what keyturn publishes, and a command
run after each write (to reload the app that reads the file).

How it fits in:

- `SinkObserver` is one of the runtime's observers. `Published` (keyturn just made a new value
  readable) and `Restored` with times not seen before (another instance, or `keyturn refresh`
  beside the daemon, published) only wake that credential's worker: the value never travels
  through an event, and the run that reported it never waits for a file or a command.
- One worker task per credential with sinks. Woken, it reads the credential's published path
  from Vault (a consistent read), renders each sink's file from it, writes the files whose
  content or mode differ, then runs their commands side by side. Latest wins: wakes during a
  pass make one more pass, which reads the newest version; no version is queued behind
  another.
- At start every worker runs once, so a file left stale by a crash between a publish and its
  write, or changed by someone else, is put right without waiting for a refresh.
- A file is written atomically: a temporary file in the same directory (mode set before any
  byte is written), fsync, rename over the old file, fsync of the directory. A reader sees
  the old file or the new one, never a mix or an empty file.
- `on_publish` runs after each write of its sink's file, without a shell, with keyturn's
  environment minus `KEYTURN_…`, `VAULT_…` and `BAO_…` (as the exec rotator), told what was
  written as one JSON object on stdin (never the value). Past its timeout its process group
  is killed. Its output is read up to 64 KiB and the last line of each stream is logged, with
  every published secret cut out.
- Failures are logged naming the credential and the sink, and counted by `on_result`
  (`keyturn_sink_writes_total`). A file that cannot be written, or a Vault read that fails, is
  retried with backoff (1 s doubling to 60 s); a failed command is not re-run (it runs again
  after the next write); an unusable published record waits for the next publish.

The worker tasks never hold the refresh path: file I/O runs on a small thread pool of its
own, commands as child processes, and at most `max_concurrency` passes run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import random
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from keyturn.clock import Clock, parse_rfc3339
from keyturn.config.schema import Config, CredentialConfig, HookConfig, SinkConfig
from keyturn.errors import KeyturnError
from keyturn.events import Event, Published, Restored
from keyturn.logs import get_logger
from keyturn.policy import BackoffPolicy, backoff_delay
from keyturn.rotators.exec import (
    MAX_OUTPUT,
    MAX_STDERR_LINE,
    child_environment,
    communicate,
    exit_reason,
    kill_group,
)
from keyturn.secret import Secret
from keyturn.vault.store import KvStore

log = get_logger("keyturn.sinks")

SinkResult = Literal[
    "written", "unchanged", "write_failed", "hook_failed", "invalid_record", "read_failed"
]
# The results counted by `on_result` (the `result` label of keyturn_sink_writes_total).
COUNTED_RESULTS = ("written", "write_failed", "hook_failed", "invalid_record", "read_failed")

# The published field holding the value itself, and the one saying until when it is good.
VALUE_FIELD = {"oauth_client": "access_token", "api_key": "api_key"}
EXPIRY_FIELD = {"oauth_client": "expires_at", "api_key": "rotate_after"}
PLAN_FIELD = {"oauth_client": "refresh_at", "api_key": "rotate_after"}
# Published fields that hold a secret (kept as `Secret`; cut out of a command's output).
SECRET_FIELDS = frozenset({"access_token", "api_key", "authorization"})

RETRY = BackoffPolicy(initial=1.0, maximum=60.0, multiplier=2.0)
MAX_CONCURRENCY = 16
FILE_THREADS = 4
TEMP_SUFFIX = ".keyturn-tmp"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_SAFE = re.compile(r"[A-Za-z0-9_./:@%+=,-]*")
_ENV_ESCAPE = re.compile(r'([\\"$`])')
_REDACTED = "[redacted]"


class SinkError(KeyturnError):
    """A sink could not be brought up to date. The message names the credential and the sink
    (its path), never a value."""

    def __init__(self, message: str, *, credential: str, sink: Path | None = None) -> None:
        self.sink = sink
        where = f"sink {sink}: " if sink is not None else ""
        super().__init__(where + message, credential=credential)


# -- the published record --------------------------------------------------------------------


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
        value = self.fields[VALUE_FIELD[self.kind]]
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
    for required in (VALUE_FIELD[kind], EXPIRY_FIELD[kind]):
        value = fields.get(required)
        if value is None or not (value.reveal() if isinstance(value, Secret) else value):
            raise bad(f"has no {required}")
    expires_at = str(fields[EXPIRY_FIELD[kind]])
    try:
        parse_rfc3339(expires_at)
    except ValueError:
        raise bad(f"has an {EXPIRY_FIELD[kind]} that is not an RFC 3339 time") from None
    plan = fields.get(PLAN_FIELD[kind])
    return PublishedRecord(
        credential=credential,
        kind=kind,
        version=version,
        fields=fields,
        expires_at=expires_at,
        refresh_at=plan if isinstance(plan, str) and plan else None,
    )


# -- rendering -------------------------------------------------------------------------------


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


# -- files -----------------------------------------------------------------------------------


def file_is_current(path: Path, content: bytes, mode: int) -> bool:
    """Whether `path` is a regular file (not a link) with exactly this mode and content."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) != mode:
            return False
        if info.st_size != len(content):
            return False
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path, flags)
        try:
            data = b""
            while len(data) <= len(content):
                chunk = os.read(fd, len(content) + 1 - len(data))
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
    except OSError:
        return False  # unreadable, gone, or replaced meanwhile: write it anew
    return hmac.compare_digest(data, content)


def write_atomically(path: Path, content: bytes, mode: int) -> None:
    """Replace `path` with `content`: a temporary file in the same directory, created with
    mode 0600 and set to `mode` before any byte is written, fsync, rename over `path`, fsync of
    the directory. Raises OSError; the temporary file never outlives a failure."""
    directory = path.parent
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=directory)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)


def remove_leftovers(path: Path) -> int:
    """Delete temporary files a crash left beside `path` (ours only: `.<name>.*.keyturn-tmp`)."""
    removed = 0
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            name = entry.name
            if name.startswith(f".{path.name}.") and name.endswith(TEMP_SUFFIX):
                with contextlib.suppress(OSError):
                    entry.unlink()
                    removed += 1
    return removed


def write_file(path: Path, content: bytes, mode: int) -> str | None:
    """`write_atomically`, with what went wrong as one line (None: written). Runs on a sink
    thread, so even the checks made to explain a failure never touch the event loop."""
    try:
        write_atomically(path, content, mode)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        if isinstance(error, FileNotFoundError) and not path.parent.is_dir():
            return f"cannot write the file: its directory {path.parent} does not exist ({reason})"
        if isinstance(error, PermissionError):
            where = path.parent
            return (
                f"cannot write the file: {reason} (keyturn must be able to create files in {where})"
            )
        return f"cannot write the file: {reason}"
    return None


# -- the on_publish command ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HookRun:
    """A finished command: how long it took and the last line of each stream (secrets cut)."""

    seconds: float
    stdout: str
    stderr: str


async def run_hook(
    hook: HookConfig,
    params: Mapping[str, object],
    *,
    environ: Mapping[str, str],
    secrets: Iterable[str],
    credential: str,
    sink: Path,
) -> HookRun:
    """Run `hook` with `params` as one JSON line on stdin. Raises SinkError on a non-zero exit,
    a time-out (the process group is killed) or a command that cannot be started."""
    cut = list(secrets)
    program = hook.command[0]
    started = time.monotonic()
    try:
        process = await asyncio.create_subprocess_exec(
            *hook.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_environment(environ),
            start_new_session=True,  # its own process group, killed as a whole
        )
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SinkError(
            f"on_publish: cannot run {program}: {reason}", credential=credential, sink=sink
        ) from None
    try:
        async with asyncio.timeout(hook.timeout):
            out, err = await communicate(process, (json.dumps(params) + "\n").encode())
    except TimeoutError:
        raise SinkError(
            f"on_publish: {program} timed out after {hook.timeout:g}s (its process group was "
            "killed)",
            credential=credential,
            sink=sink,
        ) from None
    finally:
        if process.returncode is None:  # timed out or cancelled: leave nothing behind
            kill_group(process)
            await process.wait()
    stdout, stderr = _last_line(out.data, cut), _last_line(err.data, cut)
    if process.returncode != 0:
        tail = f": {stderr}" if stderr else ""
        raise SinkError(
            f"on_publish: {program} {exit_reason(process.returncode)}{tail}",
            credential=credential,
            sink=sink,
        )
    return HookRun(time.monotonic() - started, stdout, stderr)


def _last_line(output: bytes, secrets: list[str]) -> str:
    """The last non-empty line of a command's output, every secret cut out, at most 200
    characters."""
    lines = [line.strip() for line in output[-MAX_OUTPUT:].decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    line = lines[-1]
    for secret in secrets:
        line = line.replace(secret, _REDACTED)
    if len(line) > MAX_STDERR_LINE:
        line = line[: MAX_STDERR_LINE - 3] + "..."
    return line


def hook_params(record: PublishedRecord, sink: SinkConfig, provider: str) -> dict[str, object]:
    """What `on_publish` is told on stdin: never the value."""
    return {
        "credential": record.credential,
        "kind": record.kind,
        "provider": provider,
        "version": record.version,
        "path": str(sink.path),
        "format": sink.format,
        "expires_at": record.expires_at,
        "refresh_at": record.refresh_at,
    }


# -- workers ---------------------------------------------------------------------------------


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
