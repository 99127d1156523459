"""The usage monitor as the daemon runs it: built from `[usage]`, fed by one audit source, asked
by rotations (`hooks()`) and by `GET /usage` (`view()`); `use_config` follows a reload.

Everything here runs on the event loop's thread, as the tracker requires.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

from keyturn.clock import Clock, rfc3339
from keyturn.config import Config, HttpRotatorConfig
from keyturn.config.credentials import INPUT_REFERENCES
from keyturn.config.schema import UsageSettings
from keyturn.events import Observer
from keyturn.jobs.job import ConsumerHooks, ConsumersOnOld
from keyturn.references import SecretRef
from keyturn.usage.audit import AuditParser, Identity
from keyturn.usage.detectors import DetectorSettings, source_down_alerts
from keyturn.usage.layout import Layout, Watched
from keyturn.usage.metrics import UsageCollector
from keyturn.usage.monitor import UsageMonitor
from keyturn.usage.sources import FileAuditSource, SocketAuditSource
from keyturn.usage.tracker import UsageTracker

# A credential's keys that may hold `vault:` references: keyturn's private inputs.
INPUT_KEYS = INPUT_REFERENCES


def layout_of(config: Config) -> Layout:
    """The paths of `config` the audit stream is read for: each credential's `publish_to` (with
    its `consumers` allow list), keyturn's state records, and the `vault:` references of its
    inputs and of its rotators' admin credentials (a rotator's are named after the first
    credential that uses it)."""
    inputs: list[tuple[str, str, str]] = []
    for credential in config.credentials:
        for key in INPUT_KEYS:
            ref = getattr(credential, key)
            if ref is not None and ref.scheme == "vault":
                inputs.append((credential.name, ref.mount, ref.path))
        rotator = config.rotator_of(credential)
        auth = rotator.auth if isinstance(rotator, HttpRotatorConfig) else None
        if isinstance(auth, SecretRef) and auth.scheme == "vault":
            inputs.append((credential.name, auth.mount, auth.path))
    return Layout(
        (Watched(c.name, c.provider, c.publish_to, c.consumers) for c in config.credentials),
        mount=config.vault.mount,
        state_prefix=config.keyturn.state_prefix,
        inputs=inputs,
        namespace=config.vault.namespace or "",
    )


def detector_settings(settings: UsageSettings) -> DetectorSettings:
    return DetectorSettings(
        learning=settings.learning,
        rate_window=settings.rate_window,
        rate_factor=settings.rate_factor,
        rate_floor=settings.rate_floor,
        repeat=settings.repeat,
    )


class UsageService:
    """One audit source, the monitor it feeds, and the metrics collector over both."""

    def __init__(self, config: Config, *, own: Identity, observer: Observer, clock: Clock) -> None:
        settings = config.usage
        if settings is None:
            raise ValueError("the configuration has no [usage] table")
        self.settings = settings
        self._clock = clock
        layout = layout_of(config)
        self.monitor = UsageMonitor(
            layout,
            own=own,
            observer=observer,
            clock=clock,
            settings=detector_settings(settings),
            max_consumers=settings.max_consumers,
        )
        prefix = settings.prefix.encode() if settings.prefix else b""
        self.parser = AuditParser(layout, prefix=prefix)
        told = source_down_alerts(observer, settings.source)
        self.source: FileAuditSource | SocketAuditSource
        if settings.source == "file":
            assert settings.file is not None  # the configuration requires it
            self.source = FileAuditSource(
                settings.file,
                self.parser,
                self.monitor,
                clock=clock,
                position_file=settings.position_file,
                on_up=told,
            )
        else:
            assert settings.socket is not None

            def changed(up: bool, problem: str) -> None:
                if up:  # entries sent while keyturn was not listening are lost
                    self._watched_since = clock.time()
                told(up, problem)

            self.source = SocketAuditSource(
                settings.socket,
                self.parser,
                self.monitor,
                allowed_peers=settings.allowed_networks,
                on_up=changed,
            )
        self.collector = UsageCollector(
            self.monitor.tracker, lambda: [self.source], label_cap=settings.consumer_labels
        )
        self._watched_since = clock.time()
        self._task: asyncio.Task[None] | None = None

    @property
    def tracker(self) -> UsageTracker:
        return self.monitor.tracker

    # -- life --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Starts reading: never fails (a source it cannot read is reported down, and tried
        again)."""
        if isinstance(self.source, FileAuditSource):
            with contextlib.suppress(Exception):  # `run` reports and retries whatever fails
                self.source.poll()  # opens the file now, before the first job runs
            self._task = asyncio.create_task(self.source.run(), name="usage-file-source")
        else:
            await self.source.start()

    async def stop(self) -> None:
        """Stops reading; the file source saves its position."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if isinstance(self.source, SocketAuditSource):
            await self.source.stop()
        elif task is None:
            self.source.close()

    def use_config(self, config: Config) -> None:
        """A reload: the credentials' paths, inputs and allow lists of `config`."""
        layout = layout_of(config)
        self.parser.use_layout(layout)
        self.monitor.use_layout(layout)

    # -- what jobs ask -----------------------------------------------------------------------

    def hooks(self) -> ConsumerHooks:
        return ConsumerHooks(waiting_for=self.waiting_for, published=self.published)

    def waiting_for(
        self, credential: str, old_version: int, window: float, now: float
    ) -> ConsumersOnOld:
        """The consumers still on `old_version` (see `UsageTracker.waiting_for`), and why
        others cannot be ruled out: the source is down, or keyturn has not read the audit log
        for the whole `window`."""
        tracker = self.tracker
        names = tracker.waiting_for(credential, old_version, window, now)
        unsure: str | None = None
        since = max(tracker.observed_since, self._watched_since)
        if not self.source.up:
            unsure = f"the {self.source.kind} audit source cannot be read ({self.source.problem})"
        elif since > now - window:
            unsure = (
                f"keyturn has read Vault's audit log only since {rfc3339(since)}, less than "
                "consumer_window"
            )
        return ConsumersOnOld(names, unsure)

    def published(self, credential: str, version: int) -> None:
        self.tracker.set_current(credential, version)

    # -- what `keyturn usage` and `keyturn status` read ----------------------------------------

    def view(self, names: Iterable[str] | None = None, *, summary: bool = False) -> dict[str, Any]:
        """A JSON view for `GET /usage`: per credential (the ones named, or every configured
        one) its current version, how many consumers read it and, unless `summary`, each
        consumer's reads, first and last read, last version read and whether that is current.
        Identities, versions and times only: no address, no value."""
        tracker = self.tracker
        chosen: Sequence[str] = (
            list(self.monitor.layout.credentials) if names is None else list(names)
        )
        credentials = []
        for name in chosen:
            view = tracker.consumers(name)
            entry: dict[str, Any] = {
                "credential": name,
                "current_version": view.current_version,
                "consumer_count": tracker.consumer_count(name),
            }
            if not summary:
                entry["consumers"] = [
                    {
                        "consumer": c.consumer,
                        "reads": c.reads,
                        "first_read": rfc3339(c.first_read),
                        "last_read": rfc3339(c.last_read),
                        "last_version": c.last_version,
                        "current": c.current,
                    }
                    for c in view.consumers
                ]
            credentials.append(entry)
        source = self.source
        return {
            "observed_since": rfc3339(max(tracker.observed_since, self._watched_since)),
            "source": {"kind": source.kind, "up": source.up, "problem": source.problem},
            "credentials": credentials,
        }
