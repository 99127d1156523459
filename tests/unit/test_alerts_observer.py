"""AlertingObserver: credential events become firing alerts, and their resolutions."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import random
from collections.abc import Awaitable, Callable

import httpx
import pytest
import requests
import structlog
from hvac import exceptions as hvac_errors

from keyturn.alerts.dispatcher import AlertDispatcher
from keyturn.alerts.model import Alert, fingerprint
from keyturn.alerts.observer import AlertingObserver
from keyturn.clock import FakeClock
from keyturn.config.schema import HttpCall, HttpRotatorConfig, ProviderConfig
from keyturn.errors import KeyturnError, OAuthError, VerificationFailed
from keyturn.events import (
    Failed,
    LoggingObserver,
    Observers,
    Probed,
    Published,
    Restored,
    RotationDuration,
    RotationPlanned,
    RotationStep,
    Scheduled,
    Suspicious,
    TokenRequest,
)
from keyturn.jobs.steps import verify_with_probe
from keyturn.logs import configure_logging
from keyturn.providers.client import ProviderClient
from keyturn.rotators.base import RotationRequest
from keyturn.rotators.http import HttpRotator
from keyturn.secret import PLACEHOLDER, Secret
from keyturn.testing.alerts import MemoryHook
from keyturn.vault.client import translate

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
    observer(Suspicious("reporting", "acme", "refresh_token_rejected", "critical", "invalid_grant"))
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
    observer(Suspicious("c", "p", "grant_drift", "severe", "scope"))
    assert await sent(dispatcher, hook) == [("KeyturnGrantDrift", "firing", "warning")]


async def test_failures_fire_credential_failing_then_critical(wired) -> None:
    observer, dispatcher, hook = wired
    error = OAuthError("invalid_client", credential="reporting", status=401)
    for failures in range(1, 7):
        observer(Failed("reporting", "acme", "oauth_client", error, failures))
    assert await sent(dispatcher, hook) == [
        ("KeyturnCredentialFailing", "firing", "warning"),  # at 3
        ("KeyturnCredentialFailing", "firing", "critical"),  # at 5
    ]
    assert "3 consecutive failed runs" in hook.delivered[0].summary
    assert "OAuthError" in hook.delivered[0].summary


async def test_a_foreign_error_is_named_by_type_only(wired) -> None:
    observer, dispatcher, hook = wired
    observer(Failed("c", "p", "oauth_client", OSError("/some/path/with-a-token-abc"), 3))
    await sent(dispatcher, hook)
    assert hook.delivered[0].summary == "c: 3 consecutive failed runs; last: OSError"


async def test_publishing_resolves_what_publishing_clears(wired) -> None:
    observer, dispatcher, hook = wired
    error = VerificationFailed("probe said 401", credential="c", status=401)
    observer(Failed("c", "p", "oauth_client", error, 3))
    observer(Suspicious("c", "p", "fresh_credential_rejected", "critical", "401 on /v1/users"))
    observer(Suspicious("c", "p", "client_rejected", "critical", "invalid_client"))
    observer(Suspicious("c", "p", "published_secret_changed", "warning", "version jump"))
    observer(Published("other", "p", "oauth_client", T0, T0 + 3600))  # another credential
    observer(Published("c", "p", "oauth_client", T0, T0 + 3600))
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
    observer(RotationStep("legacy", "acme", "api_key", "started"))
    observer(RotationStep("legacy", "acme", "api_key", "awaiting_manual"))
    observer(RotationStep("legacy", "acme", "api_key", "awaiting_manual"))
    assert set(dispatcher.active) == {fingerprint("manual_rotation_due", "legacy", "acme")}
    observer(RotationStep("legacy", "acme", "api_key", "verified"))
    observer(RotationStep("legacy", "acme", "api_key", "published"))
    assert await sent(dispatcher, hook) == [
        ("KeyturnManualRotationDue", "firing", "warning"),
        ("KeyturnManualRotationDue", "resolved", "warning"),
    ]
    assert "keyturn import-key legacy" in hook.delivered[0].summary


async def test_quiet_events_send_nothing(wired) -> None:
    observer, dispatcher, hook = wired
    observer(TokenRequest("c", "p", "client_credentials", "success", 0.1))
    observer(Scheduled("c", "p", "oauth_client", T0 + 60))
    observer(Probed("c", "p", 200))
    observer(Restored("c", "p", "oauth_client", T0, T0 + 60, T0, 4))
    observer(RotationPlanned("c", "p", "api_key", T0 + 86400))
    observer(RotationDuration("p", "api_key", 1.5))
    observer(Failed("c", "p", "oauth_client", OSError(), 2))
    assert await sent(dispatcher, hook) == []


async def test_keyturn_s_own_trouble_is_alerted_without_a_credential(wired) -> None:
    observer, dispatcher, hook = wired
    detail = "keyturn's Vault token expires in 20s and could not be renewed or replaced"
    observer(Suspicious(None, None, "vault_token_expiring", "critical", detail))
    assert await sent(dispatcher, hook) == [("KeyturnVaultTokenExpiring", "firing", "critical")]
    [alert] = hook.delivered
    assert (alert.credential, alert.provider, alert.summary) == ("", "", detail)


async def test_it_works_behind_observers_fan_out(wired) -> None:
    observer, dispatcher, hook = wired
    fan_out = Observers(LoggingObserver(), observer)
    fan_out(Suspicious("c", "p", "client_rejected", "critical", "invalid_client"))
    fan_out(Published("c", "p", "oauth_client", T0, T0 + 60))
    assert [status for _, status, _ in await sent(dispatcher, hook)] == ["firing", "resolved"]
    assert isinstance(hook.delivered[0], Alert)


# -- an alert says what the log line says ---------------------------------------------------

SENT = Secret("cs-0123456789abcdef-the-client-secret")
ROTATOR_ADMIN = Secret("admin-0123456789abcdef")


def provider_client(
    respond: Callable[[httpx.Request], httpx.Response], timeout: float = 10.0
) -> ProviderClient:
    settings = ProviderConfig(name="acme", base_url="https://acme.test", timeout=timeout)
    return ProviderClient(settings, clock=FakeClock(T0), transport=httpx.MockTransport(respond))


async def token_failure(
    respond: Callable[[httpx.Request], httpx.Response], timeout: float = 10.0
) -> Exception:
    """The error a client_credentials request for app1 raises when the provider does this."""
    client = provider_client(respond, timeout)
    try:
        await client.request_token(
            "app1", grant_type="client_credentials", client_id="app1-id", client_secret=SENT
        )
    except Exception as error:
        return error
    finally:
        await client.aclose()
    raise AssertionError("the token request succeeded")


async def probe_failure(status: int) -> Exception:
    client = provider_client(answer(status))
    try:
        await verify_with_probe(
            client,
            Observers(),
            credential="app1",
            provider="acme",
            probe="/v1/users",
            value=Secret("at-0123456789abcdef"),
            what="access token",
        )
    except Exception as error:
        return error
    finally:
        await client.aclose()
    raise AssertionError("the probe passed")


async def rotator_failure(status: int, body: object) -> Exception:
    provider = ProviderConfig(name="acme", base_url="https://acme.test")
    config = HttpRotatorConfig(
        name="acme-keys",
        provider="acme",
        create=HttpCall(path="/keys", value="/key", id="/id"),
        revoke=HttpCall(path="/keys/{key_id}", method="DELETE"),
    )
    transport = httpx.MockTransport(answer(status, body))
    rotator = HttpRotator(config, provider, ROTATOR_ADMIN, transport=transport, clock=FakeClock(T0))
    request = RotationRequest("app1", "api_key", "r1", "keyturn-app1-r1", None)
    try:
        await rotator.create(request)
    except Exception as error:
        return error
    finally:
        await rotator.aclose()
    raise AssertionError("the rotator created a key")


def raise_(error: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def respond(request: httpx.Request) -> httpx.Response:
        raise error

    return respond


def response(status: int, body: object = None, **headers: str) -> httpx.Response:
    """A response whose body is a stream, as one off the network is."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    if body is None:
        content = b""
    return httpx.Response(status, headers=headers, stream=httpx.ByteStream(content))


def answer(status: int, body: object = None, **headers: str) -> Callable[..., httpx.Response]:
    return lambda request: response(status, body, **headers)


def vault_failure(error: Exception) -> Exception:
    translated = translate(error, operation="write", path="secret/data/apps/app1")
    assert translated is not None
    return translated


FAILURES: dict[str, Callable[[], Awaitable[Exception]]] = {
    "connection dropped": lambda: token_failure(
        raise_(httpx.RemoteProtocolError("Server disconnected without sending a response."))
    ),
    "cannot connect": lambda: token_failure(raise_(httpx.ConnectError("Connection refused"))),
    "HTTP 503": lambda: token_failure(answer(503)),
    "timed out": lambda: token_failure(raise_(httpx.ReadTimeout("read timed out")), timeout=5),
    "rate limited": lambda: token_failure(answer(429, Retry_After="30")),
    "access_token missing": lambda: token_failure(
        answer(200, {"token_type": "Bearer", "expires_in": 60})
    ),
    "refresh_token empty": lambda: token_failure(
        answer(200, {"access_token": "at-1", "token_type": "Bearer", "refresh_token": ""})
    ),
    "expires_in not a number": lambda: token_failure(
        answer(200, {"access_token": "at-1", "token_type": "Bearer", "expires_in": "soon"})
    ),
    "body not JSON": lambda: token_failure(answer(200, b"<html>")),
    "invalid_client": lambda: token_failure(
        answer(
            401, {"error": "invalid_client", "error_description": "Client authentication failed"}
        )
    ),
    "invalid_grant": lambda: token_failure(
        answer(400, {"error": "invalid_grant", "error_description": "refresh token revoked"})
    ),
    "a 4xx without an error body": lambda: token_failure(answer(400, {"message": "no"})),
    "probe rejected": lambda: probe_failure(401),
    "probe unavailable": lambda: probe_failure(503),
    "probe status": lambda: probe_failure(404),
    "vault unreachable": lambda: asyncio.sleep(
        0, vault_failure(requests.exceptions.ConnectionError("refused"))
    ),
    "vault timed out": lambda: asyncio.sleep(0, vault_failure(requests.exceptions.ReadTimeout())),
    "vault sealed": lambda: asyncio.sleep(0, vault_failure(hvac_errors.VaultDown("sealed"))),
    "vault token rejected": lambda: asyncio.sleep(
        0, vault_failure(hvac_errors.Unauthorized("permission denied"))
    ),
    "vault permission denied": lambda: asyncio.sleep(
        0, vault_failure(hvac_errors.Forbidden("permission denied"))
    ),
    "rotator auth refused": lambda: rotator_failure(401, {"error": "invalid_token"}),
    "rotator bad request": lambda: rotator_failure(400, {"error": "invalid_request"}),
    "rotator answer without a key": lambda: rotator_failure(201, {"id": 7}),
}


@pytest.mark.parametrize("case", list(FAILURES))
async def test_the_alert_says_what_the_log_line_says(case: str, wired) -> None:
    """Each failure keyturn reports, raised by the code that raises it, goes through the log
    observer and the alerting observer side by side: the alert's summary carries the same
    error text as the log line, words and all; nothing in it is blanked."""
    observer, dispatcher, hook = wired
    error = await FAILURES[case]()
    assert isinstance(error, KeyturnError), repr(error)  # keyturn's own: its text is shown
    stream = io.StringIO()
    configure_logging("debug", stream=stream)
    try:
        Observers(LoggingObserver(), observer)(Failed("app1", "acme", "oauth_client", error, 3))
    finally:
        logging.getLogger().handlers.clear()
        structlog.reset_defaults()
    [line] = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert line["event"] == "credential.failed"
    logged = f"{line['error_type']}: {line['error']}"
    assert PLACEHOLDER not in logged, logged
    await sent(dispatcher, hook)
    [alert] = hook.delivered  # as delivered: scrubbed when made and again before delivery
    assert alert.summary == f"app1: 3 consecutive failed runs; last: {logged}"
    assert SENT.reveal() not in alert.summary
    assert ROTATOR_ADMIN.reveal() not in alert.summary
