"""Loading a credential's `sinks`: files on keyturn's own host that keyturn keeps equal to what
it publishes, each with an optional `on_publish` command (see `keyturn.sinks`).

    [[credentials.sinks]]
    path = "/run/keyturn/reporting/token.env"   # absolute; its directory must exist
    format = "env"                               # "raw" | "json" | "env"
    mode = "0640"                                # octal text; nothing for others
    env_prefix = "REPORTING_"                    # env only
    on_publish = { command = ["/usr/bin/systemctl", "try-restart", "reporting"], timeout = "10s" }

Sinks are entries without a name, so they are named by position in messages
(`credentials["reporting"].sinks[0].mode`) and cannot be overridden by `KEYTURN_…` variables.
A path may be used by one sink only, across all credentials. Whether the directory exists is
not checked here: the file may be written on another machine than the one that checks the
configuration; keyturn reports a missing directory when it writes.
"""

from __future__ import annotations

import re
from pathlib import Path

from keyturn.config.fields import MAX_TIMEOUT, Field, Invalid, choice, describe, duration, text
from keyturn.config.reader import Table
from keyturn.config.rotators import command_field
from keyturn.config.schema import HookConfig, SinkConfig, SinkFormat
from keyturn.references import looks_like_reference

SINK_FORMATS: tuple[SinkFormat, ...] = ("raw", "json", "env")
_SINK = SinkConfig(path=Path("/-"), format="json")
_HOOK = HookConfig(command=("-",))

SINKS_EXPECTED = (
    'an array of tables, e.g. [[credentials.sinks]] or sinks = [{ path = "/run/keyturn/app.env", '
    'format = "env" }]'
)
_HOOK_EXPECTED = (
    'a table, e.g. on_publish = { command = ["/usr/bin/systemctl", "try-restart", "app"], '
    'timeout = "10s" }'
)
_PATH_EXPECTED = (
    'an absolute path of a file, e.g. "/run/keyturn/reporting/token.env": no "." or ".." '
    'segment, no "//", not ending in "/", no control characters'
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MODE_TEXT = re.compile(r"(?:0o|0)?[0-7]{3}")
_MODE_EXPECTED = (
    'a file mode as a string of octal digits, e.g. "0600" or "0640": at most 0777, readable by '
    "its owner (keyturn reads the file back), and no permission for others"
)
_ENV_PREFIX = text(
    'a prefix of letters, digits and "_", not starting with a digit (at most 64 characters), '
    'e.g. "REPORTING_"',
    re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}"),
)
_HOOK_COMMAND = command_field('["/usr/bin/systemctl", "try-restart", "reporting"]', from_env=False)
_HOOK_TIMEOUT = duration(positive=True, maximum=MAX_TIMEOUT)


def _sink_path(value: object, _env: bool) -> Path:
    if not isinstance(value, str):
        raise Invalid(f"got {describe(value)}; expected {_PATH_EXPECTED}")
    if not value.strip():
        raise Invalid(f"got an empty string; expected {_PATH_EXPECTED}")
    if looks_like_reference(value):
        raise Invalid(f"got a reference; expected {_PATH_EXPECTED}, not a reference")
    shown = describe(value)
    if _CONTROL.search(value):
        raise Invalid(f"got a path with control characters; expected {_PATH_EXPECTED}")
    if not value.startswith("/"):
        raise Invalid(f"got {shown}, a relative path; expected {_PATH_EXPECTED}")
    if value.endswith("/"):
        raise Invalid(f'got {shown}, which ends in "/" (a directory); expected {_PATH_EXPECTED}')
    if any(segment in ("", ".", "..") for segment in value.split("/")[1:]):
        reason = 'which has a "//", "." or ".." segment'
        raise Invalid(f"got {shown}, {reason}; expected {_PATH_EXPECTED}")
    return Path(value)


SINK_PATH: Field[Path] = Field(_PATH_EXPECTED, _sink_path)


def _mode(value: object, _env: bool) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        raise Invalid(
            f"got the number {describe(value)}; expected {_MODE_EXPECTED} (in quotes: a TOML "
            "number is read in decimal)"
        )
    if not isinstance(value, str) or not _MODE_TEXT.fullmatch(value.strip()):
        raise Invalid(f"got {describe(value)}; expected {_MODE_EXPECTED}")
    mode = int(value.strip().removeprefix("0o"), 8)
    if mode & 0o007:
        raise Invalid(
            f"got {describe(value)}, which gives others access to the secret; expected "
            f"{_MODE_EXPECTED}"
        )
    if not mode & 0o400:
        raise Invalid(
            f"got {describe(value)}, which the owner cannot read; expected {_MODE_EXPECTED}"
        )
    return mode


MODE: Field[int] = Field(_MODE_EXPECTED, _mode)


def load_sinks(t: Table, seen: dict[Path, str]) -> tuple[SinkConfig, ...]:
    """The `sinks` of the credential table `t`. `seen` maps each sink path met so far (in every
    credential) to where it was set, so a file written by two sinks is reported."""
    result: list[SinkConfig] = []
    for entry in t.positional("sinks", SINKS_EXPECTED):
        path, sink = _sink(entry)
        if path is not None:
            first = seen.setdefault(path, entry.path)
            if first != entry.path:
                entry.problem(
                    "path",
                    f'"{path}" is also the path of {first}; expected each sink to write its '
                    "own file",
                )
                continue
        if sink is not None:
            result.append(sink)
    return tuple(result)


def _sink(t: Table) -> tuple[Path | None, SinkConfig | None]:
    """The sink's path as soon as it is valid (for the duplicate check), and the sink if it all
    is."""
    path = t.require("path", SINK_PATH)
    sink_format = t.require("format", choice(SINK_FORMATS))
    mode = t.get("mode", MODE, _SINK.mode)
    env_prefix = t.optional("env_prefix", _ENV_PREFIX)
    if env_prefix is not None and sink_format is not None and sink_format != "env":
        t.problem(
            "env_prefix",
            f'is set for format "{sink_format}", which has no variables; expected env_prefix '
            'only with format = "env"',
        )
    hook_table = t.table("on_publish", _HOOK_EXPECTED)
    hook = _hook(hook_table) if hook_table is not None and "on_publish" in t.data else None
    t.finish()
    if path is None or sink_format is None:
        return path, None
    if hook_table is None or ("on_publish" in t.data and hook is None):
        return path, None
    sink = SinkConfig(
        path=path,
        format=sink_format,
        mode=mode,
        env_prefix=env_prefix if env_prefix is not None else _SINK.env_prefix,
        on_publish=hook,
    )
    return path, sink


def _hook(t: Table) -> HookConfig | None:
    command = t.require("command", _HOOK_COMMAND)
    timeout = t.get("timeout", _HOOK_TIMEOUT, _HOOK.timeout)
    t.finish(" for on_publish")
    return HookConfig(command=command, timeout=timeout) if command is not None else None
