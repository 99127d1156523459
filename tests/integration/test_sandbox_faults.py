"""Rate limits and fault injection over real HTTP: 429 with Retry-After, injected errors with a
seeded rate, added latency, outage windows, dropped connections, and an admin API that stays
reachable through all of it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.sandbox import SandboxProcess

pytestmark = pytest.mark.sandbox


@pytest.fixture
def http(sandbox: SandboxProcess) -> Iterator[httpx.Client]:
    with loopback.client(base_url=sandbox.base_url, timeout=10) as client:
        yield client


def token_request(sandbox: SandboxProcess, http: httpx.Client) -> httpx.Response:
    oauth = sandbox.bootstrap["oauth_client"]
    return http.post("/oauth/token", json={"grant_type": "client_credentials", **oauth})


def users(sandbox: SandboxProcess, http: httpx.Client) -> httpx.Response:
    key = sandbox.bootstrap["api_key"]["key"]
    return http.get("/v1/users", headers={"Authorization": f"Bearer {key}"})


def test_rate_limit_from_the_config_file_answers_429_with_retry_after(
    sandbox_factory: Callable[..., SandboxProcess],
) -> None:
    sandbox = sandbox_factory({"rate_limits": {"token": {"requests": 3, "per_seconds": 30}}})
    with loopback.client(base_url=sandbox.base_url) as http:
        statuses = [token_request(sandbox, http).status_code for _ in range(5)]
        assert statuses == [200, 200, 200, 429, 429]
        limited = token_request(sandbox, http)
        assert limited.status_code == 429
        retry_after = int(limited.headers["retry-after"])
        assert 1 <= retry_after <= 30
        assert limited.json()["error"] == "rate_limited"
        assert limited.json()["retry_after"] == retry_after
        assert users(sandbox, http).status_code == 200  # other endpoints are not limited


def test_rate_limits_change_at_run_time_and_the_window_reopens(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    sandbox.admin.update_settings(rate_limits={"resources": {"requests": 2, "per_seconds": 1}})
    assert [users(sandbox, http).status_code for _ in range(3)] == [200, 200, 429]
    time.sleep(1.05)
    assert users(sandbox, http).status_code == 200
    sandbox.admin.update_settings(rate_limits={"resources": None})
    assert all(users(sandbox, http).status_code == 200 for _ in range(10))


def test_injected_errors_follow_the_rate_and_the_seed(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    sandbox.admin.set_faults({"token": {"error_rate": 1, "error_status": 500, "retry_after": 2}})
    failed = token_request(sandbox, http)
    assert failed.status_code == 500
    assert failed.headers["retry-after"] == "2"
    assert failed.json()["error"] == "temporarily_unavailable"
    assert users(sandbox, http).status_code == 200

    sandbox.admin.set_faults({"seed": 1234, "token": {"error_rate": 0.5}})
    first = [token_request(sandbox, http).status_code for _ in range(40)]
    assert 5 < first.count(503) < 35
    assert set(first) == {200, 503}
    sandbox.admin.set_faults({"seed": 1234})
    assert [token_request(sandbox, http).status_code for _ in range(40)] == first


def test_added_latency_slows_only_the_chosen_endpoint(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    sandbox.admin.set_faults({"users": {"latency_ms": 1000}})
    started = time.monotonic()
    assert users(sandbox, http).status_code == 200
    assert time.monotonic() - started >= 1.0
    started = time.monotonic()
    assert token_request(sandbox, http).status_code == 200
    assert time.monotonic() - started < 1.0  # not held for the latency added to /users


def test_an_outage_window_returns_503_with_retry_after_then_ends(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    sandbox.admin.set_faults({"*": {"outage_seconds": 1}})
    down = token_request(sandbox, http)
    assert down.status_code == 503
    assert down.headers["retry-after"] == "1"
    assert users(sandbox, http).status_code == 503
    assert sandbox.admin.usage()["endpoints"]["token"] == {"503": 1}  # admin still answers
    time.sleep(1.05)
    assert token_request(sandbox, http).status_code == 200


def test_a_fault_can_drop_the_connection_instead_of_answering(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    sandbox.admin.set_faults({"token": {"error_rate": 1, "drop_connection": True}})
    # No answer at all: a closed connection, or a reset one when the close comes while the
    # request is still unread (timing: both happen on a loaded machine).
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        token_request(sandbox, http)
    sandbox.admin.clear_faults()
    assert sandbox.admin.faults() == {}
    assert token_request(sandbox, http).status_code == 200


def test_invalid_fault_settings_are_refused_with_the_key(sandbox: SandboxProcess) -> None:
    with pytest.raises(httpx.HTTPStatusError) as caught:
        sandbox.admin.set_faults({"token": {"error_rate": 3}, "elsewhere": {}})
    assert caught.value.response.status_code == 400
    problems = "\n".join(caught.value.response.json()["problems"])
    assert "faults.token.error_rate" in problems
    assert "elsewhere" in problems
    assert sandbox.admin.faults() == {}
