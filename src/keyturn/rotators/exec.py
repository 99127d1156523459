"""The `exec` rotator: an operator's command creates, revokes and lists keys.

One run per action (no shell), one JSON object in on stdin and one out on stdout; nothing in
argv, and the environment without `KEYTURN_…`, `VAULT_…`, `BAO_…`. A failure names the exit
code and stderr's last line with every value from stdout cut out; past `timeout` the process
group is killed. The protocol: docs/rotation.md#exec-a-command-of-yours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Mapping
from typing import Any

from keyturn.config.schema import ExecRotatorConfig
from keyturn.errors import RotationError
from keyturn.rotators.base import NewKey, RotationRequest, json_kind
from keyturn.secret import Secret

STRIPPED_PREFIXES = ("KEYTURN_", "VAULT_", "BAO_")
MAX_OUTPUT = 65536
MAX_STDERR_LINE = 200
_REDACTED = "[redacted]"
_MIN_REDACTED = 4  # shorter stdout words are not cut from stderr (keys are never this short)


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without keyturn's and Vault's variables."""
    return {k: v for k, v in environ.items() if not k.upper().startswith(STRIPPED_PREFIXES)}


class ExecRotator:
    """Runs the configured command for each action; holds no resources between runs."""

    def __init__(
        self, config: ExecRotatorConfig, *, environ: Mapping[str, str] | None = None
    ) -> None:
        self.name = config.name
        self.config = config
        self._env = child_environment(os.environ if environ is None else environ)

    def __repr__(self) -> str:
        return f"ExecRotator({self.name!r})"

    async def aclose(self) -> None:
        return None

    # -- the Rotator interface ------------------------------------------------------------

    async def create(self, request: RotationRequest) -> NewKey:
        answer = self._object("create", await self._run("create", request, None), request)
        key = answer.get("key")
        if not isinstance(key, str) or not key:
            shown = "missing" if "key" not in answer else json_kind(key)
            raise self._error(
                f'create: stdout "key" is {shown}; expected the new key as a non-empty string',
                request,
            )
        key_id = answer.get("key_id")
        if isinstance(key_id, int) and not isinstance(key_id, bool):
            key_id = str(key_id)
        if key_id is not None and (not isinstance(key_id, str) or not key_id):
            raise self._error(
                f'create: stdout "key_id" is {json_kind(key_id)}; expected a non-empty string '
                "or no key_id",
                request,
            )
        return NewKey(Secret(key), key_id)

    async def register(self, request: RotationRequest) -> str:
        """A signing key's public JWK (`public_jwk` on stdin) registered by the command; its
        answer names the provider's id for it: {"key_id": "…"}."""
        answer = self._object("register", await self._run("register", request, None), request)
        key_id = answer.get("key_id")
        if isinstance(key_id, int) and not isinstance(key_id, bool):
            key_id = str(key_id)
        if not isinstance(key_id, str) or not key_id:
            shown = "missing" if "key_id" not in answer else json_kind(key_id)
            raise self._error(
                f'register: stdout "key_id" is {shown}; expected the provider\'s id for the '
                "registered key as a non-empty string",
                request,
            )
        return key_id

    async def revoke(self, request: RotationRequest, key_id: str) -> None:
        await self._run("revoke", request, key_id)

    async def find(self, request: RotationRequest) -> list[str] | None:
        answer = self._object("find", await self._run("find", request, None), request)
        if "key_ids" not in answer and answer.get("supported") is False:
            return None
        ids = answer.get("key_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise self._error(
                'find: stdout needs "key_ids" (an array of non-empty strings) or '
                '"supported": false',
                request,
            )
        return list(ids)

    # -- running the command --------------------------------------------------------------

    async def _run(self, action: str, request: RotationRequest, key_id: str | None) -> str:
        params: dict[str, Any] = {
            "action": action,
            "credential": request.credential,
            "kind": request.kind,
            "rotation_id": request.rotation_id,
            "key_name": request.key_name,
            "client_id": request.client_id,
        }
        if key_id is not None:
            params["key_id"] = key_id
        if request.public_key is not None:
            params["public_jwk"] = dict(request.public_key)
        stdin = (json.dumps(params) + "\n").encode()
        program = self.config.command[0]
        try:
            process = await asyncio.create_subprocess_exec(
                *self.config.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
                start_new_session=True,  # its own process group, killed as a whole
            )
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise self._error(f"{action}: cannot run {program}: {reason}", request) from exc
        try:
            async with asyncio.timeout(self.config.timeout):
                out, err = await communicate(process, stdin)
        except TimeoutError:
            raise self._error(
                f"{action}: timed out after {self.config.timeout:g}s", request
            ) from None
        finally:
            if process.returncode is None:  # timed out or cancelled: leave nothing behind
                kill_group(process)
                await process.wait()
        stdout_text = out.data.decode("utf-8", errors="replace")
        if process.returncode != 0:
            raise self._error(
                f"{action}: {exit_reason(process.returncode)}"
                + _stderr_tail(err.data, stdout_text),
                request,
            )
        if out.overflow:
            raise self._error(f"{action}: printed more than {MAX_OUTPUT} bytes on stdout", request)
        try:
            return out.data.decode("utf-8")
        except UnicodeDecodeError:
            raise self._error(f"{action}: stdout is not UTF-8 text", request) from None

    def _object(self, action: str, stdout: str, request: RotationRequest) -> dict[str, Any]:
        try:
            answer = json.loads(stdout)
        except ValueError:
            # `from None`: the decode error quotes stdout, which may hold the key.
            raise self._error(f"{action}: stdout is not one JSON object", request) from None
        if not isinstance(answer, dict):
            raise self._error(
                f"{action}: stdout is {json_kind(answer)}; expected one JSON object", request
            )
        return answer

    def _error(self, message: str, request: RotationRequest) -> RotationError:
        return RotationError(f"rotator {self.name}: {message}", credential=request.credential)


class _Output:
    """What was read from a pipe: the first (or last) MAX_OUTPUT bytes, and if there was more."""

    def __init__(self, data: bytes, overflow: bool) -> None:
        self.data = data
        self.overflow = overflow


async def _read(stream: asyncio.StreamReader | None, *, keep_tail: bool) -> _Output:
    data = b""
    overflow = False
    if stream is None:
        return _Output(data, overflow)
    while chunk := await stream.read(65536):
        data += chunk
        if len(data) > MAX_OUTPUT:  # keep draining, so the command never blocks on a full pipe
            overflow = True
            data = data[-MAX_OUTPUT:] if keep_tail else data[:MAX_OUTPUT]
    return _Output(data, overflow)


async def communicate(process: asyncio.subprocess.Process, stdin: bytes) -> tuple[_Output, _Output]:
    async def feed() -> None:
        if process.stdin is None:
            return
        # A command that exits without reading its stdin is not an error here.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            process.stdin.write(stdin)
            await process.stdin.drain()
        process.stdin.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await process.stdin.wait_closed()

    _, out, err = await asyncio.gather(
        feed(), _read(process.stdout, keep_tail=False), _read(process.stderr, keep_tail=True)
    )
    await process.wait()
    return out, err


def kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()


def exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _stderr_tail(stderr: bytes, stdout: str) -> str:
    """`: <the last non-empty line of stderr>`, without anything printed on stdout."""
    lines = [line.strip() for line in stderr.decode("utf-8", errors="replace").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    line = lines[-1]
    for value in sorted(_printed_values(stdout), key=len, reverse=True):
        line = line.replace(value, _REDACTED)
    if len(line) > MAX_STDERR_LINE:
        line = line[: MAX_STDERR_LINE - 3] + "..."
    return f": {line}"


def _printed_values(stdout: str) -> set[str]:
    """Every value the command printed: the strings of its JSON, and its lines and words."""
    strings: set[str] = set()
    with contextlib.suppress(ValueError):
        _leaves(json.loads(stdout), strings)
    words: set[str] = set()
    for line in stdout.splitlines():
        words.add(line.strip())
        words.update(line.split())
    return {s for s in strings if s} | {w for w in words if len(w) >= _MIN_REDACTED}


def _leaves(document: object, into: set[str]) -> None:
    if isinstance(document, str):
        into.add(document)
    elif isinstance(document, dict):
        for value in document.values():
            _leaves(value, into)
    elif isinstance(document, list):
        for value in document:
            _leaves(value, into)
