"""Refused logins in Vault's own words, without a Vault: a fake transport answers the way Vault
does (status and `errors` body), hvac and keyturn's translation run for real on top. Against a
real OpenBao (CIDR restrictions, wrong secret_id, wrong auth mount): test_vault_first_run.py.

What a real Vault never does is quote a secret back; a fake one can, and keyturn must blot it
out anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import hvac.exceptions as hvac_errors
import pytest
import requests

from keyturn.clock import FakeClock
from keyturn.errors import VaultAuthError
from keyturn.secret import Secret
from keyturn.testing.transport import VaultTransport
from keyturn.vault.auth import TokenKeeper, VaultAuth
from keyturn.vault.client import REASON_LIMIT, VaultClient, VaultConnection, vault_reason

Answer = tuple[int, dict[str, Any]]


async def login_error(
    auth: VaultAuth, handler: Callable[[requests.PreparedRequest], Answer]
) -> str:
    client = VaultClient(VaultConnection("http://vault.test"), transport=VaultTransport(handler))
    keeper = TokenKeeper(client, auth, clock=FakeClock(), renew_margin=60)
    try:
        with pytest.raises(VaultAuthError) as refused:
            await keeper.login()
    finally:
        await client.close()
    return str(refused.value)


APPROLE = VaultAuth(
    "approle",
    role_id=Secret("role-id-1234"),
    secret_id=Secret("secret-id-5678"),
    auth_mount="ar",
    sources=(("role_id", "file:/run/role_id"), ("secret_id", "env:KEYTURN_SECRET_ID")),
)


async def test_vaults_reason_is_repeated_and_any_secret_it_quotes_is_blotted_out() -> None:
    def echoing(request: requests.PreparedRequest) -> Answer:
        return 400, {"errors": ["invalid secret_id secret-id-5678 for role role-id-1234"]}

    message = await login_error(APPROLE, echoing)
    assert message == (
        "vault approle login at auth/ar: login rejected (HTTP 400: invalid secret_id [redacted] "
        "for role [redacted]); role_id from vault.auth.role_id (file:/run/role_id), secret_id "
        "from vault.auth.secret_id (env:KEYTURN_SECRET_ID)"
    )


async def test_a_403_on_the_login_path_points_at_the_auth_mount() -> None:
    def nothing_mounted(request: requests.PreparedRequest) -> Answer:
        assert request.path_url == "/v1/auth/ar/login"
        return 403, {"errors": ["permission denied"]}

    message = await login_error(APPROLE, nothing_mounted)
    assert message == (
        "vault approle login at auth/ar: login rejected (HTTP 403: permission denied); likely no "
        "auth method is mounted at auth/ar (check vault.auth.mount)"
    )


async def test_a_kubernetes_403_may_also_be_the_service_account_token(tmp_path: Path) -> None:
    jwt = tmp_path / "token"
    jwt.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
    auth = VaultAuth("kubernetes", role="keyturn", jwt_path=jwt, sources=(("jwt_path", str(jwt)),))
    message = await login_error(auth, lambda request: (403, {"errors": ["permission denied"]}))
    assert "likely no auth method is mounted at auth/kubernetes" in message
    assert f"or the service account token (vault.auth.jwt_path ({jwt})) was refused" in message
    assert "eyJhbGciOiJSUzI1NiJ9" not in message


async def test_a_refused_static_token_names_its_reference_not_its_value() -> None:
    auth = VaultAuth("token", token=Secret("s.abcdef123"), sources=(("token", "env:VAULT_TOKEN"),))
    message = await login_error(auth, lambda request: (403, {"errors": ["permission denied"]}))
    assert message == (
        "vault token login: login rejected (HTTP 403: permission denied); the token comes from "
        "vault.auth.token (env:VAULT_TOKEN)"
    )


async def test_a_token_refused_right_after_login_points_at_token_bound_cidrs() -> None:
    def vault(request: requests.PreparedRequest) -> Answer:
        if request.path_url.endswith("/login"):
            return 200, {"auth": {"client_token": "s.new", "lease_duration": 60, "renewable": True}}
        return 403, {"errors": ["permission denied"]}

    message = await login_error(APPROLE, vault)
    assert message == (
        "vault approle login at auth/ar: Vault issued a token and then refused it (HTTP 403: "
        "permission denied); the role's token_bound_cidrs may exclude this address, or the "
        "token's policies lack read on auth/token/lookup-self"
    )


@pytest.mark.parametrize(
    ("errors", "reason"),
    [
        (["invalid role or secret ID"], "invalid role or secret ID"),
        (["1 error occurred:\n\t* permission denied\n\n"], "permission denied"),
        (
            ['source address "10.0.0.1" unauthorized by CIDR restrictions on the role: %!w(<nil>)'],
            'source address "10.0.0.1" unauthorized by CIDR restrictions on the role',
        ),
        (["2 errors occurred:\n\t* one\n\t* two\n\n"], "one; two"),
        (["bell\x07 and\x1b[31m escape"], "bell and[31m escape"),
        ([], ""),
        ([42, None], ""),
    ],
)
def test_vault_reason_is_one_printable_line(errors: list[Any], reason: str) -> None:
    refused = hvac_errors.InvalidRequest("an answer")
    refused.errors = errors  # as Vault's JSON gave it, whatever it holds
    assert vault_reason(refused) == reason


def test_vault_reason_is_bounded_and_only_reads_hvac_errors() -> None:
    long = vault_reason(hvac_errors.InvalidRequest(errors=["x" * 5000]))
    assert len(long) == REASON_LIMIT
    assert long.endswith("…")
    assert vault_reason(ValueError("not from Vault")) == ""
    assert vault_reason(None) == ""
