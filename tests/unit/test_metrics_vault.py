"""Every Vault call reports (operation, result, seconds) to `on_operation`; no sockets opened.

`VaultClient` takes a `requests` transport, so a small fake Vault answers here the way Vault
does (status codes and `errors` bodies); hvac and keyturn's translation run for real on top.
The same words against a real OpenBao: tests/integration/test_vault_metrics.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import requests
from structlog.testing import capture_logs

from keyturn.clock import FakeClock
from keyturn.errors import (
    VaultAuthError,
    VaultCasConflict,
    VaultDataError,
    VaultPermissionDenied,
    VaultUnavailable,
)
from keyturn.secret import Secret
from keyturn.testing.transport import VaultTransport
from keyturn.vault.auth import TokenKeeper, VaultAuth
from keyturn.vault.client import (
    VAULT_OPERATIONS,
    VAULT_RESULTS,
    VaultClient,
    VaultConnection,
    operation_result,
)

Answer = tuple[int, dict[str, Any] | None] | Exception


class Calls:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, float]] = []

    def __call__(self, operation: str, result: str, seconds: float) -> None:
        self.seen.append((operation, result, seconds))


CONNECTION = VaultConnection(address="https://vault.test")


def client_for(
    handler: Callable[[requests.PreparedRequest], Answer], clock: FakeClock, calls: Calls
):
    return VaultClient(
        CONNECTION, clock=clock, on_operation=calls, transport=VaultTransport(handler)
    )


def errors(*messages: str) -> dict[str, Any]:
    return {"errors": list(messages)}


CASES: dict[str, tuple[Answer, bool, str, type[Exception] | None]] = {
    "ok": ((200, {"data": {}}), False, "success", None),
    "no content": ((204, None), False, "success", None),
    "missing, as expected": ((404, errors()), True, "not_found", None),
    "missing, not expected": ((404, errors()), False, "not_found", VaultDataError),
    "cas": (
        (400, errors("check-and-set parameter did not match the current version")),
        False,
        "cas_conflict",
        VaultCasConflict,
    ),
    "denied": (
        (403, errors("permission denied")),
        False,
        "permission_denied",
        VaultPermissionDenied,
    ),
    "token rejected": ((401, errors("missing client token")), False, "auth_error", VaultAuthError),
    "sealed": ((503, errors("Vault is sealed")), False, "unavailable", VaultUnavailable),
    "unreachable": (requests.ConnectionError("refused"), False, "unavailable", VaultUnavailable),
    "bad request": ((400, errors("invalid path")), False, "error", VaultDataError),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_each_answer_is_reported_with_its_result_word(case: str) -> None:
    answer, missing_ok, result, raised = CASES[case]
    clock, calls = FakeClock(), Calls()

    def handler(request: requests.PreparedRequest) -> Answer:
        clock.advance(0.25)  # the call "takes" a quarter second on the injected clock
        return answer

    client = client_for(handler, clock, calls)
    try:
        if raised is None:
            await client.request(
                "GET", "v1/secret/data/x", kind="read", operation="read", path="secret/x",
                missing_ok=missing_ok,
            )  # fmt: skip
        else:
            with pytest.raises(raised):
                await client.request(
                    "GET", "v1/secret/data/x", kind="read", operation="read", path="secret/x",
                    missing_ok=missing_ok,
                )  # fmt: skip
    finally:
        await client.close()
    assert calls.seen == [("read", result, 0.25)]


async def test_a_failing_callback_never_fails_the_vault_call() -> None:
    clock = FakeClock()

    def broken(operation: str, result: str, seconds: float) -> None:
        raise RuntimeError("metrics bug")

    client = VaultClient(
        CONNECTION,
        clock=clock,
        on_operation=broken,
        transport=VaultTransport(lambda request: (200, {"data": {"x": 1}})),
    )
    with capture_logs() as logs:
        body = await client.request("GET", "v1/x", kind="read", operation="read", path="x")
    await client.close()
    assert body == {"data": {"x": 1}}
    assert [log["event"] for log in logs] == ["vault.on_operation_failed"]


async def test_logins_renewals_and_lookups_are_reported() -> None:
    """A static token's login is its look-up; renewal when due; `verify` is a look-up."""
    clock, calls = FakeClock(), Calls()

    def vault(request: requests.PreparedRequest) -> Answer:
        if request.path_url.endswith("lookup-self"):
            return 200, {"data": {"ttl": 600, "creation_ttl": 600, "renewable": True}}
        if request.path_url.endswith("renew-self"):
            return 200, {"auth": {"lease_duration": 600, "renewable": True}}
        return 404, errors()

    client = client_for(vault, clock, calls)
    keeper = TokenKeeper(
        client, VaultAuth(method="token", token=Secret("s.root")), clock=clock, renew_margin=60
    )
    await keeper.login()
    await keeper.verify()
    clock.advance(590)  # past two thirds of the TTL and inside the margin: renewal is due
    await keeper.maintain_token()
    await client.close()
    assert [(op, result) for op, result, _ in calls.seen] == [
        ("login", "success"),
        ("lookup", "success"),
        ("renew", "success"),
    ]


async def test_a_rejected_approle_login_is_an_auth_error() -> None:
    clock, calls = FakeClock(), Calls()
    client = client_for(lambda request: (400, errors("invalid role or secret ID")), clock, calls)
    keeper = TokenKeeper(
        client,
        VaultAuth(method="approle", role_id=Secret("role"), secret_id=Secret("wrong")),
        clock=clock,
        renew_margin=60,
    )
    with pytest.raises(VaultAuthError):
        await keeper.login()
    await client.close()
    assert [(op, result) for op, result, _ in calls.seen] == [("login", "auth_error")]


def test_words_are_the_documented_ones() -> None:
    assert set(VAULT_OPERATIONS) == {
        "read", "write", "read_metadata", "list", "delete", "read_field", "capabilities",
        "login", "renew", "lookup",
    }  # fmt: skip
    assert set(VAULT_RESULTS) == {
        "success", "cas_conflict", "permission_denied", "unavailable", "auth_error",
        "not_found", "error",
    }  # fmt: skip
    assert operation_result(RuntimeError("the vault client is closed")) == "error"
