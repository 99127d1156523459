"""Where audit lines come from: Vault's `file` audit device (tailed) or its `socket` device.

Both split input into lines (an overlong one dropped as it streams), parse them, hand records
to `on_entry` and count skips by reason; bad input never raises. `FileAuditSource` follows
rename and copy-truncate rotation and, with a `position_file`, resumes where it stopped.
Behaviour: docs/usage.md#the-file-audit-device.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import os
import stat
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from keyturn.clock import Clock
from keyturn.logs import get_logger
from keyturn.usage.audit import (
    INTERNAL_ERROR,
    MAX_LINE,
    TOO_LONG,
    TRUNCATED,
    AuditEntry,
    AuditParser,
)

EntryHandler = Callable[[AuditEntry], None]
# Told when a source goes down (False, why) or comes back (True, "").
UpHandler = Callable[[bool, str], None]
HEAD = 256  # bytes of a file's start that identify its content
LOOPBACK = ("127.0.0.0/8", "::1/128")

_log = get_logger("keyturn.usage")


class LineSplitter:
    """Bytes as they arrive → complete lines (without the newline).

    An unfinished line waits for the rest; one that grows past `max_line` is dropped and what
    follows is skipped up to the next newline, so memory stays bounded by `max_line`.
    `too_long` counts dropped lines; `boundary` is how many bytes fed so far end in a newline
    (a file offset that starts a line).
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.too_long = 0
        self.boundary = 0
        self._fed = 0
        self._pending = b""
        self._discarding = False

    @property
    def pending(self) -> int:
        """Bytes of a line not finished yet (0 while a too long line is skipped)."""
        return len(self._pending)

    def feed(self, chunk: bytes) -> list[bytes]:
        start = self._fed
        self._fed += len(chunk)
        last = chunk.rfind(b"\n")
        if last >= 0:
            self.boundary = start + last + 1
        if self._discarding:
            cut = chunk.find(b"\n")
            if cut < 0:
                return []
            chunk = chunk[cut + 1 :]
            self._discarding = False
        data = self._pending + chunk if self._pending else chunk
        lines = data.split(b"\n")
        rest = lines.pop()
        if len(rest) > self.max_line:
            self.too_long += 1
            self._discarding = True
            rest = b""
        self._pending = rest
        if len(data) > self.max_line:
            kept = [line for line in lines if len(line) <= self.max_line]
            self.too_long += len(lines) - len(kept)
            lines = kept
        return lines


class _Counting:
    """What both sources share: parse, hand over, count; and the up/down state."""

    kind = ""

    def __init__(
        self, parser: AuditParser, on_entry: EntryHandler, on_up: UpHandler | None
    ) -> None:
        self.parser = parser
        self.skipped: Counter[str] = Counter()
        self.lines = 0
        self.entries = 0
        self.problem: str | None = "not started"
        self._told_down = False
        self._on_entry = on_entry
        self._on_up = on_up
        self._failures_logged: set[str] = set()

    @property
    def up(self) -> bool:
        return self.problem is None

    def _lines(self, lines: list[bytes], splitter: LineSplitter) -> None:
        parse = self.parser.parse
        for line in lines:
            if not line or line == b"\r":
                continue
            self.lines += 1
            result = parse(line)
            if isinstance(result, str):
                self.skipped[result] += 1
                continue
            self.entries += 1
            try:
                self._on_entry(result)
            except Exception as exc:  # a bug downstream must not stop the source
                self.skipped[INTERNAL_ERROR] += 1
                kind = type(exc).__name__
                if kind not in self._failures_logged:
                    self._failures_logged.add(kind)
                    _log.error("usage.entry_failed", source=self.kind, error_type=kind)
        if splitter.too_long:
            self.skipped[TOO_LONG] += splitter.too_long
            self.lines += splitter.too_long
            splitter.too_long = 0

    def _down(self, problem: str) -> None:
        """Down (again): logged when the problem changes, told once per outage (a source
        that never came up is an outage too)."""
        if problem != self.problem:
            self.problem = problem
            _log.warning("usage.source_down", source=self.kind, problem=problem)
        if not self._told_down:
            self._told_down = True
            if self._on_up is not None:
                self._on_up(False, problem)

    def _ok(self) -> None:
        if self.problem is not None:
            self.problem = None
            self._told_down = False
            _log.info("usage.source_up", source=self.kind)
            if self._on_up is not None:
                self._on_up(True, "")


class _Tail:
    """One open audit file: where the next read starts, and the unfinished line."""

    def __init__(self, fd: int, st: os.stat_result, offset: int, max_line: int) -> None:
        self.fd = fd
        self.device = st.st_dev
        self.inode = st.st_ino
        self.max_line = max_line
        self.retire_at: float | None = None
        self.reset(offset)

    def reset(self, offset: int = 0) -> None:
        self.offset = offset
        self.base = offset
        self.head = b""
        self.splitter = LineSplitter(self.max_line)

    @property
    def line_offset(self) -> int:
        """The offset of the first line not read completely."""
        return self.base + self.splitter.boundary

    def same_file(self, st: os.stat_result) -> bool:
        return (st.st_dev, st.st_ino) == (self.device, self.inode)

    def position(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "inode": self.inode,
            "offset": self.line_offset,
            "head_length": len(self.head),
            "head_sha256": hashlib.sha256(self.head).hexdigest(),
        }

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _matches(fd: int, saved: dict[str, Any]) -> bool:
    """Whether an open file still starts with the bytes it started with when `saved`."""
    length = saved.get("head_length")
    digest = saved.get("head_sha256")
    if not isinstance(length, int) or not isinstance(digest, str):
        return False
    head = os.pread(fd, length, 0)
    return len(head) == length and hashlib.sha256(head).hexdigest() == digest


class FileAuditSource(_Counting):
    """Tails the file of Vault's `file` audit device (see the module's docstring).

    `poll()` reads what is there now (at most `budget` bytes) and says whether more is
    waiting; `run()` polls every `poll_interval` seconds until cancelled and then `close()`s,
    which saves the position. Blocking file reads are short (a local file, in chunks).
    """

    kind = "file"

    def __init__(
        self,
        path: Path,
        parser: AuditParser,
        on_entry: EntryHandler,
        *,
        clock: Clock,
        position_file: Path | None = None,
        start_at: Literal["end", "start"] = "end",
        poll_interval: float = 0.5,
        rotate_grace: float = 5.0,
        save_interval: float = 1.0,
        chunk_size: int = 1 << 16,
        max_line: int = MAX_LINE,
        on_up: UpHandler | None = None,
    ) -> None:
        super().__init__(parser, on_entry, on_up)
        self.path = Path(path)
        self.position_file = position_file
        self.start_at = start_at
        self.poll_interval = poll_interval
        self.rotate_grace = rotate_grace
        self.save_interval = save_interval
        self.chunk_size = chunk_size
        self.max_line = max_line
        self._clock = clock
        self._current: _Tail | None = None
        self._retiring: list[_Tail] = []
        self._restored = False
        self._waited = False
        self._missing_since: float | None = None
        self._saved: list[dict[str, Any]] | None = None
        self._last_save = -1e18

    # -- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                try:
                    more = self.poll()
                except Exception as exc:  # a bug must not end the tail: reported, retried
                    _log.error(
                        "usage.poll_failed", path=str(self.path), error_type=type(exc).__name__
                    )
                    self._down(f"{self.path}: internal error ({type(exc).__name__})")
                    more = False
                self.save(force=False)
                if more:
                    await asyncio.sleep(0)
                else:
                    await self._clock.sleep(self.poll_interval)
        finally:
            self.close()

    def poll(self, budget: int = 1 << 20) -> bool:
        """Reads what the files hold now, up to `budget` bytes; True if more is waiting."""
        now = self._clock.monotonic()
        self._follow(now)
        left = budget
        for tail in list(self._retiring):
            read = self._drain(tail, left)
            left -= read
            if read == 0 and tail.retire_at is not None and now >= tail.retire_at:
                self._retire(tail)
        current = self._current
        if current is not None and left > 0:
            self._check_rewritten(current)
            left -= self._drain(current, left)
        return left <= 0

    def close(self) -> None:
        """Saves the position and closes every file."""
        self.save(force=True)
        for tail in (*self._retiring, *([self._current] if self._current else [])):
            tail.close()
        self._retiring = []
        self._current = None
        self._restored = False

    # -- reading -------------------------------------------------------------------------------

    def _drain(self, tail: _Tail, budget: int) -> int:
        total = 0
        while total < budget:
            try:
                data = os.pread(tail.fd, min(self.chunk_size, budget - total), tail.offset)
            except OSError as exc:
                self._down(f"{self.path}: {_why(exc)}")
                break
            if not data:
                break
            tail.offset += len(data)
            total += len(data)
            self._lines(tail.splitter.feed(data), tail.splitter)
            if len(tail.head) < HEAD and tail.base == 0:
                tail.head = os.pread(tail.fd, HEAD, 0)
        return total

    def _check_rewritten(self, tail: _Tail) -> None:
        """Copy-truncate: the file shrank below what was read, or starts with other bytes."""
        try:
            size = os.fstat(tail.fd).st_size
            rewritten = size < tail.offset
            if not rewritten and tail.head:
                rewritten = os.pread(tail.fd, len(tail.head), 0) != tail.head
        except OSError:
            return
        if rewritten:
            if tail.splitter.pending:
                self.skipped[TRUNCATED] += 1
                self.lines += 1
            _log.info("usage.audit_file_truncated", path=str(self.path))
            tail.reset(0)

    def _retire(self, tail: _Tail) -> None:
        if tail.splitter.pending:
            self.skipped[TRUNCATED] += 1
            self.lines += 1
        tail.close()
        self._retiring.remove(tail)

    # -- following the path --------------------------------------------------------------------

    def _follow(self, now: float) -> None:
        """Opens the file at the path, or a new one that replaced it. A file that appears
        after keyturn found none is new: it is read from its start."""
        current = self._current
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._waited = current is None
            self._missing(now, f"{self.path}: no such file")
            return
        except OSError as exc:
            self._waited = current is None
            self._down(f"{self.path}: {_why(exc)}")
            return
        if current is not None and current.same_file(st):
            self._missing_since = None
            self._ok()
            return
        opened = self._open(self.path)
        if opened is None:
            self._waited = current is None
            return
        fd, st = opened
        self._missing_since = None
        if current is not None:
            current.retire_at = now + self.rotate_grace
            self._retiring.append(current)
            _log.info("usage.audit_file_rotated", path=str(self.path))
            self._current = _Tail(fd, st, 0, self.max_line)
        else:
            self._current = self._resume(fd, st, now, waited=self._waited)
        self._ok()

    def _missing(self, now: float, problem: str) -> None:
        if self._missing_since is None:
            self._missing_since = now
        # A rename rotation leaves the path empty for a moment: down only if it stays so.
        if self._current is None or now - self._missing_since >= self.rotate_grace:
            self._down(problem)

    def _open(self, path: Path) -> tuple[int, os.stat_result] | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            self._down(f"{path}: {_why(exc)}")
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            self._down(f"{path}: not a regular file")
            return None
        return fd, st

    def _resume(self, fd: int, st: os.stat_result, now: float, *, waited: bool) -> _Tail:
        """The first file opened: where the saved position says, else by `start_at`; files
        it names that were renamed since are drained from their saved offsets."""
        saved = self._load() if not self._restored else None
        self._restored = True
        if saved is None:
            # A file that appeared while keyturn watched the path is new: read all of it.
            offset = st.st_size if self.start_at == "end" and not waited else 0
            tail = _Tail(fd, st, offset, self.max_line)
            if offset:
                tail.head = os.pread(fd, HEAD, 0)
            return tail
        tail = _Tail(fd, st, 0, self.max_line)
        for entry in saved:
            if (entry.get("device"), entry.get("inode")) == (st.st_dev, st.st_ino):
                at = entry.get("offset")
                if isinstance(at, int) and 0 <= at <= st.st_size and _matches(fd, entry):
                    tail.reset(at)
                    tail.head = os.pread(fd, HEAD, 0)
            else:
                self._reopen_renamed(entry, now)
        return tail

    def _reopen_renamed(self, entry: dict[str, Any], now: float) -> None:
        """A file read before the restart that was rotated away since: read its rest."""
        device, inode, offset = entry.get("device"), entry.get("inode"), entry.get("offset")
        if not isinstance(offset, int):
            return
        try:
            candidates = list(os.scandir(self.path.parent))
        except OSError:
            return
        for candidate in candidates:
            if not candidate.name.startswith(self.path.name) or candidate.inode() != inode:
                continue
            opened = self._open(Path(candidate.path))
            if opened is None:
                return
            fd, st = opened
            if st.st_dev == device and offset <= st.st_size and _matches(fd, entry):
                tail = _Tail(fd, st, offset, self.max_line)
                tail.head = os.pread(fd, HEAD, 0)
                tail.retire_at = now + self.rotate_grace
                self._retiring.append(tail)
                _log.info("usage.audit_file_resumed", path=candidate.path)
            else:
                os.close(fd)
            return

    # -- the position file ---------------------------------------------------------------------

    def positions(self) -> list[dict[str, Any]]:
        """Where each open file's reading stands (what the position file holds)."""
        tails = [*self._retiring, *([self._current] if self._current else [])]
        return [tail.position() for tail in tails]

    def save(self, *, force: bool) -> None:
        """Writes the position file (atomically, mode 0600) if it changed, at most once per
        `save_interval` unless `force`."""
        if self.position_file is None or not self._restored:
            return
        now = self._clock.monotonic()
        if not force and now - self._last_save < self.save_interval:
            return
        files = self.positions()
        if files == self._saved:
            return
        body = json.dumps({"version": 1, "path": str(self.path), "files": files})
        temporary = self.position_file.with_name(self.position_file.name + ".tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(body)
            os.replace(temporary, self.position_file)
        except OSError as exc:
            _log.warning(
                "usage.position_not_saved",
                path=str(self.position_file),
                error=_why(exc),
            )
            return
        self._saved = files
        self._last_save = now

    def _load(self) -> list[dict[str, Any]] | None:
        if self.position_file is None:
            return None
        try:
            body = json.loads(self.position_file.read_text())
            files = body["files"]
            if body.get("path") != str(self.path) or not isinstance(files, list):
                raise ValueError("another path")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _log.warning(
                "usage.position_ignored", path=str(self.position_file), error=type(exc).__name__
            )
            return None
        return [entry for entry in files if isinstance(entry, dict)]


class SocketAuditSource(_Counting):
    """A server Vault's `socket` audit device connects to (`socket_type=tcp`, or `unix`).

    `address`: `host:port` (`[::1]:port` for IPv6; port 0 picks one, see `port`) or
    `unix:/path` (made mode `unix_mode`, 0660: Vault's user needs keyturn's group). Only
    peers in `allowed_peers` (networks; loopback by default, None: any) may send lines;
    others are closed at once and counted in `refused`. At most `max_peers` at a time. A
    peer that disconnects leaves its unfinished line counted as `truncated`.
    """

    kind = "socket"

    def __init__(
        self,
        address: str,
        parser: AuditParser,
        on_entry: EntryHandler,
        *,
        allowed_peers: Sequence[str] | None = LOOPBACK,
        max_peers: int = 16,
        max_line: int = MAX_LINE,
        unix_mode: int = 0o660,
        on_up: UpHandler | None = None,
    ) -> None:
        super().__init__(parser, on_entry, on_up)
        self.address = address
        self.unix_mode = unix_mode
        self.max_peers = max_peers
        self.max_line = max_line
        self.port = 0
        self.peers = 0
        self.refused = 0
        self._networks = (
            None
            if allowed_peers is None
            else [ipaddress.ip_network(n, strict=False) for n in allowed_peers]
        )
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        """Listens; a problem binding (address in use, permission) leaves the source down."""
        problem = check_address(self.address)
        if problem is not None:
            self._down(problem)
            return
        try:
            if self.address.startswith("unix:"):
                path = self.address[len("unix:") :]
                self._server = await asyncio.start_unix_server(self._client, path)
                os.chmod(path, self.unix_mode)  # Vault runs as another user
            else:
                host, port = split_address(self.address)
                self._server = await asyncio.start_server(self._client, host, port)
                self.port = self._server.sockets[0].getsockname()[1]
        except OSError as exc:
            self._down(f"{self.address}: {_why(exc)}")
            return
        self._ok()

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.close()
        if server is not None:
            await server.wait_closed()
        self.problem = "stopped"  # not a failure: nobody is told

    def _allowed(self, peer: object) -> bool:
        if not isinstance(peer, tuple) or not peer:
            return True  # a unix socket has no peer address: its file mode guards it
        if self._networks is None:
            return True
        try:
            ip = ipaddress.ip_address(peer[0])
        except ValueError:
            return False
        return any(ip in network for network in self._networks)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if not self._allowed(peer) or self.peers >= self.max_peers:
            self.refused += 1
            _log.warning("usage.peer_refused", peer=str(peer[0] if peer else peer))
            writer.close()
            return
        self.peers += 1
        self._writers.add(writer)
        splitter = LineSplitter(self.max_line)
        try:
            while chunk := await reader.read(1 << 16):
                self._lines(splitter.feed(chunk), splitter)
        except (ConnectionError, OSError):
            pass
        finally:
            if splitter.pending:
                self.skipped[TRUNCATED] += 1
                self.lines += 1
            self.peers -= 1
            self._writers.discard(writer)
            writer.close()


def _why(exc: OSError) -> str:
    """An OS error in a few words ("Permission denied")."""
    return os.strerror(exc.errno) if exc.errno else type(exc).__name__


def split_address(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` → (host, port); ValueError if it is neither."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


def check_address(address: str) -> str | None:
    """What is wrong with a socket source's address, or None."""
    if address.startswith("unix:"):
        path = Path(address[len("unix:") :])
        if not path.is_absolute():
            return f"{address}: expected unix:/absolute/path"
        return None
    try:
        split_address(address)
    except ValueError as exc:
        return f"{address}: {exc}"
    return None


def check_file(path: Path) -> str | None:
    """Why keyturn cannot read an audit file now (for `keyturn check`), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return f"{path}: no such file (is Vault's file audit device writing there?)"
    except PermissionError:
        return f"{path}: permission denied (keyturn's user needs read access, see docs/usage.md)"
    except OSError as exc:
        return f"{path}: {_why(exc)}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"{path}: not a regular file"
        os.pread(fd, 1, 0)
    except OSError as exc:
        return f"{path}: {_why(exc)}"
    finally:
        os.close(fd)
    return None
