"""What the dashboard and the admin API both do: one function per action, fed a parsed body.

The admin API's handlers (the calls keyturn's `http` rotators make) and the dashboard's forms
call these same functions, so a key made by hand in the dashboard and one made by a rotator go
through the same validation and the same state change. Each returns the admin API's JSON
answer; bad input raises `ConfigError` (400), an unknown id `NotFound` (404).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from keyturn.errors import ConfigError
from keyturn_devkit.sandbox.config import Problems, check_int, check_scope
from keyturn_devkit.sandbox.context import Sandbox


def _text(data: dict[str, Any], key: str, *, required: bool, limit: int = 200) -> str:
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()) or len(value) > limit:
        raise ConfigError(f"{key}: expected a string of 1 to {limit} characters")
    return value


def _scope(data: dict[str, Any]) -> str | None:
    if data.get("scope") is None:
        return None
    problems = Problems("request")
    scope = check_scope(problems, "scope", data["scope"])
    if scope is None:
        raise ConfigError(problems.lines)
    return scope


def _redirect_uri(data: dict[str, Any]) -> str:
    """RFC 6749 §3.1.2: an absolute URI without a fragment."""
    uri = _text(data, "redirect_uri", required=True, limit=2000)
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.fragment:
        raise ConfigError("redirect_uri: expected an absolute http(s) URI without a fragment")
    return uri


# -- API keys -----------------------------------------------------------------------------------


def create_api_key(sandbox: Sandbox, data: dict[str, Any]) -> dict[str, Any]:
    """`{"name", "description"?, "scope"?}`: the new key's record plus `key`, shown only here."""
    key, value = sandbox.state.create_api_key(
        _text(data, "name", required=True),
        _text(data, "description", required=False, limit=2000),
        _scope(data),
    )
    return {**key.to_json(), "key": value.reveal()}


def api_keys(sandbox: Sandbox) -> list[dict[str, Any]]:
    return [k.to_json() for k in sandbox.state.api_keys()]


def api_key(sandbox: Sandbox, key_id: str) -> dict[str, Any]:
    return sandbox.state.api_key(key_id).to_json()


def revoke_api_key(sandbox: Sandbox, key_id: str) -> dict[str, Any]:
    return sandbox.state.revoke_api_key(key_id).to_json()


# -- OAuth applications -------------------------------------------------------------------------


def register_app(sandbox: Sandbox, data: dict[str, Any]) -> dict[str, Any]:
    """`{"name", "redirect_uri", "scope"?}`: the app plus `client_secret` and `secret_id`."""
    app, record, value = sandbox.state.register_app(
        _text(data, "name", required=True), _redirect_uri(data), _scope(data)
    )
    return {
        **app.to_json(sandbox.clock.time()),
        "client_secret": value.reveal(),
        "secret_id": record.secret_id,
    }


def apps(sandbox: Sandbox) -> list[dict[str, Any]]:
    now = sandbox.clock.time()
    return [a.to_json(now) for a in sandbox.state.apps()]


def app(sandbox: Sandbox, client_id: str) -> dict[str, Any]:
    return sandbox.state.app(client_id).to_json(sandbox.clock.time())


def delete_app(sandbox: Sandbox, client_id: str) -> dict[str, Any]:
    """The app as it was, its secrets revoked; its grants are revoked and its id forgotten."""
    return sandbox.state.delete_app(client_id).to_json(sandbox.clock.time())


def rotate_client_secret(sandbox: Sandbox, client_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """A new client secret; older ones stay valid for `overlap_seconds` (or the setting)."""
    overlap = data.get("overlap_seconds")
    if overlap is not None:
        problems = Problems("request")
        overlap = check_int(problems, "overlap_seconds", overlap, 0, 366 * 86400)
        if overlap is None:
            raise ConfigError(problems.lines)
    record, value = sandbox.state.rotate_client_secret(client_id, overlap)
    return {
        **app(sandbox, client_id),
        "client_secret": value.reveal(),
        "secret_id": record.secret_id,
    }


def revoke_client_secret(sandbox: Sandbox, client_id: str, secret_id: str) -> dict[str, Any]:
    record = sandbox.state.revoke_client_secret(client_id, secret_id)
    return record.to_json(sandbox.clock.time())
