"""The sandbox's dashboard over real HTTP (httpx): its sign-in and session cookie, CSRF
refusals, HTML escaping, values shown once, the admin API's own actions, and the keyturn
configuration each page shows, loaded with keyturn's loader. One sandbox for the module."""

from __future__ import annotations

import html
import re
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from keyturn.clock import FakeClock
from keyturn.config import load_config
from keyturn.secret import Secret
from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.dev.tls import make_throwaway_pki
from keyturn_devkit.sandbox.app import create_app
from keyturn_devkit.sandbox.config import Settings
from keyturn_devkit.sandbox.context import Sandbox
from keyturn_devkit.sandbox.dashboard import SESSION_SECONDS, Sessions

pytestmark = pytest.mark.sandbox

SCRIPT_NAME = "<script>alert('owned')</script> & co"
VAULT_TABLE = '[vault]\naddress = "http://127.0.0.1:8200"\nauth = { method = "token", token = "env:VAULT_TOKEN" }\n'  # noqa: E501


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    with SandboxProcess(workdir=tmp_path_factory.mktemp("dashboard")) as process:
        yield process


@pytest.fixture
def dashboards(sandbox: SandboxProcess) -> Iterator[Callable[[], Dashboard]]:
    """New browsers-without-a-browser on the module's sandbox, closed at the test's end."""
    made: list[Dashboard] = []

    def make() -> Dashboard:
        made.append(Dashboard(sandbox))
        return made[-1]

    yield make
    for dashboard in made:
        dashboard.http.close()


class Dashboard:
    """A browser without a browser: cookies, the CSRF token of the last page, every URL seen."""

    def __init__(self, sandbox: SandboxProcess) -> None:
        self.http = loopback.client(base_url=sandbox.base_url)
        self.admin_token = sandbox.admin_token
        self.pages: list[str] = []
        self.urls: list[str] = []
        self.csrf = ""

    def get(self, path: str) -> httpx.Response:
        response = self.http.get(path)
        self._seen(response)
        return response

    def post(self, path: str, **form: str) -> httpx.Response:
        data = {"csrf": self.csrf, **form}
        response = self.http.post(path, data={k: v for k, v in data.items() if v is not None})
        self._seen(response)
        return response

    def follow(self, response: httpx.Response) -> httpx.Response:
        assert response.status_code == 303, response.text
        return self.get(response.headers["location"])

    def _seen(self, response: httpx.Response) -> None:
        self.urls += [str(response.url), response.headers.get("location", "")]
        if response.headers.get("content-type", "").startswith("text/html"):
            self.pages.append(response.text)
            found = re.search(r'name="csrf" value="([^"]+)"', response.text)
            self.csrf = found[1] if found else self.csrf

    def sign_in(self) -> httpx.Response:
        self.get("/dashboard/sign-in")
        signed_in = self.post("/dashboard/sign-in", admin_token=self.admin_token)
        self.follow(signed_in)
        return signed_in


def shown_once(page: str) -> str | None:
    found = re.search(r'<code id="shown-once">([^<]+)</code>', page)
    return html.unescape(found[1]) if found else None


def configuration(page: str) -> str:
    found = re.search(r'<pre id="keyturn-toml">(.*?)</pre>', page, re.S)
    assert found, "the page shows no keyturn configuration"
    return html.unescape(found[1])


def create_key(dashboard: Dashboard, name: str, description: str = "") -> tuple[str, str]:
    """Through the form: (key_id, the page it redirects to)."""
    created = dashboard.post("/dashboard/api-keys", name=name, description=description)
    page = dashboard.follow(created).text
    return created.headers["location"].rsplit("/", 1)[1], page


def register_app(dashboard: Dashboard, name: str) -> tuple[str, str]:
    created = dashboard.post(
        "/dashboard/oauth-apps", name=name, redirect_uri="https://app.example/callback"
    )
    page = dashboard.follow(created).text
    return created.headers["location"].rsplit("/", 1)[1], page


def token_for(sandbox: SandboxProcess, client_id: str, secret: str) -> httpx.Response:
    body = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}
    return HTTP.post(f"{sandbox.base_url}/oauth/token", json=body)


def users(sandbox: SandboxProcess, credential: str) -> int:
    headers = {"Authorization": f"Bearer {credential}"}
    return HTTP.get(f"{sandbox.base_url}/v1/users", headers=headers).status_code


def test_sign_in_gives_a_strict_http_only_session_cookie_that_expires(
    sandbox: SandboxProcess,
    dashboards: Callable[[], Dashboard],
) -> None:
    dashboard = dashboards()
    assert dashboard.get("/dashboard").headers["location"] == "/dashboard/sign-in"
    signed_in = dashboard.sign_in()
    cookie = next(c for c in signed_in.headers.get_list("set-cookie") if "ktsb_dashboard=" in c)
    attributes = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "samesite", "max-age", "path"} <= attributes
    assert "SameSite=Strict" in cookie
    assert f"Max-Age={SESSION_SECONDS}" in cookie
    assert "secure" not in attributes  # plain HTTP: a Secure cookie would never come back
    overview = dashboard.get("/dashboard")
    assert overview.status_code == 200
    assert "API Keys" in overview.text
    assert "OAuth Applications" in overview.text
    assert "default-src 'none'" in overview.headers["content-security-policy"]


def test_sessions_end_after_their_lifetime() -> None:
    clock = FakeClock()
    sessions = Sessions(clock)
    cookie, _ = sessions.open()
    clock.advance(SESSION_SECONDS - 1)
    assert sessions.find(cookie) is not None
    clock.advance(1)
    assert sessions.find(cookie) is None


@pytest.mark.parametrize(
    ("token", "sign_in_csrf", "status"),
    [("wrong", "right", 401), ("right", None, 403), ("right", "wrong", 403)],
)
def test_sign_in_refuses_a_wrong_token_or_a_form_without_its_csrf_token(
    sandbox: SandboxProcess,
    dashboards: Callable[[], Dashboard],
    token: str,
    sign_in_csrf: str | None,
    status: int,
) -> None:
    dashboard = dashboards()
    dashboard.get("/dashboard/sign-in")
    csrf = {"right": dashboard.csrf, "wrong": "forged", None: None}[sign_in_csrf]
    admin_token = sandbox.admin_token if token == "right" else "ktsb_admin_wrong"
    dashboard.csrf = ""
    refused = dashboard.post("/dashboard/sign-in", admin_token=admin_token, csrf=csrf)  # type: ignore[arg-type]
    assert refused.status_code == status
    assert not any("ktsb_dashboard=" in c for c in refused.headers.get_list("set-cookie"))
    assert dashboard.get("/dashboard").status_code == 303


@pytest.mark.parametrize("csrf", [None, "", "forged", "another session's"])
def test_every_change_without_the_sessions_csrf_token_is_refused(
    sandbox: SandboxProcess, dashboards: Callable[[], Dashboard], csrf: str | None
) -> None:
    dashboard = dashboards()
    dashboard.sign_in()
    key_id, _ = create_key(dashboard, "csrf-target")
    client_id, _ = register_app(dashboard, "csrf-target")
    other = dashboards()
    other.sign_in()
    forged = other.csrf if csrf == "another session's" else csrf
    before = (sandbox.admin.list_api_keys(), sandbox.admin.list_oauth_apps())
    for path, form in [
        ("/dashboard/api-keys", {"name": "forged", "description": ""}),
        (f"/dashboard/api-keys/{key_id}/revoke", {}),
        ("/dashboard/oauth-apps", {"name": "forged", "redirect_uri": "https://x.example/"}),
        (f"/dashboard/oauth-apps/{client_id}/rotate-secret", {}),
        (f"/dashboard/oauth-apps/{client_id}/delete", {}),
        ("/dashboard/sign-out", {}),
    ]:
        response = dashboard.http.post(
            path, data={**form, "csrf": forged} if forged is not None else form
        )
        assert response.status_code == 403, path
        assert "did not come from this dashboard" in response.text
    assert (sandbox.admin.list_api_keys(), sandbox.admin.list_oauth_apps()) == before
    assert dashboard.get("/dashboard").status_code == 200  # still signed in: sign-out refused too
    signed_out = HTTP.post(
        f"{sandbox.base_url}/dashboard/api-keys", data={"name": "x", "csrf": dashboard.csrf}
    )
    assert signed_out.status_code == 403  # the token without the session cookie is worth nothing


def test_an_api_key_made_and_revoked_in_the_dashboard_is_the_admin_apis(
    sandbox: SandboxProcess,
    dashboards: Callable[[], Dashboard],
) -> None:
    dashboard = dashboards()
    dashboard.sign_in()
    key_id, page = create_key(dashboard, SCRIPT_NAME, "<b>nightly</b> export")
    value = shown_once(page)
    assert value is not None
    assert value.startswith("ktsb_key_")
    assert 'data-copy="shown-once"' in page
    record = sandbox.admin.get_api_key(key_id)
    assert (record["name"], record["description"]) == (SCRIPT_NAME, "<b>nightly</b> export")
    assert users(sandbox, value) == 200
    assert shown_once(dashboard.get(f"/dashboard/api-keys/{key_id}").text) is None
    assert value not in dashboard.get("/dashboard").text

    for seen in dashboard.pages:
        assert "<script>alert" not in seen
        assert "<b>nightly" not in seen
    assert "&lt;script&gt;alert(&#x27;owned&#x27;)&lt;/script&gt; &amp; co" in dashboard.pages[-1]

    revoked = dashboard.post(f"/dashboard/api-keys/{key_id}/revoke")
    assert "revoked" in dashboard.follow(revoked).text
    assert sandbox.admin.get_api_key(key_id)["status"] == "revoked"
    assert users(sandbox, value) == 401


def test_an_app_registered_rotated_and_deleted_in_the_dashboard(
    sandbox: SandboxProcess, dashboards: Callable[[], Dashboard]
) -> None:
    dashboard = dashboards()
    dashboard.sign_in()
    client_id, page = register_app(dashboard, "reporting")
    first = shown_once(page)
    assert first is not None
    issued = token_for(sandbox, client_id, first)
    assert issued.status_code == 200
    assert sandbox.admin.get_oauth_app(client_id)["redirect_uri"] == "https://app.example/callback"

    rotated = dashboard.post(
        f"/dashboard/oauth-apps/{client_id}/rotate-secret", overlap_seconds="0"
    )
    second = shown_once(dashboard.follow(rotated).text)
    assert second is not None
    assert second != first
    assert token_for(sandbox, client_id, second).status_code == 200
    assert token_for(sandbox, client_id, first).status_code == 401  # no overlap asked for
    assert shown_once(dashboard.get(f"/dashboard/oauth-apps/{client_id}").text) is None

    deleted = dashboard.post(f"/dashboard/oauth-apps/{client_id}/delete")
    assert "Deleted the application reporting" in dashboard.follow(deleted).text
    with pytest.raises(httpx.HTTPStatusError):
        sandbox.admin.get_oauth_app(client_id)
    assert token_for(sandbox, client_id, second).status_code == 401
    assert users(sandbox, issued.json()["access_token"]) == 401
    assert dashboard.get(f"/dashboard/oauth-apps/{client_id}").status_code == 404


def test_bad_input_is_answered_on_the_page_escaped_and_nothing_is_made(
    sandbox: SandboxProcess,
    dashboards: Callable[[], Dashboard],
) -> None:
    dashboard = dashboards()
    dashboard.sign_in()
    before = len(sandbox.admin.list_oauth_apps())
    refused = dashboard.post(
        "/dashboard/oauth-apps", name=SCRIPT_NAME, redirect_uri="javascript:alert(1)"
    )
    assert refused.status_code == 400
    assert "redirect_uri: expected an absolute http(s) URI" in refused.text
    assert "<script>alert" not in refused.text
    assert len(sandbox.admin.list_oauth_apps()) == before
    empty = dashboard.post("/dashboard/api-keys", name="  ", description="")
    assert empty.status_code == 400
    assert "name: expected a string" in empty.text


def test_each_pages_configuration_loads_with_keyturns_loader(
    sandbox: SandboxProcess, dashboards: Callable[[], Dashboard], tmp_path: Path
) -> None:
    dashboard = dashboards()
    dashboard.sign_in()
    key_id, key_page = create_key(dashboard, SCRIPT_NAME)
    client_id, app_page = register_app(dashboard, "Reporting (EU)")
    for name, page in [("key", key_page), ("app", app_page)]:
        path = tmp_path / f"{name}.toml"
        path.write_text(VAULT_TABLE + configuration(page))
        config = load_config(path, environ={})
        (credential,) = config.credentials
        assert config.providers["sandbox"].base_url.rstrip("/") == sandbox.base_url
        if name == "key":
            assert (credential.name, credential.kind) == ("script-alert-owned-script-co", "api_key")
            assert credential.initial_key_id == key_id
        else:
            assert (credential.name, credential.kind) == ("reporting-eu", "oauth_client")
            assert credential.client_id is not None
            assert credential.client_id.location == client_id


def test_no_secret_in_a_url_a_log_line_or_the_admin_token_in_a_page(
    sandbox: SandboxProcess,
    dashboards: Callable[[], Dashboard],
) -> None:
    dashboard = dashboards()
    dashboard.sign_in()
    session = dashboard.http.cookies["ktsb_dashboard"]
    _, key_page = create_key(dashboard, "logged")
    client_id, app_page = register_app(dashboard, "logged")
    dashboard.follow(dashboard.post(f"/dashboard/oauth-apps/{client_id}/rotate-secret"))
    values = [shown_once(key_page), shown_once(app_page), shown_once(dashboard.pages[-1])]
    secrets = [v for v in values if v is not None]
    assert len(secrets) == 3
    secrets += [sandbox.admin_token, session, dashboard.csrf]
    log = sandbox.log_text()
    assert "/dashboard/sign-in" in log  # the access log saw the dashboard's requests
    for secret in secrets:
        assert secret not in log
        assert not any(secret in url for url in dashboard.urls)
    assert not any(sandbox.admin_token in page for page in dashboard.pages)


async def test_the_session_cookie_is_secure_over_tls(tmp_path: Path) -> None:
    pki = make_throwaway_pki(tmp_path / "pki")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert, pki.key)
    sandbox = Sandbox.create(Settings(), FakeClock(), Secret("ktsb_admin_tls"))
    runner = web.AppRunner(create_app(sandbox))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        port = runner.addresses[0][1]
        verify = ssl.create_default_context(cafile=str(pki.ca_cert))
        async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{port}", verify=verify) as http:
            form = await http.get("/dashboard/sign-in")
            assert "Secure" in form.headers["set-cookie"]
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf
            data = {"csrf": csrf[1], "admin_token": "ktsb_admin_tls"}
            signed_in = await http.post("/dashboard/sign-in", data=data)
        assert signed_in.status_code == 303
        cookie = next(c for c in signed_in.headers.get_list("set-cookie") if "ktsb_dashboard" in c)
        assert "Secure" in cookie.split(";")[1:] or "; Secure" in cookie
    finally:
        await runner.cleanup()
