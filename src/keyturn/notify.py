"""systemd's notification protocol (sd_notify), spoken without libsystemd.

Without `$NOTIFY_SOCKET` every call is a no-op, and sending never raises (a failure is logged
once), so the same code runs under systemd, in containers and in tests. `SystemdNotifier`
removes `NOTIFY_SOCKET`, `WATCHDOG_*` from `environ` so exec rotators cannot speak for keyturn:
build it before anything copies the environment for children. See docs/install-systemd.md.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

from keyturn.clock import Clock, SystemClock
from keyturn.logs import get_logger

VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")

log = get_logger("keyturn.notify")


class SystemdNotifier:
    """Sends sd_notify messages to the socket systemd gave this process, if any."""

    def __init__(
        self,
        environ: MutableMapping[str, str] | None = None,
        *,
        unset_environment: bool = True,
        clock: Clock | None = None,
        pid: int | None = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        values = {name: environ.get(name) for name in VARIABLES}
        if unset_environment:
            for name in VARIABLES:
                environ.pop(name, None)
        self._clock = clock or SystemClock()
        self._failing = False
        self._socket_name = values["NOTIFY_SOCKET"] or None
        self._address = _address(self._socket_name)
        self._watchdog = _watchdog_interval(
            values["WATCHDOG_USEC"], values["WATCHDOG_PID"], os.getpid() if pid is None else pid
        )
        if self._socket_name and self._address is None:
            log.warning(
                "systemd.notify_unsupported",
                socket=self._socket_name,
                reason="NOTIFY_SOCKET is neither an absolute path nor an abstract '@' name",
            )
        if self._address is None:
            self._watchdog = None  # nobody to ping

    def __repr__(self) -> str:
        return f"SystemdNotifier(socket={self._socket_name!r}, watchdog={self._watchdog!r})"

    @property
    def enabled(self) -> bool:
        """True when there is a socket to send to."""
        return self._address is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when systemd
        expects none: no socket, no WATCHDOG_USEC, or WATCHDOG_PID names another process."""
        return self._watchdog

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *_status(status))

    def reloading(self, status: str | None = None) -> bool:
        # systemd >= 253 wants the monotonic time with RELOADING=1 (Type=notify-reload);
        # older versions ignore it.
        now = int(self._clock.monotonic() * 1_000_000)
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={now}", *_status(status))

    def stopping(self, status: str | None = None) -> bool:
        return self.notify("STOPPING=1", *_status(status))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.notify(*_status(text))

    def notify(self, *assignments: str) -> bool:
        """Send one datagram of `assignments`; True if it was sent. Never raises."""
        if self._address is None or not assignments:
            return False
        message = "\n".join(assignments).encode("utf-8", errors="replace")
        try:
            # A fresh unconnected socket each time: systemd re-creates its socket when it
            # re-executes itself. Non-blocking: a stuck PID 1 must not stall the event loop.
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.sendto(message, self._address)
        except OSError as error:
            if not self._failing:
                self._failing = True
                log.warning(
                    "systemd.notify_failed",
                    socket=self._socket_name,
                    error=error.strerror or type(error).__name__,
                )
            return False
        self._failing = False
        return True


def _address(name: str | None) -> str | None:
    if not name:
        return None
    if name.startswith("@"):
        return "\0" + name[1:]  # Linux abstract namespace
    if name.startswith("/"):
        return name
    return None


def _watchdog_interval(usec: str | None, watchdog_pid: str | None, pid: int) -> float | None:
    if not usec:
        return None
    try:
        microseconds = int(usec)
    except ValueError:
        return None
    if microseconds <= 0:
        return None
    if watchdog_pid:
        try:
            if int(watchdog_pid) != pid:
                return None  # the watchdog is meant for another process
        except ValueError:
            return None
    return microseconds / 2 / 1_000_000


def _status(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    # One assignment per line: a newline in the text would start a new one.
    return ("STATUS=" + " ".join(text.splitlines()),)
