"""The token endpoint over real HTTP: the spec's two requests verbatim, form bodies, Basic auth,
RFC 6749 errors, refresh rotation and reuse revoking the family, lifetimes, RFC 7009 revoke."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.sandbox import SandboxProcess

pytestmark = pytest.mark.sandbox


@pytest.fixture
def http(sandbox: SandboxProcess) -> Iterator[httpx.Client]:
    with loopback.client(base_url=sandbox.base_url, timeout=10) as client:
        yield client


def client_of(sandbox: SandboxProcess) -> tuple[str, str]:
    oauth = sandbox.bootstrap["oauth_client"]
    return oauth["client_id"], oauth["client_secret"]


def spec_request(http: httpx.Client, body: dict[str, str]) -> httpx.Response:
    """The spec's call: a JSON object sent as the request data, no content type, no auth header."""
    return http.post("/oauth/token", content=json.dumps(body).encode())


def users(http: httpx.Client, token: str) -> httpx.Response:
    return http.get("/v1/users", headers={"Authorization": f"Bearer {token}"})


def assert_oauth_error(response: httpx.Response, status: int, error: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["error"] == error
    assert body["error_description"]
    return dict(body)


def test_the_specs_two_token_requests_verbatim(sandbox: SandboxProcess, http: httpx.Client) -> None:
    client_id, client_secret = client_of(sandbox)
    first = spec_request(
        http,
        {
            "grant_type": "client_credentials",
            "client_id": client_id,
            "client_secret": client_secret,
        },
    )
    assert first.status_code == 200, first.text
    assert first.headers["cache-control"] == "no-store"
    assert first.headers["content-type"].startswith("application/json")
    issued = first.json()
    assert set(issued) == {"access_token", "token_type", "expires_in", "refresh_token", "scope"}
    assert issued["token_type"] == "Bearer"
    assert issued["expires_in"] == 3600
    assert users(http, issued["access_token"]).status_code == 200

    second = spec_request(
        http,
        {
            "grant_type": "refresh_token",
            "refresh_token": issued["refresh_token"],
            "client_id": client_id,
            "client_secret": client_secret,
        },
    )
    assert second.status_code == 200, second.text
    refreshed = second.json()
    assert refreshed["access_token"] != issued["access_token"]
    assert refreshed["refresh_token"] != issued["refresh_token"]
    assert users(http, refreshed["access_token"]).status_code == 200


def test_form_bodies_with_basic_or_body_client_authentication(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    client_id, client_secret = client_of(sandbox)
    basic = http.post(
        "/oauth/token",
        data={"grant_type": "client_credentials", "scope": "users:read"},
        auth=(client_id, client_secret),
    )
    assert basic.status_code == 200, basic.text
    assert basic.json()["scope"] == "users:read"
    posted = http.post(
        "/oauth/token",
        data={
            "grant_type": "refresh_token",
            "refresh_token": basic.json()["refresh_token"],
            "client_id": client_id,
            "client_secret": client_secret,
        },
    )
    assert posted.status_code == 200, posted.text
    assert posted.json()["scope"] == "users:read"


def test_a_json_body_with_its_content_type_works_too(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    client_id, client_secret = client_of(sandbox)
    body = {"grant_type": "client_credentials", "client_id": client_id}
    body["client_secret"] = client_secret
    assert http.post("/oauth/token", json=body).status_code == 200


def test_client_authentication_failures_are_invalid_client_401_with_a_challenge(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    client_id, client_secret = client_of(sandbox)
    cases = [
        {"grant_type": "client_credentials", "client_id": client_id, "client_secret": "wrong"},
        {
            "grant_type": "client_credentials",
            "client_id": "client_nobody",
            "client_secret": client_secret,
        },
        {"grant_type": "client_credentials", "client_id": client_id},
        {"grant_type": "client_credentials"},
    ]
    for body in cases:
        response = http.post("/oauth/token", json=body)
        assert_oauth_error(response, 401, "invalid_client")
        assert response.headers["www-authenticate"].startswith("Basic realm=")
    wrong_basic = http.post(
        "/oauth/token", data={"grant_type": "client_credentials"}, auth=(client_id, "nope")
    )
    assert_oauth_error(wrong_basic, 401, "invalid_client")


def test_using_basic_and_body_credentials_at_once_is_invalid_request(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    client_id, client_secret = client_of(sandbox)
    response = http.post(
        "/oauth/token",
        data={"grant_type": "client_credentials", "client_secret": client_secret},
        auth=(client_id, client_secret),
    )
    assert_oauth_error(response, 400, "invalid_request")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"grant_type": "password", "username": "u", "password": "p"}, "unsupported_grant_type"),
        ({"grant_type": "authorization_code", "code": "x"}, "unsupported_grant_type"),
        ({}, "invalid_request"),
        ({"grant_type": "refresh_token"}, "invalid_request"),
        ({"grant_type": "refresh_token", "refresh_token": "ktsb_rt_unknown"}, "invalid_grant"),
        ({"grant_type": "client_credentials", "scope": "admin"}, "invalid_scope"),
    ],
)
def test_rfc6749_errors_for_bad_grants(
    sandbox: SandboxProcess, http: httpx.Client, body: dict[str, str], error: str
) -> None:
    client_id, client_secret = client_of(sandbox)
    full = {"client_id": client_id, "client_secret": client_secret, **body}
    assert_oauth_error(http.post("/oauth/token", json=full), 400, error)


def test_reusing_a_refresh_token_revokes_the_whole_family(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    client_id, client_secret = client_of(sandbox)
    auth = {"client_id": client_id, "client_secret": client_secret}
    issued = http.post("/oauth/token", json={"grant_type": "client_credentials", **auth}).json()
    refreshed = http.post(
        "/oauth/token",
        json={"grant_type": "refresh_token", "refresh_token": issued["refresh_token"], **auth},
    ).json()
    bystander = http.post("/oauth/token", json={"grant_type": "client_credentials", **auth}).json()

    reuse = http.post(
        "/oauth/token",
        json={"grant_type": "refresh_token", "refresh_token": issued["refresh_token"], **auth},
    )
    assert "already used" in assert_oauth_error(reuse, 400, "invalid_grant")["error_description"]

    for token in (issued["access_token"], refreshed["access_token"]):
        rejected = users(http, token)
        assert rejected.status_code == 401
        assert 'error="invalid_token"' in rejected.headers["www-authenticate"]
    legit_next = http.post(
        "/oauth/token",
        json={"grant_type": "refresh_token", "refresh_token": refreshed["refresh_token"], **auth},
    )
    assert_oauth_error(legit_next, 400, "invalid_grant")
    assert users(http, bystander["access_token"]).status_code == 200
    families: dict[str, set[str]] = {}
    for token in sandbox.admin.list_tokens(client_id):
        families.setdefault(token["family_id"], set()).add(token["status"])
    assert sorted(map(sorted, families.values())) == [["active"], ["revoked"]]


def test_client_credentials_without_refresh_tokens_when_configured(
    sandbox_factory: Callable[..., SandboxProcess],
) -> None:
    sandbox = sandbox_factory({"issue_refresh_token_for_client_credentials": False})
    client_id, client_secret = client_of(sandbox)
    response = HTTP.post(
        f"{sandbox.base_url}/oauth/token",
        data={"grant_type": "client_credentials"},
        auth=(client_id, client_secret),
    )
    assert response.status_code == 200
    assert "refresh_token" not in response.json()


def test_grant_drift_settings_change_a_running_sandbox(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    client_id, client_secret = client_of(sandbox)
    body = {"grant_type": "client_credentials", "client_id": client_id}
    body["client_secret"] = client_secret
    sandbox.admin.update_settings(
        scope_override="projects:read", access_token_lifetime=30, token_type="mac"
    )
    drifted = http.post("/oauth/token", json=body).json()
    assert (drifted["scope"], drifted["expires_in"], drifted["token_type"]) == (
        "projects:read",
        30,
        "mac",
    )
    denied = users(http, drifted["access_token"])
    assert denied.status_code == 403
    assert 'error="insufficient_scope"' in denied.headers["www-authenticate"]

    sandbox.admin.update_settings(include_expires_in=False, scope_override=None)
    plain = http.post("/oauth/token", json=body).json()
    assert "expires_in" not in plain
    assert plain["scope"] == "users:read projects:read"


def test_a_one_second_access_token_expires_and_is_refreshed(
    sandbox_factory: Callable[..., SandboxProcess],
) -> None:
    sandbox = sandbox_factory({"access_token_lifetime": 1})
    client_id, client_secret = client_of(sandbox)
    with loopback.client(base_url=sandbox.base_url) as http:
        issued = http.post(
            "/oauth/token",
            data={"grant_type": "client_credentials"},
            auth=(client_id, client_secret),
        ).json()
        assert issued["expires_in"] == 1
        time.sleep(1.05)
        expired = users(http, issued["access_token"])
        assert expired.status_code == 401
        assert "expired" in expired.headers["www-authenticate"]
        refreshed = http.post(
            "/oauth/token",
            data={"grant_type": "refresh_token", "refresh_token": issued["refresh_token"]},
            auth=(client_id, client_secret),
        ).json()
        assert users(http, refreshed["access_token"]).status_code == 200


def test_rfc7009_revocation_by_the_client(sandbox: SandboxProcess, http: httpx.Client) -> None:
    client_id, client_secret = client_of(sandbox)
    issued = http.post(
        "/oauth/token", data={"grant_type": "client_credentials"}, auth=(client_id, client_secret)
    ).json()
    revoked = http.post(
        "/oauth/revoke", data={"token": issued["refresh_token"]}, auth=(client_id, client_secret)
    )
    assert revoked.status_code == 200
    assert users(http, issued["access_token"]).status_code == 401
    unknown = http.post(
        "/oauth/revoke", data={"token": "ktsb_at_unknown"}, auth=(client_id, client_secret)
    )
    assert unknown.status_code == 200
    other = sandbox.admin.create_oauth_app("other")
    foreign = http.post(
        "/oauth/revoke",
        data={"token": issued["access_token"]},
        auth=(other["client_id"], other["client_secret"]),
    )
    assert_oauth_error(foreign, 400, "invalid_request")
    assert_oauth_error(http.post("/oauth/revoke", data={"token": "x"}), 401, "invalid_client")
