"""`PrometheusObserver`: each event moves the right series; time alone moves `ready`.

Every test reads the injected registry the way Prometheus would (`get_sample_value`, or the
rendered exposition), with a FakeClock standing in for time.
"""

from __future__ import annotations

import platform
import random
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import keyturn
from keyturn.clock import FakeClock
from keyturn.config import CredentialConfig, ProviderConfig
from keyturn.errors import OAuthError
from keyturn.events import (
    Failed,
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
from keyturn.jobs.job import JobDeps
from keyturn.kinds import build_job
from keyturn.observability.metrics import PrometheusObserver
from keyturn.providers.client import ProviderClient
from keyturn.references import SecretRef
from keyturn.secret import Secret
from keyturn.testing.oauth import FakeOAuthServer
from keyturn.testing.vault import FakeVaultStore

LABELS = {"credential": "reporting", "provider": "acme", "kind": "oauth_client"}


class Metrics:
    """An observer on its own registry and clock, read back like a scrape."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.registry = CollectorRegistry()
        self.observer = PrometheusObserver(self.registry, self.clock)

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def credential(self, name: str, **labels: str) -> float | None:
        return self.value(name, **{**LABELS, **labels})

    def text(self) -> str:
        return generate_latest(self.registry).decode()


@pytest.fixture
def m() -> Metrics:
    return Metrics()


def test_published_sets_expiry_issue_and_success_and_makes_the_credential_ready(
    m: Metrics,
) -> None:
    now = m.clock.time()
    m.observer(Failed("reporting", "acme", "oauth_client", OAuthError("invalid_client"), 3))
    m.clock.advance(5)
    m.observer(Published("reporting", "acme", "oauth_client", now, now + 600))
    assert m.credential("keyturn_credential_issued_timestamp_seconds") == now
    assert m.credential("keyturn_credential_expiry_timestamp_seconds") == now + 600
    assert m.credential("keyturn_credential_last_success_timestamp_seconds") == now + 5
    assert m.credential("keyturn_credential_consecutive_failures") == 0
    assert m.credential("keyturn_credential_ready") == 1


def test_ready_drops_when_the_token_expires_even_if_nothing_happens(m: Metrics) -> None:
    now = m.clock.time()
    m.observer(Published("reporting", "acme", "oauth_client", now, now + 600))
    m.clock.advance(599)
    assert m.credential("keyturn_credential_ready") == 1
    m.clock.advance(1)
    assert m.credential("keyturn_credential_ready") == 0
    assert m.credential("keyturn_credential_expiry_timestamp_seconds") == now + 600


def test_a_credential_only_scheduled_is_not_ready_and_has_no_made_up_timestamps(
    m: Metrics,
) -> None:
    due = m.clock.time() + 30
    m.observer(Scheduled("reporting", "acme", "oauth_client", due))
    assert m.credential("keyturn_credential_next_scheduled_timestamp_seconds") == due
    assert m.credential("keyturn_credential_ready") == 0
    assert m.credential("keyturn_credential_consecutive_failures") == 0
    for absent in ("expiry", "issued", "last_success", "rotate_after"):
        assert m.credential(f"keyturn_credential_{absent}_timestamp_seconds") is None


def test_failures_count_up_and_reset_on_success(m: Metrics) -> None:
    for failures in (1, 2, 3):
        m.observer(
            Failed("reporting", "acme", "oauth_client", OAuthError("server_error"), failures)
        )
        assert m.credential("keyturn_credential_consecutive_failures") == failures
    now = m.clock.time()
    m.observer(Published("reporting", "acme", "oauth_client", now, now + 60))
    assert m.credential("keyturn_credential_consecutive_failures") == 0


def test_api_keys_expire_at_their_rotate_after_time_and_show_planned_rotation(m: Metrics) -> None:
    labels = {"kind": "api_key"}
    created = m.clock.time()
    m.observer(Published("billing", "acme", "api_key", created, created + 86400))
    m.observer(RotationPlanned("billing", "acme", "api_key", created + 86400))
    key = {"credential": "billing", "provider": "acme", **labels}
    assert m.value("keyturn_credential_expiry_timestamp_seconds", **key) == created + 86400
    assert m.value("keyturn_credential_rotate_after_timestamp_seconds", **key) == created + 86400
    assert m.value("keyturn_credential_ready", **key) == 1
    m.clock.advance(2 * 86400)  # overdue for rotation, but the key still works until retired
    assert m.value("keyturn_credential_ready", **key) == 1
    m.observer(RotationPlanned("billing", "acme", "api_key", None))  # rotation switched off
    assert m.value("keyturn_credential_rotate_after_timestamp_seconds", **key) is None


def test_restored_state_is_exposed_without_pretending_a_success_now(m: Metrics) -> None:
    now = m.clock.time()
    m.observer(
        Restored(
            "reporting",
            "acme",
            "oauth_client",
            issued_at=now - 100,
            expires_at=now + 500,
            last_success=now - 100,
            failures=0,
        )
    )
    assert m.credential("keyturn_credential_last_success_timestamp_seconds") == now - 100
    assert m.credential("keyturn_credential_ready") == 1


def test_token_requests_are_counted_and_timed_with_bounded_labels(m: Metrics) -> None:
    m.observer(TokenRequest("reporting", "acme", "refresh_token", "success", 0.3))
    m.observer(TokenRequest("reporting", "acme", "refresh_token", "invalid_grant", 0.02))
    m.observer(TokenRequest("reporting", "acme", "client_credentials", "made-up word", 0.1))
    m.observer(TokenRequest("reporting", "acme", "password", "success", 0.1))
    base = {"credential": "reporting", "provider": "acme"}
    total = "keyturn_token_requests_total"
    assert m.value(total, **base, grant_type="refresh_token", outcome="success") == 1
    assert m.value(total, **base, grant_type="refresh_token", outcome="invalid_grant") == 1
    assert m.value(total, **base, grant_type="client_credentials", outcome="other") == 1
    assert m.value(total, **base, grant_type="other", outcome="success") == 1
    duration = "keyturn_token_request_duration_seconds"
    refresh = {"provider": "acme", "grant_type": "refresh_token"}
    assert m.value(duration + "_count", **refresh) == 2
    assert m.value(duration + "_sum", **refresh) == 0.32
    assert m.value(duration + "_bucket", **refresh, le="0.05") == 1


@pytest.mark.parametrize(
    ("status", "result"),
    [(200, "success"), (204, "success"), (401, "unauthorized"), (403, "forbidden"),
     (404, "other"), (429, "other"), (500, "other")],
)  # fmt: skip
def test_probe_results(m: Metrics, status: int, result: str) -> None:
    m.observer(Probed("reporting", "acme", status))
    probes = {"credential": "reporting", "provider": "acme"}
    assert m.value("keyturn_probe_requests_total", **probes, result=result) == 1


def test_rotations_suspicious_events_and_alert_deliveries_are_counted(m: Metrics) -> None:
    for result in ("started", "created", "verified", "published", "no-such-step"):
        m.observer(RotationStep("billing", "acme", "api_key", result))
    m.observer(Suspicious("reporting", "acme", "client_rejected", "critical", "invalid_client"))
    m.observer(Suspicious("reporting", "acme", "brand_new_detector", "loud", "x"))
    m.observer.alert_delivery("oncall", "success")
    m.observer.alert_delivery("oncall", "dropped")
    m.observer.alert_delivery("oncall", "dropped")
    rotations = {"credential": "billing", "provider": "acme", "kind": "api_key"}
    assert m.value("keyturn_rotations_total", **rotations, result="published") == 1
    assert m.value("keyturn_rotations_total", **rotations, result="other") == 1
    suspicious = "keyturn_suspicious_events_total"
    base = {"credential": "reporting", "provider": "acme"}
    assert m.value(suspicious, **base, detector="client_rejected", severity="critical") == 1
    assert m.value(suspicious, **base, detector="other", severity="other") == 1
    assert m.value("keyturn_alert_deliveries_total", hook="oncall", result="dropped") == 2


def test_rotation_duration_and_schedule_lateness(m: Metrics) -> None:
    m.observer(RotationDuration("acme", "api_key", 42.0))
    m.observer.lateness(0.2)
    m.observer.lateness(-0.01)  # a clock step backwards is not negative lateness
    rotation = "keyturn_rotation_duration_seconds"
    assert m.value(rotation + "_count", provider="acme", kind="api_key") == 1
    assert m.value(rotation + "_bucket", provider="acme", kind="api_key", le="60.0") == 1
    assert m.value(rotation + "_bucket", provider="acme", kind="api_key", le="15.0") == 0
    assert m.value("keyturn_schedule_lateness_seconds_count") == 2
    assert m.value("keyturn_schedule_lateness_seconds_sum") == 0.2


def test_vault_operations_are_counted_and_timed(m: Metrics) -> None:
    m.observer.vault_operation("write", "success", 0.004)
    m.observer.vault_operation("write", "cas_conflict", 0.003)
    m.observer.vault_operation("read", "not_found", 0.002)
    m.observer.vault_operation("teleport", "kaboom", 0.001)
    total = "keyturn_vault_operations_total"
    assert m.value(total, operation="write", result="cas_conflict") == 1
    assert m.value(total, operation="read", result="not_found") == 1
    assert m.value(total, operation="other", result="other") == 1
    assert m.value("keyturn_vault_operation_duration_seconds_count", operation="write") == 2


def test_vault_token_gauges(m: Metrics) -> None:
    assert m.value("keyturn_vault_authenticated") == 0  # nothing known yet
    expires = m.clock.time() + 3600
    m.observer.vault_token(expires, authenticated=True)
    assert m.value("keyturn_vault_token_expiry_timestamp_seconds") == expires
    assert m.value("keyturn_vault_authenticated") == 1
    m.clock.advance(3600)  # the token ran out and nobody said so: not authenticated
    assert m.value("keyturn_vault_authenticated") == 0
    m.observer.vault_token(None, authenticated=True)  # a root-like token that never expires
    assert m.value("keyturn_vault_token_expiry_timestamp_seconds") is None
    assert m.value("keyturn_vault_authenticated") == 1
    m.observer.vault_token(None, authenticated=False)
    assert m.value("keyturn_vault_authenticated") == 0


def test_heartbeat_is_absent_until_the_first_beat(m: Metrics) -> None:
    assert m.value("keyturn_scheduler_heartbeat_timestamp_seconds") is None
    assert m.observer.last_heartbeat is None
    m.clock.advance(3)
    m.observer.heartbeat()
    assert m.value("keyturn_scheduler_heartbeat_timestamp_seconds") == m.clock.time()
    assert m.observer.last_heartbeat == m.clock.time()


def test_build_info_and_credentials_configured(m: Metrics) -> None:
    python = platform.python_version()
    assert m.value("keyturn_build_info", version=keyturn.__version__, python=python) == 1
    m.observer.credentials_configured(12)
    assert m.value("keyturn_credentials") == 12


def test_forget_removes_every_series_of_a_credential_and_only_those(m: Metrics) -> None:
    now = m.clock.time()
    for name in ("reporting", "billing", "audit"):
        m.observer(Published(name, "acme", "oauth_client", now, now + 600))
        m.observer(TokenRequest(name, "acme", "client_credentials", "success", 0.1))
        m.observer(Probed(name, "acme", 200))
        m.observer(RotationStep(name, "acme", "oauth_client", "started"))
        m.observer(Suspicious(name, "acme", "grant_drift", "warning", "scope changed"))
    m.observer.forget("reporting", "audit")
    text = m.text()
    assert 'credential="reporting"' not in text
    assert 'credential="audit"' not in text
    # expiry, issued, last success, ready, failures + requests, probes, rotations, suspicious
    assert text.count('credential="billing"') == 9
    assert m.observer.credential("reporting") is None
    m.observer.forget("never-seen")  # harmless


def test_keyturn_s_own_trouble_is_counted_with_empty_credential_labels(m: Metrics) -> None:
    """A detector about keyturn itself (its Vault token) names no credential: the series
    keeps the empty labels dashboards and tests already select on."""
    m.observer(Suspicious(None, None, "vault_token_expiring", "critical", "expires in 20s"))
    labels = {"credential": "", "provider": "", "detector": "vault_token_expiring"}
    assert m.value("keyturn_suspicious_events_total", **labels, severity="critical") == 1


def test_scrapes_from_another_thread_while_events_arrive(m: Metrics) -> None:
    """The server renders off the event loop: no 'dictionary changed size' mid-scrape."""
    errors: list[BaseException] = []
    done = threading.Event()

    def scrape() -> None:
        try:
            while not done.is_set():
                generate_latest(m.registry)
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=scrape)
    thread.start()
    try:
        now = m.clock.time()
        for i in range(3000):
            name = f"c{i % 300}"
            m.observer(Published(name, "acme", "oauth_client", now, now + 60))
            m.observer(TokenRequest(name, "acme", "client_credentials", "success", 0.1))
            if i % 7 == 0:
                m.observer.forget(name)
    finally:
        done.set()
        thread.join()
    assert errors == []


async def test_a_real_refresh_run_feeds_the_metrics_and_no_secret_reaches_them(m: Metrics) -> None:
    server = FakeOAuthServer()
    store = FakeVaultStore(clock=m.clock)
    client = ProviderClient(
        ProviderConfig(name="acme", base_url="https://acme.test"),
        clock=m.clock,
        transport=server.transport(),
    )

    class Inputs:
        async def client(self, *, fresh: bool = False) -> tuple[str, Secret]:
            return "cid", Secret(server.client_secret)

        async def refresh_token(self) -> Secret | None:
            return None

        async def initial_key(self) -> tuple[Secret, str | None] | None:
            return None

    credential = CredentialConfig(
        name="reporting",
        provider="acme",
        client_id=SecretRef.env("CLIENT_ID"),
        client_secret=SecretRef.env("CLIENT_SECRET"),
        publish_to="apps/reporting/acme",
    )
    deps = JobDeps(
        store=store,
        observer=Observers(m.observer),
        clock=m.clock,
        rng=random.Random(1),
        instance_id="i-1",
    )
    job = build_job(credential, client, None, Inputs(), deps)
    for _ in range(3):
        outcome = await job.run()
        m.clock.advance(outcome.next_due - m.clock.time())
    await client.aclose()
    text = m.text()
    assert "secretvalue" not in text and server.client_secret not in text
    assert m.credential("keyturn_credential_ready") == 1
    assert m.credential("keyturn_credential_next_scheduled_timestamp_seconds") == outcome.next_due
    requests = {"credential": "reporting", "provider": "acme", "outcome": "success"}
    assert m.value("keyturn_token_requests_total", **requests, grant_type="client_credentials") == 1
    assert m.value("keyturn_token_requests_total", **requests, grant_type="refresh_token") == 2
