"""UsageTracker: reads per consumer, versions, the cap, and what a rotation waits for."""

from __future__ import annotations

from keyturn.clock import FakeClock
from keyturn.usage.audit import AuditRead, AuditWrite
from keyturn.usage.layout import Layout, Watched
from keyturn.usage.tracker import OTHER, UsageTracker

T0 = 1_800_000_000.0
LAYOUT = Layout([Watched("app1", "acme", "apps/app1/acme")])


def read(consumer: str, at: float, version: int | None = 1, address: str = "10.0.0.1") -> AuditRead:
    return AuditRead(
        at, "published", "app1", "secret", "apps/app1/acme", consumer, "", address, version, True
    )


def write(version: int, ok: bool = True) -> AuditWrite:
    return AuditWrite(
        T0, "app1", "secret", "apps/app1/acme", "approle/keyturn", "", "", "write", version, ok
    )


def tracker(**kwargs: int) -> UsageTracker:
    return UsageTracker(LAYOUT, clock=FakeClock(T0), **kwargs)  # type: ignore[arg-type]


def test_reads_are_counted_per_consumer_with_the_last_version_and_time() -> None:
    t = tracker()
    t.observe(read("approle/a", T0 + 1, version=1))
    t.observe(read("approle/a", T0 + 5, version=2))
    t.observe(read("approle/b", T0 + 3, version=1))
    view = t.consumers("app1")
    assert [(c.consumer, c.reads, c.last_read, c.last_version) for c in view.consumers] == [
        ("approle/a", 2, T0 + 5, 2),
        ("approle/b", 1, T0 + 3, 1),
    ]
    assert t.consumer_count("app1") == 2


def test_a_read_arriving_late_does_not_move_the_last_read_back() -> None:
    t = tracker()
    t.observe(read("approle/a", T0 + 5, version=2))
    t.observe(read("approle/a", T0 + 1, version=1))
    usage = t.usage_of("app1")[0]
    assert (usage.reads, usage.last_read, usage.last_version) == (2, T0 + 5, 2)


def test_whether_each_consumer_read_the_current_value() -> None:
    t = tracker()
    t.observe(read("approle/a", T0, version=3))
    t.observe(read("approle/b", T0, version=2))
    t.observe(read("approle/c", T0, version=None))
    assert [c.current for c in t.consumers("app1").consumers] == [None, None, None]
    t.written(write(3))
    t.written(write(9, ok=False))  # refused: not published
    view = t.consumers("app1")
    assert view.current_version == 3
    assert {c.consumer: c.current for c in view.consumers} == {
        "approle/a": True,
        "approle/b": False,
        "approle/c": None,
    }
    t.set_current("app1", 2)  # an older version never replaces a newer one
    assert t.current_version("app1") == 3


def test_identities_beyond_the_cap_are_counted_as_other() -> None:
    t = tracker(max_consumers=2)
    results = [t.observe(read(f"approle/{n}", T0)) for n in "abcd"]
    assert [new for _, new, _ in results] == [True, True, False, False]
    usage = t.usage_of("app1")
    assert [(u.consumer, u.reads) for u in usage] == [
        ("approle/a", 1),
        ("approle/b", 1),
        (OTHER, 2),
    ]
    assert t.consumer_count("app1") == 2
    assert usage[-1].networks == ()  # `other` keeps no addresses


def test_a_new_network_is_flagged_for_a_known_consumer_only() -> None:
    t = tracker()
    assert t.observe(read("approle/a", T0, address="10.0.0.1"))[1:] == (True, False)
    assert t.observe(read("approle/a", T0, address="10.0.0.99"))[1:] == (False, False)  # same /24
    assert t.observe(read("approle/a", T0, address="10.0.7.1"))[1:] == (False, True)
    assert t.observe(read("approle/a", T0, address="fd00::1"))[1:] == (False, True)
    assert t.observe(read("approle/a", T0, address="fd00::2"))[1:] == (False, False)  # same /64
    assert t.observe(read("approle/a", T0, address="not-an-ip"))[1:] == (False, True)
    assert t.usage_of("app1")[0].address == "not-an-ip"


def test_the_networks_remembered_are_bounded() -> None:
    t = UsageTracker(LAYOUT, clock=FakeClock(T0), max_networks=3)
    for i in range(10):
        t.observe(read("approle/a", T0, address=f"10.0.{i}.1"))
    assert t.usage_of("app1")[0].networks == ("10.0.7.0/24", "10.0.8.0/24", "10.0.9.0/24")


def test_waiting_for_the_consumers_that_read_the_old_value_within_the_window() -> None:
    t = tracker()
    t.observe(read("approle/moved", T0, version=4))
    t.observe(read("approle/moved", T0 + 50, version=5))
    t.observe(read("approle/stale", T0 + 40, version=4))
    t.observe(read("approle/gone", T0 - 4000, version=4))  # outside the window
    t.observe(read("approle/older", T0 + 10, version=3))
    assert set(t.waiting_for("app1", 4, window=3600, now=T0 + 60)) == {
        "approle/stale",
        "approle/older",
    }
    t.observe(read("approle/stale", T0 + 70, version=5))
    assert t.waiting_for("app1", 4, window=3600, now=T0 + 80) == ("approle/older",)
    assert t.waiting_for("unknown", 4, window=3600, now=T0) == ()


def test_observed_since_goes_back_to_the_first_entry_when_it_is_older() -> None:
    t = tracker()
    assert t.observed_since == T0
    t.observe(read("approle/a", T0 - 30))
    t.observe(read("approle/a", T0 - 90))  # only the first entry moves it
    assert t.observed_since == T0 - 30


def test_snapshot_of_named_credentials_includes_those_never_read() -> None:
    t = tracker()
    t.observe(read("approle/a", T0))
    assert [v.credential for v in t.snapshot()] == ["app1"]
    views = t.snapshot(["app1", "quiet"])
    assert [(v.credential, len(v.consumers)) for v in views] == [("app1", 1), ("quiet", 0)]
