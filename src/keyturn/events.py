"""What happens to credentials, as values.

Each event is a frozen dataclass. An observer is any callable that takes an event and matches
the ones it cares about (`match event:`, structlog's processor shape), ignoring the rest:
logging, metrics, alert hooks and sinks are observers, and `Observers` fans an event out to
them. Fields are names, outcomes and times, never values: an observer cannot leak a secret it
was never given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from keyturn.logs import get_logger


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """A call to a token endpoint finished; `outcome` is `success` or an error label."""

    credential: str
    provider: str
    grant_type: str
    outcome: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Published:
    """A new value is readable by apps (for an API key, `expires_at` is its rotate-after
    time). `verified=False`: published although its probe got no answer, because the value
    apps read before would have expired before another try (it is probed again later)."""

    credential: str
    provider: str
    kind: str
    issued_at: float
    expires_at: float
    verified: bool = True


@dataclass(frozen=True, slots=True)
class Scheduled:
    """The next run of a credential's job is planned for `due`."""

    credential: str
    provider: str
    kind: str
    due: float


@dataclass(frozen=True, slots=True)
class Failed:
    """A run failed; `failures` counts consecutive failures."""

    credential: str
    provider: str
    kind: str
    error: Exception
    failures: int


@dataclass(frozen=True, slots=True)
class Suspicious:
    """Something that may mean a stolen or tampered credential. Some detectors are about
    keyturn itself (its Vault token running out): those name no credential or provider."""

    credential: str | None
    provider: str | None
    detector: str
    severity: str
    detail: str


@dataclass(frozen=True, slots=True)
class RotationStep:
    """A rotation step: started, adopted, created, verified, published, retired, failed,
    verification_failed, awaiting_manual."""

    credential: str
    provider: str
    kind: str
    result: str


@dataclass(frozen=True, slots=True)
class Restored:
    """What the journal says about a credential, read at the start of a run (after a restart,
    or from another instance's work); for an API key, `expires_at` is its rotate-after time."""

    credential: str
    provider: str
    kind: str
    issued_at: float | None
    expires_at: float | None
    last_success: float | None
    failures: int


@dataclass(frozen=True, slots=True)
class RotationPlanned:
    """When the current key or client secret is next due for rotation (None: never)."""

    credential: str
    provider: str
    kind: str
    at: float | None


@dataclass(frozen=True, slots=True)
class RefreshTokenPlanned:
    """When the refresh token keyturn holds stops working at the latest, so that a person
    consents again before (None: no refresh token held, or its end is not known)."""

    credential: str
    provider: str
    kind: str
    ends_at: float | None


@dataclass(frozen=True, slots=True)
class RotationDuration:
    """A rotation took `seconds` from its start to its new key being in use."""

    provider: str
    kind: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Probed:
    """A probe of a credential issued just now answered with HTTP `status` (NO_ANSWER: the
    connection failed, timed out, or the answer was a 5xx or a 429)."""

    credential: str
    provider: str
    status: int


NO_ANSWER = 0  # `Probed.status` of a probe that got no usable answer


@dataclass(frozen=True, slots=True)
class RetryAfterBounded:
    """A provider's Retry-After met a credential's retry plan: `outcome` is `honoured`,
    `shortened` (to the token's last planned refresh) or `overridden` (past that point the
    `after_expiry` cadence rules); `expired`: the token apps read had expired."""

    credential: str
    provider: str
    outcome: str
    requested: float
    expired: bool


Event: TypeAlias = (
    TokenRequest
    | Published
    | Scheduled
    | Failed
    | Suspicious
    | RotationStep
    | Restored
    | RotationPlanned
    | RefreshTokenPlanned
    | RotationDuration
    | Probed
    | RetryAfterBounded
)
Observer: TypeAlias = Callable[[Event], None]

_FAILED_RESULTS = ("failed", "verification_failed", "awaiting_manual")


_DEBUG_ONLY = (TokenRequest, Scheduled, Probed)  # the events `LoggingObserver` logs at debug


class LoggingObserver:
    """Structured log lines for the events worth a line (secrets never reach here)."""

    def __init__(self) -> None:
        self._log = get_logger("keyturn.events")
        # The level structlog's filter asks at each call, asked first: a debug line dropped
        # still cost 12 µs through structlog (two events per credential on every start).
        self._level = logging.getLogger("keyturn.events")

    def __call__(self, event: Event) -> None:
        if isinstance(event, _DEBUG_ONLY) and not self._level.isEnabledFor(logging.DEBUG):
            return
        match event:
            case TokenRequest():
                self._log.debug(
                    "token.request",
                    credential=event.credential,
                    provider=event.provider,
                    grant_type=event.grant_type,
                    outcome=event.outcome,
                    seconds=round(event.seconds, 4),
                )
            case Published():
                if event.verified:
                    self._log.info(
                        "credential.published",
                        credential=event.credential,
                        provider=event.provider,
                        kind=event.kind,
                        lifetime=round(event.expires_at - event.issued_at, 3),
                    )
                else:
                    self._log.warning(
                        "credential.published_unverified",
                        credential=event.credential,
                        provider=event.provider,
                        kind=event.kind,
                        lifetime=round(event.expires_at - event.issued_at, 3),
                        reason="the probe got no answer and the value apps read would have "
                        "expired before another try; it is probed again later",
                    )
            case Scheduled():
                self._log.debug("credential.scheduled", credential=event.credential, due=event.due)
            case Failed():
                self._log.warning(
                    "credential.failed",
                    credential=event.credential,
                    provider=event.provider,
                    kind=event.kind,
                    error=str(event.error),
                    error_type=type(event.error).__name__,
                    consecutive_failures=event.failures,
                )
            case Suspicious():
                subject = {"credential": event.credential, "provider": event.provider}
                self._log.warning(
                    "suspicious",
                    **{key: value for key, value in subject.items() if value is not None},
                    detector=event.detector,
                    severity=event.severity,
                    detail=event.detail,
                )
            case RotationStep():
                log = self._log.warning if event.result in _FAILED_RESULTS else self._log.info
                log(
                    "rotation." + event.result,
                    credential=event.credential,
                    provider=event.provider,
                    kind=event.kind,
                )
            case Probed():
                self._log.debug(
                    "credential.probe",
                    credential=event.credential,
                    provider=event.provider,
                    status=event.status,
                )
            case RetryAfterBounded():
                if event.outcome != "honoured":
                    self._log.warning(
                        "provider.retry_after_" + event.outcome,
                        credential=event.credential,
                        provider=event.provider,
                        requested_seconds=round(event.requested, 3),
                        expired=event.expired,
                    )


def _named(observer: Observer) -> str:
    """A function's own name, or an observer object's class name (for the log line)."""
    name = getattr(observer, "__qualname__", None)
    return name if isinstance(name, str) else type(observer).__name__


class Observers:
    """An observer that hands every event to several; one failing observer does not stop the
    others (an observer bug must never stop a refresh)."""

    def __init__(self, *observers: Observer) -> None:
        self._observers = list(observers)
        self._log = get_logger("keyturn.events")

    def add(self, observer: Observer) -> None:
        self._observers.append(observer)

    def __call__(self, event: Event) -> None:
        for observer in self._observers:
            try:
                observer(event)
            except Exception as exc:
                self._log.error(
                    "observer.failed",
                    observer=_named(observer),
                    event_type=type(event).__name__,
                    error=repr(exc),
                )
