"""Durations in the configuration: seconds as a number, or text like "500ms", "5m", "1h30m"
(units `d h m s ms`, largest first, each once); each key's range is its field's.
"""

from __future__ import annotations

import math
import re

DURATION_HELP = (
    'seconds as a number (e.g. 30) or a string like "500ms", "30s", "5m", "1h30m", "30d"'
)

_UNITS: dict[str, float] = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_RANK = {unit: rank for rank, unit in enumerate(_UNITS)}
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|d|h|m|s))+")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")


def parse_duration(value: object) -> float:
    """Seconds from an int/float or a duration string; raises ValueError with the reason."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a duration")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an integer beyond any float
            raise ValueError("a duration must be finite") from None
    elif isinstance(value, str):
        seconds = _parse_text(value.strip())
    else:
        raise ValueError(f"a {type(value).__name__} is not a duration")
    if not math.isfinite(seconds):
        raise ValueError("a duration must be finite")
    if seconds < 0:
        raise ValueError("a duration must not be negative")
    return seconds


def _parse_text(text: str) -> float:
    if text.startswith("-"):
        raise ValueError("a duration must not be negative")
    if _NUMBER.fullmatch(text):
        return float(text)
    if not _WHOLE.fullmatch(text):
        raise ValueError("not a duration")
    total = 0.0
    last = -1
    for number, unit in _PART.findall(text):
        if _RANK[unit] <= last:
            raise ValueError('units must go from largest to smallest, each once (e.g. "1h30m")')
        last = _RANK[unit]
        total += float(number) * _UNITS[unit]
    return total


def format_duration(seconds: float) -> str:
    """The shortest text `parse_duration` reads back as `seconds` (to the millisecond)."""
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError("a duration is finite and not negative")
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    parts: list[str] = []
    for unit, size in _UNITS.items():
        count, millis = divmod(millis, round(size * 1000))
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
