"""Signed client assertions and JWT bearer assertions (RFC 7523), and the checks of the keys
that sign them: wrong type, short RSA, unparseable PEM, certificates out of date."""

from __future__ import annotations

import json
import time

import jwt
import pytest

from keyturn.errors import KeyMaterialError
from keyturn.providers.assertions import (
    ALGORITHMS,
    bearer_assertion,
    client_assertion,
    jwk_thumbprint,
    load_certificate,
    load_service_account,
    load_signing_key,
)
from keyturn.secret import Secret
from keyturn_devkit.dev.client_keys import (
    private_key_pem,
    public_jwks,
    self_signed_certificate,
    service_account_json,
)

NOW = 1_800_000_000.0
TOKEN_URL = "https://id.example/oauth2/token"
KEYS = {alg: private_key_pem(alg) for alg in ALGORITHMS}


def _verify(token: Secret, pem: str, alg: str, audience: str) -> tuple[dict, dict]:
    jwks = public_jwks((pem, alg))  # type: ignore[arg-type]
    public = jwt.PyJWK(jwks["keys"][0]).key
    claims = jwt.decode(
        token.reveal(),
        public,
        algorithms=[alg],
        audience=audience,
        options={"verify_exp": False, "verify_iat": False},
    )
    return jwt.get_unverified_header(token.reveal()), claims


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_a_client_assertion_carries_what_rfc_7523_asks(alg: str) -> None:
    key = load_signing_key("acme", Secret(KEYS[alg]), alg=alg, kid="k1")  # type: ignore[arg-type]
    token = client_assertion(key, client_id="client-1", audience=TOKEN_URL, now=NOW)
    header, claims = _verify(token, KEYS[alg], alg, TOKEN_URL)
    assert header["alg"] == alg and header["kid"] == "k1"
    assert claims["iss"] == claims["sub"] == "client-1"
    assert claims["aud"] == TOKEN_URL
    assert claims["iat"] == int(NOW)
    assert 0 < claims["exp"] - NOW <= 60
    assert len(claims["jti"]) >= 16


def test_each_assertion_has_its_own_jti() -> None:
    key = load_signing_key("acme", Secret(KEYS["ES256"]), alg="ES256")
    ids = {
        jwt.decode(
            client_assertion(key, client_id="c", audience=TOKEN_URL, now=NOW).reveal(),
            options={"verify_signature": False},
        )["jti"]
        for _ in range(20)
    }
    assert len(ids) == 20


def test_the_kid_defaults_to_the_rfc_7638_thumbprint() -> None:
    key = load_signing_key("acme", Secret(KEYS["RS256"]), alg="RS256")
    assert key.kid == jwk_thumbprint(key.public_jwk())
    assert len(key.kid) == 43  # base64url of 32 bytes


def test_the_rfc_7638_example_thumbprint() -> None:
    # RFC 7638 §3.1's example key and its thumbprint.
    jwk = {
        "kty": "RSA",
        "n": "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6"
        "tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65"
        "YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdk"
        "t-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDK"
        "gw",
        "e": "AQAB",
        "alg": "RS256",
        "kid": "2011-04-29",
    }
    assert jwk_thumbprint(jwk) == "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs"


def test_a_certificate_adds_x5t_s256_to_the_header() -> None:
    cert = self_signed_certificate(KEYS["RS256"])
    key = load_signing_key(
        "acme", Secret(KEYS["RS256"]), alg="RS256", certificate=cert, now=time.time()
    )
    token = client_assertion(key, client_id="c", audience=TOKEN_URL, now=NOW)
    header = jwt.get_unverified_header(token.reveal())
    assert header["x5t#S256"] == key.x5t_s256
    assert key.public_jwk()["x5t#S256"] == key.x5t_s256


def test_a_bearer_assertion_carries_the_configured_claims() -> None:
    key = load_signing_key("sa", Secret(KEYS["RS256"]), alg="RS256")
    token = bearer_assertion(
        key,
        issuer="sa@p.iam.gserviceaccount.com",
        audience="https://oauth2.googleapis.com/token",
        subject="alice@example.com",
        scope="https://www.googleapis.com/auth/cloud-platform",
        now=NOW,
    )
    _, claims = _verify(token, KEYS["RS256"], "RS256", "https://oauth2.googleapis.com/token")
    assert claims["iss"] == "sa@p.iam.gserviceaccount.com"
    assert claims["sub"] == "alice@example.com"
    assert claims["scope"] == "https://www.googleapis.com/auth/cloud-platform"
    assert claims["exp"] - claims["iat"] == 3600


def test_a_service_account_key_file_gives_key_email_and_token_uri() -> None:
    text = service_account_json(KEYS["RS256"], "sa@p.iam.gserviceaccount.com", TOKEN_URL)
    account = load_service_account("sa", Secret(text), field="service_account")
    assert account.client_email == "sa@p.iam.gserviceaccount.com"
    assert account.token_uri == TOKEN_URL
    assert account.key.kid == "0123456789abcdef" and account.key.alg == "RS256"


# -- bad input ---------------------------------------------------------------------------------

WRONG_TYPE = [
    ("RS256", "ES256", "is an EC key on secp256r1; expected an RSA key of at least 2048 bits"),
    ("PS256", "EdDSA", "is an EdDSA key; expected an RSA key"),
    ("ES256", "RS256", "is an RSA key of 2048 bits; expected an EC key on P-256"),
    ("ES256", "P-384", "is an EC key on secp384r1; expected an EC key on P-256"),
    ("EdDSA", "ES256", "expected an Ed25519 or Ed448 key"),
]


@pytest.mark.parametrize(("alg", "given", "message"), WRONG_TYPE)
def test_a_key_of_the_wrong_type_is_refused_naming_credential_and_field(
    alg: str, given: str, message: str
) -> None:
    pem = KEYS.get(given) or private_key_pem(given)
    with pytest.raises(KeyMaterialError) as caught:
        load_signing_key("acme", Secret(pem), alg=alg, field="client_key")  # type: ignore[arg-type]
    assert str(caught.value).startswith("acme: client_key: ")
    assert message in str(caught.value)
    assert caught.value.field == "client_key" and not caught.value.retryable


def test_an_rsa_key_under_2048_bits_is_refused() -> None:
    pem = private_key_pem("RS256", rsa_bits=1024)
    with pytest.raises(KeyMaterialError, match="is an RSA key of 1024 bits; expected an RSA key"):
        load_signing_key("acme", Secret(pem), alg="RS256")


@pytest.mark.parametrize(
    "text",
    [
        "not a key",
        KEYS["RS256"].replace("PRIVATE KEY", "PUBLIC KEY"),
        KEYS["RS256"][:200] + KEYS["RS256"][-40:],
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    ],
)
def test_an_unreadable_key_is_refused_without_quoting_it(text: str) -> None:
    with pytest.raises(KeyMaterialError) as caught:
        load_signing_key("acme", Secret(text), alg="RS256")
    assert "acme: private_key: cannot be read" in str(caught.value)
    body = text.splitlines()[1] if "\n" in text else text
    assert body not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_no_error_or_repr_shows_the_key() -> None:
    key = load_signing_key("acme", Secret(KEYS["ES256"]), alg="ES256", kid="k")
    line = KEYS["ES256"].splitlines()[1]
    assert line not in repr(key) and line not in str(key)
    with pytest.raises(KeyMaterialError) as caught:
        load_signing_key("acme", Secret(KEYS["ES256"]), alg="RS256")
    assert line not in str(caught.value)


def test_an_expired_certificate_is_refused() -> None:
    cert = self_signed_certificate(KEYS["ES256"], days=1, starts_in=-3 * 86400)
    with pytest.raises(KeyMaterialError, match=r"acme: client_certificate: expired at 20"):
        load_certificate("acme", cert, now=time.time(), field="client_certificate")


def test_a_certificate_not_yet_valid_is_refused() -> None:
    cert = self_signed_certificate(KEYS["ES256"], starts_in=3600)
    with pytest.raises(KeyMaterialError, match=r"is not valid before .*or a clock that is right"):
        load_certificate("acme", cert, now=time.time())


def test_a_certificate_of_another_key_is_refused() -> None:
    cert = self_signed_certificate(KEYS["RS256"])
    with pytest.raises(KeyMaterialError, match="certificate: is not the certificate of"):
        load_signing_key("acme", Secret(KEYS["ES256"]), alg="ES256", certificate=cert)


def test_garbage_for_a_certificate_is_refused() -> None:
    with pytest.raises(KeyMaterialError, match="is not a PEM certificate"):
        load_certificate(
            "acme", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----", now=None
        )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("not json", "is not a service-account key file"),
        (json.dumps({"type": "authorized_user"}), "is not a service-account key file"),
        (json.dumps({"type": "service_account", "private_key": "x"}), "has no private_key_id"),
    ],
)
def test_a_bad_service_account_file_is_refused(document: str, message: str) -> None:
    with pytest.raises(KeyMaterialError, match=f"sa: key_file: {message}"):
        load_service_account("sa", Secret(document), field="key_file")


def test_a_service_account_file_with_a_bad_key_names_the_nested_field() -> None:
    text = service_account_json("garbage", "sa@x", TOKEN_URL)
    with pytest.raises(KeyMaterialError, match=r"sa: key_file\.private_key: cannot be read"):
        load_service_account("sa", Secret(text), field="key_file")
