"""The usage metrics as Prometheus scrapes them: values, the label cap, skipped lines, up."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest

from keyturn.clock import FakeClock
from keyturn.usage.audit import SKIP_REASONS, AuditRead
from keyturn.usage.layout import Layout, Watched
from keyturn.usage.metrics import UsageCollector
from keyturn.usage.tracker import UsageTracker

T0 = 1_800_000_000.0


@dataclass
class StubSource:
    up: bool = True
    skipped: Counter[str] = field(default_factory=Counter)


def read(credential: str, consumer: str, at: float) -> AuditRead:
    return AuditRead(at, "published", credential, "secret", "p", consumer, "", "", 1, True)


def scrape(tracker: UsageTracker, sources: list[StubSource], cap: int = 20) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(UsageCollector(tracker, lambda: sources, label_cap=cap))
    return registry


def test_reads_last_read_and_consumers_per_credential() -> None:
    tracker = UsageTracker(Layout([Watched("app1", "acme", "p")]), clock=FakeClock(T0))
    tracker.observe(read("app1", "approle/a", T0 + 1))
    tracker.observe(read("app1", "approle/a", T0 + 2))
    tracker.observe(read("app1", "approle/b", T0 + 3))
    registry = scrape(tracker, [StubSource()])
    value = registry.get_sample_value
    labels = {"credential": "app1", "consumer": "approle/a"}
    assert value("keyturn_consumer_reads_total", labels) == 2
    assert value("keyturn_consumer_last_read_timestamp_seconds", labels) == T0 + 2
    assert value("keyturn_consumers", {"credential": "app1"}) == 2
    assert value("keyturn_usage_source_up") == 1
    assert generate_latest(registry).count(b"# TYPE keyturn_consumer_reads_total counter") == 1


def test_consumers_beyond_the_label_cap_are_summed_as_other() -> None:
    tracker = UsageTracker(Layout([]), clock=FakeClock(T0), max_consumers=4)
    for i, name in enumerate("abcdef"):  # e and f are beyond the tracker's cap
        for _ in range(i + 1):
            tracker.observe(read("app1", f"approle/{name}", T0 + i))
    registry = scrape(tracker, [], cap=2)
    value = registry.get_sample_value
    reads = {
        name: value("keyturn_consumer_reads_total", {"credential": "app1", "consumer": name})
        for name in ("approle/a", "approle/b", "approle/c", "other")
    }
    assert reads == {"approle/a": 1, "approle/b": 2, "approle/c": None, "other": 3 + 4 + 5 + 6}
    other = {"credential": "app1", "consumer": "other"}
    assert value("keyturn_consumer_last_read_timestamp_seconds", other) == T0 + 5
    assert value("keyturn_consumers", {"credential": "app1"}) == 4
    assert value("keyturn_usage_source_up") is None  # no source configured


def test_skipped_lines_by_reason_and_up_across_sources() -> None:
    tracker = UsageTracker(Layout([]), clock=FakeClock(T0))
    sources = [
        StubSource(skipped=Counter({"not_json": 2, "request": 5})),
        StubSource(up=False, skipped=Counter({"not_json": 1})),
    ]
    registry = scrape(tracker, sources)
    value = registry.get_sample_value
    assert value("keyturn_usage_lines_skipped_total", {"reason": "not_json"}) == 3
    assert value("keyturn_usage_lines_skipped_total", {"reason": "request"}) == 5
    assert value("keyturn_usage_lines_skipped_total", {"reason": "too_long"}) == 0
    assert value("keyturn_usage_source_up") == 0
    text = generate_latest(registry).decode()
    assert text.count("keyturn_usage_lines_skipped_total{") == len(SKIP_REASONS)
