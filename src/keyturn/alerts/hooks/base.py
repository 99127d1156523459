"""What every hook shares: its policy (filters, limits), the `AlertHook` interface, and the one
HTTP POST all four hook types make.

A delivery either returns (2xx) or raises `DeliveryError`, whose `retryable` says whether
trying again may help: network errors, time-outs, 408, 429 (with its `Retry-After`) and 5xx
are retryable; any other status is not (a 400 will not turn into a 200). Messages name the
hook and the status, never the URL: a Slack or webhook URL is itself a secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import httpx

from keyturn import __version__
from keyturn.alerts.model import DEFAULT_RUNBOOK_BASE, SEVERITY_RANK, Alert, Severity
from keyturn.clock import Clock
from keyturn.logs import redact_secrets
from keyturn.policy import BackoffPolicy
from keyturn.providers.http import parse_retry_after, system_tls
from keyturn.secret import Secret

USER_AGENT = f"keyturn/{__version__}"
DEFAULT_BACKOFF = BackoffPolicy(initial=1.0, maximum=60.0, multiplier=2.0)


@dataclass(frozen=True, slots=True)
class HookPolicy:
    """Which alerts a hook takes and how hard the dispatcher tries.

    rate_limit: alerts per minute (a token bucket holding one minute's worth; resolutions
    are not limited). repeat_interval: seconds before a still-firing alert is sent again.
    max_retries: attempts after the first, with `backoff` between them.
    """

    min_severity: Severity = "warning"
    detectors: frozenset[str] | None = None
    credentials: frozenset[str] | None = None
    rate_limit: float = 30.0
    repeat_interval: float = 4 * 3600.0
    max_retries: int = 5
    runbook_base: str = DEFAULT_RUNBOOK_BASE
    backoff: BackoffPolicy = DEFAULT_BACKOFF

    def accepts(self, alert: Alert) -> bool:
        """Whether the alert passes this hook's severity, detector and credential filters."""
        if SEVERITY_RANK[alert.severity] < SEVERITY_RANK[self.min_severity]:
            return False
        if self.detectors is not None and alert.detector not in self.detectors:
            return False
        return self.credentials is None or alert.credential in self.credentials


class DeliveryError(Exception):
    """A delivery failed. `status` is the HTTP status (None for a network error)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status


class AlertHook(Protocol):
    """One configured receiver. `deliver` sends one alert (firing or resolved) once."""

    name: str
    kind: ClassVar[str]
    policy: HookPolicy

    async def deliver(self, alert: Alert) -> None: ...

    async def aclose(self) -> None: ...


RETRYABLE_STATUSES = frozenset({408, 429})


def redact_payload(body: Any) -> Any:
    """`body` with every field named like a secret (`token`, `api_key`, … as in keyturn's
    log redaction) blanked at any depth: a net for payload shapes, not a way to send values."""
    return redact_secrets(None, "alert", {"payload": body})["payload"]


class HttpHook:
    """Base of the four hook types: POST `payload(alert)` as JSON to `url`.

    `url` is held as a `Secret` whether or not it came from a reference, so it is never
    printed; only `_post` reveals it, into the request.
    """

    kind: ClassVar[str] = "http"

    def __init__(
        self,
        name: str,
        url: Secret,
        policy: HookPolicy,
        *,
        clock: Clock,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self.policy = policy
        self._url = url
        self._clock = clock
        self._http = httpx.AsyncClient(
            timeout=timeout,
            transport=transport,
            verify=system_tls(),
            follow_redirects=False,
            headers={"User-Agent": USER_AGENT},
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def url(self, alert: Alert) -> Secret:
        """Where `alert` is posted."""
        return self._url

    def payload(self, alert: Alert) -> Any:
        """The JSON body for `alert`."""
        raise NotImplementedError

    async def deliver(self, alert: Alert) -> None:
        await self._post(self.url(alert), redact_payload(self.payload(alert)))

    async def _post(self, url: Secret, body: Any, headers: Mapping[str, str] | None = None) -> None:
        where = f"alert hook {self.name}"
        try:
            async with self._http.stream(
                "POST", url.reveal(), json=body, headers=headers
            ) as response:
                status = response.status_code
                retry_after = parse_retry_after(
                    response.headers.get("Retry-After"), self._clock.time()
                )
        except httpx.TimeoutException:
            raise DeliveryError(f"{where}: timed out", retryable=True) from None
        except httpx.InvalidURL:
            raise DeliveryError(f"{where}: invalid URL (not shown)", retryable=False) from None
        except httpx.HTTPError as exc:
            # The exception's text may hold the URL; only its type is kept.
            raise DeliveryError(
                f"{where}: network error ({type(exc).__name__})", retryable=True
            ) from None
        if 200 <= status < 300:
            return
        retryable = status in RETRYABLE_STATUSES or status >= 500
        raise DeliveryError(
            f"{where}: HTTP {status}",
            retryable=retryable,
            retry_after=retry_after if status in (429, 503) else None,
            status=status,
        )

    async def aclose(self) -> None:
        await self._http.aclose()
