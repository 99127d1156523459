"""What happens to credentials, as calls on an `Observer`.

The refresher and scheduler report here; logging, metrics and alert hooks are observers.
Arguments are names, outcomes and times, never values: an observer cannot leak a secret it
was never given.
"""

from __future__ import annotations

from typing import Protocol

from keyturn.logs import get_logger


class Observer(Protocol):
    def token_request(
        self, credential: str, provider: str, grant_type: str, outcome: str, seconds: float
    ) -> None:
        """A call to a token endpoint finished; outcome is `success` or an error label."""

    def published(
        self, credential: str, provider: str, kind: str, issued_at: float, expires_at: float
    ) -> None:
        """A new value is readable by apps."""

    def scheduled(self, credential: str, provider: str, kind: str, due: float) -> None:
        """The next run of a credential's job is planned for `due`."""

    def failed(
        self, credential: str, provider: str, kind: str, error: Exception, failures: int
    ) -> None:
        """A run failed; `failures` counts consecutive failures."""

    def suspicious(
        self, credential: str, provider: str, detector: str, severity: str, detail: str
    ) -> None:
        """Something that may mean a stolen or tampered credential."""

    def rotation(self, credential: str, provider: str, kind: str, result: str) -> None:
        """A rotation step: started, adopted, created, verified, published, retired, failed,
        verification_failed, awaiting_manual."""

    def restored(
        self,
        credential: str,
        provider: str,
        kind: str,
        issued_at: float | None,
        expires_at: float | None,
        last_success: float | None,
        failures: int,
    ) -> None:
        """What the journal says about a credential, read at the start of a run (after a
        restart, or from another instance's work)."""

    def rotation_planned(self, credential: str, provider: str, kind: str, at: float | None) -> None:
        """When the current key or client secret is next due for rotation."""

    def rotation_duration(self, provider: str, kind: str, seconds: float) -> None:
        """A rotation took `seconds` from its start to its new key being in use."""

    def probe(self, credential: str, provider: str, status: int) -> None:
        """A probe of a credential issued just now answered with HTTP `status`."""


class IgnoringObserver:
    """An `Observer` that ignores every event: subclass it and override the events you act on
    (sinks act on two, alert hooks on a few)."""

    def token_request(
        self, credential: str, provider: str, grant_type: str, outcome: str, seconds: float
    ) -> None:
        return None

    def published(
        self, credential: str, provider: str, kind: str, issued_at: float, expires_at: float
    ) -> None:
        return None

    def scheduled(self, credential: str, provider: str, kind: str, due: float) -> None:
        return None

    def failed(
        self, credential: str, provider: str, kind: str, error: Exception, failures: int
    ) -> None:
        return None

    def suspicious(
        self, credential: str, provider: str, detector: str, severity: str, detail: str
    ) -> None:
        return None

    def rotation(self, credential: str, provider: str, kind: str, result: str) -> None:
        return None

    def restored(
        self,
        credential: str,
        provider: str,
        kind: str,
        issued_at: float | None,
        expires_at: float | None,
        last_success: float | None,
        failures: int,
    ) -> None:
        return None

    def rotation_planned(self, credential: str, provider: str, kind: str, at: float | None) -> None:
        return None

    def rotation_duration(self, provider: str, kind: str, seconds: float) -> None:
        return None

    def probe(self, credential: str, provider: str, status: int) -> None:
        return None


class LoggingObserver:
    """Structured log lines for each event (secrets never reach here)."""

    def __init__(self) -> None:
        self._log = get_logger("keyturn.events")

    def token_request(
        self, credential: str, provider: str, grant_type: str, outcome: str, seconds: float
    ) -> None:
        self._log.debug(
            "token.request",
            credential=credential,
            provider=provider,
            grant_type=grant_type,
            outcome=outcome,
            seconds=round(seconds, 4),
        )

    def published(
        self, credential: str, provider: str, kind: str, issued_at: float, expires_at: float
    ) -> None:
        self._log.info(
            "credential.published",
            credential=credential,
            provider=provider,
            kind=kind,
            lifetime=round(expires_at - issued_at, 3),
        )

    def scheduled(self, credential: str, provider: str, kind: str, due: float) -> None:
        self._log.debug("credential.scheduled", credential=credential, due=due)

    def failed(
        self, credential: str, provider: str, kind: str, error: Exception, failures: int
    ) -> None:
        self._log.warning(
            "credential.failed",
            credential=credential,
            provider=provider,
            kind=kind,
            error=str(error),
            error_type=type(error).__name__,
            consecutive_failures=failures,
        )

    def suspicious(
        self, credential: str, provider: str, detector: str, severity: str, detail: str
    ) -> None:
        self._log.warning(
            "suspicious",
            credential=credential,
            provider=provider,
            detector=detector,
            severity=severity,
            detail=detail,
        )

    def rotation(self, credential: str, provider: str, kind: str, result: str) -> None:
        level = (
            "warning" if result in ("failed", "verification_failed", "awaiting_manual") else "info"
        )
        getattr(self._log, level)(
            "rotation." + result, credential=credential, provider=provider, kind=kind
        )

    def probe(self, credential: str, provider: str, status: int) -> None:
        self._log.debug("credential.probe", credential=credential, provider=provider, status=status)

    def restored(
        self,
        credential: str,
        provider: str,
        kind: str,
        issued_at: float | None,
        expires_at: float | None,
        last_success: float | None,
        failures: int,
    ) -> None:
        return None

    def rotation_planned(self, credential: str, provider: str, kind: str, at: float | None) -> None:
        return None

    def rotation_duration(self, provider: str, kind: str, seconds: float) -> None:
        return None


class Observers:
    """Fans every event out to several observers; one failing observer does not stop others."""

    def __init__(self, *observers: Observer) -> None:
        self._observers = list(observers)
        self._log = get_logger("keyturn.events")

    def add(self, observer: Observer) -> None:
        self._observers.append(observer)

    def _each(self, method: str, *args: object) -> None:
        for observer in self._observers:
            try:
                getattr(observer, method)(*args)
            except Exception as exc:  # an observer bug must never stop a refresh
                self._log.error(
                    "observer.failed", observer=type(observer).__name__, error=repr(exc)
                )

    def token_request(
        self, credential: str, provider: str, grant_type: str, outcome: str, seconds: float
    ) -> None:
        self._each("token_request", credential, provider, grant_type, outcome, seconds)

    def published(
        self, credential: str, provider: str, kind: str, issued_at: float, expires_at: float
    ) -> None:
        self._each("published", credential, provider, kind, issued_at, expires_at)

    def scheduled(self, credential: str, provider: str, kind: str, due: float) -> None:
        self._each("scheduled", credential, provider, kind, due)

    def failed(
        self, credential: str, provider: str, kind: str, error: Exception, failures: int
    ) -> None:
        self._each("failed", credential, provider, kind, error, failures)

    def suspicious(
        self, credential: str, provider: str, detector: str, severity: str, detail: str
    ) -> None:
        self._each("suspicious", credential, provider, detector, severity, detail)

    def rotation(self, credential: str, provider: str, kind: str, result: str) -> None:
        self._each("rotation", credential, provider, kind, result)

    def probe(self, credential: str, provider: str, status: int) -> None:
        self._each("probe", credential, provider, status)

    def restored(
        self,
        credential: str,
        provider: str,
        kind: str,
        issued_at: float | None,
        expires_at: float | None,
        last_success: float | None,
        failures: int,
    ) -> None:
        self._each(
            "restored", credential, provider, kind, issued_at, expires_at, last_success, failures
        )

    def rotation_planned(self, credential: str, provider: str, kind: str, at: float | None) -> None:
        self._each("rotation_planned", credential, provider, kind, at)

    def rotation_duration(self, provider: str, kind: str, seconds: float) -> None:
        self._each("rotation_duration", provider, kind, seconds)
