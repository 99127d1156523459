"""`keyturn usage -c FILE [--json] [NAME…]`: who reads each credential, from the running daemon.

The usage counts live only in `keyturn run`'s memory (docs/usage.md), so this asks the
daemon's `GET /usage` at `[metrics] listen`. Exit 0 shown; 1 configuration, unknown NAME or
daemon unreachable; 2 argparse's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from keyturn.clock import SystemClock, parse_rfc3339
from keyturn.commands import add_config_argument, load_or_report
from keyturn.commands.status import printable, selected_or_report, when
from keyturn.config import Config, MetricsSettings

EXIT_OK = 0
EXIT_ERROR = 1
TIMEOUT = 5.0


class UsageUnavailable(Exception):
    """The daemon's usage view cannot be had; the message says why, in one line."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per credential")
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help="only these credentials (default: all)"
    )


def run(args: argparse.Namespace) -> int:
    config = load_or_report(args.config)
    if config is None:
        return EXIT_ERROR
    if config.usage is None:
        print(
            f"keyturn usage: {config.source} has no [usage] table: keyturn does not read "
            "Vault's audit log (see docs/usage.md)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    credentials = selected_or_report(config, args.names, "usage")
    if credentials is None:
        return EXIT_ERROR
    try:
        view = fetch_usage(config, [c.name for c in credentials] if args.names else None)
    except UsageUnavailable as error:
        print(f"keyturn usage: {error}", file=sys.stderr)
        return EXIT_ERROR
    entries = view["credentials"]
    print(render_json(entries) if args.json else render_table(entries, SystemClock().time()))
    source = view.get("source") or {}
    if source.get("up") is False:
        print(
            f"keyturn usage: the daemon's {source.get('kind')} audit source cannot be read "
            f"({source.get('problem')}): reads since then are not counted",
            file=sys.stderr,
        )
    return EXIT_OK


def daemon_url(settings: MetricsSettings) -> str:
    """Where the daemon of this configuration serves /usage (a wildcard host is reached on
    loopback)."""
    if settings.port == 0:
        raise UsageUnavailable(
            "[metrics] listen has port 0, so the daemon's port is not known; expected a fixed port"
        )
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(  # noqa: S104 - a mapping
        settings.host, settings.host
    )
    web = settings.web_config
    scheme = "https" if web is not None and web.tls is not None else "http"
    return (
        f"{scheme}://[{host}]:{settings.port}"
        if ":" in host
        else f"{scheme}://{host}:{settings.port}"
    )


def fetch_usage(
    config: Config,
    names: Sequence[str] | None = None,
    *,
    summary: bool = False,
    timeout: float = TIMEOUT,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, Any]:
    """The daemon's usage view (`keyturn.usage.service.UsageService.view`) of `names` (all
    when None); UsageUnavailable with the reason when it cannot be had."""
    url = daemon_url(config.metrics) + "/usage"
    params = httpx.QueryParams([("credential", name) for name in names or ()])
    if summary:
        params = params.add("summary", "1")
    try:
        with httpx.Client(timeout=timeout, transport=transport, trust_env=False) as http:
            response = http.get(url, params=params)
    except httpx.HTTPError as exc:
        raise UsageUnavailable(
            f"cannot reach the daemon at {url} ({type(exc).__name__}): is `keyturn run` running "
            "with this configuration?"
        ) from None
    if response.status_code == 404:
        raise UsageUnavailable(
            f"the daemon at {url} runs without a [usage] table (restart it after adding one)"
        )
    if response.status_code in (401, 403):
        raise UsageUnavailable(
            f"the daemon at {url} asks for authentication ([metrics] web_config), which "
            "`keyturn usage` cannot give yet; read /usage with the password or client "
            "certificate (curl), or from a loopback listener without web_config"
        )
    if response.status_code != 200:
        raise UsageUnavailable(f"the daemon at {url} answered HTTP {response.status_code}")
    try:
        view = response.json()
    except ValueError:
        view = None
    if not isinstance(view, dict) or not isinstance(view.get("credentials"), list):
        raise UsageUnavailable(f"the daemon at {url} answered something that is not its usage")
    return view


def consumer_counts(config: Config, timeout: float = 2.0) -> dict[str, int] | None:
    """How many consumers read each credential, from the daemon; None when there is no
    `[usage]` or the daemon cannot be reached (`keyturn status` then shows `-`)."""
    if config.usage is None:
        return None
    try:
        view = fetch_usage(config, summary=True, timeout=timeout)
    except UsageUnavailable:
        return None
    counts: dict[str, int] = {}
    for entry in view["credentials"]:
        if isinstance(entry, Mapping) and isinstance(entry.get("consumer_count"), int):
            counts[str(entry.get("credential"))] = entry["consumer_count"]
    return counts


def render_json(entries: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(json.dumps(entry) for entry in entries)


def _yes_no(value: object) -> str:
    return {True: "yes", False: "no"}.get(value, "-") if isinstance(value, bool) else "-"


def _time(value: object, now: float) -> str:
    return when(parse_rfc3339(value), now) if isinstance(value, str) else "-"


_HEADER = ("CREDENTIAL", "CONSUMER", "READS", "LAST READ", "VERSION", "CURRENT")


def render_table(entries: Sequence[Mapping[str, Any]], now: float) -> str:
    """One row per consumer (most recent reader first), `-` for a credential nobody read."""
    table = [list(_HEADER)]
    for entry in entries:
        name = str(entry.get("credential"))
        consumers = entry.get("consumers") or []
        if not consumers:
            table.append([name, "-", "0", "-", "-", "-"])
        for consumer in consumers:
            version = consumer.get("last_version")
            table.append(
                [
                    name,
                    str(consumer.get("consumer")),
                    str(consumer.get("reads")),
                    _time(consumer.get("last_read"), now),
                    "-" if version is None else str(version),
                    _yes_no(consumer.get("current")),
                ]
            )
    table = [[printable(cell) for cell in line] for line in table]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADER) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True))
        + "  "
        + line[-1]
        for line in table
    )
