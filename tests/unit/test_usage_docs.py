"""docs/usage.md against the code: its tables list exactly the metrics (with their help
texts), the skip reasons and the detectors that keyturn.usage has; docs/alerts.md names every
detector an alert hook can be filtered on."""

from __future__ import annotations

import re
from pathlib import Path

from keyturn.alerts.model import DETECTORS as ALERT_DETECTORS
from keyturn.usage.audit import SKIP_REASONS
from keyturn.usage.detectors import DETECTORS, DetectorSettings
from keyturn.usage.metrics import HELP

DOC = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()


def rows(heading_text: str) -> list[list[str]]:
    """The cells of the first table after the line containing `heading_text`."""
    after = DOC.split(heading_text, 1)[1]
    table = re.search(r"(?m)^\|.*\|\n\|[-|]+\|\n((?:\|.*\|\n)+)", after)
    assert table is not None, heading_text
    return [[c.strip() for c in r.strip("|").split(" | ")] for r in table[1].splitlines()]


def test_the_metrics_table_is_the_collectors_metrics() -> None:
    table = {r[0].strip("`"): r[3] for r in rows("### Metrics")}
    assert table == HELP


def test_the_skip_reasons_table_is_every_reason() -> None:
    assert [r[0].strip("`") for r in rows("The `reason` of a skipped line")] == list(SKIP_REASONS)


def test_the_detectors_table_names_every_detector() -> None:
    named = {r[0].strip("`") for r in rows("## Detectors")}
    assert named == set(DETECTORS)


def test_the_documented_rules_are_the_defaults() -> None:
    settings = DetectorSettings()
    assert (settings.learning, settings.rate_window, settings.repeat) == (86_400, 300, 3_600)
    assert (settings.rate_factor, settings.rate_floor, settings.baseline_alpha) == (10, 100, 0.1)
    assert "max(10 \N{MULTIPLICATION SIGN} its baseline, 100) times in a 5-minute window" in DOC
    assert "the first 24 hours" in DOC
    assert "at most once an hour" in DOC
    assert "each window weighs 0.1" in DOC


ALERTS_DOC = (Path(__file__).resolve().parents[2] / "docs" / "alerts.md").read_text()


def test_alerts_md_lists_every_detector_an_alert_can_name() -> None:
    """The alert hooks' `detectors` filter takes exactly the names alerts.md documents."""
    table = ALERTS_DOC.split("## Detectors and alerts", 1)[1]
    named = set(re.findall(r"(?m)^\| `([a-z_]+)` \| `Keyturn", table))
    assert named == set(ALERT_DETECTORS)
    assert set(DETECTORS) | {"consumers_not_moved"} <= named
    assert "token issuance" not in ALERTS_DOC  # unusual_usage is about reads of published values
