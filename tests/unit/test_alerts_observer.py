"""AlertingObserver: credential events become firing alerts, and their resolutions."""

from __future__ import annotations

import asyncio
import random

import pytest

from keyturn.alerts.dispatcher import AlertDispatcher
from keyturn.alerts.model import Alert, fingerprint
from keyturn.alerts.observer import AlertingObserver
from keyturn.clock import FakeClock
from keyturn.errors import OAuthError, VerificationFailed
from keyturn.events import LoggingObserver, Observers
from keyturn.testing.alerts import MemoryHook

T0 = 1_800_000_000.0


@pytest.fixture
async def wired() -> tuple[AlertingObserver, AlertDispatcher, MemoryHook]:
    hook = MemoryHook("all")  # min_severity info: sees everything
    dispatcher = AlertDispatcher([hook], clock=FakeClock(T0), rng=random.Random(1))
    await dispatcher.start()
    yield AlertingObserver(dispatcher), dispatcher, hook  # type: ignore[misc]
    await dispatcher.stop(1)


async def sent(dispatcher: AlertDispatcher, hook: MemoryHook) -> list[tuple[str, str, str]]:
    await asyncio.wait_for(dispatcher.idle(), 5)
    return [(a.name, a.status, a.severity) for a in hook.delivered]


async def test_suspicious_fires_the_detector_alert(wired) -> None:
    observer, dispatcher, hook = wired
    observer.suspicious("reporting", "acme", "refresh_token_rejected", "critical", "invalid_grant")
    assert await sent(dispatcher, hook) == [("KeyturnRefreshTokenRejected", "firing", "critical")]
    [alert] = hook.delivered
    assert (alert.credential, alert.provider, alert.detector) == (
        "reporting",
        "acme",
        "refresh_token_rejected",
    )
    assert alert.summary == "reporting: invalid_grant"
    assert alert.runbook_url.endswith("docs/runbook.md#keyturnrefreshtokenrejected")
    assert alert.starts_at == T0


async def test_an_unknown_severity_word_becomes_warning(wired) -> None:
    observer, dispatcher, hook = wired
    observer.suspicious("c", "p", "grant_drift", "severe", "scope")
    assert await sent(dispatcher, hook) == [("KeyturnGrantDrift", "firing", "warning")]


async def test_failures_fire_credential_failing_then_critical(wired) -> None:
    observer, dispatcher, hook = wired
    error = OAuthError("invalid_client", credential="reporting", status=401)
    for failures in range(1, 7):
        observer.failed("reporting", "acme", "oauth_client", error, failures)
    assert await sent(dispatcher, hook) == [
        ("KeyturnCredentialFailing", "firing", "warning"),  # at 3
        ("KeyturnCredentialFailing", "firing", "critical"),  # at 5
    ]
    assert "3 consecutive failed runs" in hook.delivered[0].summary
    assert "OAuthError" in hook.delivered[0].summary


async def test_a_foreign_error_is_named_by_type_only(wired) -> None:
    observer, dispatcher, hook = wired
    observer.failed("c", "p", "oauth_client", OSError("/some/path/with-a-token-abc"), 3)
    await sent(dispatcher, hook)
    assert hook.delivered[0].summary == "c: 3 consecutive failed runs; last: OSError"


async def test_publishing_resolves_what_publishing_clears(wired) -> None:
    observer, dispatcher, hook = wired
    error = VerificationFailed("probe said 401", credential="c", status=401)
    observer.failed("c", "p", "oauth_client", error, 3)
    observer.suspicious("c", "p", "fresh_credential_rejected", "critical", "401 on /v1/users")
    observer.suspicious("c", "p", "client_rejected", "critical", "invalid_client")
    observer.suspicious("c", "p", "published_secret_changed", "warning", "version jump")
    observer.published("other", "p", "oauth_client", T0, T0 + 3600)  # another credential
    observer.published("c", "p", "oauth_client", T0, T0 + 3600)
    result = await sent(dispatcher, hook)
    resolved = sorted(name for name, status, _ in result if status == "resolved")
    assert resolved == [
        "KeyturnClientRejected",
        "KeyturnCredentialFailing",
        "KeyturnFreshCredentialRejected",
    ]
    # A changed published secret is an event: someone must look; keyturn never resolves it.
    assert ("KeyturnPublishedSecretChanged", "firing", "warning") in result
    assert dispatcher.active == {}


async def test_manual_rotation_due_until_the_new_key_is_published(wired) -> None:
    observer, dispatcher, hook = wired
    observer.rotation("legacy", "acme", "api_key", "started")
    observer.rotation("legacy", "acme", "api_key", "awaiting_manual")
    observer.rotation("legacy", "acme", "api_key", "awaiting_manual")
    assert set(dispatcher.active) == {fingerprint("manual_rotation_due", "legacy", "acme")}
    observer.rotation("legacy", "acme", "api_key", "verified")
    observer.rotation("legacy", "acme", "api_key", "published")
    assert await sent(dispatcher, hook) == [
        ("KeyturnManualRotationDue", "firing", "warning"),
        ("KeyturnManualRotationDue", "resolved", "warning"),
    ]
    assert "keyturn import-key legacy" in hook.delivered[0].summary


async def test_quiet_events_send_nothing(wired) -> None:
    observer, dispatcher, hook = wired
    observer.token_request("c", "p", "client_credentials", "success", 0.1)
    observer.scheduled("c", "p", "oauth_client", T0 + 60)
    observer.probe("c", "p", 200)
    observer.restored("c", "p", "oauth_client", T0, T0 + 60, T0, 4)
    observer.rotation_planned("c", "p", "api_key", T0 + 86400)
    observer.rotation_duration("p", "api_key", 1.5)
    observer.failed("c", "p", "oauth_client", OSError(), 2)
    assert await sent(dispatcher, hook) == []


async def test_it_works_behind_observers_fan_out(wired) -> None:
    observer, dispatcher, hook = wired
    fan_out = Observers(LoggingObserver(), observer)
    fan_out.suspicious("c", "p", "client_rejected", "critical", "invalid_client")
    fan_out.published("c", "p", "oauth_client", T0, T0 + 60)
    assert [status for _, status, _ in await sent(dispatcher, hook)] == ["firing", "resolved"]
    assert isinstance(hook.delivered[0], Alert)
