"""The audit-stream detectors, driven through UsageMonitor with a FakeClock."""

from __future__ import annotations

import pytest

from keyturn.clock import FakeClock
from keyturn.events import Suspicious
from keyturn.testing.observer import RecordingObserver
from keyturn.usage.audit import AuditParser, AuditRead, AuditWrite, Identity
from keyturn.usage.detectors import MAX_REMEMBERED, DetectorSettings, allowed
from keyturn.usage.layout import Layout, Watched
from keyturn.usage.monitor import UsageMonitor
from keyturn_devkit.dev.audit import Reader, line, read_entries, write_entries

T0 = 1_800_000_000.0
HOUR = 3600.0
OWN = Identity(frozenset({"approle/keyturn"}), frozenset({"e-keyturn"}))
KEYTURN = Reader(role="keyturn", entity_id="e-keyturn")
PUBLISHED = "apps/app1/acme"


def layout(consumers: tuple[str, ...] | None = None) -> Layout:
    return Layout(
        [Watched("app1", "acme", PUBLISHED, consumers)],
        inputs=[("app1", "secret", "keyturn/inputs/app1")],
    )


class World:
    def __init__(self, consumers: tuple[str, ...] | None = None, **settings: float) -> None:
        self.clock = FakeClock(T0)
        self.observer = RecordingObserver()
        self.layout = layout(consumers)
        self.parser = AuditParser(self.layout)
        self.monitor = UsageMonitor(
            self.layout,
            own=OWN,
            observer=self.observer,
            clock=self.clock,
            settings=DetectorSettings(**settings),  # type: ignore[arg-type]
        )

    def feed(self, text: bytes) -> None:
        entry = self.parser.parse(text)
        assert isinstance(entry, AuditRead | AuditWrite), entry
        self.monitor(entry)

    def read(
        self,
        reader: Reader,
        path: str = PUBLISHED,
        *,
        at: float | None = None,
        version: int = 1,
        allowed: bool = True,
    ) -> None:
        when = self.clock.time() if at is None else at
        self.feed(line(read_entries(reader, path, at=when, version=version, allowed=allowed)[1]))

    def write(self, reader: Reader, version: int, path: str = PUBLISHED) -> None:
        self.feed(line(write_entries(reader, path, at=self.clock.time(), version=version)[1]))

    def alerts(self) -> list[tuple[str, str | None, str]]:
        return [(s.detector, s.credential, s.severity) for s in self.observer.of(Suspicious)]


APP1 = Reader(role="app1", entity_id="e-app1", remote_address="10.0.0.5")
INTRUDER = Reader(display_name="token-laptop", remote_address="192.168.9.9")


# -- unexpected_reader -----------------------------------------------------------------------


def test_a_reader_outside_the_allow_list_is_critical_at_once() -> None:
    world = World(consumers=("approle/app1",))
    world.read(APP1)
    assert world.alerts() == []
    world.read(INTRUDER, version=4)
    (event,) = world.observer.of(Suspicious)
    assert (event.detector, event.credential, event.provider, event.severity) == (
        "unexpected_reader",
        "app1",
        "acme",
        "critical",
    )
    assert event.detail == (
        'published value read by "token-laptop" from 192.168.9.9 (version 4), '
        "which is not in the credential's consumers"
    )


def test_the_allow_list_takes_patterns_and_entity_ids() -> None:
    assert allowed(("kubernetes-prod-*",), "kubernetes-prod-api/reader", "")
    assert allowed(("e-7",), "anything", "e-7")
    assert not allowed(("e-7",), "anything", "")
    assert not allowed(("approle/app1",), "approle/app10", "")


def test_keyturns_own_reads_are_neither_counted_nor_checked() -> None:
    world = World(consumers=("approle/app1",))
    world.read(KEYTURN)
    world.read(KEYTURN, "keyturn/state/app1")
    world.read(KEYTURN, "keyturn/inputs/app1")
    assert world.alerts() == []
    assert world.monitor.tracker.consumer_count("app1") == 0


def test_without_an_allow_list_new_readers_are_learned_then_reported() -> None:
    world = World(learning=HOUR)
    world.read(APP1)
    world.clock.advance(HOUR)
    world.read(APP1)
    assert world.alerts() == []
    world.read(INTRUDER)
    world.read(INTRUDER)  # known from now on
    assert world.alerts() == [("unexpected_reader", "app1", "warning")]


def test_a_refused_read_of_a_published_path_is_not_a_consumer() -> None:
    world = World(consumers=("approle/app1",))
    world.read(INTRUDER, allowed=False)
    assert world.alerts() == []
    assert world.monitor.tracker.consumer_count("app1") == 0


# -- unusual_usage ---------------------------------------------------------------------------


def test_a_burst_far_above_the_consumers_baseline_is_reported_once() -> None:
    world = World(learning=HOUR, rate_window=300, rate_factor=10, rate_floor=20)
    for _ in range(24):  # two hours of 2 reads per 5 minutes
        world.read(APP1)
        world.read(APP1)
        world.clock.advance(300)
    assert world.alerts() == []
    baseline = world.monitor.tracker.usage_of("app1")[0].baseline
    assert 1.5 < baseline <= 2.0
    for _ in range(20):
        world.read(APP1)
    assert world.alerts() == []  # 20 is the floor: not above it
    for _ in range(30):
        world.read(APP1)
    assert world.alerts() == [("unusual_usage", "app1", "warning")]
    assert "read the published value 21 times in 300s (usually 1." in (
        world.observer.of(Suspicious)[0].detail
    )


def test_the_rate_follows_the_entries_times_so_a_replayed_backlog_is_no_burst() -> None:
    world = World(learning=0, rate_window=300, rate_floor=20)
    for i in range(200):  # 200 reads spread over 200 minutes, handed over at once
        world.read(APP1, at=T0 - 12_000 + i * 60)
    assert world.alerts() == [("unexpected_reader", "app1", "warning")]  # its first read only


def test_a_known_consumer_reading_from_a_new_network_is_reported_after_learning() -> None:
    world = World(learning=HOUR)
    world.read(APP1)
    world.read(Reader(role="app1", entity_id="e-app1", remote_address="10.0.1.5"))  # learning
    world.clock.advance(HOUR)
    world.read(Reader(role="app1", entity_id="e-app1", remote_address="10.0.0.77"))  # same /24
    assert world.alerts() == []
    world.read(Reader(role="app1", entity_id="e-app1", remote_address="172.16.0.1"))
    assert world.alerts() == [("unusual_usage", "app1", "warning")]
    assert "from a new address 172.16.0.1" in world.observer.of(Suspicious)[0].detail


def test_new_network_reports_can_be_turned_off() -> None:
    world = World(learning=0, new_network_alerts=False)
    world.read(APP1)
    world.read(Reader(role="app1", entity_id="e-app1", remote_address="172.16.0.1"))
    assert world.alerts() == [("unexpected_reader", "app1", "warning")]  # the first read only


# -- private_state_read ----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["keyturn/state/app1", "keyturn/inputs/app1"])
def test_a_read_of_keyturns_private_paths_by_anyone_else_is_critical(path: str) -> None:
    world = World()  # even while learning
    world.read(APP1, path)
    (event,) = world.observer.of(Suspicious)
    assert (event.detector, event.credential, event.severity) == (
        "private_state_read",
        "app1",
        "critical",
    )
    assert f'secret/{path} read by "approle/app1" from 10.0.0.5' in event.detail


def test_a_refused_attempt_on_keyturns_state_is_a_warning() -> None:
    world = World()
    world.read(INTRUDER, "keyturn/state/app1", allowed=False)
    (event,) = world.observer.of(Suspicious)
    assert (event.detector, event.severity) == ("private_state_read", "warning")
    assert event.detail.startswith("refused read of keyturn's state record")


def test_a_state_record_of_an_unknown_credential_names_no_provider() -> None:
    world = World()
    world.read(INTRUDER, "keyturn/state/removed")
    (event,) = world.observer.of(Suspicious)
    assert (event.credential, event.provider) == ("removed", None)


# -- published_path_written ------------------------------------------------------------------


def test_a_write_by_someone_else_is_critical_and_keyturns_own_only_moves_the_version() -> None:
    world = World()
    world.write(KEYTURN, 5)
    assert world.alerts() == []
    assert world.monitor.tracker.current_version("app1") == 5
    world.write(INTRUDER, 6)
    (event,) = world.observer.of(Suspicious)
    assert (event.detector, event.severity) == ("published_path_written", "critical")
    assert event.detail == (
        'write of published path secret/apps/app1/acme by "token-laptop" from 192.168.9.9 '
        "(version 6) seen in the audit log"
    )
    assert world.monitor.tracker.current_version("app1") == 6


def test_a_metadata_only_change_is_a_warning_and_a_refused_write_nothing() -> None:
    world = World()
    _, response = write_entries(INTRUDER, PUBLISHED, at=T0, version=2)
    response["request"]["path"] = f"secret/metadata/{PUBLISHED}"
    world.feed(line(response))
    refused = dict(response, error="permission denied")
    refused["request"] = dict(response["request"], path=f"secret/data/{PUBLISHED}")
    world.feed(line(refused))
    assert world.alerts() == [("published_path_written", "app1", "warning")]


# -- repeats ---------------------------------------------------------------------------------


def test_repeats_are_reported_once_per_period_per_identity() -> None:
    world = World(consumers=("approle/app1",), repeat=HOUR)
    for _ in range(5):
        world.read(INTRUDER)
    world.read(Reader(display_name="token-other"))
    assert len(world.alerts()) == 2
    assert world.monitor.detectors.suppressed == 4
    world.clock.advance(HOUR)
    world.read(INTRUDER)
    assert len(world.alerts()) == 3


def test_the_repeat_memory_is_bounded() -> None:
    world = World(consumers=("approle/app1",), repeat=HOUR)
    for i in range(MAX_REMEMBERED + 10):
        world.read(Reader(display_name=f"token-{i}"))
    assert len(world.alerts()) == MAX_REMEMBERED + 10
    assert len(world.monitor.detectors._last) <= MAX_REMEMBERED


def test_a_reload_checks_the_new_allow_list_and_forgets_removed_credentials() -> None:
    world = World(consumers=("approle/app1",))
    world.read(APP1)
    assert world.alerts() == []
    narrower = Layout([Watched("app1", "acme", PUBLISHED, ("approle/other",))])
    world.parser.use_layout(narrower)
    world.monitor.use_layout(narrower)
    world.read(APP1)
    assert world.alerts() == [("unexpected_reader", "app1", "critical")]
    assert world.monitor.tracker.usage_of("app1")[0].reads == 2  # what was known is kept
    world.monitor.use_layout(Layout([]))
    assert world.monitor.tracker.credentials() == []


def test_a_burst_does_not_hide_a_new_network_of_the_same_consumer() -> None:
    world = World(learning=0, rate_floor=3)
    for _ in range(4):
        world.read(APP1)
    world.read(Reader(role="app1", entity_id="e-app1", remote_address="172.16.0.1"))
    assert world.alerts() == [
        ("unexpected_reader", "app1", "warning"),
        ("unusual_usage", "app1", "warning"),
        ("unusual_usage", "app1", "warning"),
    ]
    assert "from a new address 172.16.0.1" in world.observer.of(Suspicious)[2].detail


def test_an_entity_id_on_the_list_allows_that_entity_only_even_under_a_shared_name() -> None:
    world = World(consumers=("e-ci",))
    world.read(Reader(display_name="token", entity_id="e-ci"))
    world.read(Reader(display_name="token", entity_id="e-ci"))
    assert world.alerts() == []
    world.read(Reader(display_name="token", entity_id="e-other"))  # the same name "token"
    world.read(Reader(display_name="token"))
    assert world.alerts() == [("unexpected_reader", "app1", "critical")]
    assert world.monitor.detectors.suppressed == 1
