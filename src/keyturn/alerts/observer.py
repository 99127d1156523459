"""`AlertingObserver`: credential events (`keyturn.events.Observer`) → alerts.

- `suspicious(c, p, detector, severity, detail)` → `Keyturn<Detector>` with that severity.
  A condition for `client_rejected` and `fresh_credential_rejected` (resolved when `c`
  publishes again); an event (sent, never resolved by keyturn) for every other detector.
- `failed(c, p, kind, error, n)` with n ≥ `failing_after` (3) → `KeyturnCredentialFailing`,
  warning; critical from n ≥ `critical_after` (5).
- `published(c, …)` → resolves `credential_failing`, `client_rejected` and
  `fresh_credential_rejected` of `c`.
- `rotation(c, p, kind, "awaiting_manual")` → `KeyturnManualRotationDue`, warning;
  `rotation(c, p, kind, "published")` resolves it.

Every call only decides and hands the alert to the dispatcher, which never waits.
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
from keyturn.events import IgnoringObserver, Observer

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


class AlertingObserver(IgnoringObserver):
    """Implements `keyturn.events.Observer`; add it to the runtime's `Observers`. Events not
    overridden here raise nothing (a rejected probe arrives as
    `suspicious("fresh_credential_rejected")`; a credential still failing fires again at its
    next failed run, not when its record is read)."""

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

    def published(
        self, credential: str, provider: str, kind: str, issued_at: float, expires_at: float
    ) -> None:
        for detector in CLEARED_BY_PUBLISH:
            self._dispatcher.resolve(fingerprint(detector, credential, provider))

    def failed(
        self, credential: str, provider: str, kind: str, error: Exception, failures: int
    ) -> None:
        if failures < self._failing_after:
            return
        severity: Severity = "critical" if failures >= self._critical_after else "warning"
        summary = f"{credential}: {failures} consecutive failed runs; last: {_error_text(error)}"
        self._dispatcher.fire(
            self._alert(CREDENTIAL_FAILING, severity, summary, credential, provider)
        )

    def suspicious(
        self, credential: str, provider: str, detector: str, severity: str, detail: str
    ) -> None:
        level = _severity(severity)
        alert = self._alert(detector, level, f"{credential}: {detail}", credential, provider)
        if detector in CLEARED_BY_PUBLISH:
            self._dispatcher.fire(alert)
        else:
            self._dispatcher.notify(alert)

    def rotation(self, credential: str, provider: str, kind: str, result: str) -> None:
        if result == "awaiting_manual":
            summary = (
                f"{credential}: the {kind} is due for rotation and waits for a person: "
                f"keyturn import-key {credential}"
            )
            self._dispatcher.fire(
                self._alert(MANUAL_ROTATION_DUE, "warning", summary, credential, provider)
            )
        elif result == "published":
            self._dispatcher.resolve(fingerprint(MANUAL_ROTATION_DUE, credential, provider))


def as_observer(observer: AlertingObserver) -> Observer:
    """`AlertingObserver` typed as `Observer` (mypy checks that it implements the protocol)."""
    return observer
