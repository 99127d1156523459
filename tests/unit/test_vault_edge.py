"""The Vault edge without a Vault: error translation, paths, settings, parsing, file logins."""

from __future__ import annotations

from pathlib import Path

import hvac.exceptions as hvac_errors
import pytest
import requests

from keyturn.clock import FakeClock
from keyturn.errors import (
    VaultAuthError,
    VaultCasConflict,
    VaultDataError,
    VaultError,
    VaultPermissionDenied,
    VaultUnavailable,
)
from keyturn.secret import Secret
from keyturn.vault import VaultAuth, VaultConnection, VaultStore, validate_path
from keyturn.vault.client import api_url, translate
from keyturn.vault.hvac_store import parse_time
from keyturn.vault.store import reveal_data

LEAKY = "s3cr3t-value-from-vault"


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (requests.ConnectionError("refused"), VaultUnavailable),
        (requests.ConnectTimeout("slow"), VaultUnavailable),
        (requests.ReadTimeout("slow"), VaultUnavailable),
        (requests.exceptions.SSLError("bad cert"), VaultUnavailable),
        (hvac_errors.VaultDown("sealed"), VaultUnavailable),
        (hvac_errors.InternalServerError("boom"), VaultUnavailable),
        (hvac_errors.BadGateway("lb"), VaultUnavailable),
        (hvac_errors.RateLimitExceeded("slow down"), VaultUnavailable),
        (hvac_errors.UnexpectedError("412"), VaultUnavailable),
        (hvac_errors.Unauthorized("who"), VaultAuthError),
        (hvac_errors.Forbidden("permission denied"), VaultPermissionDenied),
        (hvac_errors.InvalidPath(""), VaultDataError),
        (hvac_errors.InvalidRequest(f"bad field {LEAKY}"), VaultDataError),
        (
            hvac_errors.InvalidRequest(
                errors=["check-and-set parameter did not match the current version"]
            ),
            VaultCasConflict,
        ),
        (requests.exceptions.InvalidJSONError("garbage"), VaultDataError),
    ],
)
def test_translation(raised: Exception, expected: type[VaultError]) -> None:
    error = translate(raised, operation="read", path="secret/apps/x")
    assert type(error) is expected
    assert "vault read" in str(error)
    assert "secret/apps/x" in str(error)
    assert LEAKY not in str(error)


@pytest.mark.parametrize(
    "raised",
    [
        hvac_errors.InvalidRequest("invalid role or secret ID"),
        hvac_errors.Forbidden("permission denied"),
        hvac_errors.InvalidPath("no handler"),
        hvac_errors.Unauthorized("no"),
    ],
)
def test_login_rejections_are_auth_errors(raised: Exception) -> None:
    error = translate(raised, operation="approle login", path=None, auth=True)
    assert type(error) is VaultAuthError
    assert error.retryable


def test_a_login_against_an_unavailable_vault_stays_unavailable() -> None:
    error = translate(hvac_errors.VaultDown("sealed"), operation="login", path=None, auth=True)
    assert type(error) is VaultUnavailable


def test_foreign_bugs_are_not_translated() -> None:
    assert translate(KeyError("x"), operation="read", path=None) is None


@pytest.mark.parametrize("good", ["a", "apps/billing", "keyturn/state/x-1", "a.b/c_d"])
def test_valid_paths(good: str) -> None:
    assert validate_path(good) == good


@pytest.mark.parametrize(
    "bad", ["", "/a", "a/", "a//b", "../a", "a/..", "a/./b", "a\x00b", "a\tb", "a\x7fb"]
)
def test_invalid_paths(bad: str) -> None:
    with pytest.raises(ValueError):
        validate_path(bad)


def test_api_urls_quote_the_path_but_keep_its_slashes() -> None:
    assert api_url("secret", "data", "a b/c?d#e") == "v1/secret/data/a%20b/c%3Fd%23e"


def test_reveal_data_reveals_secrets_and_rejects_other_types() -> None:
    assert reveal_data("p", {"a": Secret("x"), "b": "y"}) == {"a": "x", "b": "y"}
    with pytest.raises(TypeError, match="'n'"):
        reveal_data("p", {"n": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        reveal_data("p", {"": "x"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-02T03:04:05Z", 1767323045.0),
        ("2026-01-02T03:04:05.123456789Z", 1767323045.123456789),
        ("2026-01-02T04:04:05.5+01:00", 1767323045.5),
    ],
)
def test_parse_time(text: str, expected: float) -> None:
    assert parse_time(text, path="p", what="created_time") == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("bad", ["", "yesterday", "2026-01-02 03:04:05", None, 5])
def test_parse_time_rejects_garbage_naming_the_field(bad: object) -> None:
    with pytest.raises(VaultDataError, match="created_time"):
        parse_time(bad, path="secret/p", what="created_time")


@pytest.mark.parametrize(
    ("auth", "field"),
    [
        ({"method": "token"}, "token"),
        ({"method": "token_file"}, "token_path"),
        ({"method": "approle", "secret_id": Secret("s")}, "role_id"),
        ({"method": "kubernetes"}, "role"),
        ({"method": "ldap"}, "ldap"),
    ],
)
def test_vault_auth_names_what_is_missing(auth: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        VaultAuth(**auth)  # type: ignore[arg-type]


def test_vault_auth_defaults_and_repr() -> None:
    approle = VaultAuth("approle", role_id=Secret("rid-1"), secret_id=Secret("sid-1"))
    assert approle.mount_point == "approle"
    assert not approle.static
    assert "rid-1" not in repr(approle)
    assert "sid-1" not in repr(approle)
    k8s = VaultAuth("kubernetes", role="keyturn", auth_mount="k8s-prod")
    assert k8s.mount_point == "k8s-prod"
    assert VaultAuth("token_file", token_path=Path("/run/t")).static


@pytest.mark.parametrize(
    "options",
    [
        {"address": "127.0.0.1:8200"},
        {"address": "http://v", "mount": "/secret"},
        {"address": "http://v", "max_workers": 0},
        {"address": "http://v", "timeout": 0},
        {"address": "http://v", "renew_margin": -1},
    ],
)
def test_vault_connection_is_validated(options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        VaultConnection(**options)  # type: ignore[arg-type]


def _store(auth: VaultAuth) -> VaultStore:
    # Port 9 (discard) on loopback: these tests fail before any request is made.
    return VaultStore(VaultConnection(address="http://127.0.0.1:9"), auth, clock=FakeClock())


async def test_store_repr_shows_no_token() -> None:
    store = _store(VaultAuth("token", token=Secret("hvs.very-secret")))
    try:
        assert "hvs.very-secret" not in repr(store)
        assert "auth='token'" in repr(store)
    finally:
        await store.close()


async def test_a_missing_jwt_file_is_an_auth_error_naming_the_file(tmp_path: Path) -> None:
    jwt = tmp_path / "sa-token"
    store = _store(VaultAuth("kubernetes", role="keyturn", jwt_path=jwt))
    try:
        with pytest.raises(VaultAuthError, match="sa-token"):
            await store.keeper.login()
        assert not store.authenticated
        assert await store.maintain_token() >= 1.0
        assert isinstance(store.keeper.last_error, VaultAuthError)
    finally:
        await store.close()


async def test_an_empty_token_file_is_an_auth_error(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("\n")
    store = _store(VaultAuth("token_file", token_path=token_file))
    try:
        with pytest.raises(VaultAuthError, match="empty"):
            await store.read("a")
        assert not store.authenticated
    finally:
        await store.close()


async def test_a_closed_store_refuses_calls() -> None:
    store = _store(VaultAuth("token", token=Secret("t")))
    await store.close()
    with pytest.raises(RuntimeError):
        await store.keeper.verify()
