"""Events are values: `Observers` hands each to every observer (a callable), and one observer's
bug never keeps an event from the others."""

from __future__ import annotations

import dataclasses
import io
import json
import logging

import pytest
import structlog

from keyturn.events import Event, LoggingObserver, Observers, Probed, Published, Scheduled
from keyturn.logs import configure_logging
from keyturn.testing.observer import RecordingObserver

T0 = 1_800_000_000.0


def test_every_observer_gets_every_event_in_order() -> None:
    first, second = RecordingObserver(), RecordingObserver()
    fan_out = Observers(first)
    fan_out.add(second)
    events: list[Event] = [
        Scheduled("c", "p", "oauth_client", T0),
        Published("c", "p", "oauth_client", T0, T0 + 60),
    ]
    for event in events:
        fan_out(event)
    assert first.events == second.events == events
    assert second.of(Published) == [events[1]]


def test_a_failing_observer_does_not_stop_the_others() -> None:
    stream = io.StringIO()
    configure_logging("debug", stream=stream)
    recorder = RecordingObserver()

    def broken(event: Event) -> None:
        raise RuntimeError("observer bug")

    try:
        Observers(broken, recorder)(Probed("c", "p", 200))
    finally:
        logging.getLogger().handlers.clear()
        structlog.reset_defaults()
    assert recorder.events == [Probed("c", "p", 200)]
    [line] = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert (line["event"], line["observer"], line["event_type"]) == (
        "observer.failed",
        "test_a_failing_observer_does_not_stop_the_others.<locals>.broken",
        "Probed",
    )


def test_events_are_frozen_values() -> None:
    event = Published("c", "p", "oauth_client", T0, T0 + 60)
    assert event == Published("c", "p", "oauth_client", T0, T0 + 60)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.credential = "other"  # type: ignore[misc]


@pytest.mark.parametrize(("level", "logged"), [("debug", True), ("info", False)])
def test_debug_events_are_logged_only_at_debug(level: str, logged: bool) -> None:
    stream = io.StringIO()
    configure_logging(level, stream=stream, fmt="json")
    try:
        observer = LoggingObserver()
        observer(Scheduled("c", "p", "oauth_client", T0))
        observer(Published("c", "p", "oauth_client", T0, T0 + 60))
    finally:
        logging.getLogger().handlers.clear()
        structlog.reset_defaults()
    events = [json.loads(text)["event"] for text in stream.getvalue().splitlines()]
    assert events == (["credential.scheduled"] if logged else []) + ["credential.published"]
