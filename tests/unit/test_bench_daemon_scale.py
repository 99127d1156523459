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
from keyturn.observability import PrometheusObserver

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
