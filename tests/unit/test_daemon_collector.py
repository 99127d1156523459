"""The daemon keeps what it built at start out of the cyclic collector, and hands it back."""

from __future__ import annotations

import gc

from keyturn.daemon import GC_THRESHOLDS, out_of_the_collector


def test_what_lives_as_long_as_the_daemon_is_kept_out_of_the_collector_until_the_stop() -> None:
    before = gc.get_threshold()
    built_at_start = [{"credential": f"c{i}"} for i in range(100)]
    with out_of_the_collector():
        assert gc.get_freeze_count() >= len(built_at_start)
        assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
