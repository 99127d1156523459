"""build_rotator: one rotator per configured type, `auth` resolved through the resolver, and
no rotator's exception text ever carries a key or the rotator's own credential."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from keyturn.clock import FakeClock
from keyturn.config import parse_config
from keyturn.errors import KeyturnError, SecretReferenceError
from keyturn.references import ReferenceResolver
from keyturn.rotators.base import RotationRequest, Rotator
from keyturn.rotators.build import build_rotator
from keyturn.rotators.exec import ExecRotator
from keyturn.rotators.http import HttpRotator
from keyturn.rotators.manual import ManualRotator

KEY = "ktsb_key_THE-NEW-KEY-VALUE-never-shown"
ADMIN = "admin-token-never-shown"
# Prints the key on stdout, then fails with the key on stderr.
SCRIPT = f"import sys; print('{KEY}'); print('bad {KEY}', file=sys.stderr); sys.exit(4)"

CONFIG = parse_config(
    f"""\
[vault]
address = "https://vault.example.com"
auth = {{ method = "token", token = "env:VAULT_TOKEN" }}

[[providers]]
name = "acme"
base_url = "https://acme.example.com"

[[rotators]]
name = "api"
type = "http"
provider = "acme"
auth = "env:ADMIN_TOKEN"
auth_scheme = "Token"
create = {{ path = "/keys", body = '{{"name": "{{key_name}}"}}', value = "/key", id = "/id" }}
revoke = {{ path = "/keys/{{key_id}}" }}

[[rotators]]
name = "script"
type = "exec"
command = ["{sys.executable}", "-c", "{{script}}"]
timeout = 5

[[rotators]]
name = "person"
type = "manual"
""".replace("{script}", SCRIPT),
    "k.toml",
    {},
)
REQUEST = RotationRequest("reporting-key", "api_key", "r1", "keyturn-reporting-key-r1")


async def build(name: str, handler: httpx.MockTransport | None = None) -> Rotator:
    return await build_rotator(
        CONFIG.rotators[name],
        providers=CONFIG.providers,
        resolver=ReferenceResolver({"ADMIN_TOKEN": ADMIN}),
        clock=FakeClock(),
        transport=handler,
        environ={"VAULT_TOKEN": "x"},
    )


async def test_each_type_builds_its_rotator() -> None:
    built = {name: await build(name) for name in CONFIG.rotators}
    assert isinstance(built["api"], HttpRotator)
    assert isinstance(built["script"], ExecRotator)
    assert isinstance(built["person"], ManualRotator)
    assert {name: r.name for name, r in built.items()} == {n: n for n in CONFIG.rotators}
    for rotator in built.values():
        await rotator.aclose()


async def test_the_http_auth_reference_is_resolved_and_sent() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={"key": KEY, "id": "k1"})

    rotator = await build("api", httpx.MockTransport(handler))
    new = await rotator.create(REQUEST)
    assert (new.value.reveal(), new.key_id) == (KEY, "k1")
    assert seen[0].headers["Authorization"] == f"Token {ADMIN}"
    assert str(seen[0].url) == "https://acme.example.com/keys"
    await rotator.aclose()


async def test_an_unresolvable_auth_reference_fails_the_build() -> None:
    with pytest.raises(SecretReferenceError, match="ADMIN_TOKEN is not set"):
        await build_rotator(
            CONFIG.rotators["api"],
            providers=CONFIG.providers,
            resolver=ReferenceResolver({}),
            clock=FakeClock(),
        )


def http_answers() -> list[httpx.Response]:
    """Every kind of bad answer, each carrying the key (and the admin token) somewhere."""
    return [
        httpx.Response(201, content=f"key={KEY}".encode()),
        httpx.Response(201, json={"key": {"nested": KEY}, "id": "k"}),
        httpx.Response(201, json={"key": KEY, "id": {"v": KEY}}),
        httpx.Response(201, json={"value": KEY}),
        httpx.Response(400, json={"error": KEY[:60], "echo": ADMIN}),
        httpx.Response(400, json={"error": ADMIN}),
        httpx.Response(401, json={"key": KEY}),
        httpx.Response(429, json={"key": KEY}, headers={"Retry-After": KEY}),
        httpx.Response(500, text=KEY),
        httpx.Response(201, json={"key": KEY, "id": "k", "pad": "x" * 70000}),
    ]


async def test_no_exception_text_carries_a_key_or_the_rotators_credential(
    tmp_path: Path,
) -> None:
    errors: list[KeyturnError] = []
    answers = http_answers()
    api = await build("api", httpx.MockTransport(lambda _: answers.pop(0)))
    while answers:
        try:
            await api.create(REQUEST)
        except KeyturnError as error:
            errors.append(error)
    await api.aclose()
    for rotator in (await build("script"), await build("person")):
        try:
            await rotator.create(REQUEST)
        except KeyturnError as error:
            errors.append(error)
    assert len(errors) == len(http_answers()) + 2  # every case failed
    for error in errors:
        chain: list[BaseException] = [error]
        if error.__cause__ is not None:
            chain.append(error.__cause__)
        for shown in chain:
            for text in (str(shown), repr(shown), repr(shown.args)):
                assert KEY not in text, text
                assert KEY[:60] not in text, text
                assert ADMIN not in text, text
