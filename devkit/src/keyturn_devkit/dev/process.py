"""The life of a server process started for the demo, benchmarks and tests."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from keyturn_devkit.dev.loopback import HTTP


def terminate(
    process: subprocess.Popen[Any] | None, *, timeout: float = 10.0, signum: int = signal.SIGTERM
) -> int | None:
    """Send `signum`, wait up to `timeout`, SIGKILL if it will not go; the exit code (None when
    there was no process)."""
    if process is None:
        return None
    if process.poll() is None:
        process.send_signal(signum)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def spawn_logged(
    args: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start `args` (a fixed argv: a binary we ship or the system's) with its stdout and
    stderr appended to `log_path`, where a failed start is explained."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(args),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
            cwd=cwd,
        )


def wait_answering(
    process: subprocess.Popen[Any] | None,
    url: str,
    *,
    deadline: float,
    headers: Mapping[str, str] | None = None,
) -> bool:
    """Poll `GET url` until it answers 200 (True), or until the process exits or `deadline`
    (on the monotonic clock) passes (False): a server's start is over when it serves."""
    while time.monotonic() < deadline:
        if process is None or process.poll() is not None:
            return False
        try:
            if HTTP.get(url, headers=dict(headers or {}), timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    return False


class ManagedServer:
    """`with server:` starts it and always stops it; subclasses define `start` and `stop`."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> object:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
