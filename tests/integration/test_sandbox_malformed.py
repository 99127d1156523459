"""Bad input over real HTTP gets a clear 4xx and never takes the server down.

None of these requests changes the sandbox's state, so the module shares one sandbox: that
it is still serving after all of them is part of what is tested.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.sandbox import SandboxProcess

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    workdir: Path = tmp_path_factory.mktemp("sandbox-malformed")
    with SandboxProcess(workdir=workdir) as process:
        yield process


@pytest.fixture
def http(sandbox: SandboxProcess) -> Iterator[httpx.Client]:
    with loopback.client(base_url=sandbox.base_url, timeout=10) as client:
        yield client


@pytest.mark.parametrize(
    ("content", "content_type", "status"),
    [
        (b'{"grant_type": "client_credentials",', "application/json", 400),
        (b'["grant_type", "client_credentials"]', "application/json", 400),
        (b'{"grant_type": ["client_credentials"]}', "application/json", 400),
        (b"null", "application/json", 400),
        (b"\xc3\x28", "application/json", 400),
        (b"grant_type=a&grant_type=b", "application/x-www-form-urlencoded", 400),
        (b"<grant_type>client_credentials</grant_type>", "application/xml", 415),
        (b"grant_type=client_credentials", "multipart/form-data; boundary=x", 415),
        (b"", "application/json", 400),
    ],
)
def test_malformed_token_requests_are_clear_oauth_errors(
    sandbox: SandboxProcess, http: httpx.Client, content: bytes, content_type: str, status: int
) -> None:
    response = http.post("/oauth/token", content=content, headers={"Content-Type": content_type})
    assert response.status_code == status, response.text
    assert response.json()["error"] == "invalid_request"
    assert response.json()["error_description"]
    assert response.headers["cache-control"] == "no-store"


def test_oversized_bodies_are_refused_with_413_whether_declared_or_streamed(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    limit = sandbox.admin.settings()["max_body_bytes"]
    big = b'{"grant_type": "' + b"x" * limit + b'"}'
    declared = http.post("/oauth/token", content=big, headers={"Content-Type": "application/json"})
    assert declared.status_code == 413
    assert declared.json()["error"] == "invalid_request"

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 4096):
            yield big[start : start + 4096]

    streamed = http.post(
        "/oauth/token", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert streamed.status_code == 413
    huge = http.post(
        "/admin/api-keys",
        content=b"{" + b" " * 20_000_000 + b"}",
        headers={"Authorization": f"Bearer {sandbox.admin_token}"},
    )
    assert huge.status_code == 413
    assert http.get("/healthz").json() == {"status": "ok"}


def test_wrong_methods_and_unknown_paths_are_json_4xx(http: httpx.Client) -> None:
    wrong_method = http.get("/oauth/token")
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "POST"
    assert wrong_method.json()["error"] == "method_not_allowed"
    assert http.delete("/v1/users").status_code == 405
    missing = http.get("/v2/users")
    assert (missing.status_code, missing.json()["error"]) == (404, "not_found")


def test_malformed_admin_bodies_are_400(sandbox: SandboxProcess, http: httpx.Client) -> None:
    headers = {"Authorization": f"Bearer {sandbox.admin_token}"}
    for content in (b"{not json", b"[]", b'"text"'):
        response = http.put("/admin/settings", content=content, headers=headers)
        assert response.status_code == 400, content
        assert response.json()["error"] == "invalid_request"
    not_found = http.post("/admin/oauth-apps/client_nobody/rotate-secret", headers=headers)
    assert not_found.status_code == 404


def test_the_server_still_serves_after_every_kind_of_bad_input(
    sandbox: SandboxProcess, http: httpx.Client
) -> None:
    garbage = [
        ("POST", "/oauth/token", b"\x00\x01\x02", {"Content-Type": "application/octet-stream"}),
        ("POST", "/oauth/token", b"{}", {"Authorization": "Basic %%%"}),
        ("POST", "/oauth/token", b"{}", {"Authorization": "Bearer x"}),
        ("GET", "/v1/users", b"", {"Authorization": "Bearer " + "A" * 8000}),
        ("POST", "/oauth/revoke", b"token=", {"Content-Type": "application/x-www-form-urlencoded"}),
        (
            "PUT",
            "/admin/faults",
            b'{"token": {"latency_ms": "slow"}}',
            {"Authorization": f"Bearer {sandbox.admin_token}"},
        ),
    ]
    for method, path, content, headers in garbage:
        response = http.request(method, path, content=content, headers=headers)
        assert 400 <= response.status_code < 500, (path, response.status_code, response.text)
    assert http.get("/healthz").status_code == 200
    assert sandbox.running
    assert "Traceback" not in sandbox.log_text()
