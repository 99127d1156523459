"""The http rotator against an in-process admin API (httpx.MockTransport) whose answers are
the sandbox's own: it is backed by `SandboxState` and renders records with the sandbox's
model, as `keyturn_devkit.sandbox.admin` does. The rotators are configured with the docs' worked
example, so these tests also hold the documented pointers to the sandbox's real answers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from keyturn.clock import FakeClock
from keyturn.config import parse_config
from keyturn.config.schema import (
    HttpCall,
    HttpFind,
    HttpRotatorConfig,
    ProviderConfig,
)
from keyturn.errors import KeyturnError, ProviderUnavailable, RateLimited, RotationError
from keyturn.references import ReferenceResolver
from keyturn.rotators.base import RotationRequest, Rotator
from keyturn.rotators.build import build_rotator
from keyturn.rotators.http import HttpRotator
from keyturn.secret import Secret
from keyturn_devkit.sandbox.config import Settings
from keyturn_devkit.sandbox.model import NotFound, digest
from keyturn_devkit.sandbox.state import SandboxState

REPO = Path(__file__).resolve().parents[2]
ADMIN = "ktsb_admin_the-admin-token-value"
VAULT = '[vault]\naddress = "https://v.example.com"\nauth = { method = "token", token = "env:T" }\n'


def docs_example() -> str:
    docs = (REPO / "docs" / "configuration.md").read_text()
    section = docs.split("### Worked example: the sandbox's admin API", 1)[1]
    match = re.search(r"```toml\n(.*?)```", section, re.S)
    assert match
    return VAULT + match[1]


CONFIG = parse_config(docs_example(), "k.toml", {})
PROVIDER = CONFIG.providers["sandbox"]
KEYS = CONFIG.rotators["sandbox-keys"]
SECRETS = CONFIG.rotators["sandbox-client-secrets"]


def request(client_id: str | None = None, rotation_id: str = "r1") -> RotationRequest:
    kind = "oauth_client" if client_id else "api_key"
    name = "reporting" if client_id else "reporting-key"
    return RotationRequest(name, kind, rotation_id, f"keyturn-{name}-{rotation_id}", client_id)


@dataclass
class FakeAdmin:
    """The sandbox's admin routes for keys and client secrets, on its real state."""

    clock: FakeClock = field(default_factory=FakeClock)
    state: SandboxState = field(init=False)
    seen: list[httpx.Request] = field(default_factory=list)
    values: list[str] = field(default_factory=list)  # every secret value it handed out

    def __post_init__(self) -> None:
        self.state = SandboxState(Settings(), self.clock)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if request.headers.get("Authorization") != f"Bearer {ADMIN}":
            return httpx.Response(401, json={"error": "invalid_token"})
        path, method = request.url.path, request.method
        body = json.loads(request.content) if request.content else {}
        try:
            if (method, path) == ("POST", "/admin/api-keys"):
                key, value = self.state.create_api_key(body["name"], body.get("description", ""))
                self.values.append(value.reveal())
                return httpx.Response(201, json={**key.to_json(), "key": value.reveal()})
            if (method, path) == ("GET", "/admin/api-keys"):
                return httpx.Response(
                    200, json={"api_keys": [k.to_json() for k in self.state.api_keys()]}
                )
            if method == "DELETE" and (m := re.fullmatch(r"/admin/api-keys/([^/]+)", path)):
                return httpx.Response(200, json=self.state.revoke_api_key(m[1]).to_json())
            m = re.fullmatch(r"/admin/oauth-apps/([^/]+)/rotate-secret", path)
            if method == "POST" and m:
                record, value = self.state.rotate_client_secret(m[1], body.get("overlap_seconds"))
                self.values.append(value.reveal())
                app = self.state.app(m[1]).to_json(self.clock.time())
                return httpx.Response(
                    201,
                    json={**app, "client_secret": value.reveal(), "secret_id": record.secret_id},
                )
            m = re.fullmatch(r"/admin/oauth-apps/([^/]+)/secrets/([^/]+)", path)
            if method == "DELETE" and m:
                record = self.state.revoke_client_secret(m[1], m[2])
                return httpx.Response(200, json=record.to_json(self.clock.time()))
        except NotFound as exc:
            return httpx.Response(404, json={"error": "not_found", "error_description": str(exc)})
        return httpx.Response(404, json={"error": "not_found"})


async def keys_rotator(admin: FakeAdmin) -> Rotator:
    return await build_rotator(
        KEYS,
        providers=CONFIG.providers,
        resolver=ReferenceResolver({"SANDBOX_ADMIN_TOKEN": ADMIN}),
        clock=admin.clock,
        transport=admin.transport(),
    )


async def test_an_api_key_is_created_found_and_revoked_like_the_sandbox_does() -> None:
    admin = FakeAdmin()
    admin.state.create_api_key("someone-else")
    rotator = await keys_rotator(admin)
    try:
        new = await rotator.create(request())
        [key] = [k for k in admin.state.api_keys() if k.name == "keyturn-reporting-key-r1"]
        assert new.key_id == key.key_id
        assert isinstance(new.value, Secret)
        assert digest(new.value.reveal()) == key.digest  # the very key the sandbox issued
        sent = admin.seen[-1]
        assert json.loads(sent.content) == {
            "name": "keyturn-reporting-key-r1",
            "description": "rotated by keyturn",
        }
        assert sent.headers["Content-Type"] == "application/json"
        assert await rotator.find(request()) == [key.key_id]
        assert await rotator.find(request(rotation_id="r2")) == []
        await rotator.revoke(request(), key.key_id)
        assert admin.seen[-1].method == "DELETE"
        assert admin.seen[-1].url.path == f"/admin/api-keys/{key.key_id}"
        assert key.status == "revoked"
        await rotator.revoke(request(), key.key_id)  # again: the sandbox answers 200
        await rotator.revoke(request(), "key_unknown")  # 404: nothing left to revoke
    finally:
        await rotator.aclose()


async def test_a_client_secret_is_rotated_and_the_old_one_revoked_like_the_sandbox_does() -> None:
    admin = FakeAdmin()
    app, first, _ = admin.state.register_app("reporting", "https://app.example/cb")
    rotator = await build_rotator(
        SECRETS,
        providers=CONFIG.providers,
        resolver=ReferenceResolver({"SANDBOX_ADMIN_TOKEN": ADMIN}),
        clock=admin.clock,
        transport=admin.transport(),
    )
    try:
        new = await rotator.create(request(app.client_id))
        [_, record] = app.secrets
        assert new.key_id == record.secret_id
        assert digest(new.value.reveal()) == record.digest
        assert admin.seen[-1].url.path == f"/admin/oauth-apps/{app.client_id}/rotate-secret"
        assert json.loads(admin.seen[-1].content) == {"overlap_seconds": 86400}
        assert first.expires_at == admin.clock.time() + 86400  # the overlap was honoured
        assert await rotator.find(request(app.client_id)) is None  # no find configured
        await rotator.revoke(request(app.client_id), first.secret_id)
        assert first.status(admin.clock.time()) == "revoked"
        await rotator.revoke(request(app.client_id), "sec_unknown")  # 404 counts as revoked
    finally:
        await rotator.aclose()


async def test_client_id_is_needed_by_a_template_that_uses_it() -> None:
    admin = FakeAdmin()
    rotator = HttpRotator(SECRETS, PROVIDER, Secret(ADMIN), transport=admin.transport())
    with pytest.raises(RotationError, match=r"placeholder \{client_id\} has no value here"):
        await rotator.create(request())
    assert admin.seen == []  # nothing was sent
    await rotator.aclose()


# -- placeholders, headers --------------------------------------------------------------------


def make(
    handler: Callable[[httpx.Request], httpx.Response],
    *,
    create: HttpCall | None = None,
    revoke: HttpCall | None = None,
    find: HttpFind | None = None,
    auth: Secret | None = None,
    auth_scheme: str = "Bearer",
    clock: FakeClock | None = None,
    provider: ProviderConfig = PROVIDER,
) -> HttpRotator:
    config = HttpRotatorConfig(
        name="keys",
        provider="sandbox",
        auth=None,
        auth_scheme=auth_scheme,
        create=create or HttpCall(path="/keys", value="/key", id="/id"),
        revoke=revoke or HttpCall(path="/keys/{key_id}", method="DELETE"),
        find=find,
    )
    return HttpRotator(config, provider, auth, transport=httpx.MockTransport(handler), clock=clock)


async def test_placeholders_are_quoted_in_paths_and_escaped_in_bodies() -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json={"key": "k-value", "id": 1})

    call = HttpCall(
        path="/apps/{client_id}/keys/{credential}",
        body='{"name": "{key_name}", "why": "rotation {rotation_id} of {credential}"}',
        value="/key",
        id="/id",
    )
    revoke = HttpCall(
        path="/revoke", method="POST", body='{"id": "{key_id}", "app": "{client_id}"}'
    )
    rotator = make(handler, create=call, revoke=revoke)
    odd = RotationRequest("cred", "oauth_client", 'r"1', 'name "quoted" \\ / ü', "a/b?c=d#e f")
    new = await rotator.create(odd)
    assert new.key_id == "1"  # an integer id is kept as text
    assert seen[0].url.raw_path == b"/apps/a%2Fb%3Fc%3Dd%23e%20f/keys/cred"
    assert json.loads(seen[0].content) == {
        "name": 'name "quoted" \\ / ü',
        "why": 'rotation r"1 of cred',
    }
    await rotator.revoke(odd, 'id"/1')
    assert seen[1].method == "POST"
    assert json.loads(seen[1].content) == {"id": 'id"/1', "app": "a/b?c=d#e f"}
    await rotator.aclose()


@pytest.mark.parametrize(
    ("auth", "scheme", "header"),
    [
        (Secret("tok"), "Bearer", "Bearer tok"),
        (Secret("tok"), "Token", "Token tok"),
        (None, "Bearer", None),
    ],
)
async def test_the_rotators_own_auth_header(
    auth: Secret | None, scheme: str, header: str | None
) -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(201, json={"key": "v", "id": "i"})

    rotator = make(handler, auth=auth, auth_scheme=scheme)
    await rotator.create(request())
    assert seen[0].headers.get("Authorization") == header
    assert seen[0].headers["Cache-Control"] == "no-store"
    assert "content-type" not in seen[0].headers  # no body template, no body
    await rotator.aclose()


# -- errors -----------------------------------------------------------------------------------

KEY = "ktsb_key_THE-NEW-KEY-VALUE-never-shown"
TOKEN = "admin-token-never-shown"


def answer(
    status: int, body: object = None, **headers: str
) -> Callable[[httpx.Request], httpx.Response]:
    def handler(_: httpx.Request) -> httpx.Response:
        if isinstance(body, bytes):
            return httpx.Response(status, content=body, headers=headers)
        return httpx.Response(status, json=body, headers=headers)

    return handler


def fail(exc: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def handler(_: httpx.Request) -> httpx.Response:
        raise exc

    return handler


CREATE_ERRORS: list[
    tuple[str, Callable[[httpx.Request], httpx.Response], type[KeyturnError], str]
] = [
    ("not JSON", answer(201, KEY.encode()), RotationError, "create response is not JSON"),
    ("no value", answer(201, {"id": "k1"}), RotationError, "create response has nothing at /key"),
    ("value is a number", answer(201, {"key": 5, "id": "k1"}), RotationError, "/key is a number"),
    ("value is null", answer(201, {"key": None, "id": "k1"}), RotationError, "/key is null"),
    (
        "value is empty",
        answer(201, {"key": "", "id": "k1"}),
        RotationError,
        "/key is an empty string",
    ),
    (
        "value is an object",
        answer(201, {"key": {"v": KEY}, "id": "k1"}),
        RotationError,
        "/key is an object",
    ),
    ("no id", answer(201, {"key": KEY}), RotationError, "create response has nothing at /id"),
    (
        "id is a boolean",
        answer(201, {"key": KEY, "id": True}),
        RotationError,
        "/id is not a string or integer id",
    ),
    (
        "id is empty",
        answer(201, {"key": KEY, "id": ""}),
        RotationError,
        "/id is not a string or integer id",
    ),
    ("an array", answer(201, [KEY]), RotationError, "create response has nothing at /key"),
    (
        "too large",
        answer(201, {"key": KEY, "id": "k", "pad": "x" * 70000}),
        RotationError,
        "response larger than 65536 bytes",
    ),
    (
        "401",
        answer(401, {"error": "invalid_token"}),
        RotationError,
        "create: the provider refused the rotator's auth (HTTP 401); check rotators['keys'].auth",
    ),
    ("403", answer(403, {}), RotationError, "refused the rotator's auth (HTTP 403)"),
    (
        "400 with a code",
        answer(400, {"error": "invalid_request", "key": KEY}),
        RotationError,
        "create: unexpected HTTP 400 (invalid_request)",
    ),
    (
        "409 with a prose error",
        answer(409, {"error": f"key {KEY} exists"}),
        RotationError,
        "create: unexpected HTTP 409",
    ),
    ("404 not JSON", answer(404, b"<html>"), RotationError, "create: unexpected HTTP 404"),
    (
        "a redirect is not followed",
        answer(302, b"", Location="https://evil.example/"),
        RotationError,
        "unexpected HTTP 302",
    ),
    (
        "200 is not in ok_status",
        answer(200, {"key": KEY, "id": "k"}),
        RotationError,
        "unexpected HTTP 200",
    ),
    ("500", answer(500, {"key": KEY}), ProviderUnavailable, "create (POST /keys): HTTP 500"),
    ("503", answer(503, b""), ProviderUnavailable, "HTTP 503"),
    (
        "429",
        answer(429, {}, **{"Retry-After": "7"}),
        RateLimited,
        "rate limited (429), retry after 7s",
    ),
    (
        "network",
        fail(httpx.ConnectError("refused")),
        ProviderUnavailable,
        "create (POST /keys): ConnectError",
    ),
    (
        "time-out",
        fail(httpx.ReadTimeout("slow")),
        ProviderUnavailable,
        "create (POST /keys): timed out after 10s",
    ),
]


@pytest.mark.parametrize(
    ("case", "handler", "error", "message"), CREATE_ERRORS, ids=[c[0] for c in CREATE_ERRORS]
)
async def test_each_bad_create_answer_is_a_clear_error_without_the_key(
    case: str,
    handler: Callable[[httpx.Request], httpx.Response],
    error: type[KeyturnError],
    message: str,
) -> None:
    create = HttpCall(path="/keys", value="/key", id="/id", ok_status=(201,))
    rotator = make(handler, create=create, auth=Secret(TOKEN))
    with pytest.raises(KeyturnError) as caught:
        await rotator.create(request())
    assert type(caught.value) is error
    text = str(caught.value)
    assert text.startswith("reporting-key: rotator keys: "), text
    assert message in text, text
    assert caught.value.credential == "reporting-key"
    shown = [text, repr(caught.value), repr(caught.value.args)]
    if caught.value.__cause__ is not None:
        shown.append(str(caught.value.__cause__))
    for value in (KEY, TOKEN):
        assert all(value not in s for s in shown)
    await rotator.aclose()


async def test_retry_after_as_an_http_date_is_read_on_the_injected_clock() -> None:
    clock = FakeClock(start=1_800_000_000.0)
    date = "Fri, 15 Jan 2027 08:00:30 GMT"  # 1_800_000_030 seconds since the epoch
    rotator = make(answer(429, {}, **{"Retry-After": date}), clock=clock)
    with pytest.raises(RateLimited) as caught:
        await rotator.create(request())
    assert caught.value.retry_after == pytest.approx(30.0)
    await rotator.aclose()


async def test_the_size_bound_is_the_providers_max_response_bytes() -> None:
    small = ProviderConfig(name="sandbox", base_url="https://a.example", max_response_bytes=1024)
    rotator = make(answer(201, {"key": "v", "id": "i", "pad": "x" * 2000}), provider=small)
    with pytest.raises(RotationError, match="larger than 1024 bytes"):
        await rotator.create(request())
    await rotator.aclose()


@pytest.mark.parametrize(
    ("status", "body", "error", "message"),
    [
        (404, {"error": "not_found"}, None, ""),
        (410, b"", None, ""),
        (204, b"", None, ""),
        (400, {"error": "invalid_request"}, RotationError, "revoke: unexpected HTTP 400"),
        (401, {}, RotationError, "revoke: the provider refused the rotator's auth (HTTP 401)"),
        (500, {}, ProviderUnavailable, "revoke (DELETE /keys/{key_id}): HTTP 500"),
        (429, {}, RateLimited, "rate limited"),
    ],
)
async def test_revoke_answers(
    status: int, body: object, error: type[KeyturnError] | None, message: str
) -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return answer(status, body)(req)

    rotator = make(handler)
    if error is None:
        await rotator.revoke(request(), "key_1")
    else:
        with pytest.raises(error, match=re.escape(message)):
            await rotator.revoke(request(), "key_1")
    assert seen[0].method == "DELETE"
    assert seen[0].url.path == "/keys/key_1"
    await rotator.aclose()


# -- find -------------------------------------------------------------------------------------

FIND = HttpFind(path="/keys", items="/data/keys", name="/meta/name", id="/id")


async def test_find_returns_the_ids_of_items_with_the_key_name() -> None:
    items = [
        {"meta": {"name": "keyturn-reporting-key-r1"}, "id": "a"},
        {"meta": {"name": "other"}, "id": "b"},
        {"meta": {"name": "keyturn-reporting-key-r1"}, "id": 3},
        {"meta": {}, "id": "no-name"},  # not ours
        "not even an object",
    ]
    rotator = make(answer(200, {"data": {"keys": items}}), find=FIND)
    assert await rotator.find(request()) == ["a", "3"]
    await rotator.aclose()


async def test_find_with_the_whole_response_as_the_array() -> None:
    find = HttpFind(path="/keys", items="", name="/name", id="/id")
    rotator = make(answer(200, [{"name": "keyturn-reporting-key-r1", "id": "x"}]), find=find)
    assert await rotator.find(request()) == ["x"]
    await rotator.aclose()


@pytest.mark.parametrize(
    ("status", "body", "error", "message"),
    [
        (200, {"data": {"keys": {}}}, RotationError, "find response: /data/keys is not an array"),
        (200, {"data": {}}, RotationError, "find response has nothing at /data/keys"),
        (
            200,
            {"data": {"keys": [{"meta": {"name": "keyturn-reporting-key-r1"}}]}},
            RotationError,
            "find response: item 0 has no string or integer id at /id",
        ),
        (200, b"[", RotationError, "find response is not JSON"),
        (403, {}, RotationError, "find: the provider refused the rotator's auth (HTTP 403)"),
        (404, {}, RotationError, "find: unexpected HTTP 404"),
        (502, {}, ProviderUnavailable, "find (GET /keys): HTTP 502"),
    ],
)
async def test_find_errors(
    status: int, body: object, error: type[KeyturnError], message: str
) -> None:
    rotator = make(answer(status, body), find=FIND)
    with pytest.raises(error, match=re.escape(message)):
        await rotator.find(request())
    await rotator.aclose()


async def test_the_rotator_shows_no_secret() -> None:
    rotator = make(answer(201, {}), auth=Secret(TOKEN))
    assert TOKEN not in repr(rotator)
    assert rotator.name == "keys"
    await rotator.aclose()
