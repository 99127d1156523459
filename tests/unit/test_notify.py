"""SystemdNotifier against real AF_UNIX datagram sockets (a path and an abstract name)."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from keyturn.clock import FakeClock
from keyturn.notify import SystemdNotifier


class Receiver:
    """What systemd does: a bound datagram socket that reads one message at a time."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(2.0)

    def messages(self) -> list[str]:
        """Every datagram waiting now, decoded."""
        self.sock.setblocking(False)
        out = []
        try:
            while True:
                out.append(self.sock.recv(4096).decode())
        except BlockingIOError:
            return out
        finally:
            self.sock.settimeout(2.0)

    def one(self) -> str:
        return self.sock.recv(4096).decode()


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    path = tmp_path / "notify.sock"
    assert len(os.fsencode(path)) < 108, "tmp_path too long for an AF_UNIX address"
    return path


@pytest.fixture
def receiver(socket_path: Path) -> Iterator[Receiver]:
    r = Receiver(str(socket_path))
    yield r
    r.sock.close()


def notifier_for(path: Path, **env: str) -> SystemdNotifier:
    return SystemdNotifier({"NOTIFY_SOCKET": str(path), **env}, clock=FakeClock())


def test_without_notify_socket_everything_is_a_no_op() -> None:
    environ = {"WATCHDOG_USEC": "2000000", "PATH": "/usr/bin"}
    notifier = SystemdNotifier(environ)
    assert not notifier.enabled
    assert notifier.watchdog_interval() is None  # nobody to ping
    assert notifier.ready("x") is False
    assert notifier.reloading() is False
    assert notifier.stopping() is False
    assert notifier.watchdog() is False
    assert notifier.status("x") is False
    assert environ == {"PATH": "/usr/bin"}


def test_each_message_reaches_a_path_socket(receiver: Receiver, socket_path: Path) -> None:
    notifier = notifier_for(socket_path)
    assert notifier.enabled
    assert notifier.ready("2 credentials")
    assert receiver.one() == "READY=1\nSTATUS=2 credentials"
    assert notifier.watchdog()
    assert receiver.one() == "WATCHDOG=1"
    assert notifier.stopping()
    assert receiver.one() == "STOPPING=1"
    assert notifier.status("draining")
    assert receiver.one() == "STATUS=draining"
    assert receiver.messages() == []


def test_reloading_carries_the_monotonic_time_in_microseconds(
    receiver: Receiver, socket_path: Path
) -> None:
    clock = FakeClock()
    clock.advance(12.5)
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(socket_path)}, clock=clock)
    assert notifier.reloading("reloading keyturn.toml")
    assert receiver.one() == ("RELOADING=1\nMONOTONIC_USEC=12500000\nSTATUS=reloading keyturn.toml")


def test_the_real_clock_gives_systemd_a_plausible_monotonic_time(
    receiver: Receiver, socket_path: Path
) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(socket_path)})
    notifier.reloading()
    fields = dict(line.split("=", 1) for line in receiver.one().splitlines())
    sent = int(fields["MONOTONIC_USEC"])
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000  # what systemd compares it with
    assert 0 <= now - sent < 5_000_000


def test_an_abstract_socket_is_named_with_a_leading_at() -> None:
    name = f"keyturn-test-{uuid.uuid4().hex}"
    receiver = Receiver("\0" + name)
    try:
        notifier = SystemdNotifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.enabled
        assert notifier.ready()
        assert receiver.one() == "READY=1"
    finally:
        receiver.sock.close()


def test_a_status_is_one_line(receiver: Receiver, socket_path: Path) -> None:
    notifier = notifier_for(socket_path)
    notifier.status("first line\nREADY=1\r\nlast")
    assert receiver.one() == "STATUS=first line READY=1 last"  # no injected assignment


def test_the_variables_leave_the_environment_so_children_do_not_inherit_them(
    socket_path: Path,
) -> None:
    environ = {
        "NOTIFY_SOCKET": str(socket_path),
        "WATCHDOG_USEC": "30000000",
        "WATCHDOG_PID": str(os.getpid()),
        "HOME": "/var/empty",
    }
    notifier = SystemdNotifier(environ)
    assert environ == {"HOME": "/var/empty"}
    assert notifier.enabled
    assert notifier.watchdog_interval() == 15.0


def test_unset_environment_false_leaves_them(socket_path: Path) -> None:
    environ = {"NOTIFY_SOCKET": str(socket_path), "WATCHDOG_USEC": "30000000"}
    SystemdNotifier(environ, unset_environment=False)
    assert environ == {"NOTIFY_SOCKET": str(socket_path), "WATCHDOG_USEC": "30000000"}


@pytest.mark.parametrize(
    ("usec", "watchdog_pid", "expected"),
    [
        ("2000000", None, 1.0),
        ("60000000", None, 30.0),
        ("1", None, 0.0000005),
        ("60000000", "4242", 30.0),  # WATCHDOG_PID is this process
        ("60000000", "4243", None),  # ... another process: not ours to ping
        ("60000000", "not-a-pid", None),
        ("60000000", "", 30.0),  # empty: unset
        (None, None, None),
        ("", None, None),
        ("0", None, None),
        ("-1000000", None, None),
        ("1.5", None, None),
        ("infinity", None, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process(
    socket_path: Path, usec: str | None, watchdog_pid: str | None, expected: float | None
) -> None:
    environ = {"NOTIFY_SOCKET": str(socket_path)}
    if usec is not None:
        environ["WATCHDOG_USEC"] = usec
    if watchdog_pid is not None:
        environ["WATCHDOG_PID"] = watchdog_pid
    notifier = SystemdNotifier(environ, pid=4242)
    assert notifier.watchdog_interval() == expected


def test_watchdog_pid_is_compared_with_the_real_pid_by_default(socket_path: Path) -> None:
    ours = SystemdNotifier(
        {
            "NOTIFY_SOCKET": str(socket_path),
            "WATCHDOG_USEC": "4000000",
            "WATCHDOG_PID": str(os.getpid()),
        }
    )
    other = SystemdNotifier(
        {
            "NOTIFY_SOCKET": str(socket_path),
            "WATCHDOG_USEC": "4000000",
            "WATCHDOG_PID": str(os.getpid() + 1),
        }
    )
    assert ours.watchdog_interval() == 2.0
    assert other.watchdog_interval() is None


@pytest.mark.parametrize("name", ["relative/notify.sock", "vsock:2:1234", "notify"])
def test_an_unsupported_socket_name_disables_notification_with_one_warning(name: str) -> None:
    with capture_logs() as logs:
        notifier = SystemdNotifier({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "2000000"})
        assert notifier.ready() is False
    assert not notifier.enabled
    assert notifier.watchdog_interval() is None
    assert [entry["event"] for entry in logs] == ["systemd.notify_unsupported"]


def test_send_errors_are_logged_once_per_outage_and_never_raised(socket_path: Path) -> None:
    notifier = notifier_for(socket_path)  # nothing listens there yet
    with capture_logs() as logs:
        assert notifier.watchdog() is False
        assert notifier.watchdog() is False
        assert notifier.ready() is False
    assert [entry["event"] for entry in logs] == ["systemd.notify_failed"]
    assert logs[0]["socket"] == str(socket_path)
    assert logs[0]["error"]  # e.g. "No such file or directory"

    receiver = Receiver(str(socket_path))  # systemd is back
    try:
        with capture_logs() as logs:
            assert notifier.watchdog() is True
        assert logs == []
        assert receiver.one() == "WATCHDOG=1"
    finally:
        receiver.sock.close()
        socket_path.unlink()

    with capture_logs() as logs:  # gone again: a new outage is logged again
        assert notifier.watchdog() is False
        assert notifier.watchdog() is False
    assert [entry["event"] for entry in logs] == ["systemd.notify_failed"]


def test_a_full_receive_queue_does_not_block(socket_path: Path) -> None:
    receiver = Receiver(str(socket_path))
    try:
        receiver.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel minimum
        notifier = notifier_for(socket_path)
        results = [notifier.status("x" * 512) for _ in range(2000)]
        assert results[0] is True
        assert results[-1] is False  # EAGAIN, not a hang
    finally:
        receiver.sock.close()


def test_repr_shows_the_socket_and_interval(socket_path: Path) -> None:
    notifier = notifier_for(socket_path, WATCHDOG_USEC="2000000")
    assert repr(notifier) == f"SystemdNotifier(socket={str(socket_path)!r}, watchdog=1.0)"
