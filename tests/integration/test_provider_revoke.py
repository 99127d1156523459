"""`ProviderClient.revoke_token` (RFC 7009) against the real sandbox over HTTP on loopback:
a revoked refresh token is refused afterwards, errors keep their types, no token is echoed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Literal

import pytest

from keyturn.clock import SystemClock
from keyturn.config import ProviderConfig
from keyturn.errors import OAuthError, ProviderUnavailable
from keyturn.providers.client import ProviderClient
from keyturn.secret import Secret
from keyturn_devkit.dev.sandbox import SandboxProcess

pytestmark = pytest.mark.sandbox

ClientFactory = Callable[..., ProviderClient]


@pytest.fixture
async def make_client(sandbox: SandboxProcess) -> AsyncIterator[ClientFactory]:
    made: list[ProviderClient] = []

    def make(
        client_auth: Literal["body", "basic"] = "body", revoke_path: str | None = "/oauth/revoke"
    ) -> ProviderClient:
        settings = ProviderConfig(
            name="sandbox",
            base_url=sandbox.base_url,
            client_auth=client_auth,
            revoke_path=revoke_path,
            timeout=10.0,
        )
        client = ProviderClient(settings, clock=SystemClock())
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


def inputs(sandbox: SandboxProcess) -> tuple[str, Secret]:
    oauth = sandbox.bootstrap["oauth_client"]
    return oauth["client_id"], Secret(oauth["client_secret"])


@pytest.mark.parametrize("client_auth", ["body", "basic"])
async def test_a_revoked_refresh_token_then_gets_invalid_grant(
    sandbox: SandboxProcess, make_client: ClientFactory, client_auth: Literal["body", "basic"]
) -> None:
    client = make_client(client_auth)
    client_id, client_secret = inputs(sandbox)
    issued = await client.request_token(
        "reporting",
        grant_type="client_credentials",
        client_id=client_id,
        client_secret=client_secret,
    )
    assert issued.refresh_token is not None
    assert (
        await client.probe(
            "reporting", "/v1/users", Secret(f"Bearer {issued.access_token.reveal()}")
        )
        == 200
    )

    revoked = await client.revoke_token(
        "reporting",
        token=issued.refresh_token,
        token_type_hint="refresh_token",
        client_id=client_id,
        client_secret=client_secret,
    )
    assert revoked is True

    with pytest.raises(OAuthError) as caught:
        await client.request_token(
            "reporting",
            grant_type="refresh_token",
            client_id=client_id,
            client_secret=client_secret,
            refresh_token=issued.refresh_token,
        )
    assert caught.value.error == "invalid_grant"
    # RFC 7009 §2.1: revoking a refresh token ends its grant, the access token included.
    authorization = Secret(f"Bearer {issued.access_token.reveal()}")
    assert await client.probe("reporting", "/v1/users", authorization) == 401


async def test_revoking_an_access_token_and_an_unknown_token(
    sandbox: SandboxProcess, make_client: ClientFactory
) -> None:
    client = make_client("basic")
    client_id, client_secret = inputs(sandbox)
    issued = await client.request_token(
        "reporting",
        grant_type="client_credentials",
        client_id=client_id,
        client_secret=client_secret,
    )
    for token in (issued.access_token, Secret("ktsb_at_never_issued")):
        assert await client.revoke_token(
            "reporting",
            token=token,
            token_type_hint="access_token",
            client_id=client_id,
            client_secret=client_secret,
        )
    authorization = Secret(f"Bearer {issued.access_token.reveal()}")
    assert await client.probe("reporting", "/v1/users", authorization) == 401


async def test_revocation_errors_keep_their_types_and_never_echo_the_token(
    sandbox: SandboxProcess, make_client: ClientFactory
) -> None:
    client = make_client()
    client_id, client_secret = inputs(sandbox)
    issued = await client.request_token(
        "reporting",
        grant_type="client_credentials",
        client_id=client_id,
        client_secret=client_secret,
    )
    assert issued.refresh_token is not None
    token = issued.refresh_token

    with pytest.raises(OAuthError) as refused:
        await client.revoke_token(
            "reporting",
            token=token,
            token_type_hint="refresh_token",
            client_id=client_id,
            client_secret=Secret("not-the-secret"),
        )
    assert refused.value.error == "invalid_client"
    assert str(refused.value).startswith("reporting: revocation endpoint returned invalid_client")

    sandbox.admin.set_faults({"revoke": {"error_rate": 1, "error_status": 503, "retry_after": 7}})
    with pytest.raises(ProviderUnavailable) as unavailable:
        await client.revoke_token(
            "reporting",
            token=token,
            token_type_hint="refresh_token",
            client_id=client_id,
            client_secret=client_secret,
        )
    assert unavailable.value.status == 503
    assert unavailable.value.retry_after == 7.0
    assert unavailable.value.answer_lost is False
    assert str(unavailable.value) == "reporting: /oauth/revoke: HTTP 503, retry after 7s"
    sandbox.admin.clear_faults()

    for error in (refused.value, unavailable.value):
        assert token.reveal() not in str(error) and token.reveal() not in repr(error)
        assert client_secret.reveal() not in str(error)

    # The failed attempts revoked nothing: the refresh token still works.
    refreshed = await client.request_token(
        "reporting",
        grant_type="refresh_token",
        client_id=client_id,
        client_secret=client_secret,
        refresh_token=token,
    )
    assert refreshed.access_token != issued.access_token


async def test_no_revoke_path_means_no_revocation(
    sandbox: SandboxProcess, make_client: ClientFactory
) -> None:
    client = make_client(revoke_path=None)
    client_id, client_secret = inputs(sandbox)
    issued = await client.request_token(
        "reporting",
        grant_type="client_credentials",
        client_id=client_id,
        client_secret=client_secret,
    )
    assert issued.refresh_token is not None
    assert not await client.revoke_token(
        "reporting",
        token=issued.refresh_token,
        token_type_hint="refresh_token",
        client_id=client_id,
        client_secret=client_secret,
    )
    refreshed = await client.request_token(
        "reporting",
        grant_type="refresh_token",
        client_id=client_id,
        client_secret=client_secret,
        refresh_token=issued.refresh_token,
    )
    assert refreshed.refresh_token is not None
