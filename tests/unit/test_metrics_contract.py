"""docs/metrics.md is the contract: what the registry exposes must be exactly its tables.

The tables are parsed from the document, the observer is driven through one event of every
kind (and the usage collector given one read) so every family has a sample, and names, types,
label sets and help texts are compared.
The rendered exposition is also checked against Prometheus' naming rules (the ones
`promtool check metrics` lints), and by promtool itself where it is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from keyturn.clock import FakeClock
from keyturn.errors import ProviderUnavailable
from keyturn.events import (
    Failed,
    Probed,
    Published,
    RefreshTokenPlanned,
    RetryAfterBounded,
    RotationDuration,
    RotationPlanned,
    RotationStep,
    Scheduled,
    Suspicious,
    TokenRequest,
)
from keyturn.observability.catalog import DETECTORS, USAGE
from keyturn.observability.metrics import PrometheusObserver
from keyturn.usage.audit import AuditRead
from keyturn.usage.layout import Layout, Watched
from keyturn.usage.metrics import UsageCollector
from keyturn.usage.tracker import UsageTracker

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


@dataclass(frozen=True)
class Row:
    name: str
    type: str
    labels: frozenset[str]
    help: str


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _tables(text: str) -> dict[str, list[list[str]]]:
    """Each `## heading` with the data rows of the table under it."""
    tables: dict[str, list[list[str]]] = {}
    heading = None
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
            tables[heading] = []
        elif heading and line.startswith("|") and not re.match(r"^\|[-| ]+\|$", line):
            tables[heading].append(_cells(line))
    return {name: rows[1:] for name, rows in tables.items() if rows}  # drop the header row


def _names(cell: str) -> list[str]:
    return re.findall(r"`([a-z_]+)`", cell)


def doc_rows() -> dict[str, Row]:
    tables = _tables(DOC.read_text(encoding="utf-8"))
    rows: dict[str, Row] = {}
    per_credential = next(h for h in tables if h.startswith("Per credential"))
    credential_labels = frozenset(_names(per_credential))
    for name, kind, meaning in tables[per_credential]:
        rows[name.strip("`")] = Row(name.strip("`"), kind, credential_labels, meaning)
    for heading, kind in (("Counters", "counter"), ("Histograms", "histogram")):
        for name, labels, meaning in tables[heading]:
            rows[name.strip("`")] = Row(name.strip("`"), kind, frozenset(_names(labels)), meaning)
    for name, kind, meaning in tables["Process"]:
        labels = frozenset(_names(meaning)) if meaning.startswith("labels ") else frozenset()
        rows[name.strip("`")] = Row(name.strip("`"), kind.split()[0], labels, meaning)
    for name, kind, labels, meaning in tables["Usage (with `[usage]`)"]:
        rows[name.strip("`")] = Row(name.strip("`"), kind, frozenset(_names(labels)), meaning)
    return rows


@dataclass
class Source:
    """What the usage collector reads of an audit source."""

    up: bool = True
    skipped: Counter[str] = field(default_factory=lambda: Counter({"not_json": 1}))


def with_usage(registry: CollectorRegistry, clock: FakeClock, *, reads: bool) -> None:
    """The daemon's usage collector (with `[usage]`), after one read if `reads`."""
    tracker = UsageTracker(Layout([Watched("reporting", "acme", "apps/reporting")]), clock=clock)
    if reads:
        tracker.observe(
            AuditRead(
                clock.time(), "published", "reporting", "secret", "apps/reporting",
                "approle/reporting", "", "10.0.0.1", 1, True,
            )
        )  # fmt: skip
    registry.register(UsageCollector(tracker, lambda: [Source()] if reads else []))


def exercised(clock: FakeClock) -> tuple[CollectorRegistry, PrometheusObserver]:
    """An observer that has seen every event, so every family has at least one sample."""
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry, clock)
    observer(TokenRequest("reporting", "acme", "client_credentials", "success", 0.2))
    observer(Published("reporting", "acme", "oauth_client", clock.time(), clock.time() + 600))
    observer(
        Published("reporting", "acme", "oauth_client", clock.time(), clock.time() + 600, False)
    )
    observer(RetryAfterBounded("reporting", "acme", "overridden", 600.0, True))
    observer(Scheduled("reporting", "acme", "oauth_client", clock.time() + 400))
    observer(Failed("reporting", "acme", "oauth_client", ProviderUnavailable("down"), 1))
    observer(Suspicious("reporting", "acme", "client_rejected", "critical", "invalid_client"))
    observer(RotationStep("reporting", "acme", "oauth_client", "started"))
    observer(Probed("reporting", "acme", 200))
    observer(RotationPlanned("reporting", "acme", "oauth_client", clock.time() + 86400))
    observer(RefreshTokenPlanned("reporting", "acme", "oauth_client", clock.time() + 7 * 86400))
    observer(RotationDuration("acme", "oauth_client", 3.0))
    observer.lateness(0.02)
    observer.alert_delivery("oncall", "success")
    observer.sink_write("reporting", "written")
    observer.vault_operation("write", "success", 0.01)
    observer.vault_token(clock.time() + 3600, authenticated=True)
    observer.heartbeat()
    observer.credentials_configured(1)
    observer.membership(3, 1)
    with_usage(registry, clock, reads=True)
    return registry, observer


def exposed(registry: CollectorRegistry) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = {key for sample in family.samples for key in sample.labels} - {"le"}
        rows[name] = Row(name, family.type, frozenset(labels), family.documentation)
    return rows


def test_the_document_has_all_its_tables() -> None:
    rows = doc_rows()
    assert len(rows) == 33
    assert rows["keyturn_credential_ready"].labels == {"credential", "provider", "kind"}
    assert rows["keyturn_build_info"].labels == {"version", "python"}
    assert rows["keyturn_schedule_lateness_seconds"].labels == frozenset()


def test_the_registry_exposes_exactly_the_documented_metrics() -> None:
    documented = doc_rows()
    actual = exposed(exercised(FakeClock())[0])
    assert sorted(actual) == sorted(documented)
    for name, row in documented.items():
        assert actual[name] == row, name


def test_every_family_is_exposed_before_any_event() -> None:
    """A fresh registry already shows every name, type and help (samples come later)."""
    registry = CollectorRegistry()
    PrometheusObserver(registry, FakeClock())
    with_usage(registry, FakeClock(), reads=False)
    fresh = exposed(registry)
    assert sorted(fresh) == sorted(doc_rows())
    for name, row in doc_rows().items():
        assert (fresh[name].type, fresh[name].help) == (row.type, row.help), name


def test_the_usage_metrics_are_the_catalogs() -> None:
    documented = doc_rows()
    for spec in USAGE:
        row = documented[spec.name]
        assert (row.type, row.labels, row.help) == (spec.type, set(spec.labels), spec.help)


def test_the_detector_words_are_the_documented_ones() -> None:
    table = _tables(DOC.read_text(encoding="utf-8"))
    detectors = next(rows for heading, rows in table.items() if heading.startswith("Detectors"))
    assert {row[0].strip("`") for row in detectors} == DETECTORS


# -- Prometheus naming rules (promtool's lint, client_golang's promlint) -----------------------

UNIT_ABBREVIATIONS = ("_ms", "_sec", "_secs", "_s", "_us", "_ns", "_msec", "_usec", "_mins")
NON_BASE_UNITS = ("milliseconds", "microseconds", "nanoseconds", "minutes", "hours", "days")
TIME_WORDS = ("duration", "timestamp", "lateness", "latency", "age")


def rendered_families(clock: FakeClock) -> list[tuple[str, str, str, set[str]]]:
    text = generate_latest(exercised(clock)[0]).decode()
    families = []
    for family in text_string_to_metric_families(text):
        exposed_name = family.name + ("_total" if family.type == "counter" else "")
        labels = {key for sample in family.samples for key in sample.labels}
        families.append((exposed_name, family.type, family.documentation, labels))
    return families


@pytest.mark.parametrize("family", rendered_families(FakeClock()), ids=lambda f: f[0])
def test_naming_rules(family: tuple[str, str, str, set[str]]) -> None:
    name, kind, help_text, labels = family
    assert re.fullmatch(r"keyturn_[a-z0-9_]+", name), "snake_case with the keyturn_ prefix"
    assert help_text.strip(), "every metric has help"
    assert name.endswith("_total") == (kind == "counter"), "_total on counters and only there"
    for word in ("counter", "gauge", "histogram", "summary"):
        assert word not in name.split("_"), "no type name in the metric name"
    assert not name.endswith(UNIT_ABBREVIATIONS), "units are spelled out"
    assert not any(unit in name for unit in NON_BASE_UNITS), "base units (seconds)"
    if any(word in name.split("_") for word in TIME_WORDS):  # ("usage" is not an age)
        assert name.endswith(("_seconds", "_seconds_total")), "times are in seconds"
    if "timestamp" in name:
        assert name.endswith("_timestamp_seconds")
    assert not name.endswith(("_bucket", "_count", "_sum", "_created")), "reserved suffixes"
    if kind != "histogram":
        assert "le" not in labels
    assert "quantile" not in labels
    for label in labels:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", label) and not label.startswith("__")


def test_no_created_series() -> None:
    """`_created` series would double the series count; keyturn turns them off."""
    text = generate_latest(exercised(FakeClock())[0]).decode()
    assert "_created" not in text


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_check_metrics_finds_nothing() -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None
    text = generate_latest(exercised(FakeClock())[0])
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.decode().strip() == ""
