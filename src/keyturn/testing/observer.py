"""An observer for unit tests that records every event it is told about."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RecordingObserver:
    """Takes any observer event (token_request, published, scheduled, failed, suspicious, …)
    and keeps it as `(name, args)` in `calls`."""

    calls: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):
            raise AttributeError(name)

        def record(*args: object) -> None:
            self.calls.append((name, args))

        return record

    def named(self, name: str) -> list[tuple[object, ...]]:
        """The arguments of every `name` event, in order."""
        return [args for call, args in self.calls if call == name]
