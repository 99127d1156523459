"""The audit sources: tailing a file across rotation and restarts, and the socket server.

Files are real files in a temporary directory and sockets real loopback sockets; time is a
FakeClock that `poll()` reads (the file source) and nothing waits on.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from keyturn.clock import FakeClock, SystemClock
from keyturn.events import Suspicious
from keyturn.testing.observer import RecordingObserver
from keyturn.usage.audit import AuditEntry, AuditParser, AuditRead
from keyturn.usage.detectors import source_down_alerts
from keyturn.usage.layout import Layout, Watched
from keyturn.usage.sources import (
    FileAuditSource,
    LineSplitter,
    SocketAuditSource,
    check_address,
    check_file,
    split_address,
)
from keyturn_devkit.dev.audit import Reader, line, read_entries

T0 = 1_800_000_000.0
LAYOUT = Layout([Watched("app1", "acme", "apps/app1/acme")])


def pair(n: int) -> bytes:
    """The request and response lines of read number `n` (its version is `n`)."""
    request, response = read_entries(
        Reader(role=f"app{n % 3}"), "apps/app1/acme", at=T0 + n, version=n
    )
    return line(request) + line(response)


def versions(entries: list[AuditEntry]) -> list[int | None]:
    return [e.version for e in entries if isinstance(e, AuditRead)]


class Tail:
    """A FileAuditSource on `path` whose entries land in `entries`."""

    def __init__(self, path: Path, position: Path | None = None, **options: object) -> None:
        self.clock = FakeClock(T0)
        self.entries: list[AuditEntry] = []
        self.changes: list[tuple[bool, str]] = []
        self.source = FileAuditSource(
            path,
            AuditParser(LAYOUT),
            self.entries.append,
            clock=self.clock,
            position_file=position,
            on_up=lambda up, why: self.changes.append((up, why)),
            **options,  # type: ignore[arg-type]
        )

    def poll(self) -> list[int | None]:
        """Polls until nothing more is waiting; the versions read since the last call."""
        before = len(self.entries)
        while self.source.poll(budget=4096):
            pass
        return versions(self.entries[before:])


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


# -- LineSplitter ----------------------------------------------------------------------------


def test_lines_split_across_chunks_are_joined() -> None:
    splitter = LineSplitter(max_line=100)
    assert splitter.feed(b"ab") == []
    assert splitter.feed(b"c\nde") == [b"abc"]
    assert splitter.pending == 2
    assert splitter.feed(b"f\n\ng\n") == [b"def", b"", b"g"]
    assert splitter.boundary == 11


def test_a_line_too_long_is_dropped_without_being_held() -> None:
    splitter = LineSplitter(max_line=10)
    assert splitter.feed(b"ok\n" + b"x" * 8) == [b"ok"]
    assert splitter.feed(b"x" * 8) == []  # past the cap: dropped
    assert splitter.pending == 0
    assert splitter.feed(b"x" * 1000) == []
    assert splitter.feed(b"xx\nnext\n" + b"y" * 20 + b"\nlast\n") == [b"next", b"last"]
    assert splitter.too_long == 2


# -- FileAuditSource: tailing ----------------------------------------------------------------


def test_a_file_is_tailed_line_by_line_and_an_unfinished_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(pair(1) + pair(2))
    tail = Tail(path, start_at="start")
    assert tail.poll() == [1, 2]
    assert tail.source.up
    text = pair(3)
    append(path, text[:-700])
    assert tail.poll() == []
    append(path, text[-700:])
    assert tail.poll() == [3]
    assert tail.source.skipped == {"request": 3}
    assert tail.source.lines == 6


def test_without_a_position_an_existing_file_is_read_from_its_end(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(pair(1))
    tail = Tail(path)
    assert tail.poll() == []
    append(path, pair(2))
    assert tail.poll() == [2]


def test_a_missing_file_is_down_and_read_from_its_start_once_it_appears(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    tail = Tail(path)
    assert tail.poll() == []
    assert not tail.source.up
    assert tail.source.problem == f"{path}: no such file"
    path.write_bytes(pair(1) + pair(2))
    assert tail.poll() == [1, 2]
    assert tail.source.up
    assert tail.changes == [(False, f"{path}: no such file"), (True, "")]


def test_a_path_that_is_not_a_file_is_down_never_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.mkdir()
    tail = Tail(path)
    tail.poll()
    assert tail.source.problem == f"{path}: not a regular file"
    assert check_file(path) == f"{path}: not a regular file"
    path.rmdir()
    path.write_bytes(pair(1))
    assert tail.poll() == [1]
    assert check_file(path) is None


UNREADABLE = """
import sys
from pathlib import Path
from keyturn.clock import FakeClock
from keyturn.usage.audit import AuditParser
from keyturn.usage.layout import Layout
from keyturn.usage.sources import FileAuditSource, check_file
path = Path(sys.argv[1])
source = FileAuditSource(path, AuditParser(Layout([])), print, clock=FakeClock())
source.poll()
print(source.problem)
print(check_file(path))
"""


def test_an_unreadable_file_is_down_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(pair(1))
    path.chmod(0)
    prefix: list[str] = []
    if os.geteuid() == 0:  # root reads any file, unless it gives up the capabilities to
        setpriv = shutil.which("setpriv")
        assert setpriv is not None, "setpriv (util-linux) is needed to run this test as root"
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    result = subprocess.run(
        [*prefix, sys.executable, "-c", UNREADABLE, str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    problem, checked = result.stdout.splitlines()[-2:]
    assert problem == f"{path}: Permission denied"
    assert checked.startswith(f"{path}: permission denied (keyturn's user needs read access")


def test_a_fifo_at_the_path_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    os.mkfifo(path)
    tail = Tail(path)
    tail.poll()
    assert tail.source.problem == f"{path}: not a regular file"
    assert check_file(path) == f"{path}: not a regular file"


def test_check_file_names_a_missing_file(tmp_path: Path) -> None:
    assert "no such file" in (check_file(tmp_path / "nope.log") or "")


def test_bad_lines_are_counted_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    cut = pair(1).split(b"\n")[1][:500]
    path.write_bytes(
        b"garbage\n" + cut + b"\n" + b"{" + b"x" * 5000 + b"\n" + b"\n" + pair(2) + b"\x00\xff\n"
    )
    tail = Tail(path, start_at="start", max_line=4096)
    assert tail.poll() == [2]
    assert tail.source.skipped == {"not_json": 2, "truncated": 1, "too_long": 1, "request": 1}


def test_a_failing_consumer_of_entries_is_counted_and_does_not_stop_the_tail(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(pair(1) + pair(2))
    seen: list[AuditEntry] = []

    def handle(entry: AuditEntry) -> None:
        seen.append(entry)
        if len(seen) == 1:
            raise RuntimeError("bug")

    source = FileAuditSource(
        path, AuditParser(LAYOUT), handle, clock=FakeClock(T0), start_at="start"
    )
    source.poll()
    assert len(seen) == 2
    assert source.skipped["internal_error"] == 1


# -- FileAuditSource: rotation ---------------------------------------------------------------


def test_rename_rotation_reads_the_old_file_to_its_end_then_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(pair(1))
    tail = Tail(path, start_at="start", rotate_grace=5.0)
    assert tail.poll() == [1]
    vault = path.open("ab")  # Vault's file handle, still open across the rename
    path.rename(tmp_path / "audit.log.1")
    vault.write(pair(2))
    vault.flush()
    assert tail.poll() == [2]  # the path is missing for a moment: still up
    assert tail.source.up
    path.write_bytes(pair(4))  # the new file (logrotate `create`), and Vault reopens later
    vault.write(pair(3))
    vault.flush()
    assert sorted(v for v in tail.poll() if v) == [3, 4]
    vault.write(pair(5))  # still within the grace period
    vault.close()
    assert tail.poll() == [5]
    tail.clock.advance(5.0)
    tail.poll()
    assert tail.source.positions() == [
        {**tail.source.positions()[0], "inode": path.stat().st_ino}
    ]  # the old file is closed
    append(path, pair(6))
    assert tail.poll() == [6]


def test_a_path_missing_for_longer_than_the_grace_is_down(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(pair(1))
    tail = Tail(path, start_at="start", rotate_grace=5.0)
    tail.poll()
    path.unlink()
    tail.poll()
    assert tail.source.up
    tail.clock.advance(5.0)
    tail.poll()
    assert not tail.source.up
    assert tail.changes == [(True, ""), (False, f"{path}: no such file")]


def test_copy_truncate_is_read_again_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(pair(1) + pair(2))
    tail = Tail(path, start_at="start")
    assert tail.poll() == [1, 2]
    shutil.copyfile(path, tmp_path / "audit.log.1")
    with path.open("r+b") as handle:
        handle.truncate(0)
    assert tail.poll() == []
    append(path, pair(3))
    assert tail.poll() == [3]


def test_copy_truncate_regrown_past_the_offset_is_noticed_by_its_first_bytes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(pair(1))
    tail = Tail(path, start_at="start")
    assert tail.poll() == [1]
    with path.open("r+b") as handle:
        handle.truncate(0)
    append(path, pair(2) + pair(3) + pair(4))  # longer than what was read, before the poll
    assert tail.poll() == [2, 3, 4]


# -- FileAuditSource: restarts ---------------------------------------------------------------


def test_a_restart_resumes_where_it_stopped_and_reads_what_came_meanwhile(
    tmp_path: Path,
) -> None:
    path, position = tmp_path / "audit.log", tmp_path / "position.json"
    path.write_bytes(pair(1) + pair(2))
    first = Tail(path, position, start_at="start")
    assert first.poll() == [1, 2]
    append(path, pair(3)[:300])  # half a line when it stops
    first.poll()
    first.source.close()
    saved = json.loads(position.read_text())
    assert saved["files"][0]["offset"] == len(pair(1) + pair(2))
    assert "app" not in position.read_text()  # offsets and hashes, no content
    assert oct(position.stat().st_mode & 0o777) == "0o600"
    append(path, pair(3)[300:] + pair(4))
    second = Tail(path, position)
    assert second.poll() == [3, 4]


def test_a_restart_after_a_rename_rotation_finishes_the_old_file(tmp_path: Path) -> None:
    path, position = tmp_path / "audit.log", tmp_path / "position.json"
    path.write_bytes(pair(1))
    first = Tail(path, position, start_at="start")
    assert first.poll() == [1]
    first.source.close()
    append(path, pair(2))  # written while keyturn was down, then rotated away
    path.rename(tmp_path / "audit.log.1")
    path.write_bytes(pair(3))
    second = Tail(path, position)
    assert sorted(v for v in second.poll() if v) == [2, 3]
    second.source.close()
    third = Tail(path, position)
    append(path, pair(4))
    assert third.poll() == [4]


def test_a_restart_after_copy_truncate_reads_the_new_content_from_the_start(
    tmp_path: Path,
) -> None:
    path, position = tmp_path / "audit.log", tmp_path / "position.json"
    path.write_bytes(pair(1) + pair(2))
    first = Tail(path, position, start_at="start")
    assert first.poll() == [1, 2]
    first.source.close()
    with path.open("r+b") as handle:
        handle.truncate(0)
    append(path, pair(3) + pair(4) + pair(5))  # longer than the saved offset
    second = Tail(path, position)
    assert second.poll() == [3, 4, 5]


def test_a_damaged_position_file_is_ignored(tmp_path: Path) -> None:
    path, position = tmp_path / "audit.log", tmp_path / "position.json"
    path.write_bytes(pair(1))
    position.write_text("{not json")
    tail = Tail(path, position)
    assert tail.poll() == []  # as if there were none: from the end
    append(path, pair(2))
    assert tail.poll() == [2]


async def test_run_polls_until_cancelled_and_saves_its_position(tmp_path: Path) -> None:
    path, position = tmp_path / "audit.log", tmp_path / "position.json"
    path.write_bytes(b"")
    entries: list[AuditEntry] = []
    source = FileAuditSource(
        path,
        AuditParser(LAYOUT),
        entries.append,
        clock=SystemClock(),
        position_file=position,
        poll_interval=0.01,
    )
    task = asyncio.create_task(source.run())
    await asyncio.sleep(0.05)
    append(path, pair(1))
    for _ in range(200):
        if entries:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert versions(entries) == [1]
    assert json.loads(position.read_text())["files"][0]["offset"] == len(pair(1))


# -- SocketAuditSource -----------------------------------------------------------------------


class Listener:
    def __init__(self, address: str = "127.0.0.1:0", **options: object) -> None:
        self.entries: list[AuditEntry] = []
        self.source = SocketAuditSource(
            address,
            AuditParser(LAYOUT),
            self.entries.append,
            **options,  # type: ignore[arg-type]
        )

    async def send(self, *chunks: bytes) -> None:
        if self.source.address.startswith("unix:"):
            _, writer = await asyncio.open_unix_connection(self.source.address[5:])
        else:
            _, writer = await asyncio.open_connection("127.0.0.1", self.source.port)
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
        writer.close()
        await writer.wait_closed()
        await self.settle()

    async def settle(self) -> None:
        for _ in range(100):
            await asyncio.sleep(0.005)
            if self.source.peers == 0:
                return


async def test_a_peer_sends_lines_in_any_chunks() -> None:
    listener = Listener()
    await listener.source.start()
    assert listener.source.up
    data = pair(1) + pair(2)
    await listener.send(data[:100], data[100:2000], data[2000:])
    assert versions(listener.entries) == [1, 2]
    await listener.source.stop()
    assert not listener.source.up


async def test_garbage_from_a_peer_is_counted_and_the_next_peer_is_fine() -> None:
    listener = Listener(max_line=4096)
    await listener.source.start()
    await listener.send(b"\x00\x01garbage\n", b"{" + b"z" * 10_000 + b"\n", pair(1)[:400])
    assert listener.source.skipped == {"not_json": 1, "too_long": 1, "truncated": 1}
    await listener.send(pair(2))
    assert versions(listener.entries) == [2]
    await listener.source.stop()


async def test_a_peer_outside_the_allowed_networks_is_refused() -> None:
    listener = Listener(allowed_peers=("10.0.0.0/8",))
    await listener.source.start()
    await listener.send(pair(1))
    assert listener.entries == []
    assert listener.source.refused == 1
    await listener.source.stop()


async def test_a_unix_socket(tmp_path: Path) -> None:
    listener = Listener(f"unix:{tmp_path / 'audit.sock'}")
    await listener.source.start()
    assert (tmp_path / "audit.sock").stat().st_mode & 0o777 == 0o660
    await listener.send(pair(1))
    assert versions(listener.entries) == [1]
    await listener.source.stop()


async def test_an_address_in_use_leaves_the_source_down() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        changes: list[tuple[bool, str]] = []
        source = SocketAuditSource(
            f"127.0.0.1:{port}",
            AuditParser(LAYOUT),
            lambda entry: None,
            on_up=lambda up, why: changes.append((up, why)),
        )
        await source.start()
    assert not source.up
    assert source.problem == f"127.0.0.1:{port}: Address already in use"
    assert changes == [(False, source.problem)]


def test_socket_addresses() -> None:
    assert split_address("127.0.0.1:9090") == ("127.0.0.1", 9090)
    assert split_address("[::1]:9090") == ("::1", 9090)
    assert check_address("unix:/run/keyturn/audit.sock") is None
    assert check_address("unix:relative.sock") is not None
    assert check_address("localhost") is not None
    assert check_address("host:99999") is not None


def test_a_source_that_goes_down_raises_one_alert_per_outage(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    observer = RecordingObserver()
    source = FileAuditSource(
        path,
        AuditParser(LAYOUT),
        lambda entry: None,
        clock=FakeClock(T0),
        on_up=source_down_alerts(observer, "file"),
    )
    source.poll()
    source.poll()
    path.write_bytes(b"")
    source.poll()
    path.unlink()
    source.poll()  # within the grace of a rotation: still up
    assert [(e.detector, e.credential, e.severity) for e in observer.of(Suspicious)] == [
        ("usage_source_down", None, "warning")
    ]
    assert observer.of(Suspicious)[0].detail == (
        f"the file audit source cannot be read ({path}: no such file): reads of published "
        "credentials are not counted or checked"
    )
