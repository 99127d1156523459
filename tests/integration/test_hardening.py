"""keyturn's process hardening (`keyturn.hardening`), checked from outside each process.

Every process here starts as a shell would start it: umask 022 and core dumps allowed (the
core limit raised as far as it goes). What the kernel says about it is read from
/proc/<pid>/limits and /proc/<pid>/status; what another process of the same user can read of
it is asked of a reader process. Where the suite runs as root, every process here, the reader
too, first gives up all its capabilities (the bounding set emptied, then exec): root without
CAP_SYS_PTRACE is held back by the dumpable flag as any other user is, while root with it
reads everything (which is why docs/security.md does not defend against root). Each check is
made on an unhardened sibling too, so a hardening that did nothing fails the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from keyturn_devkit.dev.openbao import OpenBaoDevServer

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl and /proc are Linux's")

# Starts argv[1:] as a shell with `umask 022; ulimit -c unlimited` would, without any
# capability (a no-op for a user that has none).
AS_A_USER = """
import ctypes, os, resource, sys

os.umask(0o022)
try:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
except (OSError, ValueError):
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
libc = ctypes.CDLL(None, use_errno=True)
PR_CAPBSET_DROP = 24
for cap in range(64):  # fails without CAP_SETPCAP: then there was nothing to drop
    libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), ctypes.c_ulong(0), ctypes.c_ulong(0),
               ctypes.c_ulong(0))

class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

class Data(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]

if libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()) != 0:
    raise OSError(ctypes.get_errno(), "capset")
os.execv(sys.argv[1], sys.argv[1:])
"""

# A process that hardens itself (argv[1] == "hardened") or not, then starts a child through
# exec, as an on_publish hook or an exec rotator is started; prints both pids and sleeps.
TARGET = """
import os, subprocess, sys, time
from keyturn.logs import configure_logging
from keyturn.hardening import harden_process

configure_logging("info", fmt="json")
if sys.argv[1] == "hardened":
    harden_process()
child = subprocess.Popen([sys.argv[2], "60"])
print(os.getpid(), child.pid, flush=True)
time.sleep(60)
"""

# Tries each path given: "read" (opened, and one byte read unless it is /proc/<pid>/mem, whose
# first page is never mapped), "denied" (PermissionError) or the errno's name.
READER = """
import errno, json, sys

seen = {}
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as handle:
            if not path.endswith("/mem"):
                handle.read(1)
        seen[path] = "read"
    except PermissionError:
        seen[path] = "denied"
    except OSError as error:
        seen[path] = errno.errorcode.get(error.errno, str(error.errno))
print(json.dumps(seen))
"""


def as_a_user(argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-c", AS_A_USER, *argv]


def start(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(as_a_user(argv), start_new_session=True, **popen)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to its process group (it and its children), then reaped."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def readable(*pids: int) -> dict[int, tuple[str, str]]:
    """What a process of the same user can read of each pid: (environ, mem)."""
    paths = [f"/proc/{pid}/{name}" for pid in pids for name in ("environ", "mem")]
    result = subprocess.run(
        as_a_user([sys.executable, "-c", READER, *paths]),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    seen = json.loads(result.stdout)
    return {pid: (seen[f"/proc/{pid}/environ"], seen[f"/proc/{pid}/mem"]) for pid in pids}


def core_limit(pid: int) -> tuple[str, str]:
    """(soft, hard) of "Max core file size" in /proc/<pid>/limits."""
    text = Path(f"/proc/{pid}/limits").read_text()
    match = re.search(r"^Max core file size\s+(\S+)\s+(\S+)", text, re.MULTILINE)
    assert match is not None, text
    return match.group(1), match.group(2)


def umask(pid: int) -> str:
    match = re.search(r"^Umask:\s+(\d+)$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert match is not None
    return match.group(1)


def hardened_lines(log: str) -> dict[str, dict[str, str]]:
    """measure -> its `process.hardened` / `process.not_hardened` line, from a JSON log."""
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return {
        line["measure"]: line
        for line in lines
        if line["event"] in ("process.hardened", "process.not_hardened")
    }


@pytest.fixture
def targets() -> Iterator[dict[str, tuple[subprocess.Popen[bytes], int, int]]]:
    """Two targets, "hardened" and "plain": (process, its pid, its exec'd child's pid)."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    started = {}
    try:
        for mode in ("hardened", "plain"):
            process = start(
                [sys.executable, "-c", TARGET, mode, sleep],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert process.stdout is not None
            pid, child = map(int, process.stdout.readline().split())
            started[mode] = (process, pid, child)
        yield started
    finally:
        for process, _, _ in started.values():
            stop(process)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()


def test_a_hardened_process_dumps_no_core_hides_its_memory_and_creates_private_files(
    targets: dict[str, tuple[subprocess.Popen[bytes], int, int]],
) -> None:
    (hardened, pid, child), (_, plain, plain_child) = targets["hardened"], targets["plain"]
    if core_limit(plain) == ("0", "0"):
        pytest.skip("core dumps are off for every process here: the test could not fail")
    # The sibling started as every process here is: core dumps on, umask 022, readable.
    assert umask(plain) == "0022"
    assert readable(plain)[plain][0] == "read"
    # The hardened one: no core at any limit, a private umask, and its memory and
    # environment closed to the same user.
    assert core_limit(pid) == ("0", "0")
    assert umask(pid) == "0077"
    assert readable(pid)[pid] == ("denied", "denied")
    assert os.stat(f"/proc/{pid}/environ").st_uid == 0  # the kernel's mark of "not dumpable"
    # Its exec'd child (an on_publish hook, an exec rotator) inherits the umask and the core
    # limit; exec makes it dumpable again, as docs/security.md says.
    assert core_limit(child) == ("0", "0")
    assert umask(child) == "0077"
    assert readable(child)[child][0] == "read"
    assert core_limit(plain_child) != ("0", "0")
    # One line per measure, each saying what it did.
    stop(hardened)
    assert hardened.stderr is not None
    lines = hardened_lines(hardened.stderr.read().decode())
    assert {name: line["event"] for name, line in lines.items()} == {
        "core_dumps": "process.hardened",
        "dumpable": "process.hardened",
        "umask": "process.hardened",
    }
    assert lines["umask"]["detail"] == "umask 0077 (was 0022)"
    assert lines["core_dumps"]["detail"].startswith("RLIMIT_CORE 0 (was soft ")


WRITER = """
import os, sys
from pathlib import Path
from keyturn.hardening import harden_process
from keyturn.sinks import write_atomically

harden_process()
folder = Path(sys.argv[1])
write_atomically(folder / "shared.json", b"{}", 0o640)
write_atomically(folder / "wide.json", b"{}", 0o644)
(folder / "plain.txt").write_text("no mode given")
(folder / "folder").mkdir()
"""


def test_a_sink_keeps_its_configured_mode_under_the_private_umask(tmp_path: Path) -> None:
    """A sink's file is fchmod-ed to its `mode`: the 077 umask narrows only what keyturn creates
    without one."""
    subprocess.run(as_a_user([sys.executable, "-c", WRITER, str(tmp_path)]), check=True)
    modes = {path.name: path.stat().st_mode & 0o777 for path in tmp_path.iterdir()}
    assert modes == {"shared.json": 0o640, "wide.json": 0o644, "plain.txt": 0o600, "folder": 0o700}


WITHOUT_PRCTL_OR_RLIMITS = """
import functools
import keyturn.hardening as hardening
from keyturn.logs import configure_logging

configure_logging("info", fmt="json")
hardening.resource = None  # as on a platform without the resource module
hardening.not_dumpable = functools.partial(hardening.not_dumpable, "darwin")
measures = hardening.harden_process()
print([measure.applied for measure in measures])
"""


def test_a_measure_the_platform_lacks_is_a_warning_never_a_crash() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_PRCTL_OR_RLIMITS],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert result.stdout == "[False, False, True]\n"
    lines = hardened_lines(result.stderr)
    assert lines["core_dumps"]["event"] == lines["dumpable"]["event"] == "process.not_hardened"
    assert lines["core_dumps"]["level"] == lines["dumpable"]["level"] == "warning"
    assert lines["dumpable"]["reason"].startswith(
        "prctl(PR_SET_DUMPABLE) is Linux only (this is darwin)"
    )
    assert lines["umask"]["event"] == "process.hardened"


def wait_for(predicate: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{predicate} not true within {timeout}s")


@pytest.mark.openbao
def test_keyturn_run_hardens_itself_before_it_starts(
    openbao: OpenBaoDevServer, tmp_path: Path
) -> None:
    token = tmp_path / "vault-token"
    token.write_text(openbao.root_token)
    config = tmp_path / "keyturn.toml"
    config.write_text(
        f'[keyturn]\ninstance_id = "hardening"\n'
        f'state_prefix = "t{uuid.uuid4().hex[:8]}/keyturn/state"\n'
        f'[vault]\naddress = "{openbao.address}"\n'
        f'auth = {{ method = "token_file", path = "{token}" }}\n'
        '[metrics]\nlisten = "127.0.0.1:0"\n'
    )
    log = tmp_path / "keyturn.log"
    with log.open("wb") as out:
        daemon = start(
            [sys.executable, "-m", "keyturn", "--log-format", "json", "run", "-c", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "daemon.started" in log.read_text() or daemon.poll() is not None)
        assert daemon.poll() is None, log.read_text()
        assert core_limit(daemon.pid) == ("0", "0")
        assert umask(daemon.pid) == "0077"
        assert readable(daemon.pid)[daemon.pid] == ("denied", "denied")
        text = log.read_text()
        lines = hardened_lines(text)
        assert {line["event"] for line in lines.values()} == {"process.hardened"}
        assert set(lines) == {"core_dumps", "dumpable", "umask"}
        # The first thing it did: before it logged in to Vault or started anything.
        events = [json.loads(line)["event"] for line in text.splitlines() if line[:1] == "{"]
        assert events[:3] == ["process.hardened"] * 3
        assert "daemon.started" in events
    finally:
        stop(daemon)


def test_import_key_is_hardened_before_it_reads_the_key(tmp_path: Path) -> None:
    """A one-shot command that handles a secret: hardened before it reads the key on stdin
    (nothing here answers: it never gets further than waiting for the key)."""
    config = tmp_path / "keyturn.toml"
    config.write_text(
        '[vault]\naddress = "http://127.0.0.1:9"\n'
        f'auth = {{ method = "token_file", path = "{tmp_path / "token"}" }}\n'
        '[[providers]]\nname = "acme"\nbase_url = "http://127.0.0.1:9"\n'
        "allow_insecure_http = true\n"
        '[[rotators]]\nname = "by-hand"\ntype = "manual"\n'
        '[[credentials]]\nname = "legacy"\nprovider = "acme"\nkind = "api_key"\n'
        'publish_to = "apps/legacy/acme"\nprobe = "/v1/users"\n'
        'rotation = { max_age = "90d", rotator = "by-hand" }\n'
    )
    command = start(
        [sys.executable, "-m", "keyturn", "import-key", "-c", str(config), "legacy"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: command.poll() is not None or umask(command.pid) == "0077")
        assert command.poll() is None
        assert core_limit(command.pid) == ("0", "0")
        assert readable(command.pid)[command.pid] == ("denied", "denied")
        _, err = command.communicate(b"", timeout=30)  # no key: it ends, asking for one
        assert b"expected the key as one line on standard input" in err
    finally:
        stop(command)
