"""The `keyturn` command line: one sub-command per module, dispatched here.

Each command module exposes `add_arguments(parser)` and `run(args) -> int` (the exit code);
this file only wires them, so a command's code lives beside what it drives.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from keyturn import __version__

# name -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("keyturn.commands.run", "the daemon: keep every credential fresh in Vault"),
    "check": ("keyturn.commands.check", "validate the config, references, Vault access, providers"),
    "status": ("keyturn.commands.status", "one row per credential, read from Vault"),
    "refresh": ("keyturn.commands.refresh", "refresh one credential now (safe beside the daemon)"),
    "rotate": (
        "keyturn.commands.rotate",
        "rotate a key or client secret now (safe beside the daemon)",
    ),
    "import-key": ("keyturn.commands.import_key", "hand over a key made by hand (read from stdin)"),
    "sandbox": ("keyturn.sandbox.command", "run the reference service on loopback"),
    "demo": ("keyturn.demo", "run everything embedded: dev OpenBao, sandbox, the daemon"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyturn",
        description="Keeps the OAuth tokens and API keys of a third-party API fresh in Vault.",
    )
    parser.add_argument("--version", action="version", version=f"keyturn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(command_parser)
        command_parser.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._module.run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0
