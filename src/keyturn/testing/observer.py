"""An observer for unit tests that records every event it is told about."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from keyturn.events import Event

E = TypeVar("E", bound=Event)


@dataclass
class RecordingObserver:
    """Keeps every event in `events`, in order."""

    events: list[Event] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[E]) -> list[E]:
        """Every event of type `kind`, in order."""
        return [event for event in self.events if isinstance(event, kind)]
