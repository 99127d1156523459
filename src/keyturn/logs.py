"""Structured JSON logs with redaction designed in.

Two layers keep secrets out of logs: values travel as `Secret` (which renders as a
placeholder), and `redact_secrets` blanks any event field whose *name* says it holds a
secret, whatever its type, recursively through dicts and lists.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO

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


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """JSON lines on `stream` (stderr by default): one object per event, secrets redacted.

    Standard-library loggers (aiohttp, apscheduler, hvac) go through the same pipeline.
    """
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
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
            structlog.processors.JSONRenderer(),
        ],
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # Library chatter at info is noise for operators; their warnings still come through.
    for noisy in ("apscheduler", "aiohttp.access", "hvac", "httpx", "httpcore", "urllib3"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))


def get_logger(name: str) -> Any:
    """A structlog logger bound to `name`."""
    return structlog.get_logger(name)
