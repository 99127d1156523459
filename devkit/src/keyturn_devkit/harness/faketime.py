"""Step one process's wall clock with libfaketime (Debian `libfaketime`, installed by
scripts/system-deps.sh), leaving its monotonic clock and every other process alone.

    clock = FakeWallClock(tmp_path / "faketime")      # offset "+0" to begin with
    DaemonProcess(config, workdir, env=clock.env())   # LD_PRELOAD=libfaketime.so.1 ...
    clock.step(-300)                                  # the process's time.time() jumps back
    clock.step(0)                                     # and forward again

The offset lives in a file (`FAKETIME_TIMESTAMP_FILE`) that libfaketime re-reads once a second
(`FAKETIME_CACHE_DURATION=1`), so a step reaches the process within a second of `step()`;
`FAKETIME_DONT_FAKE_MONOTONIC=1` keeps CLOCK_MONOTONIC real, as an NTP step or a VM resume
would. `check()` proves all of that with a tiny Python subprocess first.

Why not `FAKETIME_NO_CACHE=1` (every clock read opens the file, a step seen at once): every
clock read, monotonic ones included, then costs a file read, and a process that makes HTTP
calls from several threads crawls. Measured on loopback with libfaketime 0.9.10: a `requests`
call from an executor thread 0.3 s on average and up to 0.8 s, an httpx call up to 2 s, where
the one-second cache costs a few milliseconds. A daemon that slow misses 3-second refresh
margins by seconds, which measures libfaketime, not keyturn.

Known limit of libfaketime 0.9.10 with `FAKETIME_DONT_FAKE_MONOTONIC`: `time.sleep()` fails
with EINVAL (it uses an absolute CLOCK_MONOTONIC `clock_nanosleep`, which libfaketime shifts).
asyncio, threading and selectors waits are unaffected; keyturn's daemon does not call
`time.sleep`. Every clock read still goes through libfaketime, so a process under test runs a
little slower than usual.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

LIBRARY_NAMES = ("libfaketime.so.1",)
SEARCH_DIRS = (
    "/usr/lib/x86_64-linux-gnu/faketime",
    "/usr/lib/aarch64-linux-gnu/faketime",
    "/usr/lib/faketime",
    "/usr/local/lib/faketime",
    "/usr/lib64/faketime",
)

_PROBE = """
import json, os, time
path = os.environ["FAKETIME_TIMESTAMP_FILE"]
wall0, mono0 = time.time(), time.monotonic()
with open(path + ".tmp", "w") as f:
    f.write("-300s\\n")
os.replace(path + ".tmp", path)
deadline = mono0 + 3.0  # libfaketime re-reads the file within a second (time.sleep fails here)
while time.time() > wall0 - 100 and time.monotonic() < deadline:
    pass
wall1, mono1 = time.time(), time.monotonic()
with open(path + ".tmp", "w") as f:
    f.write("+0\\n")
os.replace(path + ".tmp", path)
print(json.dumps({"wall0": wall0, "wall1": wall1, "mono0": mono0, "mono1": mono1}))
"""


def libfaketime_path() -> Path | None:
    """The libfaketime shared object, None when it is not installed."""
    for directory in SEARCH_DIRS:
        for name in LIBRARY_NAMES:
            candidate = Path(directory) / name
            if candidate.is_file():
                return candidate
    return None


class FakeWallClock:
    """An offset file for libfaketime and the environment that applies it to a subprocess."""

    def __init__(self, path: Path, library: Path | None = None) -> None:
        found = library or libfaketime_path()
        if found is None:
            raise RuntimeError(
                "libfaketime is not installed: apt-get install libfaketime (scripts/system-deps.sh)"
            )
        self.library = found
        self.path = path
        self.offset = 0.0
        self.step(0)

    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": str(self.library),
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def step(self, offset: float) -> None:
        """Set the process's wall clock to real time plus `offset` seconds, within a second
        (libfaketime's re-read); atomically: a reader never sees a half-written file."""
        text = "+0" if offset == 0 else f"{offset:+.3f}s"
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(text + "\n")
        os.replace(partial, self.path)
        self.offset = offset

    def check(self) -> tuple[float, float]:
        """Run a tiny Python under libfaketime that steps its own clock back 300 s; returns
        (wall-clock step, monotonic step) as it saw them. Restores the offset afterwards."""
        saved = self.offset
        started = time.monotonic()
        try:
            result = subprocess.run(
                [sys.executable, "-c", _PROBE],
                env={**os.environ, **self.env()},
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
        finally:
            self.step(saved)
        real = time.monotonic() - started
        seen = json.loads(result.stdout)
        waited = seen["mono1"] - seen["mono0"]  # the probe's wait for libfaketime's re-read
        # A real monotonic clock moved forward by no more than the time the probe ran.
        mono_step = min(0.0, waited) + max(0.0, waited - real)
        return seen["wall1"] - seen["wall0"] - waited, mono_step
