"""bench/provider_recovery.py's pure helpers: what it reads from the sandbox's access log, from
Vault's times and from keyturn's /metrics, and how it counts requests per second."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import CollectorRegistry

from keyturn.clock import FakeClock
from keyturn.events import Published, TokenRequest
from keyturn.observability.metrics import PrometheusObserver
from keyturn.policy import RefreshPolicy

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "provider_recovery.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("provider_recovery", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and annotations look their module up
    spec.loader.exec_module(module)
    return module


def test_parse_time_reads_vaults_nanoseconds_and_the_sandboxs_microseconds(
    bench: ModuleType,
) -> None:
    assert bench.parse_time("1970-01-01T00:00:10.123456789Z") == pytest.approx(10.123456789)
    assert bench.parse_time("1970-01-01T00:00:10.5+00:00") == pytest.approx(10.5)
    assert bench.parse_time("1970-01-01T01:00:00+01:00") == 0.0
    with pytest.raises(ValueError):
        bench.parse_time("yesterday")


def test_token_requests_reads_the_token_route_of_the_access_log(bench: ModuleType) -> None:
    lines = [
        json.dumps({"event": "request", "route": "/oauth/token", "status": 503,
                    "timestamp": "1970-01-01T00:00:02.000000Z"}),
        "sandbox listening on 127.0.0.1:1234",
        json.dumps({"event": "request", "route": "/admin/faults", "status": 200,
                    "timestamp": "1970-01-01T00:00:01.000000Z"}),
        json.dumps({"event": "request", "route": "/oauth/token", "status": 200,
                    "timestamp": "1970-01-01T00:00:01.500000Z"}),
        "{not json",
    ]  # fmt: skip

    assert bench.token_requests("\n".join(lines)) == [(1.5, 200), (2.0, 503)]


def test_the_peak_is_the_busiest_sliding_second_not_a_clock_second(bench: ModuleType) -> None:
    # Clock seconds hold 2 and 2; the window [0.6, 1.6) holds 4.
    times = [0.1, 0.6, 0.9, 1.2, 1.5, 2.5]

    assert bench.per_second(times, 0.0, 3) == [3, 2, 1]
    assert bench.peak_per_second(times, 0.0, 3.0) == 4
    assert bench.peak_per_second(times, 1.0, 3.0) == 2  # only inside [start, end)
    assert bench.peak_per_second([], 0.0, 1.0) == 0


def test_a_phase_counts_by_status_and_per_second(bench: ModuleType) -> None:
    requests = [(0.5, 200), (10.0, 503), (10.2, 503), (10.4, 503), (19.9, 503), (20.0, 200)]

    figures = bench.phase(requests, 10.0, 20.0)

    assert figures.statuses == {503: 4}
    assert figures.total == 4
    assert figures.mean == pytest.approx(0.4)
    assert figures.peak == 3


def test_reached_and_percentile(bench: ModuleType) -> None:
    published = [103.0, 101.0, 102.0, 104.0]

    assert bench.reached(published, 100.0, 4, 1 / 4) == 1.0
    assert bench.reached(published, 100.0, 4, 0.5) == 2.0
    assert bench.reached(published, 100.0, 4, 1.0) == 4.0
    assert bench.reached(published, 100.0, 5, 1.0) is None  # one never came back
    assert bench.percentile([float(v) for v in range(1, 101)], 0.95) == 95.0
    assert math.isnan(bench.percentile([], 0.5))


def test_expired_time_and_its_part_after_the_outage(bench: ModuleType) -> None:
    # Expired at 30 during an outage that ended at 60, published again at 64.
    late = bench.Expired(expired_at=30.0, republished_at=64.0)
    # Published again before its token expired: never expired.
    early = bench.Expired(expired_at=70.0, republished_at=64.0)

    assert (late.seconds(), late.after(60.0)) == (34.0, 4.0)
    assert (early.seconds(), early.after(60.0)) == (0.0, 0.0)


def test_the_default_lifetime_expires_every_token_during_the_outage(bench: ModuleType) -> None:
    for outage in (10.0, 30.0, 60.0, 600.0):
        lifetime = bench.default_lifetime(outage)
        assert lifetime < outage
    assert bench.default_lifetime(60.0) == 45
    # 1,000 credentials refresh at under 50/s before a 60 s outage (margin 5 s).
    assert 1000 / bench.refresh_interval(45, RefreshPolicy(margin=5.0)) < 50


def test_rate_limit_none_means_no_rate_limit(bench: ModuleType) -> None:
    assert bench.rate_limit("none") is None
    assert bench.rate_limit("0") is None
    assert bench.rate_limit("50") == 50.0


def test_gauges_and_counters_read_keyturns_own_exposition(bench: ModuleType) -> None:
    clock = FakeClock(1000.0)
    metrics = PrometheusObserver(CollectorRegistry(), clock)
    metrics(Published("c0", "sandbox", "oauth_client", 990.0, 1030.0))
    metrics(Published("c1", "sandbox", "oauth_client", 960.0, 1000.0))  # expired at 1000
    for outcome in ("success", "http_5xx", "http_5xx"):
        metrics(TokenRequest("c0", "sandbox", "refresh_token", outcome, 0.01))
    metrics(TokenRequest("c1", "sandbox", "client_credentials", "http_5xx", 0.01))
    text = metrics.exposition().decode()

    assert bench.gauges(text, "keyturn_credential_ready") == {"c0": 1.0, "c1": 0.0}
    assert bench.gauges(text, "keyturn_credential_issued_timestamp_seconds") == {
        "c0": 990.0,
        "c1": 960.0,
    }
    assert bench.counter_by(text, "keyturn_token_requests_total", "outcome") == {
        "success": 1.0,
        "http_5xx": 3.0,
    }


def test_lateness_counts_the_runs_between_two_scrapes(bench: ModuleType) -> None:
    metrics = PrometheusObserver(CollectorRegistry(), FakeClock())
    metrics.lateness(0.02)
    before = bench.histogram(metrics.exposition().decode(), bench.LATENESS)
    for seconds in (0.001, 0.05, 0.7, 2.0, 7.0):
        metrics.lateness(seconds)
    after = bench.histogram(metrics.exposition().decode(), bench.LATENESS)

    assert after[math.inf] == 6.0
    # Five runs: two within 0.1 s, one between 0.5 and 1 s, one 2 s and one 7 s late.
    assert bench.lateness_text(before, after) == (
        "5 runs, 40 % within 0.1 s, 2 later than 1 s, 1 later than 5 s; p99 <= 15 s"
    )
    assert bench.lateness_text(after, after) == "no runs"
