"""`GET /v1/users` and `GET /v1/projects`: small fixed lists behind Bearer authentication.

Either credential works on either path, as the spec says. A missing, malformed, unknown,
expired or revoked credential gets 401 with an RFC 6750 `WWW-Authenticate` challenge (an
unknown, expired or revoked one gets 403 instead with the setting `invalid_token_status = 403`,
as some providers answer); an access token without the path's scope (`users:read`,
`projects:read`) gets 403 `insufficient_scope`.
API keys carry every scope unless created with a narrower one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from keyturn_devkit.sandbox.context import SANDBOX
from keyturn_devkit.sandbox.model import BearerRejected
from keyturn_devkit.sandbox.wire import bearer_challenge, bearer_value, json_response

USERS: Sequence[dict[str, Any]] = (
    {
        "id": "usr_01",
        "name": "Ada Lovelace",
        "email": "ada@example.com",
        "role": "admin",
        "created_at": "2024-01-15T09:30:00Z",
    },
    {
        "id": "usr_02",
        "name": "Grace Hopper",
        "email": "grace@example.com",
        "role": "member",
        "created_at": "2024-02-03T14:05:00Z",
    },
    {
        "id": "usr_03",
        "name": "Alan Turing",
        "email": "alan@example.com",
        "role": "member",
        "created_at": "2024-03-21T11:45:00Z",
    },
)

PROJECTS: Sequence[dict[str, Any]] = (
    {
        "id": "prj_01",
        "name": "analytical-engine",
        "owner_id": "usr_01",
        "status": "active",
        "created_at": "2024-01-16T08:00:00Z",
    },
    {
        "id": "prj_02",
        "name": "compiler",
        "owner_id": "usr_02",
        "status": "active",
        "created_at": "2024-02-10T16:20:00Z",
    },
    {
        "id": "prj_03",
        "name": "enigma-notes",
        "owner_id": "usr_03",
        "status": "archived",
        "created_at": "2024-04-02T10:10:00Z",
    },
)

Handler = Callable[[web.Request], Awaitable[web.Response]]


def _rejected(rejection: BearerRejected, scope: str | None = None) -> web.Response:
    challenge = bearer_challenge(rejection.error, rejection.description, scope)
    body: dict[str, Any] = {"error": rejection.error or "unauthorized"}
    body["error_description"] = rejection.description or "a Bearer credential is required"
    return json_response(body, rejection.status, {"WWW-Authenticate": challenge})


def listing(records: Sequence[dict[str, Any]], scope: str) -> Handler:
    """A handler answering `{"data": records, "has_more": false}` to an authorized caller."""
    body = {"data": list(records), "has_more": False}

    async def handler(request: web.Request) -> web.Response:
        state = request.app[SANDBOX].state
        value, malformed = bearer_value(request.headers.get("Authorization"))
        try:
            if value is None:
                # RFC 6750 §3.1: no error code when no credential was offered at all.
                raise BearerRejected("invalid_request" if malformed else None, malformed)
            principal = state.authenticate_bearer(value)
        except BearerRejected as rejection:
            request["auth_error"] = rejection.error or "missing"
            return _rejected(rejection)
        request["key_id" if principal.kind == "api_key" else "client_id"] = principal.credential_id
        if not principal.allows(scope):
            request["auth_error"] = "insufficient_scope"
            denied = BearerRejected(
                "insufficient_scope", f"this request needs the scope {scope}", status=403
            )
            return _rejected(denied, scope)
        return json_response(body)

    return handler
