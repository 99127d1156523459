"""Logs are JSON lines with secrets redacted by key name and by type."""

from __future__ import annotations

import io
import json
import logging

import structlog

from keyturn.logs import configure_logging, get_logger, redact_secrets
from keyturn.secret import PLACEHOLDER, Secret

VALUE = "tok-abcdef-123456"


def _run(emit) -> list[dict]:
    stream = io.StringIO()
    configure_logging("debug", stream=stream)
    try:
        emit()
    finally:
        logging.getLogger().handlers.clear()
        structlog.reset_defaults()
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_secret_named_fields_are_blanked_at_any_depth() -> None:
    event = redact_secrets(
        None,
        "info",
        {
            "event": "x",
            "access_token": VALUE,
            "body": {"refresh_token": VALUE, "list": [{"Client_Secret": VALUE}]},
            "value": Secret(VALUE),
        },
    )
    assert VALUE not in json.dumps(event)
    assert event["access_token"] == PLACEHOLDER


def test_structlog_lines_are_json_without_secrets() -> None:
    def emit() -> None:
        get_logger("keyturn.test").info(
            "token.issued", credential="reporting", token=VALUE, nested={"api_key": VALUE}
        )

    lines = _run(emit)
    assert lines[0]["event"] == "token.issued"
    assert lines[0]["credential"] == "reporting"
    assert VALUE not in json.dumps(lines)


def test_stdlib_loggers_share_the_pipeline() -> None:
    def emit() -> None:
        logging.getLogger("some.library").warning("something %s", Secret(VALUE))

    lines = _run(emit)
    assert lines[0]["level"] == "warning"
    assert lines[0]["logger"] == "some.library"
    assert VALUE not in json.dumps(lines)


def test_exceptions_render_without_secret_values() -> None:
    def emit() -> None:
        try:
            raise RuntimeError(f"failed with {Secret(VALUE)}")
        except RuntimeError:
            get_logger("keyturn.test").exception("boom")

    lines = _run(emit)
    assert "RuntimeError" in lines[0]["exception"]
    assert VALUE not in json.dumps(lines)
