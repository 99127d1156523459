"""Who reads the credentials keyturn publishes, from Vault's audit log (docs/usage.md).

    source (file tail or socket) → AuditParser → UsageMonitor → UsageTracker + UsageDetectors

`Layout` says which paths matter, `Identity` is keyturn's own (never counted); the daemon runs
it all as one `keyturn.usage.service.UsageService`.
"""

from __future__ import annotations

from keyturn.usage.audit import (
    MAX_LINE,
    SKIP_REASONS,
    AuditEntry,
    AuditParser,
    AuditRead,
    AuditWrite,
    Identity,
    consumer_label,
)
from keyturn.usage.detectors import (
    DETECTORS,
    DetectorSettings,
    UsageDetectors,
    source_down_alerts,
)
from keyturn.usage.layout import Layout, Watched
from keyturn.usage.metrics import UsageCollector
from keyturn.usage.monitor import UsageMonitor
from keyturn.usage.sources import FileAuditSource, SocketAuditSource, check_address, check_file
from keyturn.usage.tracker import ConsumerView, CredentialView, UsageTracker

__all__ = [
    "DETECTORS",
    "MAX_LINE",
    "SKIP_REASONS",
    "AuditEntry",
    "AuditParser",
    "AuditRead",
    "AuditWrite",
    "ConsumerView",
    "CredentialView",
    "DetectorSettings",
    "FileAuditSource",
    "Identity",
    "Layout",
    "SocketAuditSource",
    "UsageCollector",
    "UsageDetectors",
    "UsageMonitor",
    "UsageTracker",
    "Watched",
    "check_address",
    "check_file",
    "consumer_label",
    "source_down_alerts",
]
