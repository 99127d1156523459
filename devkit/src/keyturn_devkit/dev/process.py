"""The life of a server process started for the demo, benchmarks and tests."""

from __future__ import annotations

import signal
import subprocess
from types import TracebackType
from typing import Any, Self


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
