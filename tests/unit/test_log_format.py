"""`--log-format console|json`: which format is chosen, where the option goes on the command
line, and that console lines are redacted exactly like JSON ones."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable, Iterator

import pytest
import structlog

from keyturn.cli import build_parser
from keyturn.logs import choose_format, configure_logging, get_logger
from keyturn.secret import PLACEHOLDER, Secret

VALUE = "tok-abcdef-123456"


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    logging.getLogger().handlers.clear()
    structlog.reset_defaults()


# -- the choice -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "stream", "expected"),
    [
        (None, Terminal(), "console"),
        (None, io.StringIO(), "json"),
        ("auto", Terminal(), "console"),
        ("auto", io.StringIO(), "json"),
        ("json", Terminal(), "json"),
        ("console", io.StringIO(), "console"),
    ],
)
def test_console_on_a_terminal_json_elsewhere_unless_asked(
    requested: str | None, stream: io.StringIO, expected: str
) -> None:
    assert choose_format(requested, stream) == expected


def test_a_closed_stream_is_not_a_terminal() -> None:
    stream = io.StringIO()
    stream.close()
    assert choose_format(None, stream) == "json"


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one of console, json"):
        choose_format("yaml", io.StringIO())


def test_a_later_configuration_keeps_the_format_asked_for() -> None:
    """The CLI configures the format once; a command that sets its level (or the sandbox, or
    the demo with its log file) calls configure_logging again without one."""
    assert configure_logging("warning", stream=io.StringIO(), fmt="console") == "console"
    assert configure_logging("info", stream=io.StringIO()) == "console"
    assert configure_logging("info", stream=io.StringIO(), fmt="json") == "json"
    assert configure_logging("debug", stream=Terminal()) == "json"


def test_auto_is_decided_again_for_each_stream() -> None:
    """`keyturn demo` on a terminal: console there, but its log file still gets JSON."""
    assert configure_logging("warning", stream=Terminal()) == "console"
    assert configure_logging("info", stream=io.StringIO()) == "json"


# -- the command line ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["status"], None),
        (["--log-format", "json", "status"], "json"),
        (["status", "--log-format", "console"], "console"),
        (["--log-format", "json", "status", "--log-format", "console"], "console"),
        (["--log-format", "console", "refresh", "reporting"], "console"),
        (["run", "--log-format", "json"], "json"),
        (["check", "--log-format", "json"], "json"),
        (["sandbox", "--log-format", "json"], "json"),
        (["demo", "--log-format", "console"], "console"),
        (["import-key", "x", "--log-format", "json"], "json"),
    ],
)
def test_every_command_takes_log_format_before_or_after_its_name(
    argv: list[str], expected: str | None
) -> None:
    assert build_parser().parse_args(argv).log_format == expected


def test_log_format_takes_only_console_or_json(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["status", "--log-format", "yaml"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err


# -- redaction in both formats ------------------------------------------------------------------


def _emit_everything() -> None:
    log = get_logger("keyturn.test")
    log.warning(
        "token.issued",
        credential="reporting",
        token=VALUE,  # a secret-named field holding a plain str
        value=Secret(VALUE),  # a Secret under an innocent name
        nested={"api_key": VALUE, "items": [{"Client_Secret": VALUE}]},
    )
    logging.getLogger("some.library").warning("sent %s", Secret(VALUE))
    try:
        raise RuntimeError(f"failed with {Secret(VALUE)}")
    except RuntimeError:
        log.exception("boom", authorization=f"Bearer {VALUE}")


def _capture(fmt: str, stream: io.StringIO | None = None) -> str:
    out = stream if stream is not None else io.StringIO()
    configure_logging("debug", stream=out, fmt=fmt)
    _emit_everything()
    return out.getvalue()


@pytest.mark.parametrize("make_stream", [io.StringIO, Terminal], ids=["plain", "colours"])
def test_console_lines_are_redacted_like_json(make_stream: Callable[[], io.StringIO]) -> None:
    console = _capture("console", make_stream())
    assert VALUE not in console
    assert not any(line.startswith("{") for line in console.splitlines()), console
    plain = _strip_colours(console)
    assert "token.issued" in plain
    assert "credential=reporting" in plain
    assert f"token={PLACEHOLDER}" in plain
    assert f"value={PLACEHOLDER}" in plain
    assert f"'api_key': '{PLACEHOLDER}'" in plain
    assert f"'Client_Secret': '{PLACEHOLDER}'" in plain
    assert f"authorization={PLACEHOLDER}" in plain
    assert f"sent {PLACEHOLDER}" in plain
    assert "RuntimeError: failed with " + PLACEHOLDER in plain


def test_json_lines_carry_the_same_redactions() -> None:
    lines = [json.loads(line) for line in _capture("json").splitlines() if line.startswith("{")]
    assert VALUE not in json.dumps(lines)
    issued, sent, boom = lines
    assert issued["token"] == issued["value"] == PLACEHOLDER
    assert issued["nested"] == {"api_key": PLACEHOLDER, "items": [{"Client_Secret": PLACEHOLDER}]}
    assert sent["event"] == f"sent {PLACEHOLDER}"
    assert boom["authorization"] == PLACEHOLDER
    assert f"RuntimeError: failed with {PLACEHOLDER}" in boom["exception"]


def test_colours_only_on_a_terminal_and_never_with_no_color(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert "\x1b[" in _capture("console", Terminal())
    assert "\x1b[" not in _capture("console", io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in _capture("console", Terminal())


def test_console_respects_the_level() -> None:
    stream = io.StringIO()
    configure_logging("warning", stream=stream, fmt="console")
    get_logger("keyturn.test").info("quiet.info")
    get_logger("keyturn.test").warning("loud.warning")
    assert "quiet.info" not in stream.getvalue()
    assert "loud.warning" in stream.getvalue()


def _strip_colours(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
