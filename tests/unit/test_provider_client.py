"""The token client over httpx.MockTransport: request shapes, strict parsing, error mapping."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from urllib.parse import parse_qs

import httpx
import pytest

from keyturn.clock import FakeClock
from keyturn.errors import MalformedResponse, OAuthError, ProviderUnavailable, RateLimited
from keyturn.providers.client import ProviderClient, ProviderSettings
from keyturn.providers.http import parse_retry_after
from keyturn.secret import Secret

SECRET = Secret("cs-very-secret")
REFRESH = Secret("rt-very-secret")


def make_client(
    handler: Callable[[httpx.Request], httpx.Response], **settings: object
) -> ProviderClient:
    base = ProviderSettings(name="acme", base_url="https://acme.test")
    merged = {**{f: getattr(base, f) for f in base.__slots__}, **settings}
    return ProviderClient(
        ProviderSettings(**merged),  # type: ignore[arg-type]
        clock=FakeClock(),
        transport=httpx.MockTransport(handler),
    )


def ok(body: dict[str, object]) -> httpx.Response:
    return httpx.Response(200, json=body, headers={"Cache-Control": "no-store"})


GOOD = {"access_token": "at-1", "token_type": "Bearer", "expires_in": 3600, "refresh_token": "rt-2"}


async def test_json_body_as_in_the_spec() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return ok(GOOD)

    client = make_client(handler)
    token = await client.request_token(
        "reporting",
        grant_type="refresh_token",
        client_id="cid",
        client_secret=SECRET,
        refresh_token=REFRESH,
    )
    assert token.access_token.reveal() == "at-1"
    assert token.refresh_token is not None and token.refresh_token.reveal() == "rt-2"
    assert token.expires_in == 3600
    request = seen[0]
    assert request.url.path == "/oauth/token"
    assert request.headers["content-type"] == "application/json"
    assert "authorization" not in request.headers
    assert json.loads(request.content) == {
        "grant_type": "refresh_token",
        "refresh_token": "rt-very-secret",
        "client_id": "cid",
        "client_secret": "cs-very-secret",
    }


async def test_form_body_with_basic_auth() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return ok({"access_token": "at", "token_type": "bearer"})

    client = make_client(handler, token_request="form", client_auth="basic")
    token = await client.request_token(
        "r", grant_type="client_credentials", client_id="id:1", client_secret=SECRET, scope="a b"
    )
    assert token.expires_in is None and token.refresh_token is None
    request = seen[0]
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    assert parse_qs(request.content.decode()) == {
        "grant_type": ["client_credentials"],
        "scope": ["a b"],
    }
    scheme, encoded = request.headers["authorization"].split()
    assert scheme == "Basic"
    assert base64.b64decode(encoded).decode() == "id%3A1:cs-very-secret"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "body"),
        (b"[1,2]", "body"),
        (json.dumps({"token_type": "Bearer", "expires_in": 10}).encode(), "access_token"),
        (json.dumps({"access_token": "", "token_type": "Bearer"}).encode(), "access_token"),
        (json.dumps({"access_token": "a", "token_type": "mac"}).encode(), "token_type"),
        (json.dumps({"access_token": "a"}).encode(), "token_type"),
        (
            json.dumps(
                {"access_token": "a", "token_type": "Bearer", "expires_in": "soon"}
            ).encode(),
            "expires_in",
        ),
        (
            json.dumps({"access_token": "a", "token_type": "Bearer", "expires_in": -5}).encode(),
            "expires_in",
        ),
        (
            json.dumps({"access_token": "a", "token_type": "Bearer", "expires_in": 0}).encode(),
            "expires_in",
        ),
        (
            json.dumps({"access_token": "a", "token_type": "Bearer", "expires_in": True}).encode(),
            "expires_in",
        ),
        (
            json.dumps({"access_token": "a", "token_type": "Bearer", "refresh_token": 5}).encode(),
            "refresh_token",
        ),
        (
            json.dumps({"access_token": "a", "token_type": "Bearer", "scope": ["x"]}).encode(),
            "scope",
        ),
    ],
)
async def test_untrustworthy_success_bodies_are_rejected_by_field(body: bytes, field: str) -> None:
    client = make_client(lambda _: httpx.Response(200, content=body))
    with pytest.raises(MalformedResponse) as caught:
        await client.request_token(
            "reporting", grant_type="client_credentials", client_id="c", client_secret=SECRET
        )
    assert caught.value.field == field
    assert str(caught.value).startswith(f"reporting: {field}:")


async def test_oversized_body_is_rejected() -> None:
    client = make_client(
        lambda _: httpx.Response(200, content=b"x" * 5000), max_response_bytes=1000
    )
    with pytest.raises(MalformedResponse, match="larger than 1000 bytes"):
        await client.request_token(
            "r", grant_type="client_credentials", client_id="c", client_secret=SECRET
        )


@pytest.mark.parametrize(
    ("response", "error_type", "attrs"),
    [
        (
            httpx.Response(400, json={"error": "invalid_grant"}),
            OAuthError,
            {"error": "invalid_grant"},
        ),
        (
            httpx.Response(401, json={"error": "invalid_client"}),
            OAuthError,
            {"error": "invalid_client", "status": 401},
        ),
        (httpx.Response(503), ProviderUnavailable, {"status": 503}),
        (httpx.Response(429, headers={"Retry-After": "7"}), RateLimited, {"retry_after": 7.0}),
        (httpx.Response(400, content=b"<html>"), MalformedResponse, {"field": "body"}),
    ],
)
async def test_error_statuses_map_to_error_types(response, error_type, attrs) -> None:
    client = make_client(lambda _: response)
    with pytest.raises(error_type) as caught:
        await client.request_token(
            "r", grant_type="client_credentials", client_id="c", client_secret=SECRET
        )
    for name, value in attrs.items():
        assert getattr(caught.value, name) == value


async def test_network_errors_are_provider_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = make_client(handler)
    with pytest.raises(ProviderUnavailable, match="ConnectError") as caught:
        await client.request_token(
            "r", grant_type="client_credentials", client_id="c", client_secret=SECRET
        )
    assert caught.value.retryable


async def test_an_error_description_echoing_a_secret_is_withheld() -> None:
    body = {"error": "invalid_client", "error_description": "bad secret cs-very-secret"}
    client = make_client(lambda _: httpx.Response(401, json=body))
    with pytest.raises(OAuthError) as caught:
        await client.request_token(
            "r", grant_type="client_credentials", client_id="c", client_secret=SECRET
        )
    assert "cs-very-secret" not in str(caught.value)
    assert "withheld" in str(caught.value.description)


async def test_probe_returns_the_status_and_sends_the_authorization() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(401 if request.url.path == "/v1/users" else 200)

    client = make_client(handler)
    assert await client.probe("r", "/v1/projects", Secret("Bearer at")) == 200
    assert await client.probe("r", "/v1/users", Secret("Bearer at")) == 401
    assert seen == ["Bearer at", "Bearer at"]


@pytest.mark.parametrize(
    ("header", "expected"),
    [("120", 120.0), (None, None), ("soon", None), ("Thu, 01 Jan 1970 00:01:40 GMT", 60.0)],
)
def test_retry_after_forms(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, now=40.0) == expected
