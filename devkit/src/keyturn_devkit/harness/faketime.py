"""Step one process's wall clock with libfaketime (Debian `libfaketime`, installed by
scripts/system-deps.sh), leaving its monotonic clock and every other process alone.

    clock = FakeWallClock(tmp_path / "faketime")      # offset "+0" to begin with
    DaemonProcess(config, workdir, env=clock.env())   # LD_PRELOAD=libfaketime.so.1 ...
    clock.step(-300)                                  # the process's time.time() jumps back
    clock.step(0)                                     # and forward again

The offset lives in a file (`FAKETIME_TIMESTAMP_FILE`) that libfaketime re-reads on every call
(`FAKETIME_NO_CACHE=1`); `FAKETIME_DONT_FAKE_MONOTONIC=1` keeps CLOCK_MONOTONIC real, as an NTP
step or a VM resume would. `check()` proves all of that with a tiny Python subprocess first.

Known limit of libfaketime 0.9.10 with `FAKETIME_DONT_FAKE_MONOTONIC`: `time.sleep()` fails
with EINVAL (it uses an absolute CLOCK_MONOTONIC `clock_nanosleep`, which libfaketime shifts).
asyncio, threading and selectors waits are unaffected; keyturn's daemon does not call
`time.sleep`. Every clock read goes through libfaketime (and, with `FAKETIME_NO_CACHE`, reads
the file): an idle multi-threaded Python process uses several times more CPU under it, so a
process under test runs slower than usual.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def step(self, offset: float) -> None:
        """Set the process's wall clock to real time plus `offset` seconds (atomically: a
        reader never sees a half-written file)."""
        text = "+0" if offset == 0 else f"{offset:+.3f}s"
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(text + "\n")
        os.replace(partial, self.path)
        self.offset = offset

    def check(self) -> tuple[float, float]:
        """Run a tiny Python under libfaketime that steps its own clock back 300 s; returns
        (wall-clock step, monotonic step) as it saw them. Restores the offset afterwards."""
        saved = self.offset
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
        seen = json.loads(result.stdout)
        return seen["wall1"] - seen["wall0"], seen["mono1"] - seen["mono0"]
