"""`keyturn sandbox`: run the reference service on loopback.

    keyturn sandbox [--host 127.0.0.1] [--port N] [--config FILE] [--bootstrap-out FILE]

Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot listen (or write the bootstrap file),
2 for a bad configuration or argument.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import sys
from pathlib import Path

from keyturn.errors import ConfigError
from keyturn.logs import configure_logging, get_logger
from keyturn_devkit.sandbox.config import Settings, load_settings
from keyturn_devkit.sandbox.server import serve

DEFAULT_PORT = 8787


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"0: any free port (default {DEFAULT_PORT})"
    )
    parser.add_argument("--config", type=Path, help="TOML settings file (see docs/sandbox.md)")
    parser.add_argument(
        "--bootstrap-out",
        type=Path,
        help="write the admin token, base URL, an API key and an OAuth client here (mode 0600) "
        "once listening; without it they are printed once on stdout",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config) if args.config else Settings()
    except ConfigError as exc:
        for line in exc.problems:
            print(f"keyturn sandbox: {line}", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"keyturn sandbox: --port: expected 0 to 65535, got {args.port}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    log = get_logger("keyturn.sandbox")
    if not _is_loopback(args.host):
        # The sandbox speaks plain HTTP and hands out secrets: loopback is where it belongs.
        log.warning("listening beyond loopback over plain HTTP", host=args.host)
    try:
        asyncio.run(serve(settings, args.host, args.port, args.bootstrap_out))
    except OSError as exc:  # the port is taken, or the bootstrap file cannot be written
        log.error("cannot start", host=args.host, port=args.port, reason=str(exc))
        print(f"keyturn sandbox: cannot start on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0
