"""The aiohttp Application: routes, and one middleware for faults, rate limits and the access log.

Order for a service endpoint (`token`, `revoke`, `users`, `projects`): injected latency, then an
injected outage or error, then the rate limit, then the handler, then an injected answer delay.
Admin routes and `/healthz` skip faults and limits, so a test can always reach the admin API to
undo what it set.

The access log names the route pattern, never the raw path or query (which a careless client
could fill with a token), and only non-secret ids: client_id, key_id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from keyturn.logs import get_logger
from keyturn_devkit.sandbox import admin, dashboard, oauth
from keyturn_devkit.sandbox.config import ENDPOINTS
from keyturn_devkit.sandbox.context import SANDBOX, Sandbox
from keyturn_devkit.sandbox.faults import Fault
from keyturn_devkit.sandbox.resources import PROJECTS, USERS, listing
from keyturn_devkit.sandbox.wire import NO_STORE, json_response

log = get_logger("keyturn.sandbox")
# A concrete logger bound once logging is configured: the lazy proxy re-binds on every call,
# a cost the access log would pay per request.
ACCESS_LOG: web.AppKey[Any] = web.AppKey("access_log", object)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_LOGGED = ("client_id", "key_id", "grant_type", "oauth_error", "auth_error", "family_id", "fault")


def _fault_response(fault: Fault) -> web.Response:
    headers = dict(NO_STORE)
    if fault.retry_after is not None:
        headers["Retry-After"] = str(fault.retry_after)
    body = {
        "error": "temporarily_unavailable",
        "error_description": f"injected fault ({fault.reason})",
    }
    return json_response(body, fault.status or 503, headers)


def _rate_limited(retry_after: int) -> web.Response:
    body = {
        "error": "rate_limited",
        "error_description": f"rate limit exceeded; retry after {retry_after} s",
        "retry_after": retry_after,
    }
    return json_response(body, 429, {**NO_STORE, "Retry-After": str(retry_after)})


async def _service(
    request: web.Request, handler: Handler, sandbox: Sandbox, endpoint: str
) -> web.StreamResponse:
    fault = sandbox.faults.decide(endpoint)
    if fault is not None:
        if fault.latency:
            await sandbox.clock.sleep(fault.latency)
        if fault.status is not None:
            request["fault"] = fault.reason
            if fault.drop_connection and request.transport is not None:
                request.transport.close()
            return _fault_response(fault)
    retry_after = sandbox.limiter.check(endpoint)
    if retry_after is not None:
        request["fault"] = "rate_limited"
        return _rate_limited(retry_after)
    response = await handler(request)
    if fault is not None and fault.answer_delay:
        # The request is handled (a refresh token rotated, a token revoked); only the answer
        # is late. A client that gives up meanwhile never learns what happened.
        request["fault"] = "answer_delay"
        await sandbox.clock.sleep(fault.answer_delay)
    return response


def _from_http_exception(exc: web.HTTPException) -> web.Response:
    """404/405/413 from aiohttp itself, as JSON like every other answer."""
    headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "invalid_request")
    return json_response({"error": code, "error_description": exc.reason}, exc.status, headers)


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    sandbox = request.app[SANDBOX]
    started = sandbox.clock.monotonic()
    route = request.match_info.route
    endpoint = route.name if route.name in ENDPOINTS else None
    response: web.StreamResponse
    try:
        if endpoint is not None:
            response = await _service(request, handler, sandbox, endpoint)
        else:
            response = await handler(request)
    except web.HTTPException as exc:
        response = _from_http_exception(exc)
    except (ConnectionError, asyncio.CancelledError):
        raise  # the client went away; nothing to answer
    except Exception as exc:  # a bug must not take the server down, nor leak a traceback
        log.error("request failed", error_type=type(exc).__name__, exc_info=True)
        response = json_response(
            {"error": "server_error", "error_description": "internal error"}, 500
        )
    group = endpoint or ("admin" if request.path.startswith("/admin/") else "other")
    sandbox.responses[(group, response.status)] += 1
    if sandbox.state.settings.access_log:
        resource = route.resource
        fields: dict[str, Any] = {k: request[k] for k in _LOGGED if k in request}
        request.app[ACCESS_LOG].info(
            "request",
            method=request.method,
            route=resource.canonical if resource is not None else "<unmatched>",
            status=response.status,
            latency_ms=round((sandbox.clock.monotonic() - started) * 1000, 2),
            **fields,
        )
    return response


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


def create_app(sandbox: Sandbox) -> web.Application:
    """The sandbox's Application; `client_max_size` backs up the per-handler body limits."""
    app = web.Application(middlewares=[middleware], client_max_size=16 * 1024 * 1024)
    app[SANDBOX] = sandbox
    app[ACCESS_LOG] = get_logger("keyturn.sandbox.access").bind()
    app.router.add_post("/oauth/token", oauth.token, name="token")
    app.router.add_post("/oauth/revoke", oauth.revoke, name="revoke")
    app.router.add_get("/v1/users", listing(USERS, "users:read"), name="users", allow_head=False)
    app.router.add_get(
        "/v1/projects", listing(PROJECTS, "projects:read"), name="projects", allow_head=False
    )
    app.router.add_get("/healthz", healthz, name="healthz", allow_head=False)
    admin.add_routes(app)
    dashboard.add_routes(app, sandbox.clock)
    return app
