"""The admin API: what the spec's dashboard does, plus settings, faults, tokens and usage.

Every route sits under `/admin/` and needs `Authorization: Bearer <admin token>`. JSON in and
out. A secret value (API key, client secret) appears in exactly one response, the one that
created it; listings show ids and status only.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from keyturn.errors import ConfigError
from keyturn.logs import get_logger
from keyturn.secret import Secret
from keyturn_devkit.sandbox import actions
from keyturn_devkit.sandbox.context import SANDBOX, Sandbox
from keyturn_devkit.sandbox.model import BearerRejected, NotFound, OAuthFailure
from keyturn_devkit.sandbox.wire import (
    NO_STORE,
    bearer_challenge,
    bearer_value,
    json_response,
    parse_json_object,
    read_body,
)

log = get_logger("keyturn.sandbox.admin")

Handler = Callable[[web.Request], Awaitable[web.Response]]
AdminHandler = Callable[[web.Request, Sandbox], Awaitable[web.Response]]


def _error(status: int, error: str, description: str, **extra: Any) -> web.Response:
    return json_response({"error": error, "error_description": description, **extra}, status)


def admin_token_matches(sandbox: Sandbox, value: str | None) -> bool:
    """Whether `value` is the admin token (compared in constant time)."""
    expected = sandbox.admin_token.reveal().encode()
    return value is not None and hmac.compare_digest(value.encode(), expected)


def guarded(handler: AdminHandler) -> Handler:
    """Check the admin token, parse errors into 4xx answers, hand the handler the sandbox."""

    @functools.wraps(handler)
    async def wrapper(request: web.Request) -> web.Response:
        sandbox = request.app[SANDBOX]
        value, _ = bearer_value(request.headers.get("Authorization"))
        if not admin_token_matches(sandbox, value) and not _admin_scoped(sandbox, value):
            response = _error(401, "invalid_token", "admin token required")
            challenge = bearer_challenge("invalid_token", "admin token required")
            response.headers["WWW-Authenticate"] = challenge.replace(
                'realm="keyturn-sandbox"', 'realm="keyturn-sandbox-admin"'
            )
            return response
        try:
            return await handler(request, sandbox)
        except OAuthFailure as failure:
            return _error(failure.status, failure.error, failure.description)
        except ConfigError as exc:
            return _error(400, "invalid_request", "invalid settings", problems=exc.problems)
        except NotFound as exc:
            return _error(404, "not_found", str(exc))

    return wrapper


def _admin_scoped(sandbox: Sandbox, value: str | None) -> bool:
    """Whether `value` is a live access token with the `admin_scope` setting's scope."""
    scope = sandbox.state.settings.admin_scope
    if value is None or not scope:
        return False
    try:
        principal = sandbox.state.authenticate_bearer(value)
    except BearerRejected:
        return False
    granted = principal.scope.split() if principal.scope is not None else []
    return principal.kind == "access_token" and scope in granted


async def _body(request: web.Request, sandbox: Sandbox) -> dict[str, Any]:
    raw = await read_body(request, sandbox.state.settings.max_body_bytes)
    return parse_json_object(raw) if raw.strip() else {}


# -- API keys and OAuth applications: the actions the dashboard shares -----------------------


@guarded
async def create_api_key(request: web.Request, sandbox: Sandbox) -> web.Response:
    body = actions.create_api_key(sandbox, await _body(request, sandbox))
    request["key_id"] = body["key_id"]
    return json_response(body, 201, NO_STORE)


@guarded
async def list_api_keys(request: web.Request, sandbox: Sandbox) -> web.Response:
    return json_response({"api_keys": actions.api_keys(sandbox)})


@guarded
async def get_api_key(request: web.Request, sandbox: Sandbox) -> web.Response:
    return json_response(actions.api_key(sandbox, request.match_info["key_id"]))


@guarded
async def revoke_api_key(request: web.Request, sandbox: Sandbox) -> web.Response:
    return json_response(actions.revoke_api_key(sandbox, request.match_info["key_id"]))


@guarded
async def create_oauth_app(request: web.Request, sandbox: Sandbox) -> web.Response:
    body = actions.register_app(sandbox, await _body(request, sandbox))
    request["client_id"] = body["client_id"]
    return json_response(body, 201, NO_STORE)


@guarded
async def list_oauth_apps(request: web.Request, sandbox: Sandbox) -> web.Response:
    return json_response({"oauth_apps": actions.apps(sandbox)})


@guarded
async def get_oauth_app(request: web.Request, sandbox: Sandbox) -> web.Response:
    return json_response(actions.app(sandbox, request.match_info["client_id"]))


@guarded
async def delete_oauth_app(request: web.Request, sandbox: Sandbox) -> web.Response:
    request["client_id"] = request.match_info["client_id"]
    return json_response(actions.delete_app(sandbox, request.match_info["client_id"]))


@guarded
async def rotate_client_secret(request: web.Request, sandbox: Sandbox) -> web.Response:
    client_id = request.match_info["client_id"]
    data = await _body(request, sandbox)
    request["client_id"] = client_id
    return json_response(actions.rotate_client_secret(sandbox, client_id, data), 201, NO_STORE)


@guarded
async def revoke_client_secret(request: web.Request, sandbox: Sandbox) -> web.Response:
    client_id, secret_id = request.match_info["client_id"], request.match_info["secret_id"]
    return json_response(actions.revoke_client_secret(sandbox, client_id, secret_id))


# -- tokens, usage, settings, faults ------------------------------------------------------------


@guarded
async def list_tokens(request: web.Request, sandbox: Sandbox) -> web.Response:
    client_id = request.query.get("client_id")
    now = sandbox.clock.time()
    tokens = sandbox.state.tokens(client_id)
    return json_response({"tokens": [t.to_json(now) for t in tokens]})


@guarded
async def revoke_tokens(request: web.Request, sandbox: Sandbox) -> web.Response:
    """`{"token": value}` revokes that token (a refresh token: its family); `{"client_id"}` all."""
    data = await _body(request, sandbox)
    if isinstance(data.get("token"), str) and data["token"]:
        found = sandbox.state.find_token(Secret(data["token"]))
        if found is None:
            return json_response({"revoked": False})
        sandbox.state.revoke_token(found)
        return json_response({"revoked": True, "token_id": found.token_id, "kind": found.kind})
    if isinstance(data.get("client_id"), str):
        families = sandbox.state.revoke_client_tokens(data["client_id"])
        return json_response({"revoked": families > 0, "families": families})
    raise ConfigError("expected a body with token or client_id")


@guarded
async def introspect_token(request: web.Request, sandbox: Sandbox) -> web.Response:
    """`{"token": value}`: that token's record (as in the listing) plus `active`, or
    `{"active": false}` for a value the sandbox does not know (never issued, or forgotten)."""
    data = await _body(request, sandbox)
    value = data.get("token")
    if not isinstance(value, str) or not value:
        raise ConfigError("expected a body with token")
    found = sandbox.state.find_token(Secret(value))
    if found is None:
        return json_response({"active": False})
    record = found.to_json(sandbox.clock.time())
    return json_response({"active": record["status"] == "active", **record})


@guarded
async def usage(request: web.Request, sandbox: Sandbox) -> web.Response:
    now = sandbox.clock.time()
    state = sandbox.state
    body = {
        "api_keys": {k.key_id: {**k.usage.to_json(), "status": k.status} for k in state.api_keys()},
        "oauth_clients": {a.client_id: a.to_json(now)["usage"] for a in state.apps()},
        "endpoints": sandbox.endpoint_counts(),
        "live_tokens": state.token_count(),
    }
    return json_response(body)


@guarded
async def get_settings(request: web.Request, sandbox: Sandbox) -> web.Response:
    return json_response(sandbox.state.settings.to_json())


@guarded
async def put_settings(request: web.Request, sandbox: Sandbox) -> web.Response:
    """Change some settings (a partial object); the rest keep their values."""
    changes = await _body(request, sandbox)
    settings = sandbox.update_settings(changes)
    log.info("settings changed", settings=sorted(changes))
    return json_response(settings.to_json())


@guarded
async def get_faults(request: web.Request, sandbox: Sandbox) -> web.Response:
    return json_response(sandbox.faults.to_json())


@guarded
async def put_faults(request: web.Request, sandbox: Sandbox) -> web.Response:
    changes = await _body(request, sandbox)
    sandbox.faults.update(changes)
    log.info("faults changed", endpoints=sorted(changes))
    return json_response(sandbox.faults.to_json())


@guarded
async def delete_faults(request: web.Request, sandbox: Sandbox) -> web.Response:
    sandbox.faults.clear()
    log.info("faults cleared")
    return json_response({})


def add_routes(app: web.Application) -> None:
    """Register every admin route (the middleware leaves `/admin/` alone: no faults, no limits)."""
    routes = [
        ("POST", "/admin/api-keys", create_api_key),
        ("GET", "/admin/api-keys", list_api_keys),
        ("GET", "/admin/api-keys/{key_id}", get_api_key),
        ("DELETE", "/admin/api-keys/{key_id}", revoke_api_key),
        ("POST", "/admin/oauth-apps", create_oauth_app),
        ("GET", "/admin/oauth-apps", list_oauth_apps),
        ("GET", "/admin/oauth-apps/{client_id}", get_oauth_app),
        ("DELETE", "/admin/oauth-apps/{client_id}", delete_oauth_app),
        ("POST", "/admin/oauth-apps/{client_id}/rotate-secret", rotate_client_secret),
        ("DELETE", "/admin/oauth-apps/{client_id}/secrets/{secret_id}", revoke_client_secret),
        ("GET", "/admin/tokens", list_tokens),
        ("POST", "/admin/tokens/revoke", revoke_tokens),
        ("POST", "/admin/tokens/introspect", introspect_token),
        ("GET", "/admin/usage", usage),
        ("GET", "/admin/settings", get_settings),
        ("PUT", "/admin/settings", put_settings),
        ("GET", "/admin/faults", get_faults),
        ("PUT", "/admin/faults", put_faults),
        ("DELETE", "/admin/faults", delete_faults),
    ]
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
