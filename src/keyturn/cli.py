"""The `keyturn` command line: one sub-command per module, dispatched here.

Each command module exposes `add_arguments(parser)` and `run(args) -> int` (the exit code);
this file only wires them, so a command's code lives beside what it drives. Options every
command takes (`--log-format`) are added here, before or after the command's name, and the log
format is decided here, once, before the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from keyturn import __version__
from keyturn.commands import add_log_format_argument
from keyturn.logs import configure_logging

# name -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("keyturn.commands.run", "the daemon: keep every credential fresh in Vault"),
    "check": ("keyturn.commands.check", "validate the config, references, Vault access, providers"),
    "status": ("keyturn.commands.status", "one row per credential, read from Vault"),
    "usage": (
        "keyturn.commands.usage",
        "who reads each credential (from the running daemon, with [usage])",
    ),
    "refresh": ("keyturn.commands.refresh", "refresh one credential now (safe beside the daemon)"),
    "rotate": (
        "keyturn.commands.rotate",
        "rotate a key or client secret now (safe beside the daemon)",
    ),
    "import-key": ("keyturn.commands.import_key", "hand over a key made by hand (read from stdin)"),
    "import-signing-key": (
        "keyturn.commands.import_signing_key",
        "hand over a signing key's key pair and registration access token (read from stdin)",
    ),
    "import-refresh-token": (
        "keyturn.commands.import_refresh_token",
        "hand over a refresh token issued elsewhere (read from stdin) and refresh with it",
    ),
    "sandbox": ("keyturn_devkit.sandbox.command", "run the reference service on loopback"),
    "demo": ("keyturn_devkit.demo", "run everything embedded: dev OpenBao, sandbox, the daemon"),
}

# The package of the sandbox and the demo: keyturn-devkit (devkit/ in keyturn's repository), a
# distribution of its own, so that a production install carries nothing that serves or fakes
# secrets.
DEVKIT = "keyturn_devkit"


class DevkitMissing(Exception):
    """A command whose module is in keyturn-devkit ran where that package is not installed."""

    def __init__(self, command: str) -> None:
        super().__init__(
            f"keyturn {command} needs the keyturn-devkit package: pip install -e ./devkit "
            "(from a clone of keyturn), or make demo"
        )


def _command_module(module_name: str) -> ModuleType | None:
    """A command's module; None for a keyturn-devkit command when that package is absent."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != DEVKIT:
            raise
        return None


def command_named(argv: Sequence[str]) -> str | None:
    """The command `argv` asks for (the first word that names one), None if there is none."""
    return next((word for word in argv if word in COMMANDS), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (to add its options), so `keyturn run`
    never loads the sandbox or the demo's dev servers. None: every command's module (a
    keyturn-devkit command's, when that package is installed). DevkitMissing: `command` is a
    keyturn-devkit command and that package is not installed."""
    parser = argparse.ArgumentParser(
        prog="keyturn",
        description="Keeps the OAuth tokens and API keys of a third-party API fresh in Vault.",
    )
    parser.add_argument("--version", action="version", version=f"keyturn {__version__}")
    add_log_format_argument(parser)
    # The same options after the command's name; SUPPRESS: absent there, the value given before
    # it (or the default) stays.
    common = argparse.ArgumentParser(add_help=False)
    add_log_format_argument(common, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(
            name, help=help_text, description=help_text, parents=[common]
        )
        if command is None or name == command:
            module = _command_module(module_name)
            if module is None:
                if name == command:
                    raise DevkitMissing(name)
                continue
            module.add_arguments(command_parser)
            command_parser.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(command_named(words) or "")
    except DevkitMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    args = parser.parse_args(words)
    # Warnings only until the command sets its level (from the configuration, or its own
    # option); the format chosen here holds for every later configure_logging in the process.
    configure_logging("warning", fmt=args.log_format)
    try:
        return int(args._module.run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0
