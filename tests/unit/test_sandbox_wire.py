"""Request parsing: JSON and form parameters, Basic and Bearer headers, RFC 6750 challenges."""

from __future__ import annotations

import base64
import json

import pytest

from keyturn_devkit.sandbox.model import OAuthFailure
from keyturn_devkit.sandbox.wire import (
    basic_credentials,
    bearer_challenge,
    bearer_value,
    parse_params,
)

SPEC_BODY = {"grant_type": "client_credentials", "client_id": "c", "client_secret": "s"}


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (json.dumps(SPEC_BODY).encode(), "application/json"),
        (json.dumps(SPEC_BODY).encode(), "application/json; charset=utf-8"),
        (json.dumps(SPEC_BODY).encode(), ""),  # the spec shows no content type
        (b"  " + json.dumps(SPEC_BODY).encode(), "text/plain"),
        (b"grant_type=client_credentials&client_id=c&client_secret=s", ""),
        (
            b"grant_type=client_credentials&client_id=c&client_secret=s",
            "application/x-www-form-urlencoded",
        ),
    ],
)
def test_json_and_form_bodies_give_the_same_parameters(body: bytes, content_type: str) -> None:
    assert parse_params(body, content_type) == SPEC_BODY


def test_form_values_are_percent_decoded() -> None:
    params = parse_params(b"client_secret=a%2Bb+c%26d", "application/x-www-form-urlencoded")
    assert params == {"client_secret": "a+b c&d"}


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b'{"grant_type": ', "application/json", 400, "not valid JSON"),
        (b"[1, 2]", "application/json", 400, "JSON object"),
        (b'{"grant_type": 5, "scope": []}', "application/json", 400, "grant_type, scope"),
        (b"\xff\xfe", "application/json", 400, "UTF-8"),
        (b"a=1&a=2", "application/x-www-form-urlencoded", 400, "repeated"),
        (b"a=1&&&b", "application/x-www-form-urlencoded", 400, "form encoding"),
        (b"<xml/>", "application/xml", 415, "unsupported content type"),
        (b"[" * 100_000, "application/json", 400, "JSON|deeply"),
    ],
)
def test_malformed_bodies_are_invalid_request_with_a_clear_reason(
    body: bytes, content_type: str, status: int, message: str
) -> None:
    with pytest.raises(OAuthFailure, match=message) as caught:
        parse_params(body, content_type)
    assert (caught.value.error, caught.value.status) == ("invalid_request", status)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_credentials_are_form_decoded_after_base64() -> None:
    found = basic_credentials(_basic("client%3A1", "p%40ss+word"))
    assert found is not None
    assert found[0] == "client:1"
    assert found[1].reveal() == "p@ss word"


@pytest.mark.parametrize("header", ["Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode()])
def test_malformed_basic_credentials_are_invalid_client(header: str) -> None:
    with pytest.raises(OAuthFailure) as caught:
        basic_credentials(header)
    assert (caught.value.error, caught.value.status) == ("invalid_client", 401)


def test_other_schemes_are_not_basic_credentials() -> None:
    assert basic_credentials("Bearer abc") is None


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Bearer abc.DEF-123_~+/==", ("abc.DEF-123_~+/==", "")),
        ("bearer   abc  ", ("abc", "")),
        (None, (None, "")),
        ("", (None, "")),
        ("Basic abc", (None, "")),
        ("Bearer", (None, "the Bearer credential is empty")),
        ("Bearer a b", (None, "the Bearer credential is malformed")),
        ('Bearer "abc"', (None, "the Bearer credential is malformed")),
    ],
)
def test_bearer_header_parsing(header: str | None, expected: tuple[str | None, str]) -> None:
    assert bearer_value(header) == expected


def test_bearer_challenge_has_rfc6750_attributes() -> None:
    assert bearer_challenge(None, "") == 'Bearer realm="keyturn-sandbox"'
    assert bearer_challenge("insufficient_scope", "needs it", "users:read") == (
        'Bearer realm="keyturn-sandbox", error="insufficient_scope", '
        'error_description="needs it", scope="users:read"'
    )
