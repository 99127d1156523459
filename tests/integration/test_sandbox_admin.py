"""The admin API over real HTTP: its guard, API keys, OAuth apps and client-secret rotation,
settings, and the bootstrap file the sandbox writes once listening."""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Callable

import httpx
import pytest

from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.sandbox import SandboxProcess

pytestmark = pytest.mark.sandbox


def client_credentials(sandbox: SandboxProcess, client_id: str, secret: str) -> httpx.Response:
    return HTTP.post(
        f"{sandbox.base_url}/oauth/token",
        data={"grant_type": "client_credentials"},
        auth=(client_id, secret),
    )


def test_the_bootstrap_file_is_private_and_its_credentials_work(sandbox: SandboxProcess) -> None:
    mode = stat.S_IMODE(sandbox.bootstrap_path.stat().st_mode)
    assert mode == 0o600
    data = json.loads(sandbox.bootstrap_path.read_text())
    assert set(data) == {"base_url", "admin_token", "api_key", "oauth_client"}
    assert data["base_url"].startswith("http://127.0.0.1:")
    assert not data["base_url"].endswith(":0")
    key = data["api_key"]["key"]
    assert (
        HTTP.get(
            f"{data['base_url']}/v1/users", headers={"Authorization": f"Bearer {key}"}
        ).status_code
        == 200
    )
    oauth = data["oauth_client"]
    issued = client_credentials(sandbox, oauth["client_id"], oauth["client_secret"])
    assert issued.status_code == 200
    assert [k["key_id"] for k in sandbox.admin.list_api_keys()] == [data["api_key"]["key_id"]]


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic YWRtaW46YWRtaW4="])
def test_the_admin_api_needs_the_admin_token(sandbox: SandboxProcess, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    for method, path in [
        ("GET", "/admin/api-keys"),
        ("PUT", "/admin/settings"),
        ("POST", "/admin/oauth-apps"),
        ("DELETE", "/admin/faults"),
    ]:
        response = httpx.request(method, f"{sandbox.base_url}{path}", headers=headers, json={})
        assert response.status_code == 401
        challenge = response.headers["www-authenticate"]
        assert challenge.startswith('Bearer realm="keyturn-sandbox-admin"')
    bearer = {"Authorization": f"Bearer {sandbox.admin_token}"}
    assert HTTP.get(f"{sandbox.base_url}/admin/api-keys", headers=bearer).status_code == 200


def test_api_key_lifecycle_shows_the_value_once(sandbox: SandboxProcess) -> None:
    created = sandbox.admin.create_api_key("reporting", "nightly export")
    assert created["key"].startswith("ktsb_key_")
    assert created["key_id"].startswith("key_")
    assert (created["name"], created["description"], created["status"]) == (
        "reporting",
        "nightly export",
        "active",
    )
    listed = sandbox.admin.list_api_keys()
    fetched = sandbox.admin.get_api_key(created["key_id"])
    assert created["key"] not in json.dumps(listed) + json.dumps(fetched)
    assert fetched["status"] == "active"

    revoked = sandbox.admin.revoke_api_key(created["key_id"])
    assert revoked["status"] == "revoked"
    assert revoked["revoked_at"].endswith("Z")
    statuses = {k["key_id"]: k["status"] for k in sandbox.admin.list_api_keys()}
    assert statuses == {
        sandbox.bootstrap["api_key"]["key_id"]: "active",
        created["key_id"]: "revoked",
    }
    with pytest.raises(httpx.HTTPStatusError) as caught:
        sandbox.admin.get_api_key("key_nothing")
    assert caught.value.response.status_code == 404


@pytest.mark.parametrize(
    "body",
    [{}, {"name": ""}, {"name": 5}, {"name": "x", "scope": 'bad"scope'}],
)
def test_invalid_api_key_requests_are_400(sandbox: SandboxProcess, body: dict[str, object]) -> None:
    with pytest.raises(httpx.HTTPStatusError) as caught:
        sandbox.admin.request("POST", "/admin/api-keys", body)
    assert caught.value.response.status_code == 400
    assert caught.value.response.json()["error"] == "invalid_request"


def test_registering_an_oauth_app_yields_working_client_credentials(
    sandbox: SandboxProcess,
) -> None:
    app = sandbox.admin.create_oauth_app("billing", "https://billing.example/callback")
    assert app["client_id"].startswith("client_")
    assert client_credentials(sandbox, app["client_id"], app["client_secret"]).status_code == 200
    listed = sandbox.admin.list_oauth_apps()
    assert app["client_secret"] not in json.dumps(listed)
    names = {a["client_id"]: a["name"] for a in listed}
    assert names[app["client_id"]] == "billing"
    for uri in ("not a uri", "https://x.example/cb#frag", "ftp://x.example/cb"):
        with pytest.raises(httpx.HTTPStatusError) as caught:
            sandbox.admin.create_oauth_app("bad", uri)
        assert "redirect_uri" in caught.value.response.text


def test_rotating_a_client_secret_keeps_the_old_one_for_the_overlap(
    sandbox: SandboxProcess,
) -> None:
    client_id = sandbox.bootstrap["oauth_client"]["client_id"]
    old = sandbox.bootstrap["oauth_client"]["client_secret"]
    rotated = sandbox.admin.rotate_client_secret(client_id, overlap_seconds=1)
    new = rotated["client_secret"]
    assert new != old
    assert [s["status"] for s in rotated["secrets"]] == ["expiring", "active"]
    assert client_credentials(sandbox, client_id, old).status_code == 200
    assert client_credentials(sandbox, client_id, new).status_code == 200
    time.sleep(1.05)
    expired = client_credentials(sandbox, client_id, old)
    assert expired.status_code == 401
    assert expired.json()["error"] == "invalid_client"
    assert client_credentials(sandbox, client_id, new).status_code == 200
    statuses = [s["status"] for s in sandbox.admin.get_oauth_app(client_id)["secrets"]]
    assert statuses == ["expired", "active"]


def test_an_old_secret_can_be_revoked_before_its_overlap_ends(sandbox: SandboxProcess) -> None:
    client_id = sandbox.bootstrap["oauth_client"]["client_id"]
    old = sandbox.bootstrap["oauth_client"]["client_secret"]
    rotated = sandbox.admin.rotate_client_secret(client_id)
    old_id = rotated["secrets"][0]["secret_id"]
    assert rotated["secrets"][0]["expires_at"] is not None  # the default overlap applies
    assert sandbox.admin.revoke_client_secret(client_id, old_id)["status"] == "revoked"
    assert client_credentials(sandbox, client_id, old).status_code == 401
    assert client_credentials(sandbox, client_id, rotated["client_secret"]).status_code == 200


def test_admin_revokes_every_token_of_a_client(sandbox: SandboxProcess) -> None:
    oauth = sandbox.bootstrap["oauth_client"]
    tokens = [
        client_credentials(sandbox, oauth["client_id"], oauth["client_secret"]).json()
        for _ in range(2)
    ]
    result = sandbox.admin.revoke_client_tokens(oauth["client_id"])
    assert result == {"revoked": True, "families": 2}
    for token in tokens:
        response = HTTP.get(
            f"{sandbox.base_url}/v1/users",
            headers={"Authorization": f"Bearer {token['access_token']}"},
        )
        assert response.status_code == 401
    assert {t["status"] for t in sandbox.admin.list_tokens(oauth["client_id"])} == {"revoked"}


def test_deleting_an_app_ends_its_secrets_and_grants(sandbox: SandboxProcess) -> None:
    oauth = sandbox.bootstrap["oauth_client"]
    grant = client_credentials(sandbox, oauth["client_id"], oauth["client_secret"]).json()
    deleted = sandbox.admin.delete_oauth_app(oauth["client_id"])
    assert [s["status"] for s in deleted["secrets"]] == ["revoked"]
    refused = client_credentials(sandbox, oauth["client_id"], oauth["client_secret"])
    assert refused.json()["error"] == "invalid_client"
    bearer = {"Authorization": f"Bearer {grant['access_token']}"}
    assert HTTP.get(f"{sandbox.base_url}/v1/users", headers=bearer).status_code == 401
    reasons = {t["revoke_reason"] for t in sandbox.admin.list_tokens(oauth["client_id"])}
    assert reasons == {"application deleted"}
    for call in (sandbox.admin.get_oauth_app, sandbox.admin.delete_oauth_app):
        with pytest.raises(httpx.HTTPStatusError) as caught:
            call(oauth["client_id"])
        assert caught.value.response.status_code == 404


def test_settings_are_read_and_partially_updated_and_bad_ones_name_the_key(
    sandbox: SandboxProcess,
) -> None:
    before = sandbox.admin.settings()
    assert before["access_token_lifetime"] == 3600
    after = sandbox.admin.update_settings(access_token_lifetime=5)
    assert after == {**before, "access_token_lifetime": 5}
    with pytest.raises(httpx.HTTPStatusError) as caught:
        sandbox.admin.update_settings(access_token_lifetime="soon", colour="red")
    problems = caught.value.response.json()["problems"]
    assert len(problems) == 2
    assert any("access_token_lifetime" in p for p in problems)
    assert any("colour: unknown setting" in p for p in problems)
    assert sandbox.admin.settings()["access_token_lifetime"] == 5


def test_a_config_file_sets_the_starting_settings(
    sandbox_factory: Callable[..., SandboxProcess],
) -> None:
    sandbox = sandbox_factory(
        {
            "access_token_lifetime": 42,
            "default_scope": "users:read",
            "rate_limits": {"users": {"requests": 9, "per_seconds": 3}},
        }
    )
    oauth = sandbox.bootstrap["oauth_client"]
    issued = client_credentials(sandbox, oauth["client_id"], oauth["client_secret"]).json()
    assert (issued["expires_in"], issued["scope"]) == (42, "users:read")
    settings = sandbox.admin.settings()
    assert settings["rate_limits"] == {"users": {"requests": 9, "per_seconds": 3.0}}
