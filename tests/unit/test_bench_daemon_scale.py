"""bench/daemon_scale.py counts the daemon's Vault calls from its /metrics text: read here from
what keyturn's own exposition renders, so a change in how it writes the counter cannot turn the
benchmark's figures into zeros unnoticed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import CollectorRegistry

from keyturn.clock import FakeClock
from keyturn.observability.metrics import PrometheusObserver

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "daemon_scale.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("daemon_scale", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and annotations look their module up
    spec.loader.exec_module(module)
    return module


def exposition(calls: list[tuple[str, str]]) -> str:
    metrics = PrometheusObserver(CollectorRegistry(), FakeClock())
    for operation, result in calls:
        metrics.vault_operation(operation, result, 0.01)
    return metrics.exposition().decode()


def test_vault_calls_reads_keyturns_own_exposition(bench: ModuleType) -> None:
    text = exposition(
        [("read", "success")] * 3 + [("read", "not_found"), ("write", "cas_conflict")]
    )

    assert bench.vault_calls(text) == {
        ("read", "success"): 3.0,
        ("read", "not_found"): 1.0,
        ("write", "cas_conflict"): 1.0,
    }


def test_calls_split_divides_the_delta_by_operation_and_names_failures(
    bench: ModuleType,
) -> None:
    before = bench.vault_calls(exposition([("read", "success")] * 4 + [("login", "success")]))
    after = bench.vault_calls(
        exposition(
            [("read", "success")] * 6
            + [("login", "success")]
            + [("write", "success")] * 3
            + [("write", "cas_conflict"), ("renew", "success")]
        )
    )

    # Between the scrapes: 2 reads, 4 writes (one refused), 1 renewal, over 2 credentials.
    assert bench.calls_split(before, after, 2) == (
        "3.5 (read 1, write 2, list 0, read_metadata 0, renew 0.5); "
        "results other than success: cas_conflict 0.5"
    )


def test_calls_split_without_anything_to_divide_by(bench: ModuleType) -> None:
    assert bench.calls_split({}, {("read", "success"): 1.0}, 0).startswith("n/a")


def test_each_cold_start_is_compared_with_the_rounds_around_it(bench: ModuleType) -> None:
    rows = [
        ("credentials", "1000"),
        ("keyturn cold start 1 of 2", "15 s"),
        ("keyturn: spawn -> all published", "30 s"),
        ("after", ""),
    ]
    # Rounds of 10, 20 and 30 s; cold start 1 between the first two, cold start 2 after.
    rounds = [(seconds, 1.0, 0.5, 0.5, 0.0, 1.0) for seconds in (10.0, 20.0, 30.0)]

    shown = bench.baseline_rows(rows, rounds, [15.0, 30.0], 1000)

    names = [name for name, _ in shown]
    assert names == [
        "credentials",
        "baseline round 1: token requests + KV writes",
        "baseline round 2: token requests + KV writes",
        "baseline round 3: token requests + KV writes",
        "keyturn cold start 1 of 2",
        "keyturn: spawn -> all published",
        "ratio keyturn / baseline",
        "after",
    ]
    # 15 / mean(10, 20) = 1.00 and 30 / mean(20, 30) = 1.20: the median is 1.10.
    assert dict(shown)["ratio keyturn / baseline"] == (
        "1.10 (median of 2 cold starts, each against the mean of the baseline rounds before "
        "and after it: 1.00, 1.20)"
    )


def test_one_cold_start_shows_its_ratio_to_each_round(bench: ModuleType) -> None:
    rows = [("keyturn: spawn -> all published", "30 s")]
    rounds = [(seconds, 1.0, 0.5, 0.5, 0.0, 1.0) for seconds in (20.0, 30.0)]

    shown = dict(bench.baseline_rows(rows, rounds, [30.0], 1000))

    assert shown["ratio keyturn / baseline"] == (
        "1.20 (against the mean of the rounds before and after it; per round: 1.50, 1.00)"
    )
