"""What `FakeVaultStore` adds for other modules' unit tests (its KV v2 behaviour itself is
proven against OpenBao by tests/integration/test_vault_contract.py)."""

from __future__ import annotations

import pytest

from keyturn.clock import FakeClock
from keyturn.errors import (
    VaultCasConflict,
    VaultPermissionDenied,
    VaultUnavailable,
)
from keyturn.secret import Secret
from keyturn.testing import FakeVaultStore
from keyturn.vault import KvStore


def test_the_fake_is_a_kv_store() -> None:
    assert isinstance(FakeVaultStore(), KvStore)


async def test_fail_next_fails_exactly_the_next_calls() -> None:
    fake = FakeVaultStore()
    fake.fail_next(VaultUnavailable("down"))
    fake.fail_next(VaultCasConflict("lost", path="secret/a"))
    with pytest.raises(VaultUnavailable):
        await fake.read("a")
    with pytest.raises(VaultCasConflict):
        await fake.write("a", {"k": "v"}, cas=0)
    assert await fake.write("a", {"k": "v"}, cas=0) == 1
    assert fake.writes == [("a", 1)]


async def test_writes_records_our_writes_but_not_external_ones() -> None:
    fake = FakeVaultStore()
    await fake.write("a", {"k": "1"}, cas=0)
    assert fake.external_write("a", {"k": "mallory"}, custom_metadata={"writer": "x"}) == 2
    await fake.write("a", {"k": "3"}, cas=2)
    assert fake.writes == [("a", 1), ("a", 3)]
    metadata = await fake.read_metadata("a")
    assert metadata is not None
    assert metadata.current_version == 3
    assert dict(metadata.custom_metadata) == {"writer": "x"}


async def test_times_come_from_the_injected_clock() -> None:
    clock = FakeClock(start=1_000.0)
    fake = FakeVaultStore(clock=clock)
    await fake.write("a", {"k": "1"}, cas=None)
    clock.advance(30)
    await fake.write("a", {"k": "2"}, cas=None)
    fake.delete_versions("a")
    metadata = await fake.read_metadata("a")
    assert metadata is not None
    assert metadata.created_time == 1_000.0
    assert metadata.updated_time == 1_030.0
    assert metadata.versions[2].deletion_time == 1_030.0


async def test_read_field_reads_other_mounts() -> None:
    fake = FakeVaultStore()
    fake.external_write("oauth/billing", {"client_secret": "cs"}, mount="kv-team")
    values = await fake.read_fields("kv-team", "oauth/billing", ("client_secret",))
    assert values["client_secret"] == Secret("cs")
    assert await fake.read("oauth/billing") is None  # not on the store's own mount


@pytest.mark.parametrize(
    ("policy_path", "allowed", "denied"),
    [
        ("secret/data/apps/x", "apps/x", "apps/y"),
        ("secret/data/apps/*", "apps/x/y", "other/x"),
        ("secret/data/+/x", "apps/x", "apps/y"),
    ],
)
async def test_policy_globs(policy_path: str, allowed: str, denied: str) -> None:
    fake = FakeVaultStore()
    app = fake.with_policy({policy_path: ["read"]})
    await fake.write(allowed, {"k": "v"}, cas=0)
    assert await app.read(allowed) is not None
    with pytest.raises(VaultPermissionDenied):
        await app.read(denied)


async def test_deny_and_the_most_specific_path_win() -> None:
    fake = FakeVaultStore()
    app = fake.with_policy(
        {"secret/data/apps/*": ["read"], "secret/data/apps/private": ["deny", "read"]}
    )
    caps = await app.capabilities(["secret/data/apps/x", "secret/data/apps/private"])
    assert caps["secret/data/apps/x"] == frozenset({"read"})
    with pytest.raises(VaultPermissionDenied):
        await app.read("apps/private")


async def test_create_does_not_allow_update() -> None:
    fake = FakeVaultStore()
    writer = fake.with_policy({"secret/data/w/*": ["create"]})
    assert await writer.write("w/a", {"k": "1"}, cas=0) == 1
    with pytest.raises(VaultPermissionDenied):
        await writer.write("w/a", {"k": "2"}, cas=1)


async def test_unavailable_and_closed() -> None:
    fake = FakeVaultStore()
    fake.unavailable = True
    with pytest.raises(VaultUnavailable):
        await fake.health()
    fake.unavailable = False
    await fake.health()
    await fake.close()
    with pytest.raises(RuntimeError):
        await fake.read("a")


async def test_max_versions_is_configurable() -> None:
    fake = FakeVaultStore(max_versions=2)
    for i in range(4):
        await fake.write("a", {"k": str(i)}, cas=None)
    metadata = await fake.read_metadata("a")
    assert metadata is not None
    assert sorted(metadata.versions) == [3, 4]
    assert metadata.oldest_version == 3
