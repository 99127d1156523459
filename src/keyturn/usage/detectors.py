"""Detectors on the audit stream; each reports through `keyturn.events.Suspicious`.

Windows go by the audit entries' own times (a replayed backlog is no burst); only allow-list
violations, private-state reads and out-of-band writes report while learning; each finding
repeats at most once per `repeat`. Detectors, baselines, defaults: docs/usage.md#detectors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from keyturn.clock import Clock
from keyturn.events import Observer, Suspicious
from keyturn.usage.audit import AuditRead, AuditWrite
from keyturn.usage.layout import Layout
from keyturn.usage.tracker import OTHER, ConsumerUsage

UNEXPECTED_READER = "unexpected_reader"
UNUSUAL_USAGE = "unusual_usage"
PRIVATE_STATE_READ = "private_state_read"
PUBLISHED_PATH_WRITTEN = "published_path_written"
USAGE_SOURCE_DOWN = "usage_source_down"
DETECTORS = (
    UNEXPECTED_READER,
    UNUSUAL_USAGE,
    PRIVATE_STATE_READ,
    PUBLISHED_PATH_WRITTEN,
    USAGE_SOURCE_DOWN,
)
MAX_REMEMBERED = 10_000  # repeat-suppression entries kept


@dataclass(frozen=True, slots=True)
class DetectorSettings:
    """The detectors' rules (see the module's table); durations in seconds."""

    learning: float = 86_400.0
    rate_window: float = 300.0
    rate_factor: float = 10.0
    rate_floor: int = 100
    baseline_alpha: float = 0.1
    new_network_alerts: bool = True
    repeat: float = 3_600.0


def allowed(patterns: tuple[str, ...], consumer: str, entity_id: str) -> bool:
    """Whether an identity is in an allow list of labels, `fnmatch` patterns or entity ids."""
    return _by_name(patterns, consumer) or (bool(entity_id) and entity_id in patterns)


def _by_name(patterns: tuple[str, ...], consumer: str) -> bool:
    return any(p == consumer or fnmatchcase(consumer, p) for p in patterns)


class UsageDetectors:
    """The four detectors. keyturn's own operations never reach them (`UsageMonitor` filters
    them out). `suppressed` counts reports held back as repeats."""

    def __init__(
        self,
        layout: Layout,
        *,
        observer: Observer,
        clock: Clock,
        settings: DetectorSettings | None = None,
    ) -> None:
        self.layout = layout
        self.settings = settings or DetectorSettings()
        self.suppressed = 0
        self._observer = observer
        self._clock = clock
        self._learning_until = clock.time() + self.settings.learning
        self._last: dict[tuple[str, str, str, str, str], float] = {}
        self._window = -1

    @property
    def learning(self) -> bool:
        return self._clock.time() < self._learning_until

    def read(
        self, read: AuditRead, usage: ConsumerUsage, new_consumer: bool, new_network: bool
    ) -> None:
        """A consumer's successful read of a published path, as the tracker counted it."""
        learning = self.learning
        watched = self.layout.credentials.get(read.credential)
        patterns = watched.consumers if watched is not None else None
        if patterns is not None:
            # A name on the list is remembered on the consumer's record; an entity id is
            # checked at every read (several identities can share a name).
            if usage.allowed is not True or usage.consumer == OTHER:
                if _by_name(patterns, read.consumer):
                    if usage.consumer != OTHER:
                        usage.allowed = True
                elif not (read.entity_id and read.entity_id in patterns):
                    self._report(
                        UNEXPECTED_READER,
                        read.credential,
                        read.consumer,
                        "critical",
                        f'published value read by "{read.consumer}"{_from(read)}'
                        f"{_version(read.version)}, which is not in the credential's consumers",
                    )
        elif new_consumer and not learning:
            self._report(
                UNEXPECTED_READER,
                read.credential,
                read.consumer,
                "warning",
                f'published value read by a new identity "{read.consumer}"{_from(read)}'
                f"{_version(read.version)}",
            )
        if usage.consumer == OTHER:  # beyond the tracker's cap: no rate or network of its own
            return
        self._rate(read, usage, learning)
        if new_network and not learning and self.settings.new_network_alerts:
            self._report(
                UNUSUAL_USAGE,
                read.credential,
                read.consumer,
                "warning",
                f'"{read.consumer}" read the published value from a new address '
                f"{read.remote_address}",
                rule="network",
            )

    def _rate(self, read: AuditRead, usage: ConsumerUsage, learning: bool) -> None:
        settings = self.settings
        window = int(read.time // settings.rate_window)
        if window == self._window:
            window = self._window  # one int object for every consumer in this window
        else:
            self._window = window
        if window > usage.window:
            if usage.window >= 0:
                alpha = settings.baseline_alpha
                baseline = usage.baseline + alpha * (usage.window_count - usage.baseline)
                idle = min(window - usage.window - 1, 10_000)
                usage.baseline = baseline * (1.0 - alpha) ** idle if idle > 0 else baseline
            usage.window = window
            usage.window_count = 0
        usage.window_count += 1
        if learning:
            return
        limit = max(settings.rate_factor * usage.baseline, float(settings.rate_floor))
        if usage.window_count > limit:
            self._report(
                UNUSUAL_USAGE,
                read.credential,
                read.consumer,
                "warning",
                f'"{read.consumer}" read the published value {usage.window_count} times in '
                f"{settings.rate_window:g}s (usually {usage.baseline:.1f})",
                rule="rate",
            )

    def private(self, read: AuditRead) -> None:
        """A read of keyturn's state record or of an input by someone other than keyturn."""
        what = "state record" if read.target == "state" else "input"
        where = f" from {read.remote_address}" if read.remote_address else ""
        path = f"{read.mount}/{read.path}"
        if read.ok:
            detail = f'keyturn\'s {what} {path} read by "{read.consumer}"{where}'
        else:
            detail = f'refused read of keyturn\'s {what} {path} by "{read.consumer}"{where}'
        severity = "critical" if read.ok else "warning"
        self._report(PRIVATE_STATE_READ, read.credential, read.consumer, severity, detail)

    def write(self, write: AuditWrite) -> None:
        """A change of a published path by someone other than keyturn."""
        if not write.ok:
            return  # refused by Vault: the path did not change
        where = f" from {write.remote_address}" if write.remote_address else ""
        detail = (
            f'{write.action} of published path {write.mount}/{write.path} by "{write.consumer}"'
            f"{where}{_version(write.version)} seen in the audit log"
        )
        severity = "warning" if write.action == "metadata" else "critical"
        self._report(PUBLISHED_PATH_WRITTEN, write.credential, write.consumer, severity, detail)

    def _report(
        self,
        detector: str,
        credential: str,
        consumer: str,
        severity: str,
        detail: str,
        rule: str = "",
    ) -> None:
        """Tells the observer, unless the same finding (detector, severity, `rule`,
        credential, identity) was told less than `repeat` seconds ago."""
        now = self._clock.time()
        key = (detector, severity, rule, credential, consumer)
        last = self._last.get(key)
        if last is not None and now - last < self.settings.repeat:
            self.suppressed += 1
            return
        if len(self._last) >= MAX_REMEMBERED:
            self._forget(now)
        self._last[key] = now
        self._observer(
            Suspicious(credential, self.layout.provider(credential), detector, severity, detail)
        )

    def _forget(self, now: float) -> None:
        """Drops suppression entries that have expired; the oldest half if none has."""
        horizon = now - self.settings.repeat
        kept = {k: t for k, t in self._last.items() if t > horizon}
        if len(kept) >= MAX_REMEMBERED:
            kept = dict(list(kept.items())[MAX_REMEMBERED // 2 :])
        self._last = kept


def source_down_alerts(observer: Observer, kind: str) -> Callable[[bool, str], None]:
    """A source's `on_up`: `usage_source_down` (warning, about keyturn itself: no credential)
    once per outage, so that a blind usage monitor does not go unnoticed."""

    def changed(up: bool, problem: str) -> None:
        if not up:
            observer(
                Suspicious(
                    None,
                    None,
                    USAGE_SOURCE_DOWN,
                    "warning",
                    f"the {kind} audit source cannot be read ({problem}): reads of published "
                    "credentials are not counted or checked",
                )
            )

    return changed


def _from(read: AuditRead) -> str:
    return f" from {read.remote_address}" if read.remote_address else ""


def _version(version: int | None) -> str:
    return f" (version {version})" if version is not None else ""
