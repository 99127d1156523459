"""CLI commands that work on a configuration file: run, check, status, refresh.

Also what every command shares: `-c/--config`, `--log-format`, and loading the
configuration (which sets the log level).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from keyturn.config import Config, load_config
from keyturn.errors import ConfigError
from keyturn.logs import LOG_FORMATS, configure_logging

DEFAULT_CONFIG = Path(os.environ.get("KEYTURN_CONFIG", "/etc/keyturn/keyturn.toml"))


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="the TOML configuration (default: $KEYTURN_CONFIG or /etc/keyturn/keyturn.toml)",
    )


def add_log_format_argument(parser: argparse.ArgumentParser, *, default: object = None) -> None:
    """`--log-format console|json`. The top-level parser takes it with `default=None` (auto:
    console when stderr is a terminal, JSON otherwise); each sub-command's parser takes it too,
    with `default=argparse.SUPPRESS` so that leaving it out there keeps the top-level value."""
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=default,
        help="how log events on stderr look (default: console when stderr is a terminal, "
        "json otherwise)",
    )


def load_or_report(path: Path, *, one_shot: bool = True) -> Config | None:
    """The configuration, or None after printing one line per problem to stderr.

    One-shot commands (check, status, refresh) log warnings and errors only: their answer is
    their output (stdout), not a stream of info lines. The log format stays the one the CLI
    chose (`--log-format`, see `keyturn.cli.main`).
    """
    try:
        config = load_config(path)
    except ConfigError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return None
    level = config.keyturn.log_level
    configure_logging("warning" if one_shot and level in ("debug", "info") else level)
    return config
