"""`PrometheusObserver`: every metric of docs/metrics.md, fed by the events of `keyturn.events`.

Counters and histograms are ordinary prometheus_client metrics. Per-credential gauges and the
Vault token gauges are computed when Prometheus scrapes, from state the observer keeps: so
`keyturn_credential_ready` drops to 0 the moment a token expires even if nothing else happens,
a value never seen is absent rather than a misleading 0, and `forget` removes every series of
a credential at once. The scrape may run on another thread (the HTTP server renders off the
event loop), so that state is guarded by a lock and copied before it is rendered.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.registry import Collector

import keyturn
from keyturn.clock import Clock
from keyturn.events import (
    Event,
    Failed,
    Probed,
    Published,
    Restored,
    RotationDuration,
    RotationPlanned,
    RotationStep,
    Scheduled,
    Suspicious,
    TokenRequest,
)
from keyturn.observability import catalog as c
from keyturn.observability.catalog import MetricSpec, bounded
from keyturn.observability.health import value_ready


@dataclass(frozen=True, slots=True)
class CredentialMetrics:
    """What the observer knows about one credential (epoch seconds; None: not known yet)."""

    provider: str
    kind: str
    issued_at: float | None = None
    expires_at: float | None = None
    next_scheduled: float | None = None
    last_success: float | None = None
    failures: int = 0
    rotate_after: float | None = None

    def ready(self, now: float) -> bool:
        """The same rule as readiness (`keyturn_credential_ready`)."""
        return value_ready(self.kind, self.issued_at, self.expires_at, now)


def _family(spec: MetricSpec) -> GaugeMetricFamily:
    return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)


class _StateCollector(Collector):
    """Renders the observer's per-credential and Vault-token state at scrape time."""

    def __init__(self, observer: PrometheusObserver) -> None:
        self._observer = observer
        # Set while `exposition` renders the registry: the state is then rendered apart.
        self._apart = threading.local()

    def describe(self) -> Iterable[Metric]:
        return [
            *(_family(spec) for spec in _STATE_SPECS),
            *(
                CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
                for spec in _COUNTER_SPECS
            ),
        ]

    def collect(self) -> Iterable[Metric]:
        if getattr(self._apart, "on", False):
            return []
        credentials, vault, heartbeat, now = self._observer.snapshot()
        families = {spec.name: _family(spec) for spec in _STATE_SPECS}
        for name, values in _state_rows(credentials, now):
            m = credentials[name]
            labels = [name, m.provider, m.kind]
            for spec, value in values:
                families[spec.name].add_metric(labels, value)
        for spec, value in _process_rows(vault, heartbeat, now):
            families[spec.name].add_metric([], value)
        counters = []
        for spec, series in _counter_rows(self._observer.counts()):
            family = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
            for label_values, value in series:
                family.add_metric(list(label_values), value)
            counters.append(family)
        return [*families.values(), *counters]

    @contextmanager
    def rendered_apart(self) -> Iterator[None]:
        self._apart.on = True
        try:
            yield
        finally:
            self._apart.on = False


def _state_rows(
    credentials: Mapping[str, CredentialMetrics], now: float
) -> Iterator[tuple[str, list[tuple[MetricSpec, float]]]]:
    """Each credential's gauges that have a value, by credential name."""
    for name in sorted(credentials):
        m = credentials[name]
        values = (
            (c.EXPIRY, m.expires_at),
            (c.ISSUED, m.issued_at),
            (c.NEXT_SCHEDULED, m.next_scheduled),
            (c.LAST_SUCCESS, m.last_success),
            (c.READY, float(m.ready(now))),
            (c.FAILURES, float(m.failures)),
            (c.ROTATE_AFTER, m.rotate_after),
        )
        yield name, [(spec, value) for spec, value in values if value is not None]


def _process_rows(
    vault: tuple[float | None, bool], heartbeat: float | None, now: float
) -> list[tuple[MetricSpec, float]]:
    """The Vault token's and the heartbeat's gauges."""
    expires_at, authenticated = vault
    rows: list[tuple[MetricSpec, float]] = []
    if expires_at is not None:
        rows.append((c.VAULT_TOKEN_EXPIRY, expires_at))
    working = authenticated and (expires_at is None or now < expires_at)
    rows.append((c.VAULT_AUTHENTICATED, float(working)))
    if heartbeat is not None:
        rows.append((c.HEARTBEAT, heartbeat))
    return rows


def _counter_rows(
    counts: Mapping[str, Mapping[tuple[str, ...], float]],
) -> Iterator[tuple[MetricSpec, list[tuple[tuple[str, ...], float]]]]:
    """Each per-credential counter with its series, by label values."""
    for spec in _COUNTER_SPECS:
        yield spec, sorted(counts[spec.name].items())


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value))


# Counters with a `credential` label: kept by the observer and rendered like the gauges.
_COUNTER_SPECS = (c.TOKEN_REQUESTS, c.PROBE_REQUESTS, c.ROTATIONS, c.SUSPICIOUS, c.SINK_WRITES)

_STATE_SPECS = (
    c.EXPIRY,
    c.ISSUED,
    c.NEXT_SCHEDULED,
    c.LAST_SUCCESS,
    c.READY,
    c.FAILURES,
    c.ROTATE_AFTER,
    c.VAULT_TOKEN_EXPIRY,
    c.VAULT_AUTHENTICATED,
    c.HEARTBEAT,
)


class PrometheusObserver:
    """An observer (called with each event of `keyturn.events`) that keeps every keyturn
    metric in `registry`.

    Besides the events it takes what only the daemon knows, as methods: `lateness`,
    `alert_delivery`, `sink_write` (the sinks' `on_result`), `vault_operation` (the Vault
    store's `on_operation`), `vault_token`, `heartbeat` and `credentials_configured`.
    Label words outside their bounded sets are exposed as `other`; nothing here ever receives
    a secret.
    """

    def __init__(self, registry: CollectorRegistry, clock: Clock) -> None:
        # `_created` series would double the series count for nothing Prometheus uses.
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self._clock = clock
        self._lock = threading.Lock()
        self._credentials: dict[str, CredentialMetrics] = {}
        self._vault_token: tuple[float | None, bool] = (None, False)
        self._heartbeat: float | None = None
        self._heartbeat_monotonic: float | None = None
        # Every (counter name, label values) series of each credential, for `forget`.
        self._series: dict[str, set[tuple[str, tuple[str, ...]]]] = {}

        def counter(spec: MetricSpec) -> Counter:
            return Counter(spec.name, spec.help, spec.labels, registry=registry)

        def histogram(spec: MetricSpec) -> Histogram:
            return Histogram(
                spec.name, spec.help, spec.labels, registry=registry, buckets=spec.buckets
            )

        # Per-credential counters are kept here, not in prometheus_client (see `exposition`).
        self._token_requests = c.TOKEN_REQUESTS
        self._probes = c.PROBE_REQUESTS
        self._rotations = c.ROTATIONS
        self._suspicious = c.SUSPICIOUS
        self._sink_writes = c.SINK_WRITES
        self._counts: dict[str, dict[tuple[str, ...], float]] = {
            spec.name: {} for spec in _COUNTER_SPECS
        }
        self._vault_operations = counter(c.VAULT_OPERATIONS_TOTAL)
        self._alert_deliveries = counter(c.ALERT_DELIVERIES)
        self._token_duration = histogram(c.TOKEN_REQUEST_DURATION)
        self._vault_duration = histogram(c.VAULT_OPERATION_DURATION)
        self._rotation_duration = histogram(c.ROTATION_DURATION)
        self._lateness = histogram(c.SCHEDULE_LATENESS)
        build = Gauge(c.BUILD_INFO.name, c.BUILD_INFO.help, c.BUILD_INFO.labels, registry=registry)
        build.labels(keyturn.__version__, platform.python_version()).set(1)
        self._credentials_configured = Gauge(
            c.CREDENTIALS.name, c.CREDENTIALS.help, registry=registry
        )
        self._registry = registry
        self._state = _StateCollector(self)
        self._label_texts: dict[tuple[str, str, str], str] = {}
        registry.register(self._state)

    # -- the events (`keyturn.events`) ----------------------------------------------------------

    def __call__(self, event: Event) -> None:
        match event:
            case TokenRequest(credential, provider, grant_type, outcome, seconds):
                grant = bounded(grant_type, c.GRANT_TYPES)
                labels = (credential, provider, grant, bounded(outcome, c.TOKEN_OUTCOMES))
                self._count(credential, self._token_requests, labels)
                self._token_duration.labels(provider, grant).observe(max(0.0, seconds))
            case Published(credential, provider, kind, issued_at, expires_at):
                now = self._clock.time()
                self._value(credential, provider, kind, issued_at, expires_at, now, 0)
            case Restored(credential, provider, kind, issued_at, expires_at, last_success, n):
                # After a restart, or on an instance that did not do the last refresh, nothing
                # is published while values are valid, yet their expiry and readiness must be
                # exposed: this sets them without claiming a success now.
                self._value(credential, provider, kind, issued_at, expires_at, last_success, n)
            case Scheduled(credential, provider, kind, due):
                self._update(credential, provider, kind, next_scheduled=due)
            case Failed(credential, provider, kind, _error, failures):
                self._update(credential, provider, kind, failures=max(0, failures))
            case Suspicious(credential, provider, detector, severity, _detail):
                # keyturn's own trouble (its Vault token) is labelled with empty names.
                name = credential or ""
                detected = (bounded(detector, c.DETECTORS), bounded(severity, c.SEVERITIES))
                self._count(name, self._suspicious, (name, provider or "", *detected))
            case RotationStep(credential, provider, kind, result):
                labels = (
                    credential,
                    provider,
                    bounded(kind, c.KINDS),
                    bounded(result, c.ROTATION_RESULTS),
                )
                self._count(credential, self._rotations, labels)
            case RotationPlanned(credential, provider, kind, at):
                self._update(credential, provider, kind, rotate_after=at)
            case RotationDuration(provider, kind, seconds):
                self._rotation_duration.labels(provider, bounded(kind, c.KINDS)).observe(
                    max(0.0, seconds)
                )
            case Probed(credential, provider, status):
                result = c.probe_result(status)
                self._count(credential, self._probes, (credential, provider, result))

    # -- what only the daemon knows -------------------------------------------------------------

    def lateness(self, seconds: float) -> None:
        """A job ran `seconds` after its planned time."""
        self._lateness.observe(max(0.0, seconds))

    def alert_delivery(self, hook: str, result: str) -> None:
        self._alert_deliveries.labels(hook, bounded(result, c.ALERT_RESULTS)).inc()

    def sink_write(self, credential: str, result: str) -> None:
        """One local sink of `credential` brought up to date, or not (`keyturn.sinks`)."""
        self._count(credential, self._sink_writes, (credential, bounded(result, c.SINK_RESULTS)))

    def vault_operation(self, operation: str, result: str, seconds: float) -> None:
        """One Vault call; fits `VaultStore(on_operation=...)`."""
        op = bounded(operation, c.OPERATIONS)
        self._vault_operations.labels(op, bounded(result, c.OPERATION_RESULTS)).inc()
        self._vault_duration.labels(op).observe(max(0.0, seconds))

    def vault_token(self, expires_at: float | None, authenticated: bool) -> None:
        """keyturn's own Vault token: when it expires (None: never) and whether it works.
        It also counts as not authenticated once `expires_at` has passed."""
        with self._lock:
            self._vault_token = (expires_at, authenticated)

    def heartbeat(self) -> None:
        """The scheduler loop is alive now."""
        with self._lock:
            self._heartbeat = self._clock.time()
            self._heartbeat_monotonic = self._clock.monotonic()

    @property
    def last_heartbeat(self) -> float | None:
        """Wall time of the last beat (the exported timestamp)."""
        return self._heartbeat

    @property
    def last_heartbeat_monotonic(self) -> float | None:
        """Monotonic time of the last beat: what liveness measures ages with, so a wall-clock
        step never makes the loop look stalled or gives a negative age."""
        return self._heartbeat_monotonic

    def credentials_configured(self, count: int) -> None:
        self._credentials_configured.set(count)

    def forget(self, credential: str) -> None:
        """Drop every series of a credential that is no longer configured."""
        with self._lock:
            self._credentials.pop(credential, None)
            for name, labels in self._series.pop(credential, set()):
                self._counts[name].pop(labels, None)
            self._label_texts = {k: v for k, v in self._label_texts.items() if k[0] != credential}

    # -- reading --------------------------------------------------------------------------------

    def credential(self, name: str) -> CredentialMetrics | None:
        with self._lock:
            return self._credentials.get(name)

    def snapshot(
        self,
    ) -> tuple[dict[str, CredentialMetrics], tuple[float | None, bool], float | None, float]:
        """(credentials, vault token, last heartbeat, now), consistent with each other."""
        with self._lock:
            return dict(self._credentials), self._vault_token, self._heartbeat, self._clock.time()

    def counts(self) -> dict[str, dict[tuple[str, ...], float]]:
        """The per-credential counters: counter name -> label values -> count (a copy)."""
        with self._lock:
            return {name: dict(series) for name, series in self._counts.items()}

    def exposition(self, openmetrics: bool = False) -> bytes:
        """The registry in Prometheus' text format (or OpenMetrics), as prometheus_client
        renders it, except the per-credential gauges, which are written here: the library
        escapes and validates every label name of every sample (0.9 s a scrape at 10,000
        credentials), while these label names are fixed and each credential's label text is
        made once."""
        with self._state.rendered_apart():
            body = (openmetrics_latest if openmetrics else generate_latest)(self._registry)
        state = self._state_text(openmetrics)
        if openmetrics:
            return body.removesuffix(b"# EOF\n") + state + b"# EOF\n"
        return body + state

    # -- internals ------------------------------------------------------------------------------

    def _state_text(self, openmetrics: bool) -> bytes:
        credentials, vault, heartbeat, now = self.snapshot()
        lines: dict[str, list[str]] = {spec.name: [] for spec in _STATE_SPECS}
        for name, values in _state_rows(credentials, now):
            labels = self._label_text(name, credentials[name])
            for spec, value in values:
                lines[spec.name].append(f"{spec.name}{{{labels}}} {_number(value)}\n")
        for spec, value in _process_rows(vault, heartbeat, now):
            lines[spec.name].append(f"{spec.name} {_number(value)}\n")
        out: list[str] = []
        for spec in _STATE_SPECS:
            out.append(f"# HELP {spec.name} {_escape_help(spec.help)}\n")
            out.append(f"# TYPE {spec.name} gauge\n")
            out.extend(lines[spec.name])
        for spec, series in _counter_rows(self.counts()):
            # OpenMetrics names the family without `_total`; the samples keep it.
            family = spec.name.removesuffix("_total") if openmetrics else spec.name
            out.append(f"# HELP {family} {_escape_help(spec.help)}\n")
            out.append(f"# TYPE {family} counter\n")
            for label_values, value in series:
                text = ",".join(
                    f'{label}="{_escape_label(v)}"'
                    for label, v in zip(spec.labels, label_values, strict=True)
                )
                out.append(f"{spec.name}{{{text}}} {_number(value)}\n")
        return "".join(out).encode()

    def _label_text(self, name: str, m: CredentialMetrics) -> str:
        key = (name, m.provider, m.kind)
        text = self._label_texts.get(key)
        if text is None:
            text = ",".join(
                f'{label}="{_escape_label(value)}"'
                for label, value in zip(c.CREDENTIAL_LABELS, key, strict=True)
            )
            self._label_texts[key] = text
        return text

    def _value(
        self,
        credential: str,
        provider: str,
        kind: str,
        issued_at: float | None,
        expires_at: float | None,
        last_success: float | None,
        failures: int,
    ) -> None:
        """The value apps read (for an API key `expires_at` is its rotate-after time)."""
        self._update(
            credential,
            provider,
            kind,
            issued_at=issued_at,
            expires_at=expires_at,
            last_success=last_success,
            failures=max(0, failures),
        )

    def _update(self, credential: str, provider: str, kind: str, **changes: Any) -> None:
        with self._lock:
            current = self._credentials.get(credential)
            if current is None:
                current = CredentialMetrics(provider, bounded(kind, c.KINDS))
            self._credentials[credential] = replace(
                current, provider=provider, kind=bounded(kind, c.KINDS), **changes
            )

    def _count(self, credential: str, spec: MetricSpec, labels: tuple[str, ...]) -> None:
        with self._lock:
            counts = self._counts[spec.name]
            counts[labels] = counts.get(labels, 0.0) + 1.0
            self._series.setdefault(credential, set()).add((spec.name, labels))
