"""A sink's `on_publish` command: run after its file was written, without a shell, told what was
written on stdin (never the value), killed with its process group past its timeout, its last
output lines logged with every secret cut out."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from keyturn.config.credentials import HookConfig, SinkConfig
from keyturn.rotators.exec import (
    MAX_OUTPUT,
    MAX_STDERR_LINE,
    child_environment,
    communicate,
    exit_reason,
    kill_group,
)
from keyturn.sinks.render import PublishedRecord, SinkError

_REDACTED = "[redacted]"


@dataclass(frozen=True, slots=True)
class HookRun:
    """A finished command: how long it took and the last line of each stream (secrets cut)."""

    seconds: float
    stdout: str
    stderr: str


async def run_hook(
    hook: HookConfig,
    params: Mapping[str, object],
    *,
    environ: Mapping[str, str],
    secrets: Iterable[str],
    credential: str,
    sink: Path,
) -> HookRun:
    """Run `hook` with `params` as one JSON line on stdin. Raises SinkError on a non-zero exit,
    a time-out (the process group is killed) or a command that cannot be started."""
    cut = list(secrets)
    program = hook.command[0]
    started = time.monotonic()
    try:
        process = await asyncio.create_subprocess_exec(
            *hook.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_environment(environ),
            start_new_session=True,  # its own process group, killed as a whole
        )
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SinkError(
            f"on_publish: cannot run {program}: {reason}", credential=credential, sink=sink
        ) from None
    try:
        async with asyncio.timeout(hook.timeout):
            out, err = await communicate(process, (json.dumps(params) + "\n").encode())
    except TimeoutError:
        raise SinkError(
            f"on_publish: {program} timed out after {hook.timeout:g}s (its process group was "
            "killed)",
            credential=credential,
            sink=sink,
        ) from None
    finally:
        if process.returncode is None:  # timed out or cancelled: leave nothing behind
            kill_group(process)
            await process.wait()
    stdout, stderr = _last_line(out.data, cut), _last_line(err.data, cut)
    if process.returncode != 0:
        tail = f": {stderr}" if stderr else ""
        raise SinkError(
            f"on_publish: {program} {exit_reason(process.returncode)}{tail}",
            credential=credential,
            sink=sink,
        )
    return HookRun(time.monotonic() - started, stdout, stderr)


def _last_line(output: bytes, secrets: list[str]) -> str:
    """The last non-empty line of a command's output, every secret cut out, at most 200
    characters."""
    lines = [line.strip() for line in output[-MAX_OUTPUT:].decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    line = lines[-1]
    for secret in secrets:
        line = line.replace(secret, _REDACTED)
    if len(line) > MAX_STDERR_LINE:
        line = line[: MAX_STDERR_LINE - 3] + "..."
    return line


def hook_params(record: PublishedRecord, sink: SinkConfig, provider: str) -> dict[str, object]:
    """What `on_publish` is told on stdin: never the value."""
    return {
        "credential": record.credential,
        "kind": record.kind,
        "provider": provider,
        "version": record.version,
        "path": str(sink.path),
        "format": sink.format,
        "expires_at": record.expires_at,
        "refresh_at": record.refresh_at,
    }
