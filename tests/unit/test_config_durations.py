"""Durations: numbers of seconds or "500ms" / "5m" / "1h30m" text."""

from __future__ import annotations

import pytest

from keyturn.config.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        (2.5, 2.5),
        (0, 0.0),
        ("30", 30.0),
        ("2.5", 2.5),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("30d", 2_592_000.0),
        ("1h30m", 5400.0),
        ("1d2h3m4s5ms", 93784.005),
        ("1.5h", 5400.0),
        (" 10s ", 10.0),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (True, "a boolean is not a duration"),
        (-1, "must not be negative"),
        ("-5s", "must not be negative"),
        (float("inf"), "must be finite"),
        (float("nan"), "must be finite"),
        (10**400, "must be finite"),  # a TOML integer beyond any float
        ("9" * 400 + "d", "must be finite"),
        ("", "not a duration"),
        ("10x", "not a duration"),
        ("1 h", "not a duration"),
        ("h", "not a duration"),
        ("1H", "not a duration"),
        ("5s5m", "largest to smallest"),
        ("1m1m", "largest to smallest"),
        ([1], "a list is not a duration"),
    ],
)
def test_parse_duration_rejects(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.5, "500ms"), (30, "30s"), (90, "1m30s"), (5400, "1h30m"), (86400, "1d")],
)
def test_format_duration_round_trips(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds
