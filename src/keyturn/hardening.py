"""The process hardens itself at start, whatever started it (systemd, a container, a shell).

`harden_process` applies no core dumps, not dumpable (Linux) and umask 077 once, right after
the configuration loaded and before a command that logs in to Vault reads any secret. A
measure the platform lacks is a `process.not_hardened` warning, never a crash. Which commands,
and what children inherit: docs/security.md#process-hardening.
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
