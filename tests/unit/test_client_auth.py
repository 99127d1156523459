"""Keyless client authentication in the token client, over httpx.MockTransport: the request's
fields for private_key_jwt and the JWT bearer grant, what a refusal says (a bare 401/403
included), the clock skew read from the server's Date, and the configuration's rules."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable
from urllib.parse import parse_qs

import httpx
import jwt
import pytest

from keyturn.clock import FakeClock
from keyturn.commands.check import _check_references, vault_references
from keyturn.config import ProviderConfig, parse_config
from keyturn.errors import ConfigError, OAuthError
from keyturn.jobs.build import CredentialInputs
from keyturn.providers.assertions import CLIENT_ASSERTION_TYPE, JWT_BEARER_GRANT
from keyturn.providers.client import ProviderClient
from keyturn.providers.client_auth import BearerClaims, ClientKey, keyless_client
from keyturn.references import ReferenceResolver
from keyturn.secret import Secret
from keyturn.testing.vault import FakeVaultStore
from keyturn_devkit.dev.client_keys import private_key_pem, self_signed_certificate

NOW = 1_800_000_000.0
KEY = private_key_pem("ES256")
TOKEN = {"access_token": "at-1", "token_type": "Bearer", "expires_in": 60}


def make_client(
    handler: Callable[[httpx.Request], httpx.Response], clock: FakeClock, **settings: object
) -> ProviderClient:
    provider = ProviderConfig(name="acme", base_url="https://id.test", **settings)  # type: ignore[arg-type]
    return ProviderClient(provider, clock=clock, transport=httpx.MockTransport(handler))


def pkj(**extra: object) -> object:
    return keyless_client(
        "ledger",
        "private_key_jwt",
        key=Secret(KEY),
        alg=None,
        kid="k1",
        certificate=None,
        now=NOW,
        **extra,  # type: ignore[arg-type]
    )


async def test_private_key_jwt_sends_a_form_with_a_fresh_assertion_even_to_a_json_provider() -> (
    None
):
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=TOKEN)

    client = make_client(handler, FakeClock(NOW), token_request="json")
    for _ in range(2):
        await client.request_token(
            "ledger", grant_type="client_credentials", client_id="cid", client_secret=pkj()
        )
    forms = [parse_qs(r.content.decode()) for r in seen]
    assert seen[0].headers["content-type"] == "application/x-www-form-urlencoded"
    assert forms[0]["client_assertion_type"] == [CLIENT_ASSERTION_TYPE]
    assert forms[0]["client_id"] == ["cid"]
    assert "client_secret" not in forms[0] and "authorization" not in seen[0].headers
    claims = [
        jwt.decode(f["client_assertion"][0], options={"verify_signature": False}) for f in forms
    ]
    assert claims[0]["aud"] == "https://id.test/oauth/token"
    assert claims[0]["iat"] == int(NOW)
    assert claims[0]["jti"] != claims[1]["jti"]


async def test_the_issuer_as_audience_when_the_provider_says_so() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=TOKEN)

    client = make_client(
        handler,
        FakeClock(NOW),
        client_assertion_audience="issuer",
        issuer="https://id.test/realms/acme",
    )
    await client.request_token(
        "ledger", grant_type="client_credentials", client_id="cid", client_secret=pkj()
    )
    form = parse_qs(seen[0].content.decode())
    claims = jwt.decode(form["client_assertion"][0], options={"verify_signature": False})
    assert claims["aud"] == "https://id.test/realms/acme"


async def test_the_jwt_bearer_grant_replaces_client_credentials() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=TOKEN)

    bearer = BearerClaims("sa@p.iam", subject="alice@example.com", scope="read")
    client_key = keyless_client(
        "gcs", None, key=Secret(KEY), alg=None, kid=None, certificate=None, now=NOW, bearer=bearer
    )
    client = make_client(handler, FakeClock(NOW), token_request="form")
    await client.request_token(
        "gcs",
        grant_type="client_credentials",
        client_id="sa@p.iam",
        client_secret=client_key,
        scope="read",
    )
    form = parse_qs(seen[0].content.decode())
    assert form["grant_type"] == [JWT_BEARER_GRANT]
    assert set(form) == {"grant_type", "assertion"}  # no client authentication, scope a claim
    claims = jwt.decode(form["assertion"][0], options={"verify_signature": False})
    assert (claims["iss"], claims["sub"], claims["scope"]) == (
        "sa@p.iam",
        "alice@example.com",
        "read",
    )
    assert claims["aud"] == "https://id.test/oauth/token"


@pytest.mark.parametrize("status", [401, 403])
async def test_a_bare_refusal_is_invalid_client_naming_what_was_sent(status: int) -> None:
    client = make_client(lambda _: httpx.Response(status), FakeClock(NOW))
    with pytest.raises(OAuthError) as caught:
        await client.request_token(
            "ledger", grant_type="client_credentials", client_id="cid", client_secret=pkj()
        )
    assert caught.value.error == "invalid_client"
    message = str(caught.value)
    assert message.startswith("ledger: token endpoint returned invalid_client (")
    assert f"HTTP {status} with no error body" in message
    assert (
        "sent client assertion iss=sub=cid aud=https://id.test/oauth/token alg=ES256 kid=k1"
        in message
    )
    assert "clock" not in message


async def test_a_server_clock_far_ahead_is_named() -> None:
    date = email.utils.formatdate(NOW + 600, usegmt=True)

    def handler(_: httpx.Request) -> httpx.Response:
        body = {"error": "invalid_client", "error_description": "client authentication failed"}
        return httpx.Response(401, json=body, headers={"Date": date})

    client = make_client(handler, FakeClock(NOW))
    with pytest.raises(OAuthError) as caught:
        await client.request_token(
            "ledger", grant_type="client_credentials", client_id="cid", client_secret=pkj()
        )
    message = str(caught.value)
    assert "(client authentication failed; sent client assertion" in message
    assert "the server's clock is 600s ahead of keyturn's" in message


async def test_a_secret_client_keeps_the_old_wording() -> None:
    client = make_client(lambda _: httpx.Response(401), FakeClock(NOW))
    with pytest.raises(Exception, match="HTTP 401 without an RFC 6749 error body"):
        await client.request_token(
            "ledger", grant_type="client_credentials", client_id="cid", client_secret=Secret("s")
        )


def test_mutual_tls_builds_one_context_presenting_the_certificate() -> None:
    key = private_key_pem("RS256")
    client_key = keyless_client(
        "m",
        "self_signed_tls_client_auth",
        key=Secret(key),
        alg=None,
        kid=None,
        certificate=Secret(self_signed_certificate(key)),
        now=time.time(),  # the certificate is valid from now (a real one)
    )
    assert client_key.tls is not None
    first = client_key.tls_context()
    assert first is not None and client_key.tls_context() is first
    assert client_key.signing_key is not None
    assert client_key.tls.thumbprint == client_key.signing_key.x5t_s256


# -- configuration ----------------------------------------------------------------------------

HEAD = """
[vault]
address = "http://127.0.0.1:8200"
auth = { method = "token", token = "env:VAULT_TOKEN" }
[[providers]]
name = "id"
base_url = "https://id.test"
"""


def credential(**keys: str) -> str:
    lines = "\n".join(f'{k} = "{v}"' for k, v in keys.items())
    return (
        HEAD
        + '[[credentials]]\nname = "ledger"\nprovider = "id"\nkind = "oauth_client"\n'
        + 'client_id = "ledger"\npublish_to = "apps/ledger"\n'
        + lines
        + "\n"
    )


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ({}, 'credentials["ledger"].client_secret: is missing'),
        (
            {"client_auth": "private_key_jwt"},
            'credentials["ledger"].client_key: is missing; client_auth = "private_key_jwt" needs',
        ),
        (
            {"client_auth": "private_key_jwt", "client_key": "env:K", "client_secret": "env:S"},
            'credentials["ledger"].client_secret: is set with client_auth = "private_key_jwt"',
        ),
        (
            {"client_auth": "tls_client_auth", "client_key": "env:K"},
            'credentials["ledger"].client_certificate: is missing',
        ),
        (
            {"grant": "jwt_bearer"},
            'credentials["ledger"].grant: is "jwt_bearer": expected exactly one',
        ),
        (
            {"client_secret": "env:S", "service_account": "env:SA"},
            'credentials["ledger"].service_account: is set without grant = "jwt_bearer"',
        ),
        (
            {"client_auth": "private_key_jwt", "client_key": "K"},
            'credentials["ledger"].client_key: got an inline secret',
        ),
    ],
)
def test_each_way_of_authenticating_has_its_keys(keys: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(credential(**keys), "k.toml", {})
    assert any(problem in line for line in caught.value.problems), caught.value.problems


def test_the_issuer_audience_needs_an_issuer() -> None:
    text = credential(client_secret="env:S").replace(
        'base_url = "https://id.test"',
        'base_url = "https://id.test"\nclient_assertion_audience = "issuer"',
    )
    with pytest.raises(
        ConfigError, match=r'providers\["id"\].client_assertion_audience: is "issuer"'
    ):
        parse_config(text, "k.toml", {})


def test_a_keyless_credential_loads() -> None:
    config = parse_config(
        credential(client_auth="private_key_jwt", client_key="env:K", client_key_alg="PS256"),
        "k.toml",
        {},
    )
    (loaded,) = config.credentials
    assert loaded.keyless and loaded.client_key_alg == "PS256"


async def test_keyturn_check_resolves_the_key_and_certificate_references() -> None:
    config = parse_config(
        credential(
            client_auth="self_signed_tls_client_auth",
            client_key="env:LEDGER_KEY_MISSING",
            client_certificate="vault:secret/inputs/ledger#certificate",
        ),
        "k.toml",
        {},
    )
    problems = await _check_references(config, FakeVaultStore(), skip=set())
    assert any(p.startswith("credentials['ledger'].client_key: ") for p in problems), problems
    assert any(p.startswith("credentials['ledger'].client_certificate: ") for p in problems)
    # The certificate's Vault reference is among those whose read capability is checked.
    assert any(key.endswith("client_certificate") for key, _ in vault_references(config))


@pytest.mark.parametrize("rotated_key", [True, False])
async def test_a_key_another_credential_rotates_is_read_at_each_request(rotated_key: bool) -> None:
    """A server that fetches the client's jwks_uri may accept the old key long after it left
    the document, so no refusal says it changed: such a key is read again each time."""
    config = parse_config(
        credential(client_auth="private_key_jwt", client_key="env:K", client_key_alg="ES256"),
        "k.toml",
        {},
    )
    environ = {"K": KEY}
    inputs = CredentialInputs(
        config.credentials[0], ReferenceResolver(environ), FakeClock(NOW), rotated_key=rotated_key
    )
    _, before = await inputs.client()
    environ["K"] = private_key_pem("ES256")
    _, after = await inputs.client()
    assert isinstance(before, ClientKey) and isinstance(after, ClientKey)
    assert before.signing_key is not None and after.signing_key is not None
    assert (after.signing_key.kid != before.signing_key.kid) is rotated_key
