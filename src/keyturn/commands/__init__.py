"""CLI commands that work on a configuration file: run, check, status, refresh."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from keyturn.config import Config, load_config
from keyturn.errors import ConfigError
from keyturn.logs import configure_logging

DEFAULT_CONFIG = Path(os.environ.get("KEYTURN_CONFIG", "/etc/keyturn/keyturn.toml"))


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="the TOML configuration (default: $KEYTURN_CONFIG or /etc/keyturn/keyturn.toml)",
    )


def load_or_report(path: Path, *, one_shot: bool = True) -> Config | None:
    """The configuration, or None after printing one line per problem to stderr.

    One-shot commands (check, status, refresh) log warnings and errors only: their answer is
    their output, not a stream of info lines.
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
