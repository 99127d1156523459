"""bench/instances_scale.py reads what keyturn and the sandbox write: the sandbox's token list
(grants and duplicate requests in a window), keyturn's /metrics gauges and its JSON log lines.
Each is produced here by the real code (the sandbox's state, keyturn's observer, membership and
logging), so a change in how either writes them cannot turn the benchmark's figures into zeros
unnoticed."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import io
import logging
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import structlog
from prometheus_client import CollectorRegistry

from keyturn.clock import FakeClock
from keyturn.logs import configure_logging
from keyturn.members import Membership
from keyturn.observability.metrics import PrometheusObserver
from keyturn.policy import RefreshPolicy, refresh_window
from keyturn.testing.vault import FakeVaultStore
from keyturn_devkit.sandbox.config import Settings
from keyturn_devkit.sandbox.state import SandboxState

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "instances_scale.py"
LIFETIME = 180


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("instances_scale", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and annotations look their module up
    spec.loader.exec_module(module)
    return module


def test_token_window_counts_refresh_grants_and_duplicate_requests(bench: ModuleType) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    t0 = clock.time()
    state = SandboxState(Settings(access_token_lifetime=LIFETIME), clock)
    a, _, _ = state.register_app("a", "http://127.0.0.1/cb")
    b, _, _ = state.register_app("b", "http://127.0.0.1/cb")
    c, _, _ = state.register_app("c", "http://127.0.0.1/cb")
    first_a, first_b = state.grant_client_credentials(a), state.grant_client_credentials(b)
    clock.advance(101)  # t0 + 101: a's refresh, in the window
    assert first_a.refresh_token is not None
    state.grant_refresh_token(a, first_a.refresh_token)
    clock.advance(4)  # t0 + 105: b's refresh
    assert first_b.refresh_token is not None
    state.grant_refresh_token(b, first_b.refresh_token)
    clock.advance(15)  # t0 + 120: b asks again, 15 s after its refresh: a duplicate
    state.grant_client_credentials(b)
    clock.advance(30)  # t0 + 150: c's first token (no earlier one to compare with)
    state.grant_client_credentials(c)
    clock.advance(100)  # t0 + 250: after the window
    state.grant_client_credentials(c)
    listing = [token.to_json(clock.time()) for token in state.tokens()]  # as GET /admin/tokens

    counted = bench.token_window(listing, t0 + 90, t0 + 200, LIFETIME / 2)

    assert counted.access == 4
    assert counted.refreshes == 2
    assert (counted.duplicates, counted.clients, counted.closest) == (1, 1, 15.0)
    assert counted.duplicate_share() == "50.000 % of refreshes"


def test_token_window_without_refreshes(bench: ModuleType) -> None:
    counted = bench.token_window([], 0.0, 10.0, 90.0)

    assert (counted.access, counted.refreshes, counted.duplicates) == (0, 0, 0)
    assert counted.closest is None
    assert counted.duplicate_share().startswith("n/a")


def test_gauges_read_from_keyturns_own_exposition(bench: ModuleType) -> None:
    metrics = PrometheusObserver(CollectorRegistry(), FakeClock())
    metrics.membership(3, 667)
    metrics.vault_operation("read", "success", 0.01)
    text = metrics.exposition().decode()

    assert bench.gauge(text, "keyturn_credentials_owned") == 667.0
    assert bench.gauge(text, "keyturn_instances") == 3.0
    assert bench.gauge(text, "keyturn_vault_operations_total") is None  # labelled: not a gauge


def test_add_calls_sums_instances_by_operation_and_result(bench: ModuleType) -> None:
    one = {("read", "success"): 2.0, ("write", "cas_conflict"): 1.0}
    two = {("read", "success"): 3.0, ("write", "success"): 4.0}

    assert bench.add_calls(one, two) == {
        ("read", "success"): 5.0,
        ("write", "cas_conflict"): 1.0,
        ("write", "success"): 4.0,
    }


def test_members_gone_is_found_in_keyturns_json_log(bench: ModuleType) -> None:
    """A survivor's `members.gone`, logged by the real membership code, read back with its time."""
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)

    def member(name: str) -> Membership:
        return Membership(
            store,
            state_prefix="keyturn/state",
            instance_id=name,
            takeover_after=10.0,
            clock=vault,
            host="host",
            pid=1,
        )

    survivor, victim = member("k0"), member("k1")
    stream = io.StringIO("Traceback (most recent call last):\n")
    stream.seek(0, io.SEEK_END)
    configure_logging("info", stream=stream, fmt="json")
    before = time.time()
    try:
        asyncio.run(survivor.join())
        asyncio.run(victim.join())
        asyncio.run(survivor.beat())  # sees k1 alive
        vault.advance(11.0)  # k1 beats no more
        asyncio.run(survivor.beat())
    finally:
        logging.getLogger().handlers.clear()
        structlog.reset_defaults()
    after = time.time()

    gone = bench.first_after(bench.log_events(stream.getvalue(), "members.gone"), before)
    joined = bench.log_events(stream.getvalue(), "members.joined")

    assert gone["instance"] == "k1"
    assert gone["reason"] == "silent"
    assert before - 1 <= gone["at"] <= after + 1  # dated by its `timestamp`, to the microsecond
    assert bench.first_after(joined, before, instance="k1")["at"] <= gone["at"]
    assert bench.first_after(joined, after + 60) == {}  # nothing logged after the test


def test_windows_follow_the_refresh_policy(bench: ModuleType) -> None:
    earliest, latest = refresh_window(0.0, LIFETIME, RefreshPolicy())
    spawned, cold = 1_000.25, 35.0

    first, steady = bench.windows(spawned, cold, LIFETIME, 120.0, now=spawned + cold)

    assert first[0] >= spawned + earliest  # no token issued at the spawn is due before
    assert first[1] >= spawned + cold + latest  # the last token of the cold start is due by then
    assert steady[0] >= max(first[1], spawned + 2 * earliest)  # the second generation
    assert steady[1] - steady[0] == 120.0
    assert all(edge == int(edge) for edge in (*first, *steady))  # the sandbox's whole seconds


def test_windows_open_now_after_a_cold_start_longer_than_the_first_refresh(
    bench: ModuleType,
) -> None:
    now = 1_000.0 + 150.5  # the cold start took longer than the earliest refresh (~101 s)

    first, _ = bench.windows(1_000.0, 150.5, LIFETIME, 120.0, now=now)

    assert now <= first[0] < now + 1


@pytest.mark.parametrize(("text", "seconds"), [("10s", 10.0), ("1m", 60.0), ("2.5", 2.5)])
def test_duration_seconds(bench: ModuleType, text: str, seconds: float) -> None:
    assert bench.duration_seconds(text) == seconds


def test_duration_seconds_refuses_other_units(bench: ModuleType) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        bench.duration_seconds("10 parsecs")
