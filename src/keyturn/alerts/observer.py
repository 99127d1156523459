"""`AlertingObserver`: credential events (`keyturn.events`) → firing and resolved alerts.

Which event raises or resolves which alert is the table in docs/alerts.md#detectors-and-alerts.
Every event only decides and hands the alert to the dispatcher, which never waits.
"""

from __future__ import annotations

from keyturn.alerts.dispatcher import AlertDispatcher
from keyturn.alerts.model import (
    DEFAULT_RUNBOOK_BASE,
    Alert,
    Severity,
    fingerprint,
)
from keyturn.errors import KeyturnError
from keyturn.events import Event, Failed, Published, RotationStep, Suspicious

CREDENTIAL_FAILING = "credential_failing"
MANUAL_ROTATION_DUE = "manual_rotation_due"
# Detectors whose condition clears when the credential publishes a working value again. The
# others (a changed published secret, a rejected refresh token, grant drift, …) are events:
# someone has to look, so keyturn never resolves them by itself.
CLEARED_BY_PUBLISH = ("client_rejected", "fresh_credential_rejected", CREDENTIAL_FAILING)


def _severity(value: str) -> Severity:
    if value == "info":
        return "info"
    if value == "critical":
        return "critical"
    return "warning"


def _error_text(error: Exception) -> str:
    """keyturn's own message (which names fields, never values); only the type otherwise."""
    if isinstance(error, KeyturnError):
        return f"{type(error).__name__}: {error}"
    return type(error).__name__


class AlertingObserver:
    """An observer of `keyturn.events`; add it to the runtime's `Observers`."""

    def __init__(
        self,
        dispatcher: AlertDispatcher,
        *,
        failing_after: int = 3,
        critical_after: int = 5,
        runbook_base: str = DEFAULT_RUNBOOK_BASE,
    ) -> None:
        self._dispatcher = dispatcher
        self._clock = dispatcher.clock
        self._failing_after = failing_after
        self._critical_after = critical_after
        self._runbook_base = runbook_base

    def _alert(
        self, detector: str, severity: Severity, summary: str, credential: str, provider: str
    ) -> Alert:
        return Alert.make(
            detector,
            severity,
            summary,
            credential=credential,
            provider=provider,
            starts_at=self._clock.time(),
            runbook_base=self._runbook_base,
        )

    def __call__(self, event: Event) -> None:
        match event:
            case Published(credential=credential, provider=provider):
                for detector in CLEARED_BY_PUBLISH:
                    self._dispatcher.resolve(fingerprint(detector, credential, provider))
            case Failed(credential, provider, _kind, error, n) if n >= self._failing_after:
                level: Severity = "critical" if n >= self._critical_after else "warning"
                summary = f"{credential}: {n} consecutive failed runs; last: {_error_text(error)}"
                self._dispatcher.fire(
                    self._alert(CREDENTIAL_FAILING, level, summary, credential, provider)
                )
            case Suspicious(credential, provider, detector, severity, detail):
                summary = f"{credential}: {detail}" if credential is not None else detail
                alert = self._alert(
                    detector, _severity(severity), summary, credential or "", provider or ""
                )
                if detector in CLEARED_BY_PUBLISH:
                    self._dispatcher.fire(alert)
                else:
                    self._dispatcher.notify(alert)
            case RotationStep(credential, provider, kind, "awaiting_manual"):
                summary = (
                    f"{credential}: the {kind} is due for rotation and waits for a person: "
                    f"keyturn import-key {credential}"
                )
                self._dispatcher.fire(
                    self._alert(MANUAL_ROTATION_DUE, "warning", summary, credential, provider)
                )
            case RotationStep(credential, provider, _kind, "published"):
                self._dispatcher.resolve(fingerprint(MANUAL_ROTATION_DUE, credential, provider))
