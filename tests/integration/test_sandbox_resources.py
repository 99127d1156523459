"""`/v1/users` and `/v1/projects` over real HTTP: both credential kinds on both paths, and 401 with
an RFC 6750 challenge for every way a credential can be wrong."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.sandbox import SandboxProcess

pytestmark = pytest.mark.sandbox


@pytest.fixture
def http(sandbox: SandboxProcess) -> Iterator[httpx.Client]:
    with loopback.client(base_url=sandbox.base_url, timeout=10) as client:
        yield client


def access_token(sandbox: SandboxProcess, http: httpx.Client) -> str:
    oauth = sandbox.bootstrap["oauth_client"]
    response = http.post("/oauth/token", json={"grant_type": "client_credentials", **oauth})
    return str(response.json()["access_token"])


@pytest.mark.parametrize("path", ["/v1/users", "/v1/projects"])
def test_an_api_key_and_an_access_token_both_work_on_both_paths(
    sandbox: SandboxProcess, http: httpx.Client, path: str
) -> None:
    for credential in (sandbox.bootstrap["api_key"]["key"], access_token(sandbox, http)):
        response = http.get(path, headers={"Authorization": f"Bearer {credential}"})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["has_more"] is False
        assert len(body["data"]) >= 2
        assert all({"id", "name", "created_at"} <= set(record) for record in body["data"])
    other = "/v1/projects" if path == "/v1/users" else "/v1/users"
    key = sandbox.bootstrap["api_key"]["key"]
    assert (
        http.get(path, headers={"Authorization": f"Bearer {key}"}).json()
        != http.get(other, headers={"Authorization": f"Bearer {key}"}).json()
    )


def challenge(response: httpx.Response) -> str:
    assert response.status_code == 401, response.text
    return response.headers["www-authenticate"]


def test_a_missing_or_foreign_scheme_credential_gets_a_bare_bearer_challenge(
    http: httpx.Client, sandbox: SandboxProcess
) -> None:
    assert challenge(http.get("/v1/users")) == 'Bearer realm="keyturn-sandbox"'
    key = sandbox.bootstrap["api_key"]["key"]
    basic = http.get("/v1/projects", headers={"Authorization": f"Basic {key}"})
    assert challenge(basic) == 'Bearer realm="keyturn-sandbox"'


@pytest.mark.parametrize("header", ["Bearer", "Bearer two words", 'Bearer "quoted"'])
def test_a_malformed_bearer_header_is_401_invalid_request(http: httpx.Client, header: str) -> None:
    value = challenge(http.get("/v1/users", headers={"Authorization": header}))
    assert 'error="invalid_request"' in value


def test_unknown_revoked_and_expired_credentials_are_401_invalid_token(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    unknown = http.get("/v1/users", headers={"Authorization": "Bearer ktsb_key_nothing"})
    assert 'error="invalid_token"' in challenge(unknown)
    assert unknown.json()["error"] == "invalid_token"

    created = sandbox.admin.create_api_key("doomed")
    sandbox.admin.revoke_api_key(created["key_id"])
    revoked = http.get("/v1/projects", headers={"Authorization": f"Bearer {created['key']}"})
    assert 'error_description="the API key has been revoked"' in challenge(revoked)

    token = access_token(sandbox, http)
    sandbox.admin.revoke_token(token)
    revoked_token = http.get("/v1/users", headers={"Authorization": f"Bearer {token}"})
    assert "revoked" in challenge(revoked_token)


def test_an_api_key_with_a_narrow_scope_is_403_on_the_other_path(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    narrow = sandbox.admin.create_api_key("projects only", scope="projects:read")
    headers = {"Authorization": f"Bearer {narrow['key']}"}
    assert http.get("/v1/projects", headers=headers).status_code == 200
    denied = http.get("/v1/users", headers=headers)
    assert denied.status_code == 403
    assert denied.headers["www-authenticate"] == (
        'Bearer realm="keyturn-sandbox", error="insufficient_scope", '
        'error_description="this request needs the scope users:read", scope="users:read"'
    )


def test_resource_requests_are_counted_per_credential(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    key = sandbox.bootstrap["api_key"]
    for _ in range(3):
        http.get("/v1/users", headers={"Authorization": f"Bearer {key['key']}"})
    token = access_token(sandbox, http)
    http.get("/v1/projects", headers={"Authorization": f"Bearer {token}"})
    usage = sandbox.admin.usage()
    assert usage["api_keys"][key["key_id"]]["request_count"] == 3
    assert usage["api_keys"][key["key_id"]]["last_used_at"].endswith("Z")
    client = usage["oauth_clients"][sandbox.bootstrap["oauth_client"]["client_id"]]
    assert (client["oauth_requests"], client["resource_requests"]) == (1, 1)
    assert usage["endpoints"]["users"] == {"200": 3}
