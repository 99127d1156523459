"""The token client over httpx.MockTransport: request shapes, strict parsing, error mapping."""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from collections.abc import Callable
from urllib.parse import parse_qs

import httpx
import pytest

from keyturn.clock import FakeClock
from keyturn.config import ProviderConfig
from keyturn.errors import MalformedResponse, OAuthError, ProviderUnavailable, RateLimited
from keyturn.providers.client import ProviderClient
from keyturn.providers.http import parse_retry_after
from keyturn.providers.tokens import TokenResponse
from keyturn.secret import Secret

SECRET = Secret("cs-very-secret")
REFRESH = Secret("rt-very-secret")


def make_client(
    handler: Callable[[httpx.Request], httpx.Response], **settings: object
) -> ProviderClient:
    return ProviderClient(
        ProviderConfig(name="acme", base_url="https://acme.test", **settings),  # type: ignore[arg-type]
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


# -- Retry-After on 429 and 5xx ------------------------------------------------------------


async def request(client: ProviderClient, credential: str = "r") -> TokenResponse:
    return await client.request_token(
        credential, grant_type="client_credentials", client_id="c", client_secret=SECRET
    )


@pytest.mark.parametrize("status", [500, 502, 503, 504])
async def test_a_5xx_carries_its_retry_after(status: int) -> None:
    client = make_client(lambda _: httpx.Response(status, headers={"Retry-After": "30"}))
    with pytest.raises(ProviderUnavailable) as caught:
        await request(client, "reporting")
    assert caught.value.status == status
    assert caught.value.retry_after == 30.0
    assert caught.value.answer_lost is False
    assert str(caught.value) == f"reporting: /oauth/token: HTTP {status}, retry after 30s"


async def test_a_5xx_without_retry_after_says_only_the_status() -> None:
    client = make_client(lambda _: httpx.Response(503))
    with pytest.raises(ProviderUnavailable) as caught:
        await request(client)
    assert caught.value.retry_after is None
    assert str(caught.value) == "r: /oauth/token: HTTP 503"


@pytest.mark.parametrize("header", ["-5", "1.5", "soon", "\u0663"])
async def test_an_invalid_retry_after_is_named_and_not_used(header: str) -> None:
    client = make_client(lambda _: httpx.Response(429, headers={b"Retry-After": header.encode()}))
    with pytest.raises(RateLimited) as caught:
        await request(client)
    assert caught.value.retry_after is None
    assert str(caught.value) == "r: /oauth/token: rate limited (429), no valid Retry-After"
    assert "None" not in str(caught.value)

    client = make_client(lambda _: httpx.Response(503, headers={b"Retry-After": header.encode()}))
    with pytest.raises(ProviderUnavailable) as unavailable:
        await request(client)
    assert unavailable.value.retry_after is None
    assert str(unavailable.value) == "r: /oauth/token: HTTP 503, no valid Retry-After"


async def test_a_valid_retry_after_is_shown_without_noise() -> None:
    client = make_client(lambda _: httpx.Response(429, headers={"Retry-After": "30"}))
    with pytest.raises(RateLimited) as caught:
        await request(client)
    assert caught.value.retry_after == 30.0
    assert str(caught.value) == "r: /oauth/token: rate limited (429), retry after 30s"


async def test_a_429_without_retry_after_says_so() -> None:
    client = make_client(lambda _: httpx.Response(429))
    with pytest.raises(RateLimited) as caught:
        await request(client)
    assert str(caught.value) == "r: /oauth/token: rate limited (429), no Retry-After"


@pytest.mark.parametrize(
    ("header", "expected"),
    [("-5", None), ("1.5", None), ("\u0663", None), (" 7 ", 7.0), ("Mon, 99 Jan 2020 x", None)],
)
def test_retry_after_rejects_what_rfc_9110_does_not_allow(
    header: str, expected: float | None
) -> None:
    assert parse_retry_after(header, now=0.0) == expected


# -- what a 2xx token body may hold ---------------------------------------------------------


def token_body(**fields: object) -> bytes:
    return json.dumps({"access_token": "a", "token_type": "Bearer", **fields}).encode()


async def refused(body: bytes, status: int = 200) -> MalformedResponse:
    client = make_client(lambda _: httpx.Response(status, content=body))
    with pytest.raises(MalformedResponse) as caught:
        await request(client, "reporting")
    return caught.value


@pytest.mark.parametrize("error", ["invalid_grant", "", 0, {"code": "x"}])
async def test_a_success_body_that_also_carries_an_error_is_refused(error: object) -> None:
    caught = await refused(token_body(error=error, refresh_token="rt-2"))
    assert caught.field == "error"
    assert str(caught) == "reporting: error: a success response that also carries an error"


async def test_an_error_member_that_is_null_is_ignored() -> None:
    client = make_client(lambda _: httpx.Response(200, content=token_body(error=None)))
    token = await request(client)
    assert token.access_token.reveal() == "a"


@pytest.mark.parametrize(("sent", "lifetime"), [("3600", 3600.0), ("0060", 60.0), (7.5, 7.5)])
async def test_expires_in_as_ascii_digits_is_accepted(sent: object, lifetime: float) -> None:
    client = make_client(lambda _: httpx.Response(200, content=token_body(expires_in=sent)))
    token = await request(client)
    assert token.expires_in == lifetime


@pytest.mark.parametrize(
    "sent", ["3600.0", " 3600", "3600s", "-5", "+5", "1e3", "", "\u0663\u0666", "0x10", "inf"]
)
async def test_expires_in_strings_other_than_ascii_digits_are_not_numbers(sent: str) -> None:
    caught = await refused(token_body(expires_in=sent))
    assert caught.field == "expires_in"
    assert str(caught) == "reporting: expires_in: not a number"


@pytest.mark.parametrize(
    "sent", [315_360_001, 1e12, 10**400, "1000000000000", "9" * 5000, "315360001"]
)
async def test_expires_in_above_ten_years_is_refused(sent: object) -> None:
    body = token_body(expires_in="PLACEHOLDER").replace(
        b'"PLACEHOLDER"',
        json.dumps(sent).encode() if not isinstance(sent, int) else str(sent).encode(),
    )
    caught = await refused(body)
    assert caught.field == "expires_in"
    assert str(caught) == "reporting: expires_in: must be at most 315360000 seconds"


async def test_expires_in_of_exactly_ten_years_is_accepted() -> None:
    client = make_client(lambda _: httpx.Response(200, content=token_body(expires_in=315_360_000)))
    assert (await request(client)).expires_in == 315_360_000


@pytest.mark.parametrize("sent", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
async def test_non_finite_expires_in_is_refused(sent: bytes) -> None:
    body = b'{"access_token": "a", "token_type": "Bearer", "expires_in": ' + sent + b"}"
    caught = await refused(body)
    assert caught.field == "expires_in"
    assert str(caught) == "reporting: expires_in: must be a positive number of seconds"


@pytest.mark.parametrize("status", [200, 400])
async def test_a_deeply_nested_body_is_malformed_not_a_crash(status: int) -> None:
    body = b"[" * 30_000 + b"]" * 30_000  # 60 KB
    caught = await refused(body, status)
    assert caught.field == "body"
    if status == 200:
        assert str(caught) == "reporting: body: body is nested too deeply"
    else:  # parse_error_response gave up: not an RFC 6749 error body
        assert str(caught) == "reporting: body: HTTP 400 without an RFC 6749 error body"


async def test_a_deeply_nested_object_member_is_malformed_too() -> None:
    body = b'{"access_token": ' + b'{"a":' * 10_000 + b"1" + b"}" * 10_001
    caught = await refused(body)
    assert str(caught) == "reporting: body: body is nested too deeply"


@pytest.mark.parametrize("field", ["access_token", "refresh_token", "token_type"])
@pytest.mark.parametrize("bad", ["\u202e", "\n", "\x00", "\x7f", "\u00e9", "\t"])
async def test_a_character_outside_vschar_is_refused_by_field(field: str, bad: str) -> None:
    value = f"Bea{bad}rer" if field == "token_type" else f"tok-SECRETVALUE{bad}x"
    caught = await refused(token_body(**{field: value}))
    assert caught.field == field
    assert str(caught) == (
        f"reporting: {field}: contains a character outside %x20-7E (RFC 6749 VSCHAR)"
    )
    assert "SECRETVALUE" not in repr(caught) and bad not in str(caught)
    assert caught.__cause__ is None


async def test_a_whitespace_refresh_token_is_refused() -> None:
    caught = await refused(token_body(refresh_token="   "))
    assert caught.field == "refresh_token"


# -- bodies read raw, decoded here with a bound ----------------------------------------------


def raw_response(
    status: int, *, content: bytes, headers: dict[str, str] | dict[bytes, bytes]
) -> httpx.Response:
    """A response streamed as the network transport gives it (not pre-read and decoded by
    httpx, which `httpx.Response(content=...)` would be)."""
    return httpx.Response(status, stream=httpx.ByteStream(content), headers=headers)


def gzip_bytes(data: bytes) -> bytes:
    return gzip.compress(data)


def deflate_bytes(data: bytes, *, raw: bool) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("gzip", gzip_bytes),
        ("x-gzip", gzip_bytes),
        ("GZIP", gzip_bytes),
        ("deflate", lambda d: deflate_bytes(d, raw=False)),
        ("deflate", lambda d: deflate_bytes(d, raw=True)),
        ("identity", lambda d: d),
        ("identity, gzip", gzip_bytes),
    ],
)
async def test_gzip_and_deflate_bodies_are_decoded(
    encoding: str, encode: Callable[[bytes], bytes]
) -> None:
    body = json.dumps({**GOOD, "scope": "s " * 500}).encode()
    client = make_client(
        lambda _: raw_response(200, content=encode(body), headers={"Content-Encoding": encoding})
    )
    token = await request(client)
    assert token.access_token.reveal() == "at-1"


async def test_a_gzip_body_of_several_members_is_decoded() -> None:
    body = json.dumps(GOOD).encode()
    content = gzip.compress(body[:10]) + gzip.compress(b"") + gzip.compress(body[10:])
    client = make_client(
        lambda _: raw_response(200, content=content, headers={"Content-Encoding": "gzip"})
    )
    assert (await request(client)).expires_in == 3600


async def test_keyturn_asks_only_for_the_encodings_it_decodes() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["accept-encoding"])
        return ok(GOOD)

    await request(make_client(handler))
    assert seen == ["gzip, deflate"]


@pytest.mark.parametrize(
    ("encoding", "shown"),
    [
        ("br", "'br'"),
        ("zstd", "'zstd'"),
        ("compress", "'compress'"),
        ("gzip, gzip", "'gzip, gzip'"),
        ("x\u202ey", "'?'"),
    ],
)
async def test_other_content_encodings_are_refused_by_name(encoding: str, shown: str) -> None:
    client = make_client(
        lambda _: raw_response(
            200, content=b"\x00" * 10, headers={b"Content-Encoding": encoding.encode()}
        )
    )
    with pytest.raises(MalformedResponse) as caught:
        await request(client, "reporting")
    assert caught.value.field == "body"
    assert str(caught.value) == (
        f"reporting: body: unsupported content encoding {shown} (keyturn accepts gzip and deflate)"
    )


async def test_a_gzip_bomb_is_refused_on_its_decoded_size() -> None:
    bomb = gzip.compress(b"\0" * 5_000_000)
    assert len(bomb) < 10_000
    client = make_client(
        lambda _: raw_response(200, content=bomb, headers={"Content-Encoding": "gzip"}),
        max_response_bytes=20_000,
    )
    with pytest.raises(MalformedResponse) as caught:
        await request(client, "reporting")
    assert str(caught.value) == "reporting: body: response larger than 20000 bytes"


async def test_a_decoded_body_of_exactly_the_limit_is_accepted() -> None:
    body = json.dumps({**GOOD, "scope": ""}).encode()
    padded = body[:-1] + b" " * (4000 - len(body)) + b"}"
    assert len(padded) == 4000
    client = make_client(
        lambda _: raw_response(
            200, content=gzip.compress(padded), headers={"Content-Encoding": "gzip"}
        ),
        max_response_bytes=4000,
    )
    assert (await request(client)).expires_in == 3600
    one_more = padded[:-1] + b" }"
    client = make_client(
        lambda _: raw_response(
            200, content=gzip.compress(one_more), headers={"Content-Encoding": "gzip"}
        ),
        max_response_bytes=4000,
    )
    with pytest.raises(MalformedResponse, match="larger than 4000 bytes"):
        await request(client)


@pytest.mark.parametrize(
    ("encoding", "content", "message"),
    [
        ("gzip", gzip.compress(b'{"a": 1}')[:-6], "gzip data is truncated"),
        ("gzip", b"\x1f\x8b\x08\x00garbage-garbage", "gzip data is corrupt"),
        ("gzip", b"not gzip at all", "gzip data is corrupt"),
        (
            "deflate",
            zlib.compress(b'{"a": 1}') + b"extra",
            "data after the end of the deflate stream",
        ),
        ("deflate", b"\xff", "deflate data is truncated"),
    ],
    # Named by what is wrong: gzip's header carries the time, and ids must be the same in
    # every process that collects them (pytest-xdist).
    ids=[
        "gzip-truncated",
        "gzip-garbage",
        "not-gzip",
        "deflate-trailing-data",
        "deflate-truncated",
    ],
)
async def test_broken_compressed_bodies_are_malformed(
    encoding: str, content: bytes, message: str
) -> None:
    client = make_client(
        lambda _: raw_response(200, content=content, headers={"Content-Encoding": encoding})
    )
    with pytest.raises(MalformedResponse) as caught:
        await request(client, "reporting")
    assert str(caught.value) == f"reporting: body: {message}"


async def test_an_empty_503_that_says_gzip_is_still_a_503() -> None:
    client = make_client(
        lambda _: raw_response(503, content=b"", headers={"Content-Encoding": "gzip"})
    )
    with pytest.raises(ProviderUnavailable) as caught:
        await request(client)
    assert caught.value.status == 503


# -- answer_lost: may the provider have processed a request whose answer we did not read? ----


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (httpx.ConnectError, False),
        (httpx.ConnectTimeout, False),
        (httpx.PoolTimeout, False),
        (httpx.ReadTimeout, True),
        (httpx.WriteTimeout, True),
        (httpx.ReadError, True),
        (httpx.WriteError, True),
        (httpx.RemoteProtocolError, True),
    ],
)
async def test_answer_lost_follows_how_far_the_request_got(
    error: type[httpx.TransportError], lost: bool
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error("boom", request=request)

    with pytest.raises(ProviderUnavailable) as caught:
        await request(make_client(handler), "reporting")
    assert caught.value.answer_lost is lost
    assert caught.value.status is None


async def test_only_a_refresh_token_grant_is_traced_to_tell_a_lost_answer() -> None:
    """httpcore's trace (how far a request got) costs CPU on every request; only a refresh
    token grant needs it (a refresh token that may have been used is burned)."""
    traced: dict[str, bool] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        grant = json.loads(request.content)["grant_type"]
        traced[grant] = "trace" in request.extensions
        return ok({"access_token": "at", "token_type": "Bearer", "expires_in": 60})

    client = make_client(handler, token_request="json")
    await request(client)
    await client.request_token(
        "r",
        grant_type="refresh_token",
        client_id="c",
        client_secret=SECRET,
        refresh_token=Secret("rt-1"),
    )

    assert traced == {"client_credentials": False, "refresh_token": True}


async def test_a_status_received_is_not_an_answer_lost() -> None:
    with pytest.raises(ProviderUnavailable) as caught:
        await request(make_client(lambda _: httpx.Response(502)))
    assert caught.value.answer_lost is False


# -- no foreign exception leaves the client ---------------------------------------------------


@pytest.mark.parametrize("value", ["Bearer a\u202eb", "Bearer a\nb", "Bearer \x00"])
async def test_a_probe_value_that_cannot_be_a_header_is_named_not_a_crash(value: str) -> None:
    client = make_client(lambda _: httpx.Response(200))
    with pytest.raises(MalformedResponse) as caught:
        await client.probe("reporting", "/v1/projects", Secret(value))
    assert caught.value.field == "authorization"
    assert value not in str(caught.value) and "Bearer" not in str(caught.value)


async def test_a_probe_path_that_is_not_a_url_is_named_not_a_crash() -> None:
    client = make_client(lambda _: httpx.Response(200))
    with pytest.raises(MalformedResponse) as caught:
        await client.probe("reporting", "/v1/\x00", Secret("Bearer at"))
    assert caught.value.field == "request"
    assert caught.value.credential == "reporting"
    assert caught.value.__cause__ is None


# -- RFC 7009 revocation -----------------------------------------------------------------------


async def test_revoke_posts_a_form_with_the_hint_and_body_credentials() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    client = make_client(handler, revoke_path="/oauth/revoke", token_request="json")
    assert await client.revoke_token(
        "reporting",
        token=REFRESH,
        token_type_hint="refresh_token",
        client_id="cid",
        client_secret=SECRET,
    )
    request = seen[0]
    assert request.method == "POST" and request.url.path == "/oauth/revoke"
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    assert request.headers["cache-control"] == "no-store"
    assert "authorization" not in request.headers
    assert parse_qs(request.content.decode()) == {
        "token": ["rt-very-secret"],
        "token_type_hint": ["refresh_token"],
        "client_id": ["cid"],
        "client_secret": ["cs-very-secret"],
    }


async def test_revoke_with_basic_auth_keeps_the_secret_out_of_the_body() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    client = make_client(handler, revoke_path="/oauth/revoke", client_auth="basic")
    assert await client.revoke_token(
        "r",
        token=Secret("at-1"),
        token_type_hint="access_token",
        client_id="c",
        client_secret=SECRET,
    )
    assert parse_qs(seen[0].content.decode()) == {
        "token": ["at-1"],
        "token_type_hint": ["access_token"],
    }
    assert (
        seen[0].headers["authorization"]
        == "Basic " + base64.b64encode(b"c:cs-very-secret").decode()
    )


async def test_revoke_without_a_revoke_path_sends_nothing() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    client = make_client(handler)
    assert not await client.revoke_token(
        "r", token=REFRESH, token_type_hint="refresh_token", client_id="c", client_secret=SECRET
    )
    assert seen == []


@pytest.mark.parametrize(
    ("response", "error_type", "attrs"),
    [
        (
            httpx.Response(503, headers={"Retry-After": "12"}),
            ProviderUnavailable,
            {"status": 503, "retry_after": 12.0, "answer_lost": False},
        ),
        (httpx.Response(429, headers={"Retry-After": "3"}), RateLimited, {"retry_after": 3.0}),
        (
            httpx.Response(400, json={"error": "unsupported_token_type"}),
            OAuthError,
            {"error": "unsupported_token_type", "status": 400},
        ),
        (httpx.Response(404, content=b"<html>"), MalformedResponse, {"field": "body"}),
        (httpx.Response(302), MalformedResponse, {"field": "body"}),
    ],
)
async def test_revoke_failures_map_to_error_types(
    response: httpx.Response, error_type: type[Exception], attrs: dict[str, object]
) -> None:
    client = make_client(lambda _: response, revoke_path="/oauth/revoke")
    with pytest.raises(error_type) as caught:
        await client.revoke_token(
            "reporting",
            token=REFRESH,
            token_type_hint="refresh_token",
            client_id="c",
            client_secret=SECRET,
        )
    for name, value in attrs.items():
        assert getattr(caught.value, name) == value
    assert str(caught.value).startswith("reporting: ")


async def test_a_revoke_error_is_named_as_such_and_never_echoes_the_token() -> None:
    body = {"error": "invalid_request", "error_description": "unknown token rt-very-secret"}
    client = make_client(lambda _: httpx.Response(400, json=body), revoke_path="/oauth/revoke")
    with pytest.raises(OAuthError) as caught:
        await client.revoke_token(
            "reporting",
            token=REFRESH,
            token_type_hint="refresh_token",
            client_id="c",
            client_secret=SECRET,
        )
    assert "rt-very-secret" not in str(caught.value) and "rt-very-secret" not in repr(caught.value)
    assert str(caught.value).startswith("reporting: revocation endpoint returned invalid_request")
