"""`UsageMonitor`: what happens to one parsed audit entry (a source's `on_entry`).

keyturn's own entries only note a written version; others' reads of state or inputs are
`private_state_read`; a successful read of a published path is counted then checked; another
identity's change of a published path notes its version and is `published_path_written`.
"""

from __future__ import annotations

from keyturn.clock import Clock
from keyturn.events import Observer
from keyturn.usage.audit import AuditEntry, AuditWrite, Identity
from keyturn.usage.detectors import DetectorSettings, UsageDetectors
from keyturn.usage.layout import Layout
from keyturn.usage.tracker import UsageTracker


class UsageMonitor:
    """Feeds parsed entries to a tracker and the detectors. `own`: keyturn's identity in the
    audit log (`Identity.from_lookup` of its token's `lookup-self`)."""

    def __init__(
        self,
        layout: Layout,
        *,
        own: Identity,
        observer: Observer,
        clock: Clock,
        settings: DetectorSettings | None = None,
        max_consumers: int = 100,
    ) -> None:
        self.layout = layout
        self.own = own
        self.tracker = UsageTracker(layout, clock=clock, max_consumers=max_consumers)
        self.detectors = UsageDetectors(layout, observer=observer, clock=clock, settings=settings)

    def use_layout(self, layout: Layout) -> None:
        """Another configuration (a reload): credentials gone are forgotten, allow lists are
        checked again from the next read; what is known of the others is kept. The source's
        `AuditParser.use_layout` takes the same layout."""
        self.layout = self.tracker.layout = self.detectors.layout = layout
        for name in self.tracker.credentials():
            if name not in layout.credentials:
                self.tracker.forget(name)
                continue
            for usage in self.tracker.usage_of(name):
                usage.allowed = None

    def __call__(self, entry: AuditEntry) -> None:
        mine = self.own.matches(entry.consumer, entry.entity_id)
        if isinstance(entry, AuditWrite):
            self.tracker.written(entry)
            if not mine:
                self.detectors.write(entry)
            return
        if mine:
            return
        if entry.target != "published":
            self.detectors.private(entry)
            return
        if entry.ok:
            usage, new_consumer, new_network = self.tracker.observe(entry)
            self.detectors.read(entry, usage, new_consumer, new_network)
