"""The usage metrics, computed from the tracker and the sources when Prometheus scrapes.

Label cardinality is bounded: per credential, the first `label_cap` consumers to read it
(in the order they first read, so a consumer keeps its label for the life of the process)
have a `consumer` label of their own; every other one is summed into `consumer="other"`
(reads added up, the latest last read). Counters stay monotonic: the set summed into
`other` only grows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from keyturn.observability import catalog
from keyturn.usage.audit import SKIP_REASONS
from keyturn.usage.tracker import OTHER, UsageTracker

# Names and help texts are the metrics contract's (keyturn.observability.catalog, docs/metrics.md).
READS = catalog.CONSUMER_READS.name
LAST_READ = catalog.CONSUMER_LAST_READ.name
CONSUMERS = catalog.CONSUMERS.name
SKIPPED = catalog.USAGE_LINES_SKIPPED.name
SOURCE_UP = catalog.USAGE_SOURCE_UP.name
HELP = {spec.name: spec.help for spec in catalog.USAGE}


class CountingSource(Protocol):
    """What the collector reads of a source (`FileAuditSource`, `SocketAuditSource`)."""

    @property
    def up(self) -> bool: ...

    @property
    def skipped(self) -> Counter[str]: ...


class UsageCollector(Collector):
    """Register with the daemon's registry: `registry.register(UsageCollector(tracker,
    lambda: sources))`."""

    def __init__(
        self,
        tracker: UsageTracker,
        sources: Callable[[], Sequence[CountingSource]],
        *,
        label_cap: int = 20,
    ) -> None:
        self._tracker = tracker
        self._sources = sources
        self.label_cap = label_cap

    def describe(self) -> Iterable[Metric]:
        return list(_families())

    def collect(self) -> Iterable[Metric]:
        reads, last_read, consumers, skipped, up = _families()
        tracker = self._tracker
        for credential in sorted(tracker.credentials()):
            rest_reads, rest_last = 0, None
            for index, usage in enumerate(tracker.usage_of(credential)):
                if index < self.label_cap and usage.consumer != OTHER:
                    labels = [credential, usage.consumer]
                    reads.add_metric(labels, usage.reads)
                    last_read.add_metric(labels, usage.last_read)
                else:
                    rest_reads += usage.reads
                    last = usage.last_read
                    rest_last = last if rest_last is None else max(rest_last, last)
            if rest_last is not None:
                reads.add_metric([credential, OTHER], rest_reads)
                last_read.add_metric([credential, OTHER], rest_last)
            consumers.add_metric([credential], tracker.consumer_count(credential))
        sources = list(self._sources())
        total: Counter[str] = Counter()
        for source in sources:
            total.update(dict(source.skipped))
        for reason in SKIP_REASONS:
            skipped.add_metric([reason], total.get(reason, 0))
        if sources:
            up.add_metric([], float(all(source.up for source in sources)))
        return [reads, last_read, consumers, skipped, up]


def _families() -> tuple[
    CounterMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
    CounterMetricFamily,
    GaugeMetricFamily,
]:
    return (
        CounterMetricFamily(READS, HELP[READS], labels=("credential", "consumer")),
        GaugeMetricFamily(LAST_READ, HELP[LAST_READ], labels=("credential", "consumer")),
        GaugeMetricFamily(CONSUMERS, HELP[CONSUMERS], labels=("credential",)),
        CounterMetricFamily(SKIPPED, HELP[SKIPPED], labels=("reason",)),
        GaugeMetricFamily(SOURCE_UP, HELP[SOURCE_UP]),
    )
