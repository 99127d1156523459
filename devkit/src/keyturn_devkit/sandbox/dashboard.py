"""The dashboard at /dashboard: the service's "API Keys" and "OAuth Applications" sections.

A person signs in with the admin token and gets a session cookie (HttpOnly, SameSite=Strict,
an hour, Secure over TLS); the token itself never reaches a page. Every form that changes
something carries a CSRF token (the session's, or on the sign-in form one tied to a short-lived
cookie), and a post without the right one is refused with 403. Each change is the admin API's
own action (`actions`), the calls keyturn's rotators make. A new key or client secret is kept
in the session and shown once on the page the form redirects to, never in a URL or a log.
"""

from __future__ import annotations

import functools
import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from keyturn.clock import Clock
from keyturn.errors import ConfigError
from keyturn.logs import get_logger
from keyturn.secret import Secret
from keyturn_devkit.sandbox import actions, snippets
from keyturn_devkit.sandbox import dashboard_pages as pages
from keyturn_devkit.sandbox.admin import admin_token_matches
from keyturn_devkit.sandbox.context import SANDBOX, Sandbox
from keyturn_devkit.sandbox.model import NotFound, OAuthFailure, digest
from keyturn_devkit.sandbox.wire import NO_STORE, parse_params, read_body

log = get_logger("keyturn.sandbox.dashboard")

SESSION_COOKIE = "ktsb_dashboard"
SIGN_IN_COOKIE = "ktsb_sign_in"
SESSION_SECONDS = 3600
SIGN_IN_SECONDS = 600
MAX_SESSIONS = 64
HEADERS = {
    **NO_STORE,
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass
class Session:
    """One signed-in browser: its CSRF token, its end, and what its next page shows once."""

    csrf: str = field(repr=False)
    expires_at: float
    shown_once: dict[str, Secret] = field(default_factory=dict)
    notice: str = ""


class Sessions:
    """Signed-in browsers by the digest of their cookie; expired ones dropped, at most 64."""

    def __init__(self, clock: Clock, lifetime: float = SESSION_SECONDS) -> None:
        self._clock = clock
        self.lifetime = lifetime
        self._sessions: dict[bytes, Session] = {}

    def open(self) -> tuple[str, Session]:
        now = self._clock.time()
        for key in [k for k, s in self._sessions.items() if s.expires_at <= now]:
            del self._sessions[key]
        while len(self._sessions) >= MAX_SESSIONS:  # the oldest goes first
            del self._sessions[next(iter(self._sessions))]
        cookie = secrets.token_urlsafe(32)
        session = Session(csrf=secrets.token_urlsafe(32), expires_at=now + self.lifetime)
        self._sessions[digest(cookie)] = session
        return cookie, session

    def find(self, cookie: str | None) -> Session | None:
        if not cookie:
            return None
        session = self._sessions.get(digest(cookie))
        return session if session is not None and session.expires_at > self._clock.time() else None

    def close(self, cookie: str | None) -> None:
        if cookie:
            self._sessions.pop(digest(cookie), None)


SESSIONS = web.AppKey("dashboard_sessions", Sessions)
Form = dict[str, str]
Action = Callable[[web.Request, Sandbox, Session, Form], Awaitable[web.Response]]


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", headers=HEADERS)


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={**HEADERS, "Location": location})


def _same(given: str | None, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(str(given).encode(), expected.encode())


async def _read_form(request: web.Request, sandbox: Sandbox) -> Form:
    body = await read_body(request, sandbox.state.settings.max_body_bytes)
    content_type = request.headers.get("Content-Type", "application/x-www-form-urlencoded")
    return parse_params(body, content_type)


def _session(request: web.Request) -> Session | None:
    return request.app[SESSIONS].find(request.cookies.get(SESSION_COOKIE))


def page(
    handler: Callable[[web.Request, Sandbox, Session], web.Response],
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A page for signed-in browsers; anyone else is sent to the sign-in form."""

    @functools.wraps(handler)
    async def wrapper(request: web.Request) -> web.Response:
        session = _session(request)
        if session is None:
            return _see_other("/dashboard/sign-in")
        try:
            return handler(request, request.app[SANDBOX], session)
        except NotFound as exc:
            return _html(pages.error_page("Not found", str(exc), csrf=session.csrf), 404)

    return wrapper


def change(handler: Action) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A form post: a session and its CSRF token are required, else 403 and nothing changes."""

    @functools.wraps(handler)
    async def wrapper(request: web.Request) -> web.Response:
        sandbox, session = request.app[SANDBOX], _session(request)
        if session is None:
            return _html(pages.error_page("Signed out", "Sign in again, then retry."), 403)
        try:
            form = await _read_form(request, sandbox)
        except OAuthFailure as failure:
            return _html(pages.error_page("Bad form", failure.description), failure.status)
        if not _same(form.get("csrf"), session.csrf):
            log.warning("dashboard form refused", reason="missing or wrong CSRF token")
            message = "This form did not come from this dashboard page. Reload it and retry."
            return _html(pages.error_page("Refused", message, csrf=session.csrf), 403)
        try:
            return await handler(request, sandbox, session, form)
        except NotFound as exc:
            return _html(pages.error_page("Not found", str(exc), csrf=session.csrf), 404)

    return wrapper


# -- signing in and out -------------------------------------------------------------------------


def _sign_in_form(request: web.Request, problem: str = "", status: int = 200) -> web.Response:
    """The form, with a CSRF token that must come back both in the form and in a cookie."""
    token = secrets.token_urlsafe(32)
    response = _html(pages.sign_in(token, problem), status)
    response.set_cookie(
        SIGN_IN_COOKIE, token, max_age=SIGN_IN_SECONDS, path="/dashboard",
        httponly=True, samesite="Strict", secure=request.secure,
    )  # fmt: skip
    return response


async def sign_in_form(request: web.Request) -> web.Response:
    return _sign_in_form(request)


async def sign_in(request: web.Request) -> web.Response:
    sandbox = request.app[SANDBOX]
    try:
        form = await _read_form(request, sandbox)
    except OAuthFailure as failure:
        return _html(pages.error_page("Bad form", failure.description), failure.status)
    expected = request.cookies.get(SIGN_IN_COOKIE, "")
    if not expected or not _same(form.get("csrf"), expected):
        log.warning("dashboard sign-in refused", reason="missing or wrong CSRF token")
        return _sign_in_form(request, "The sign-in form expired. Sign in again.", 403)
    if not admin_token_matches(sandbox, form.get("admin_token")):
        log.warning("dashboard sign-in refused", reason="wrong admin token")
        return _sign_in_form(request, "That is not this sandbox's admin token.", 401)
    sessions = request.app[SESSIONS]
    cookie, _ = sessions.open()
    log.info("dashboard signed in")
    response = _see_other("/dashboard")
    response.set_cookie(
        SESSION_COOKIE, cookie, max_age=int(sessions.lifetime), path="/dashboard",
        httponly=True, samesite="Strict", secure=request.secure,
    )  # fmt: skip
    response.del_cookie(SIGN_IN_COOKIE, path="/dashboard")
    return response


@change
async def sign_out(
    request: web.Request, sandbox: Sandbox, session: Session, form: Form
) -> web.Response:
    request.app[SESSIONS].close(request.cookies.get(SESSION_COOKIE))
    response = _see_other("/dashboard/sign-in")
    response.del_cookie(SESSION_COOKIE, path="/dashboard")
    return response


# -- pages --------------------------------------------------------------------------------------


@page
def overview(request: web.Request, sandbox: Sandbox, session: Session) -> web.Response:
    notice, session.notice = session.notice, ""
    keys, apps = actions.api_keys(sandbox), actions.apps(sandbox)
    return _html(pages.overview(keys, apps, session.csrf, notice=notice))


def _base_url(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


@page
def api_key_page(request: web.Request, sandbox: Sandbox, session: Session) -> web.Response:
    key = actions.api_key(sandbox, request.match_info["key_id"])
    shown = session.shown_once.pop(key["key_id"], None)
    toml = snippets.api_key(_base_url(request), key)
    value = shown.reveal() if shown else None
    return _html(pages.api_key_page(key, session.csrf, toml, value))


@page
def app_page(request: web.Request, sandbox: Sandbox, session: Session) -> web.Response:
    app = actions.app(sandbox, request.match_info["client_id"])
    shown = session.shown_once.pop(app["client_id"], None)
    toml = snippets.oauth_app(_base_url(request), app)
    value = shown.reveal() if shown else None
    return _html(pages.app_page(app, session.csrf, toml, value))


# -- changes: each one the admin API's action ---------------------------------------------------


def _given(form: Form, *names: str) -> dict[str, object]:
    """The fields a person filled in; an empty optional field is left out, as in the API."""
    return {n: form.get(n, "") for n in names if form.get(n, "").strip() or n == "name"}


def _refused(
    sandbox: Sandbox, session: Session, section: str, form: Form, exc: ConfigError
) -> web.Response:
    keys, apps = actions.api_keys(sandbox), actions.apps(sandbox)
    shown = {k: v for k, v in form.items() if k != "csrf"}
    text = pages.overview(
        keys, apps, session.csrf, problems={section: exc.problems}, forms={section: shown}
    )
    return _html(text, 400)


def _creation(
    section: str,
    make: Callable[[Sandbox, dict[str, object]], dict[str, Any]],
    fields: tuple[str, ...],
    id_field: str,
    value_field: str,
    page: str,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A creation form: make it, keep its value for one showing, go to its page."""

    @change
    async def create(
        request: web.Request, sandbox: Sandbox, session: Session, form: Form
    ) -> web.Response:
        try:
            made = make(sandbox, _given(form, *fields))
        except ConfigError as exc:
            return _refused(sandbox, session, section, form, exc)
        request[id_field] = made[id_field]
        session.shown_once[made[id_field]] = Secret(made.pop(value_field))
        return _see_other(f"{page}/{made[id_field]}")

    return create


create_api_key = _creation(
    "api_key",
    actions.create_api_key,
    ("name", "description", "scope"),
    "key_id",
    "key",
    "/dashboard/api-keys",
)
register_app = _creation(
    "oauth_app",
    actions.register_app,
    ("name", "redirect_uri", "scope"),
    "client_id",
    "client_secret",
    "/dashboard/oauth-apps",
)


@change
async def revoke_api_key(
    request: web.Request, sandbox: Sandbox, session: Session, form: Form
) -> web.Response:
    key = actions.revoke_api_key(sandbox, request.match_info["key_id"])
    request["key_id"] = key["key_id"]
    return _see_other(f"/dashboard/api-keys/{key['key_id']}")


@change
async def rotate_client_secret(
    request: web.Request, sandbox: Sandbox, session: Session, form: Form
) -> web.Response:
    client_id = request.match_info["client_id"]
    request["client_id"] = client_id
    data: dict[str, object] = {}
    overlap = form.get("overlap_seconds", "").strip()
    if overlap:
        data["overlap_seconds"] = int(overlap) if overlap.isdigit() else overlap
    try:
        app = actions.rotate_client_secret(sandbox, client_id, data)
    except ConfigError as exc:
        message = "; ".join(exc.problems)
        return _html(pages.error_page("Not rotated", message, csrf=session.csrf), 400)
    session.shown_once[client_id] = Secret(app.pop("client_secret"))
    return _see_other(f"/dashboard/oauth-apps/{client_id}")


@change
async def delete_app(
    request: web.Request, sandbox: Sandbox, session: Session, form: Form
) -> web.Response:
    app = actions.delete_app(sandbox, request.match_info["client_id"])
    request["client_id"] = app["client_id"]
    session.notice = f"Deleted the application {app['name']} ({app['client_id']})."
    return _see_other("/dashboard#oauth-apps")


# -- static files and routes --------------------------------------------------------------------


def _static(text: str, content_type: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def serve(request: web.Request) -> web.Response:
        headers = {"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"}
        return web.Response(text=text, content_type=content_type, headers=headers)

    return serve


def add_routes(app: web.Application, clock: Clock) -> None:
    app[SESSIONS] = Sessions(clock)
    routes = [
        ("GET", "/dashboard", overview),
        ("GET", "/dashboard/sign-in", sign_in_form),
        ("POST", "/dashboard/sign-in", sign_in),
        ("POST", "/dashboard/sign-out", sign_out),
        ("POST", "/dashboard/api-keys", create_api_key),
        ("GET", "/dashboard/api-keys/{key_id}", api_key_page),
        ("POST", "/dashboard/api-keys/{key_id}/revoke", revoke_api_key),
        ("POST", "/dashboard/oauth-apps", register_app),
        ("GET", "/dashboard/oauth-apps/{client_id}", app_page),
        ("POST", "/dashboard/oauth-apps/{client_id}/rotate-secret", rotate_client_secret),
        ("POST", "/dashboard/oauth-apps/{client_id}/delete", delete_app),
        ("GET", "/dashboard/static/dashboard.css", _static(pages.STYLE, "text/css")),
        ("GET", "/dashboard/static/dashboard.js", _static(pages.SCRIPT, "text/javascript")),
    ]
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
