"""Structured logs with redaction designed in: JSON lines, or aligned lines for a terminal.

Two layers keep secrets out of logs: values travel as `Secret` (which renders as a
placeholder), and `redact_secrets` blanks any event field whose *name* says it holds a
secret, whatever its type, recursively through dicts and lists. Both formats share every
processor up to the last one, the renderer, so they redact exactly alike.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal, TextIO

import structlog

from keyturn.secret import PLACEHOLDER, Secret

SENSITIVE_KEYS = frozenset(
    {
        "access_token",
        "refresh_token",
        "id_token",
        "client_secret",
        "api_key",
        "key",
        "secret",
        "secret_id",
        "password",
        "token",
        "authorization",
        "admin_token",
        "vault_token",
        "x-vault-token",
        "cookie",
        "set-cookie",
        # keys instead of client secrets (RFC 7523, RFC 7591/7592)
        "private_key",
        "client_assertion",
        "assertion",
        "registration_access_token",
    }
)


def _scrub(value: Any, depth: int = 0) -> Any:
    if isinstance(value, Secret):
        return PLACEHOLDER
    if depth > 8:
        return value
    if isinstance(value, Mapping):
        return {
            k: PLACEHOLDER if str(k).lower() in SENSITIVE_KEYS else _scrub(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_scrub(v, depth + 1) for v in value]
    return value


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: blank secret-named fields and every `Secret`, at any depth."""
    for key in list(event_dict):
        if key.lower() in SENSITIVE_KEYS:
            event_dict[key] = PLACEHOLDER
        else:
            event_dict[key] = _scrub(event_dict[key])
    return event_dict


LogFormat = Literal["console", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("console", "json")
# Library chatter at info is noise for operators; their warnings still come through.
_NOISY = ("apscheduler", "aiohttp.access", "hvac", "httpx", "httpcore", "urllib3")


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def choose_format(requested: str | None, stream: TextIO) -> LogFormat:
    """The format to write to `stream`: `requested` ("console" or "json") when given;
    otherwise ("auto" or None) console on a terminal and JSON anywhere else (a pipe, a file,
    the journal)."""
    if requested in LOG_FORMATS:
        return requested
    if requested not in (None, "auto"):
        raise ValueError(f"log format {requested!r}; expected one of {', '.join(LOG_FORMATS)}")
    return "console" if _is_terminal(stream) else "json"


class _LogHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """keyturn's root handler; remembers the format asked for (None: auto), so that a later
    `configure_logging` without one (a new level, another stream) keeps the operator's choice."""

    def __init__(self, stream: TextIO, requested: str | None) -> None:
        super().__init__(stream)
        self.requested = requested


def _requested_format() -> str | None:
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _LogHandler):
            return handler.requested
    return None


def _renderer(chosen: LogFormat, stream: TextIO) -> Any:
    if chosen == "json":
        return structlog.processors.JSONRenderer()
    return structlog.dev.ConsoleRenderer(
        # Colours only for a person at a terminal who has not asked for none (no-color.org).
        colors=_is_terminal(stream) and not os.environ.get("NO_COLOR"),
        # Exceptions arrive already formatted (format_exc_info runs before, as for JSON): the
        # same text in both formats, never a traceback renderer that could show locals.
        exception_formatter=structlog.dev.plain_traceback,
        sort_keys=True,
    )


def configure_logging(
    level: str = "info", stream: TextIO | None = None, fmt: str | None = None
) -> LogFormat:
    """Log events on `stream` (stderr by default), secrets redacted; returns the format used.

    `fmt` is "console" (aligned, readable lines), "json" (one object per line) or "auto"
    (console on a terminal, JSON otherwise). None keeps what was asked before in this process
    (the CLI's `--log-format`), and is "auto" when nothing was; "auto" is decided for each
    `stream`, so a log file gets JSON even when the terminal gets console lines.

    Standard-library loggers (aiohttp, apscheduler, hvac) go through the same pipeline.
    """
    out = stream or sys.stderr
    requested = fmt if fmt is not None else _requested_format()
    chosen = choose_format(requested, out)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_secrets,
    ]
    structlog.configure(
        processors=[
            *shared[:1],
            structlog.stdlib.filter_by_level,
            *shared[1:],
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            redact_secrets,
            _renderer(chosen, out),
        ],
    )
    handler = _LogHandler(out, None if requested == "auto" else requested)
    handler.setFormatter(formatter)
    logging.getLogger().handlers[:] = [handler]
    set_log_level(level)
    return chosen


def set_log_level(level: str) -> None:
    """Change the level of the configured pipeline (debug, info, warning, error)."""
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    logging.getLogger().setLevel(numeric)
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))


def get_logger(name: str) -> Any:
    """A structlog logger bound to `name`."""
    return structlog.get_logger(name)
