"""keyturn's own Vault token against a real OpenBao: logins, renewal, re-login, `authenticated`.

Time decisions run on a `FakeClock` that starts at the real time, so a test can jump to
"renewal is due" without waiting; Vault keeps its own real clock, which is what proves a
renewal or a new login really happened. Real waiting: 2 s for a max TTL to bite, and one
2.6 s run on the system clock that must outlive its token's original TTL.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import hvac
import pytest
from structlog.testing import capture_logs

from keyturn.clock import FakeClock, SystemClock
from keyturn.errors import VaultAuthError, VaultUnavailable
from keyturn.secret import Secret
from keyturn.vault import VaultAuth, VaultConnection, VaultStore
from keyturn.vault.auth import NO_EXPIRY_CHECK
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.ports import free_port_pair

pytestmark = pytest.mark.openbao

StoreFactory = Callable[..., VaultStore]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=time.time())


@pytest.fixture
async def make_store(openbao: OpenBaoDevServer, clock: FakeClock) -> AsyncIterator[StoreFactory]:
    stores: list[VaultStore] = []

    def make(
        auth: VaultAuth, *, renew_margin: float = 1.0, address: str | None = None
    ) -> VaultStore:
        connection = VaultConnection(
            address=address or openbao.address,
            timeout=3.0,
            max_workers=2,
            renew_margin=renew_margin,
        )
        store = VaultStore(connection, auth, clock=clock)
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


def _kv_policy(root: hvac.Client, prefix: str) -> str:
    name = f"kv-{uuid.uuid4().hex[:10]}"
    root.sys.create_or_update_policy(
        name, f'path "secret/data/{prefix}/*" {{ capabilities = ["create", "read", "update"] }}'
    )
    return name


def _approle(root: hvac.Client, policy: str, **role: Any) -> VaultAuth:
    mount = f"approle-{uuid.uuid4().hex[:8]}"
    root.sys.enable_auth_method("approle", path=mount)
    root.auth.approle.create_or_update_approle(
        "keyturn", token_policies=[policy], mount_point=mount, **role
    )
    role_id = root.auth.approle.read_role_id("keyturn", mount_point=mount)["data"]["role_id"]
    secret_id = root.auth.approle.generate_secret_id("keyturn", mount_point=mount)["data"][
        "secret_id"
    ]
    return VaultAuth(
        "approle", role_id=Secret(role_id), secret_id=Secret(secret_id), auth_mount=mount
    )


def _lookup(root: hvac.Client, accessor: str | None) -> dict[str, Any]:
    assert accessor is not None
    return dict(root.auth.token.lookup_accessor(accessor)["data"])


@pytest.fixture
def prefix() -> str:
    return f"auth/{uuid.uuid4().hex[:12]}"


async def test_approle_login_gives_a_working_token(
    vault_client: hvac.Client, make_store: StoreFactory, clock: FakeClock, prefix: str
) -> None:
    auth = _approle(
        vault_client, _kv_policy(vault_client, prefix), token_ttl="60s", token_max_ttl="120s"
    )
    store = make_store(auth)
    assert not store.authenticated  # nothing has logged in yet
    assert await store.write(f"{prefix}/a", {"v": "1"}, cas=0) == 1
    assert store.authenticated
    expires_at = store.token_expires_at()
    assert expires_at is not None
    assert abs(expires_at - (clock.time() + 60)) < 2
    info = _lookup(vault_client, store.keeper.accessor)
    assert info["path"].startswith(f"auth/{auth.auth_mount}/login")
    assert await store.maintain_token() == pytest.approx(40, abs=1)  # 2/3 of 60 s


async def test_a_rejected_approle_login_says_so_without_the_secret(
    vault_client: hvac.Client, make_store: StoreFactory, prefix: str
) -> None:
    good = _approle(vault_client, _kv_policy(vault_client, prefix))
    bad = VaultAuth(
        "approle",
        role_id=good.role_id,
        secret_id=Secret("wrong-secret-id-42"),
        auth_mount=good.auth_mount,
    )
    store = make_store(bad)
    with pytest.raises(VaultAuthError) as caught:
        await store.read(f"{prefix}/a")
    assert "login rejected" in str(caught.value)
    assert "wrong-secret-id-42" not in str(caught.value)
    assert not store.authenticated
    delay = await store.maintain_token()
    assert 1.0 <= delay <= 300
    assert isinstance(store.keeper.last_error, VaultAuthError)
    for text in (repr(store), repr(store.keeper), repr(bad)):
        assert "wrong-secret-id-42" not in text
        assert bad.role_id is not None
        assert bad.role_id.reveal() not in text


async def test_renewal_extends_a_short_ttl_token(
    vault_client: hvac.Client, make_store: StoreFactory, clock: FakeClock
) -> None:
    created = vault_client.auth.token.create(ttl="4s", explicit_max_ttl="30s", policies=["default"])
    store = make_store(VaultAuth("token", token=Secret(created["auth"]["client_token"])))
    first = await store.maintain_token()  # logs in (looks the token up)
    assert first == pytest.approx(4 * 2 / 3, abs=0.7)
    assert store.authenticated
    before = _lookup(vault_client, store.keeper.accessor)
    assert "last_renewal_time" not in before
    assert await store.maintain_token() == pytest.approx(first, abs=0.1)  # not due: no call
    clock.advance(first)
    again = await store.maintain_token()
    after = _lookup(vault_client, store.keeper.accessor)
    assert after.get("last_renewal_time")  # Vault recorded a renewal
    assert after["expire_time"] > before["expire_time"]
    assert again == pytest.approx(4 * 2 / 3, abs=0.1)
    assert store.token_expires_at() == pytest.approx(clock.time() + 4, abs=1)
    assert store.authenticated


async def test_max_ttl_reached_leads_to_a_fresh_login(
    vault_client: hvac.Client, make_store: StoreFactory, clock: FakeClock, prefix: str
) -> None:
    auth = _approle(
        vault_client, _kv_policy(vault_client, prefix), token_ttl="4s", token_max_ttl="5s"
    )
    store = make_store(auth)
    delay = await store.maintain_token()
    first = store.keeper.accessor
    await asyncio.sleep(2.1)  # < 3 s of the 5 s max TTL left: the next renewal is capped
    clock.advance(delay)
    capped = await store.maintain_token()
    assert store.keeper.accessor == first  # renewed, same token ...
    assert _lookup(vault_client, first)["ttl"] <= 3  # ... capped by the max TTL
    clock.advance(capped)
    await store.maintain_token()
    assert store.keeper.accessor != first  # renewal could not help: logged in afresh
    assert store.authenticated
    assert await store.write(f"{prefix}/after", {"v": "1"}, cas=0) == 1


async def test_renewal_refused_for_a_revoked_token_logs_in_again(
    vault_client: hvac.Client, make_store: StoreFactory, clock: FakeClock, prefix: str
) -> None:
    auth = _approle(vault_client, _kv_policy(vault_client, prefix), token_ttl="60s")
    store = make_store(auth)
    clock.advance(await store.maintain_token())  # log in, then jump to "renewal due"
    revoked = store.keeper.accessor
    vault_client.auth.token.revoke_accessor(revoked)
    await store.maintain_token()
    assert store.keeper.accessor != revoked
    assert store.authenticated
    assert await store.read(f"{prefix}/none") is None


async def test_a_data_call_with_a_revoked_token_logs_in_once_and_retries(
    vault_client: hvac.Client, make_store: StoreFactory, prefix: str
) -> None:
    store = make_store(_approle(vault_client, _kv_policy(vault_client, prefix)))
    await store.write(f"{prefix}/a", {"v": "1"}, cas=0)
    revoked = store.keeper.accessor
    vault_client.auth.token.revoke_accessor(revoked)
    results = await asyncio.gather(*(store.read(f"{prefix}/a") for _ in range(5)))
    assert all(entry is not None and entry.data["v"] == "1" for entry in results)
    assert store.keeper.accessor != revoked
    assert store.keeper.generation == 2  # five 403s, one re-login


async def test_a_revoked_static_token_is_an_auth_error(
    vault_client: hvac.Client, make_store: StoreFactory, prefix: str
) -> None:
    token = vault_client.auth.token.create(policies=[_kv_policy(vault_client, prefix)], ttl="10m")
    store = make_store(VaultAuth("token", token=Secret(token["auth"]["client_token"])))
    await store.write(f"{prefix}/a", {"v": "1"}, cas=0)
    await store.health()
    vault_client.auth.token.revoke(token["auth"]["client_token"])
    with pytest.raises(VaultAuthError):
        await store.health()
    assert not store.authenticated
    with pytest.raises(VaultAuthError) as caught:  # re-login re-uses the same dead token
        await store.read(f"{prefix}/a")
    assert token["auth"]["client_token"] not in str(caught.value)
    assert not store.authenticated
    assert await store.maintain_token() >= 1.0
    assert isinstance(store.keeper.last_error, VaultAuthError)
    assert not store.authenticated


async def test_a_token_file_is_read_again_when_its_token_cannot_be_renewed(
    vault_client: hvac.Client, make_store: StoreFactory, clock: FakeClock, tmp_path: Path
) -> None:
    def new_token() -> str:
        created = vault_client.auth.token.create(ttl="60s", renewable=False, policies=["default"])
        return str(created["auth"]["client_token"])

    token_file = tmp_path / "vault-token"
    token_file.write_text(new_token() + "\n")
    store = make_store(VaultAuth("token_file", token_path=token_file))
    delay = await store.maintain_token()
    assert delay == pytest.approx(40, abs=1)
    first = store.keeper.accessor
    token_file.write_text(new_token())  # as Vault Agent would
    clock.advance(delay)
    await store.maintain_token()
    assert store.keeper.accessor not in (None, first)
    assert store.authenticated


async def test_a_static_token_that_cannot_be_renewed_warns_then_expires(
    vault_client: hvac.Client, make_store: StoreFactory, clock: FakeClock
) -> None:
    created = vault_client.auth.token.create(ttl="60s", renewable=False, policies=["default"])
    store = make_store(VaultAuth("token", token=Secret(created["auth"]["client_token"])))
    clock.advance(await store.maintain_token())
    with capture_logs() as logs:
        later = await store.maintain_token()
    warnings = [e for e in logs if e["event"] == "vault_token_not_renewable"]
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"
    assert created["auth"]["client_token"] not in repr(logs)
    assert 1.0 <= later <= 40.5  # 2/3 of what Vault says is left (its clock did not move)
    assert store.authenticated
    clock.advance(61)
    assert not store.authenticated  # our clock says it is gone, whatever Vault says


async def test_a_root_token_never_expires(
    openbao: OpenBaoDevServer, make_store: StoreFactory
) -> None:
    store = make_store(VaultAuth("token", token=Secret(openbao.root_token)))
    assert await store.maintain_token() == NO_EXPIRY_CHECK
    assert store.token_expires_at() is None
    assert store.authenticated
    assert await store.maintain_token() == NO_EXPIRY_CHECK  # looks it up again (revocation)


async def test_vault_down_during_login_drops_authenticated(make_store: StoreFactory) -> None:
    store = make_store(
        VaultAuth("token", token=Secret("s.whatever")),
        address=f"http://127.0.0.1:{free_port_pair()}",
    )
    delay = await store.maintain_token()
    assert 1.0 <= delay <= 300
    assert isinstance(store.keeper.last_error, VaultUnavailable)
    assert not store.authenticated


async def test_concurrent_calls_share_a_small_pool(
    openbao: OpenBaoDevServer, make_store: StoreFactory, prefix: str
) -> None:
    store = make_store(VaultAuth("token", token=Secret(openbao.root_token)))
    versions = await asyncio.gather(
        *(store.write(f"{prefix}/p{i}", {"v": str(i)}, cas=0) for i in range(40))
    )
    assert versions == [1] * 40
    entries = await asyncio.gather(*(store.read(f"{prefix}/p{i}") for i in range(40)))
    assert [e.data["v"] if e else None for e in entries] == [str(i) for i in range(40)]


async def test_system_clock_store_renews_in_real_time(
    vault_client: hvac.Client, openbao: OpenBaoDevServer
) -> None:
    created = vault_client.auth.token.create(ttl="2s", explicit_max_ttl="30s", policies=["default"])
    connection = VaultConnection(address=openbao.address, renew_margin=1.0, max_workers=1)
    store = VaultStore(
        connection,
        VaultAuth("token", token=Secret(created["auth"]["client_token"])),
        clock=SystemClock(),
    )
    try:
        deadline = time.monotonic() + 2.6  # past the original 2 s TTL
        calls = 0
        while (remaining := deadline - time.monotonic()) > 0:
            delay = await store.maintain_token()
            calls += 1
            await asyncio.sleep(min(delay, remaining))
        assert calls >= 2  # the login, then at least one renewal
        assert _lookup(vault_client, store.keeper.accessor).get("last_renewal_time")
        await store.health()  # still alive: renewed in time
        assert store.authenticated
    finally:
        await store.close()
