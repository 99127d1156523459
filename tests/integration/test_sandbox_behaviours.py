"""Two behaviours of real providers the sandbox can take on, over real HTTP.

- `revoke_previous_access_token_on_refresh`: a `refresh_token` grant revokes the access token
  the refresh replaces, at once, as django-oauth-toolkit does when it issues refresh tokens.
  Off (the default), the previous access token keeps working until it expires.
- `invalid_token_status = 403`: an unknown, expired or revoked credential is answered 403
  instead of RFC 6750's 401.

Both are settings: in the `--config` file, or changed at run time with `PUT /admin/settings`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.sandbox import SandboxProcess

pytestmark = pytest.mark.sandbox


def grant(sandbox: SandboxProcess, **params: str) -> dict[str, Any]:
    oauth = sandbox.bootstrap["oauth_client"]
    body = {"client_id": oauth["client_id"], "client_secret": oauth["client_secret"], **params}
    response = HTTP.post(f"{sandbox.base_url}/oauth/token", json=body, timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def client_credentials(sandbox: SandboxProcess) -> dict[str, Any]:
    return grant(sandbox, grant_type="client_credentials")


def refresh(sandbox: SandboxProcess, issued: dict[str, Any]) -> dict[str, Any]:
    return grant(sandbox, grant_type="refresh_token", refresh_token=issued["refresh_token"])


def projects(sandbox: SandboxProcess, token: str) -> httpx.Response:
    return HTTP.get(
        f"{sandbox.base_url}/v1/projects",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def assert_refused(response: httpx.Response, status: int, why: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == "invalid_token"
    assert why in response.json()["error_description"]
    challenge = response.headers["WWW-Authenticate"]
    assert challenge.startswith("Bearer ") and 'error="invalid_token"' in challenge


def token_record(sandbox: SandboxProcess, value: str) -> dict[str, Any]:
    return dict(sandbox.admin.introspect_token(value))


def test_by_default_the_previous_access_token_works_until_it_expires(
    sandbox_factory: Callable[..., SandboxProcess],
) -> None:
    sandbox = sandbox_factory({"access_token_lifetime": 2})
    assert sandbox.admin.settings()["revoke_previous_access_token_on_refresh"] is False
    assert sandbox.admin.settings()["invalid_token_status"] == 401
    first = client_credentials(sandbox)
    second = refresh(sandbox, first)

    assert projects(sandbox, first["access_token"]).status_code == 200
    assert projects(sandbox, second["access_token"]).status_code == 200
    assert token_record(sandbox, first["access_token"])["status"] == "active"

    time.sleep(2.3)  # the first token's lifetime is over (and so is the second's)
    assert_refused(projects(sandbox, first["access_token"]), 401, "expired")


def test_with_the_setting_a_refresh_revokes_the_previous_access_token_at_once(
    sandbox_factory: Callable[..., SandboxProcess],
) -> None:
    sandbox = sandbox_factory({"revoke_previous_access_token_on_refresh": True})
    first = client_credentials(sandbox)
    other_grant = client_credentials(sandbox)  # another family of the same client
    assert projects(sandbox, first["access_token"]).status_code == 200

    second = refresh(sandbox, first)
    # An hour of lifetime left, and refused right after the refresh.
    assert_refused(projects(sandbox, first["access_token"]), 401, "revoked")
    assert projects(sandbox, second["access_token"]).status_code == 200
    record = token_record(sandbox, first["access_token"])
    assert (record["status"], record["revoke_reason"]) == ("revoked", "replaced at refresh")
    # Only the token the refresh replaced: another grant's token is untouched.
    assert projects(sandbox, other_grant["access_token"]).status_code == 200

    third = refresh(sandbox, second)
    assert_refused(projects(sandbox, second["access_token"]), 401, "revoked")
    assert projects(sandbox, third["access_token"]).status_code == 200


def test_a_dead_token_can_be_answered_403_and_other_answers_keep_their_status(
    sandbox_factory: Callable[..., SandboxProcess],
) -> None:
    sandbox = sandbox_factory(
        {"revoke_previous_access_token_on_refresh": True, "invalid_token_status": 403}
    )
    first = client_credentials(sandbox)
    second = refresh(sandbox, first)

    assert_refused(projects(sandbox, first["access_token"]), 403, "revoked")
    assert projects(sandbox, second["access_token"]).status_code == 200
    assert_refused(projects(sandbox, "ktsb_at_not-a-token-it-issued"), 403, "unknown")
    revoked_key = sandbox.admin.create_api_key("soon-revoked")
    sandbox.admin.revoke_api_key(revoked_key["key_id"])
    assert_refused(projects(sandbox, revoked_key["key"]), 403, "revoked")

    # No credential at all is still RFC 6750's 401 without an error code, and a token that
    # lacks the path's scope is still 403 insufficient_scope.
    missing = HTTP.get(f"{sandbox.base_url}/v1/projects", timeout=10)
    assert missing.status_code == 401
    assert "error=" not in missing.headers["WWW-Authenticate"]
    narrow = grant(sandbox, grant_type="client_credentials", scope="users:read")
    assert projects(sandbox, narrow["access_token"]).status_code == 403
    assert projects(sandbox, narrow["access_token"]).json()["error"] == "insufficient_scope"


def test_both_behaviours_can_be_switched_at_run_time(sandbox: SandboxProcess) -> None:
    first = client_credentials(sandbox)
    second = refresh(sandbox, first)
    assert projects(sandbox, first["access_token"]).status_code == 200

    changed = sandbox.admin.update_settings(
        revoke_previous_access_token_on_refresh=True, invalid_token_status=403
    )
    assert changed["revoke_previous_access_token_on_refresh"] is True
    assert changed["invalid_token_status"] == 403
    third = refresh(sandbox, second)
    assert_refused(projects(sandbox, second["access_token"]), 403, "revoked")
    assert projects(sandbox, third["access_token"]).status_code == 200

    sandbox.admin.update_settings(invalid_token_status=401)
    assert_refused(projects(sandbox, second["access_token"]), 401, "revoked")

    refused = HTTP.put(
        f"{sandbox.base_url}/admin/settings",
        headers={"Authorization": f"Bearer {sandbox.admin_token}"},
        json={"invalid_token_status": 404, "revoke_previous_access_token_on_refresh": "yes"},
        timeout=10,
    )
    assert refused.status_code == 400
    problems = "\n".join(refused.json()["problems"])
    assert "invalid_token_status: expected 401 or 403, got 404" in problems
    assert "revoke_previous_access_token_on_refresh: expected true or false" in problems
    assert sandbox.admin.settings()["invalid_token_status"] == 401  # nothing changed


def test_a_bad_value_in_the_config_file_names_the_key(tmp_path: Path) -> None:
    sandbox = SandboxProcess(config={"invalid_token_status": 402}, workdir=tmp_path / "bad")
    with pytest.raises(RuntimeError, match=r"exit code 2") as refused:
        sandbox.start(timeout=10)
    assert "invalid_token_status: expected 401 or 403, got 402" in str(refused.value)
