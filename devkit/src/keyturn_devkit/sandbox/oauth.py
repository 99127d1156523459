"""`POST /oauth/token` (RFC 6749 §4.4 and §6) and `POST /oauth/revoke` (RFC 7009).

Bodies are the spec's JSON object or an RFC 6749 form; the client authenticates with
`client_id`/`client_secret` in the body (the spec's way, `client_secret_post`) or with HTTP
Basic (`client_secret_basic`), never both. Every answer carries `Cache-Control: no-store`.
"""

from __future__ import annotations

from aiohttp import web

from keyturn.secret import Secret
from keyturn_devkit.sandbox.config import Problems, check_scope
from keyturn_devkit.sandbox.context import SANDBOX, Sandbox
from keyturn_devkit.sandbox.model import OAuthApp, OAuthFailure
from keyturn_devkit.sandbox.wire import (
    NO_STORE,
    basic_credentials,
    json_response,
    oauth_error,
    parse_params,
    parse_token_params,
    read_body,
)

GRANT_TYPES = ("client_credentials", "refresh_token")
# What the token endpoint knows; with `refuse_unknown_parameters`, anything else is refused.
TOKEN_PARAMETERS = frozenset(
    {"grant_type", "client_id", "client_secret", "scope", "refresh_token", "audience"}
)


async def _params(request: web.Request, sandbox: Sandbox) -> dict[str, str]:
    body = await read_body(request, sandbox.state.settings.max_body_bytes)
    return parse_params(body, request.headers.get("Content-Type", ""))


async def _token_params(
    request: web.Request, sandbox: Sandbox
) -> tuple[dict[str, str], tuple[str, ...]]:
    body = await read_body(request, sandbox.state.settings.max_body_bytes)
    return parse_token_params(body, request.headers.get("Content-Type", ""))


def _targets(
    sandbox: Sandbox, params: dict[str, str], resources: tuple[str, ...]
) -> tuple[str, ...]:
    """The `audience` and RFC 8707 `resource` values asked for, each one the settings allow
    (`invalid_target` naming the parameter otherwise), and no parameter it does not know when
    `refuse_unknown_parameters` is on (`invalid_request` naming it)."""
    settings = sandbox.state.settings
    if settings.refuse_unknown_parameters:
        unknown = sorted(set(params) - TOKEN_PARAMETERS)
        if unknown:
            raise OAuthFailure("invalid_request", f"unknown parameter {unknown[0]}")
    audience = params.get("audience")
    asked = ((("audience", audience),) if audience else ()) + tuple(
        ("resource", r) for r in resources
    )
    for name, value in asked:
        if settings.allowed_targets and value not in settings.allowed_targets:
            raise OAuthFailure("invalid_target", f"{name} is not one this server serves")
    return tuple(dict.fromkeys(value for _, value in asked))


def _authenticate(request: web.Request, sandbox: Sandbox, params: dict[str, str]) -> OAuthApp:
    """RFC 6749 §2.3.1: Basic or body credentials, exactly one method."""
    header = request.headers.get("Authorization")
    body_id = params.get("client_id")
    body_secret = params.get("client_secret")
    if header:
        basic = basic_credentials(header)
        if basic is None:
            raise OAuthFailure(
                "invalid_client", "unsupported Authorization scheme: use Basic or body", 401
            )
        if body_secret is not None:
            raise OAuthFailure("invalid_request", "client authenticated both by Basic and body")
        if body_id is not None and body_id != basic[0]:
            raise OAuthFailure("invalid_request", "client_id in the body does not match Basic")
        client_id, secret = basic
    elif not body_id or body_secret is None:
        raise OAuthFailure("invalid_client", "client_id and client_secret are required", 401)
    else:
        client_id, secret = body_id, Secret(body_secret)
    # The access log shows the client_id, but only a registered one: a confused caller may
    # have put its secret in that field.
    if sandbox.state.has_app(client_id):
        request["client_id"] = client_id
    return sandbox.state.authenticate_client(client_id, secret)


def _requested_scope(params: dict[str, str]) -> str | None:
    scope = params.get("scope")
    if scope is None or scope == "":
        return None
    problems = Problems("request")
    if check_scope(problems, "scope", scope) is None:
        raise OAuthFailure("invalid_scope", "scope must be space-separated scope tokens")
    return scope


async def token(request: web.Request) -> web.Response:
    sandbox = request.app[SANDBOX]
    try:
        params, resources = await _token_params(request, sandbox)
        grant_type = params.get("grant_type")
        if not grant_type:
            raise OAuthFailure("invalid_request", "grant_type is required")
        if grant_type not in GRANT_TYPES:
            raise OAuthFailure(
                "unsupported_grant_type",
                f"grant_type must be one of {', '.join(GRANT_TYPES)}",
            )
        request["grant_type"] = grant_type
        app = _authenticate(request, sandbox, params)
        scope = _requested_scope(params)
        targets = _targets(sandbox, params, resources)
        if grant_type == "client_credentials":
            grant = sandbox.state.grant_client_credentials(app, scope, targets)
        else:
            refresh_token = params.get("refresh_token")
            if not refresh_token:
                raise OAuthFailure("invalid_request", "refresh_token is required")
            grant = sandbox.state.grant_refresh_token(app, Secret(refresh_token), scope, targets)
    except OAuthFailure as failure:
        request["oauth_error"] = failure.error
        return oauth_error(failure)
    request["family_id"] = grant.family_id
    return json_response(grant.to_json(), 200, NO_STORE)


async def revoke(request: web.Request) -> web.Response:
    """RFC 7009: 200 whether or not the token was known; another client's token is refused."""
    sandbox = request.app[SANDBOX]
    try:
        params = await _params(request, sandbox)
        value = params.get("token")
        if not value:
            raise OAuthFailure("invalid_request", "token is required")
        app = _authenticate(request, sandbox, params)
        found = sandbox.state.find_token(Secret(value))
        if found is not None:
            if found.client_id != app.client_id:
                raise OAuthFailure("invalid_request", "token was issued to another client")
            sandbox.state.revoke_token(found)
    except OAuthFailure as failure:
        request["oauth_error"] = failure.error
        return oauth_error(failure)
    return json_response({}, 200, NO_STORE)
