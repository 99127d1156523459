"""One contract for every `KvStore`: the in-memory fake and a real OpenBao behave the same.

Each test runs twice, over `FakeVaultStore` and over `VaultStore` against the session's
OpenBao dev server, through a small `Backend` harness whose "someone else" operations use the
fake's conveniences on one side and a root hvac client on the other.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import hvac
import pytest

from keyturn.clock import SystemClock
from keyturn.errors import (
    SecretReferenceError,
    VaultCasConflict,
    VaultPermissionDenied,
    VaultUnavailable,
)
from keyturn.secret import Secret
from keyturn.testing import FakeVaultStore
from keyturn.vault import KvStore, VaultAuth, VaultConnection, VaultStore
from keyturn_devkit.dev.ports import free_port_pair

Policy = Mapping[str, Sequence[str]]


@dataclass
class Backend:
    """A store under test plus the out-of-band powers a test needs over the same Vault."""

    name: str
    store: KvStore
    external_write: Callable[[str, dict[str, str]], int]
    delete_versions: Callable[[str, list[int]], None]
    destroy_versions: Callable[[str, list[int]], None]
    limited: Callable[[Policy], Awaitable[KvStore]]
    down: Callable[[], KvStore]
    prefix: str = field(default_factory=lambda: f"contract/{uuid.uuid4().hex[:12]}")
    opened: list[KvStore] = field(default_factory=list)

    def path(self, name: str) -> str:
        return f"{self.prefix}/{name}"


def _fake_backend() -> Backend:
    fake = FakeVaultStore()

    async def limited(policy: Policy) -> KvStore:
        return fake.with_policy(policy)

    def down() -> KvStore:
        store = FakeVaultStore()
        store.unavailable = True
        return store

    return Backend(
        name="fake",
        store=fake,
        external_write=fake.external_write,
        delete_versions=fake.delete_versions,
        destroy_versions=fake.destroy_versions,
        limited=limited,
        down=down,
    )


def _real_store(address: str, token: str, timeout: float = 10.0) -> VaultStore:
    connection = VaultConnection(address=address, max_workers=4, timeout=timeout)
    return VaultStore(connection, VaultAuth("token", token=Secret(token)), clock=SystemClock())


def _openbao_backend(address: str, root: hvac.Client) -> Backend:
    kv = root.secrets.kv.v2
    backend: Backend

    def external_write(path: str, data: dict[str, str]) -> int:
        return int(kv.create_or_update_secret(path, data)["data"]["version"])

    def delete_versions(path: str, versions: list[int]) -> None:
        kv.delete_secret_versions(path, versions)

    def destroy_versions(path: str, versions: list[int]) -> None:
        kv.destroy_secret_versions(path, versions)

    async def limited(policy: Policy) -> KvStore:
        name = f"contract-{uuid.uuid4().hex[:12]}"
        rules = "\n".join(
            f'path "{path}" {{ capabilities = {list(caps)!r} }}'.replace("'", '"')
            for path, caps in policy.items()
        )
        root.sys.create_or_update_policy(name, rules)
        token = root.auth.token.create(policies=[name], ttl="10m")["auth"]["client_token"]
        store = _real_store(address, token)
        backend.opened.append(store)
        return store

    def down() -> KvStore:
        store = _real_store(f"http://127.0.0.1:{free_port_pair()}", "s.unused", timeout=2.0)
        backend.opened.append(store)
        return store

    backend = Backend(
        name="openbao",
        store=_real_store(address, root.token),
        external_write=external_write,
        delete_versions=delete_versions,
        destroy_versions=destroy_versions,
        limited=limited,
        down=down,
    )
    return backend


@pytest.fixture(params=["fake", pytest.param("openbao", marks=pytest.mark.openbao)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "fake":
        harness = _fake_backend()
    else:
        openbao = request.getfixturevalue("openbao")
        root = hvac.Client(url=openbao.address, token=openbao.root_token)
        harness = _openbao_backend(openbao.address, root)
    yield harness
    for store in [harness.store, *harness.opened]:
        await store.close()


def test_both_implementations_satisfy_the_protocol(backend: Backend) -> None:
    assert isinstance(backend.store, KvStore)


async def test_read_of_a_path_never_written_is_none(backend: Backend) -> None:
    assert await backend.store.read(backend.path("missing")) is None
    assert await backend.store.read_metadata(backend.path("missing")) is None


async def test_writes_return_versions_one_two_three(backend: Backend) -> None:
    path = backend.path("counter")
    versions = [await backend.store.write(path, {"n": str(i)}, cas=None) for i in range(3)]
    assert versions == [1, 2, 3]
    entry = await backend.store.read(path)
    assert entry is not None
    assert (entry.path, entry.version, dict(entry.data)) == (path, 3, {"n": "2"})
    assert abs(entry.created_time - time.time()) < 60


async def test_secret_values_are_stored_as_their_text(backend: Backend) -> None:
    path = backend.path("secret-value")
    await backend.store.write(path, {"api_key": Secret("k-123"), "key_id": "id-1"}, cas=0)
    entry = await backend.store.read(path)
    assert entry is not None
    assert dict(entry.data) == {"api_key": "k-123", "key_id": "id-1"}


async def test_cas_zero_means_must_not_exist(backend: Backend) -> None:
    path = backend.path("cas-zero")
    assert await backend.store.write(path, {"a": "1"}, cas=0) == 1
    with pytest.raises(VaultCasConflict) as caught:
        await backend.store.write(path, {"a": "2"}, cas=0)
    assert caught.value.retryable
    assert path in str(caught.value)
    entry = await backend.store.read(path)
    assert entry is not None
    assert entry.data["a"] == "1"


async def test_cas_must_equal_the_current_version(backend: Backend) -> None:
    path = backend.path("cas-n")
    await backend.store.write(path, {"a": "1"}, cas=0)
    assert await backend.store.write(path, {"a": "2"}, cas=1) == 2
    with pytest.raises(VaultCasConflict):
        await backend.store.write(path, {"a": "3"}, cas=1)
    with pytest.raises(VaultCasConflict):
        await backend.store.write(backend.path("cas-never-written"), {"a": "1"}, cas=4)


async def test_a_write_by_someone_else_loses_our_cas(backend: Backend) -> None:
    path = backend.path("external")
    await backend.store.write(path, {"a": "ours"}, cas=0)
    assert backend.external_write(path, {"a": "theirs"}) == 2
    with pytest.raises(VaultCasConflict):
        await backend.store.write(path, {"a": "ours again"}, cas=1)
    entry = await backend.store.read(path)
    assert entry is not None
    assert (entry.version, entry.data["a"]) == (2, "theirs")


async def test_custom_metadata_round_trips_and_is_replaced(backend: Backend) -> None:
    path = backend.path("meta")
    first = {"managed-by": "keyturn", "credential": "billing", "writer": "i-1"}
    await backend.store.write(path, {"a": "1"}, cas=0, custom_metadata=first)
    entry = await backend.store.read(path)
    assert entry is not None
    assert dict(entry.custom_metadata) == first
    await backend.store.write(path, {"a": "2"}, cas=1)  # None: metadata untouched
    metadata = await backend.store.read_metadata(path)
    assert metadata is not None
    assert dict(metadata.custom_metadata) == first
    await backend.store.write(path, {"a": "3"}, cas=2, custom_metadata={"writer": "i-2"})
    entry = await backend.store.read(path)
    assert entry is not None
    assert dict(entry.custom_metadata) == {"writer": "i-2"}


async def test_read_metadata_shows_deleted_and_destroyed_versions(backend: Backend) -> None:
    path = backend.path("history")
    for i in range(3):
        await backend.store.write(path, {"a": str(i)}, cas=i)
    backend.destroy_versions(path, [1])
    backend.delete_versions(path, [3])
    metadata = await backend.store.read_metadata(path)
    assert metadata is not None
    assert (metadata.path, metadata.current_version, metadata.oldest_version) == (path, 3, 0)
    assert sorted(metadata.versions) == [1, 2, 3]
    assert metadata.versions[1].destroyed
    assert metadata.versions[1].deletion_time is None
    assert not metadata.versions[2].destroyed
    assert metadata.versions[2].deletion_time is None
    assert metadata.versions[3].deletion_time is not None
    assert not metadata.versions[3].destroyed
    assert metadata.created_time <= metadata.updated_time
    assert await backend.store.read(path) is None  # the latest version is deleted
    with pytest.raises(VaultCasConflict):  # ... but it still counts for check-and-set
        await backend.store.write(path, {"a": "x"}, cas=2)
    assert await backend.store.write(path, {"a": "x"}, cas=3) == 4


async def test_only_the_last_ten_versions_are_kept(backend: Backend) -> None:
    path = backend.path("pruned")
    for i in range(12):
        await backend.store.write(path, {"a": str(i)}, cas=None)
    metadata = await backend.store.read_metadata(path)
    assert metadata is not None
    assert sorted(metadata.versions) == list(range(3, 13))
    assert (metadata.current_version, metadata.oldest_version) == (12, 3)


async def test_delete_all_removes_every_version_and_the_metadata(backend: Backend) -> None:
    path = backend.path("lock")
    await backend.store.write(path, {"owner": "i-1"}, cas=0, custom_metadata={"k": "v"})
    await backend.store.write(path, {"owner": "i-2"}, cas=1)
    await backend.store.delete_all(path)
    assert await backend.store.read(path) is None
    assert await backend.store.read_metadata(path) is None
    assert await backend.store.write(path, {"owner": "i-3"}, cas=0) == 1
    await backend.store.delete_all(backend.path("never-written"))  # no error


async def test_list_keys_names_what_is_directly_under_a_prefix(backend: Backend) -> None:
    assert await backend.store.list_keys(backend.path("listed")) == []  # nothing there yet
    for name in ("b", "a", "sub/c"):
        await backend.store.write(backend.path(f"listed/{name}"), {"v": name}, cas=0)
    assert await backend.store.list_keys(backend.path("listed"), consistent=True) == [
        "a",
        "b",
        "sub/",
    ]
    await backend.store.delete_all(backend.path("listed/b"))
    assert await backend.store.list_keys(backend.path("listed")) == ["a", "sub/"]


async def test_list_metadata_pages_a_folder_with_each_key_s_metadata(backend: Backend) -> None:
    folder = backend.path("published")
    assert await backend.store.list_metadata(folder, limit=10) is None  # nothing there yet
    for name in ("c", "a", "b", "sub/d"):
        await backend.store.write(f"{folder}/{name}", {"v": name}, cas=0)
    await backend.store.write(f"{folder}/b", {"v": "b2"}, cas=1, custom_metadata={"k": "v"})
    await backend.store.delete_all(f"{folder}/c")

    first = await backend.store.list_metadata(folder, limit=2, consistent=True)
    assert first is not None
    assert [name for name, _ in first] == ["a", "b"]
    listed = dict(first)
    direct = await backend.store.read_metadata(f"{folder}/b", consistent=True)
    assert listed["b"] == direct  # the same metadata a read of the path gives
    assert listed["b"] is not None and listed["b"].current_version == 2
    assert listed["b"].custom_metadata == {"k": "v"}
    assert listed["a"] is not None and listed["a"].path == f"{folder}/a"

    rest = await backend.store.list_metadata(folder, after="b", limit=2)
    assert rest == [("sub/", None)]  # c is gone; a sub-folder has no metadata
    assert await backend.store.list_metadata(folder, after="sub/", limit=2) is None


async def test_read_fields_returns_secrets(backend: Backend) -> None:
    path = backend.path("inputs")
    await backend.store.write(path, {"client_id": "cid-1", "client_secret": "cs-1"}, cas=0)
    values = await backend.store.read_fields("secret", path, ("client_id", "client_secret"))
    assert all(isinstance(value, Secret) for value in values.values())
    assert {k: v.reveal() for k, v in values.items()} == {
        "client_id": "cid-1",
        "client_secret": "cs-1",
    }


@pytest.mark.parametrize(
    ("mount", "name", "field"),
    [("secret", "inputs", "nope"), ("secret", "absent", "client_secret"), ("nomount", "x", "f")],
)
async def test_read_fields_errors_name_the_reference(
    backend: Backend, mount: str, name: str, field: str
) -> None:
    await backend.store.write(backend.path("inputs"), {"client_secret": "cs-1"}, cas=None)
    path = backend.path(name)
    # Where the secret exists, a field that is there comes first: the error names the other.
    fields = ("client_secret", field) if name == "inputs" else (field,)
    with pytest.raises(SecretReferenceError) as caught:
        await backend.store.read_fields(mount, path, fields)
    assert f"vault:{mount}/{path}#{field}" in str(caught.value)
    assert "cs-1" not in str(caught.value)


@pytest.mark.parametrize("bad", ["", "/abs", "a/../b", "a//b", "trailing/", "./a", "a\nb"])
async def test_bad_paths_are_rejected_before_any_call(backend: Backend, bad: str) -> None:
    with pytest.raises(ValueError):
        await backend.store.read(bad)
    with pytest.raises(ValueError):
        await backend.store.write(bad, {"a": "1"}, cas=None)
    with pytest.raises(ValueError):
        await backend.store.read_fields("secret", bad, ("a",))


async def test_non_string_values_are_rejected(backend: Backend) -> None:
    with pytest.raises(TypeError):
        await backend.store.write(backend.path("typed"), {"n": 3}, cas=None)  # type: ignore[dict-item]


async def test_capabilities_of_a_limited_token(backend: Backend) -> None:
    app, rw = f"secret/data/{backend.prefix}/app", f"secret/data/{backend.prefix}/rw/*"
    store = await backend.limited({app: ["read"], rw: ["create", "update", "read"]})
    other = f"secret/data/{backend.prefix}/other"
    written = f"secret/data/{backend.prefix}/rw/one"
    caps = await store.capabilities([app, other, written])
    assert caps == {
        app: frozenset({"read"}),
        other: frozenset({"deny"}),
        written: frozenset({"create", "update", "read"}),
    }
    assert (await backend.store.capabilities([other]))[other] == frozenset({"root"})


async def test_permission_denied_is_not_an_auth_failure(backend: Backend) -> None:
    app = backend.path("app")
    await backend.store.write(app, {"access_token": "t-1"}, cas=0)
    store = await backend.limited({f"secret/data/{app}": ["read"]})
    entry = await store.read(app)
    assert entry is not None
    assert entry.data["access_token"] == "t-1"
    with pytest.raises(VaultPermissionDenied) as denied_write:
        await store.write(app, {"access_token": "forged"}, cas=None)
    with pytest.raises(VaultPermissionDenied) as denied_read:
        await store.read(backend.path("other"))
    with pytest.raises(VaultPermissionDenied):
        await store.read_metadata(app)
    assert app in str(denied_write.value)
    assert backend.path("other") in str(denied_read.value)
    await store.health()  # the token itself is fine
    assert getattr(store, "authenticated", None) is True


async def test_health_passes_on_a_working_vault(backend: Backend) -> None:
    await backend.store.health()


async def test_a_vault_that_is_down_is_unavailable(backend: Backend) -> None:
    store = backend.down()
    with pytest.raises(VaultUnavailable) as caught:
        await store.read(backend.path("x"))
    assert caught.value.retryable
    with pytest.raises(VaultUnavailable):
        await store.write(backend.path("x"), {"a": "1"}, cas=0)
    with pytest.raises(VaultUnavailable):
        await store.health()


async def test_a_closed_store_refuses_calls(backend: Backend) -> None:
    await backend.store.write(backend.path("c"), {"a": "1"}, cas=None)
    await backend.store.close()
    with pytest.raises(RuntimeError):
        await backend.store.read(backend.path("c"))
