"""The process hardens itself at start, whatever started it (systemd, a container, a shell).

Three measures, applied by `harden_process` once, before a command reads any secret:

- **No core dumps**: `RLIMIT_CORE` set to 0, soft and hard, so a crash never writes this
  process's memory (access tokens, refresh tokens, keys, keyturn's own Vault token) to disk,
  and nothing later in the process can raise the limit again.
- **Not dumpable** (Linux): `prctl(PR_SET_DUMPABLE, 0)`. Another process of the same user can
  then neither `ptrace` this one nor open its `/proc/<pid>/mem` or `/proc/<pid>/environ`
  (its `/proc/<pid>` files become root's). Root with `CAP_SYS_PTRACE` still can: nothing a
  process does keeps out its host's root. On other platforms there is no such call: a warning,
  never a crash.
- **Umask 077**: whatever keyturn creates without an explicit mode is its own alone. Files
  that need another mode set it explicitly and are unaffected: a sink's file is created 0600
  and `fchmod`-ed to its configured `mode` before a byte is written (`keyturn.sinks`), the
  audit socket is `chmod`-ed to its `unix_mode` after `bind` (`keyturn.usage.sources`).

Each measure logs one line: `process.hardened` (info) with what it did, or
`process.not_hardened` (a warning) with why it could not. A measure that cannot be applied
never stops keyturn: the others still hold, and the warning tells the operator.

Which commands: every command that logs in to Vault, since each then holds keyturn's Vault
token (which reads every input and every private state record) and some of the secrets it
reads: `run` (the daemon), `refresh`, `rotate`, `import-key` and `import-refresh-token` (a key
or refresh token on stdin, read after hardening), `check` (every reference resolved; with
`--live` a real token) and `status` (private state records, which hold refresh tokens). Not
`usage` (it asks the daemon's `/usage` over HTTP and holds no secret), nor the devkit's
`sandbox` and `demo`. Each calls it right after its configuration loaded, so its lines go out
at the configured level and format (a one-shot command shows only the warnings); the
configuration file holds references, never values, so nothing secret is read before.

Children: the commands of exec rotators and `on_publish` hooks inherit the umask (files they
create without a mode are 0600: a hook that writes a file for another user must set that
file's mode, or its own umask) and the core limit of 0. The dumpable flag is reset to 1 by
`execve`, so such a child's memory (an exec rotator's new key, on its stdout) is readable by
other processes of keyturn's user for the child's short life.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

from keyturn.logs import get_logger

try:
    import resource
except ImportError:  # not a POSIX platform
    resource = None  # type: ignore[assignment]

UMASK = 0o077
PR_GET_DUMPABLE = 3  # <linux/prctl.h>
PR_SET_DUMPABLE = 4

log = get_logger("keyturn.hardening")


@dataclass(frozen=True, slots=True)
class Measure:
    """One measure's result: `applied`, with what it did (`detail`), or not, with why."""

    name: str
    applied: bool
    detail: str


def _limit(value: int) -> str:
    return "unlimited" if resource is not None and value == resource.RLIM_INFINITY else str(value)


def no_core_dumps() -> Measure:
    """RLIMIT_CORE to 0, soft and hard."""
    name = "core_dumps"
    if resource is None:
        return Measure(name, False, f"no resource limits on {sys.platform}: core dumps stay on")
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        return Measure(name, False, f"setrlimit(RLIMIT_CORE, 0) failed: {reason}")
    return Measure(name, True, f"RLIMIT_CORE 0 (was soft {_limit(soft)}, hard {_limit(hard)})")


def not_dumpable(platform: str = sys.platform) -> Measure:
    """prctl(PR_SET_DUMPABLE, 0) through libc, then read back with PR_GET_DUMPABLE."""
    name = "dumpable"
    if not platform.startswith("linux"):
        return Measure(
            name,
            False,
            f"prctl(PR_SET_DUMPABLE) is Linux only (this is {platform}): other processes of "
            "the same user may read this one's memory",
        )
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError) as error:
        return Measure(name, False, f"prctl not found in the C library: {error}")
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return Measure(
            name, False, f"prctl(PR_SET_DUMPABLE, 0) failed: {os.strerror(ctypes.get_errno())}"
        )
    if prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        return Measure(name, False, "prctl(PR_SET_DUMPABLE, 0) did not hold")
    return Measure(name, True, "not dumpable: no ptrace or /proc/<pid>/mem by the same user")


def private_umask() -> Measure:
    """umask 077 (it cannot fail)."""
    previous = os.umask(UMASK)
    return Measure("umask", True, f"umask {UMASK:04o} (was {previous:04o})")


def harden_process() -> list[Measure]:
    """Apply every measure once, each logged; returns what each did. Never raises for a
    measure the platform does not allow."""
    measures = [no_core_dumps(), not_dumpable(), private_umask()]
    for measure in measures:
        if measure.applied:
            log.info("process.hardened", measure=measure.name, detail=measure.detail)
        else:
            log.warning("process.not_hardened", measure=measure.name, reason=measure.detail)
    return measures
