"""Logs are JSON lines with secrets redacted by key name and by type."""

from __future__ import annotations

import io
import json
import logging

import structlog

from keyturn.events import (
    Failed,
    LoggingObserver,
    Published,
    Restored,
    RotationDuration,
    RotationStep,
    Suspicious,
    TokenRequest,
)
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


def test_the_logging_observer_writes_one_line_per_event_worth_one() -> None:
    def emit() -> None:
        log = LoggingObserver()
        log(TokenRequest("reporting", "acme", "client_credentials", "success", 0.123456))
        log(Published("reporting", "acme", "oauth_client", 1000.0, 1600.0))
        log(Failed("reporting", "acme", "oauth_client", OSError("disk full"), 3))
        log(RotationStep("billing", "acme", "api_key", "awaiting_manual"))
        log(RotationStep("billing", "acme", "api_key", "published"))
        log(Suspicious(None, None, "vault_token_expiring", "critical", "expires in 20s"))
        log(Restored("reporting", "acme", "oauth_client", None, None, None, 0))  # no line
        log(RotationDuration("acme", "api_key", 3.0))  # no line

    lines = _run(emit)
    assert [(line["event"], line["level"]) for line in lines] == [
        ("token.request", "debug"),
        ("credential.published", "info"),
        ("credential.failed", "warning"),
        ("rotation.awaiting_manual", "warning"),
        ("rotation.published", "info"),
        ("suspicious", "warning"),
    ]
    assert lines[0]["seconds"] == 0.1235
    assert lines[1]["lifetime"] == 600.0
    assert (lines[2]["error_type"], lines[2]["consecutive_failures"]) == ("OSError", 3)
    # keyturn's own trouble names no credential rather than an empty one
    assert "credential" not in lines[5] and lines[5]["detector"] == "vault_token_expiring"
