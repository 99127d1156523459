"""keyturn against a 3-node OpenBao cluster on Raft storage, pointed at a standby node.

OpenBao's standby nodes answer reads from their own copy of the Raft log and forward writes to
the active node, so a read through a standby can miss a write that was just acknowledged, and
a check-and-set write judged by a standby that is behind is refused although the active node
would accept it. keyturn's store sends every write and every `consistent=True` read to the
active node, and reports a check-and-set conflict only once a consistent read proves it.

The cluster is started once for the module (`raft_cluster` in conftest.py). The staleness of
the plain read path and of raw writes through a standby is measured and printed (run with -s),
never asserted: it depends on timing.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import hvac
import pytest

from keyturn.clock import SystemClock, parse_rfc3339
from keyturn.errors import VaultCasConflict, VaultError
from keyturn.secret import Secret
from keyturn.vault import VaultAuth, VaultConnection, VaultStore
from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.raft import OpenBaoRaftCluster, RaftNode
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess, Deployment, prepare_deployment

pytestmark = [pytest.mark.openbao, pytest.mark.slow]

ROUNDS = 200
POLICY = Path(__file__).parents[2] / "deploy" / "vault" / "keyturn.hcl"


def keyturn_token(cluster: OpenBaoRaftCluster) -> str:
    """A token with exactly the shipped keyturn policy (no metadata read on state records)."""
    root = hvac.Client(url=cluster.leader().address, token=cluster.root_token)
    root.sys.create_or_update_policy("keyturn", POLICY.read_text())
    created = root.auth.token.create(policies=["keyturn"], ttl="1h", no_default_policy=True)
    return str(created["auth"]["client_token"])


def store_for(address: str, token: str, *nodes: str) -> VaultStore:
    connection = VaultConnection(address=address, nodes=nodes, timeout=5.0, max_workers=4)
    return VaultStore(connection, VaultAuth("token", token=Secret(token)), clock=SystemClock())


@pytest.fixture
async def standby_store(healthy_cluster: OpenBaoRaftCluster) -> AsyncIterator[VaultStore]:
    """A store whose configured address is a standby node, with keyturn's own policy."""
    store = store_for(healthy_cluster.standbys()[0].address, keyturn_token(healthy_cluster))
    try:
        yield store
    finally:
        await store.close()


def state_path() -> str:
    return f"keyturn/state/{uuid.uuid4().hex[:12]}"


# -- the store ----------------------------------------------------------------------------


async def test_consistent_reads_through_a_standby_see_every_write(
    healthy_cluster: OpenBaoRaftCluster, standby_store: VaultStore
) -> None:
    """The job's pattern, ROUNDS times: write the record with check-and-set on the version
    just written, then read it back. The consistent read always sees the write and no
    check-and-set is refused; the plain read (the standby's copy) is counted, not judged."""
    path = state_path()
    version, stale_plain = 0, 0
    for i in range(ROUNDS):
        version = await standby_store.write(path, {"round": str(i)}, cas=version)
        plain = await standby_store.read(path)
        current = await standby_store.read(path, consistent=True)
        assert current is not None
        assert (current.version, current.data["round"]) == (version, str(i))
        if plain is None or plain.version != version:
            stale_plain += 1
    assert version == ROUNDS
    print(f"\nthrough a standby: plain reads stale {stale_plain}/{ROUNDS}, consistent 0/{ROUNDS}")


async def test_a_real_conflict_is_still_reported(
    healthy_cluster: OpenBaoRaftCluster, standby_store: VaultStore
) -> None:
    path = state_path()
    assert await standby_store.write(path, {"owner": "us"}, cas=0) == 1
    root = hvac.Client(url=healthy_cluster.standbys()[-1].address, token=healthy_cluster.root_token)
    root.secrets.kv.v2.create_or_update_secret(path=path, secret={"owner": "them"})
    with pytest.raises(VaultCasConflict):
        await standby_store.write(path, {"owner": "us"}, cas=1)
    current = await standby_store.read(path, consistent=True)
    assert current is not None and (current.version, current.data["owner"]) == (2, "them")
    assert await standby_store.write(path, {"owner": "us"}, cas=2) == 3


async def test_a_write_by_another_client_is_seen_by_a_consistent_read(
    healthy_cluster: OpenBaoRaftCluster, standby_store: VaultStore
) -> None:
    """Another instance writes through the other standby; our consistent read of the record
    (what decides whether the lease is free) sees it every time."""
    path = state_path()
    other = httpx.AsyncClient(
        base_url=healthy_cluster.standbys()[-1].address,
        headers={"X-Vault-Token": healthy_cluster.root_token},
        timeout=10.0,
    )
    async with other:
        for i in range(ROUNDS // 2):
            answer = await other.post(f"/v1/secret/data/{path}", json={"data": {"lease": str(i)}})
            assert answer.status_code == 200, answer.text
            current = await standby_store.read(path, consistent=True)
            assert current is not None and current.data["lease"] == str(i)


async def test_a_list_of_all_nodes_survives_a_stopped_node(
    healthy_cluster: OpenBaoRaftCluster,
) -> None:
    first, second = healthy_cluster.standbys()
    leader = healthy_cluster.leader()
    token = keyturn_token(healthy_cluster)
    store = store_for(first.address, token, second.address, leader.address)
    try:
        path = state_path()
        assert await store.write(path, {"n": "1"}, cas=0) == 1
        healthy_cluster.stop_node(first.index)
        # Plain and consistent reads, and check-and-set writes, carry on through the others.
        for version in range(2, 12):
            assert await store.write(path, {"n": str(version)}, cas=version - 1) == version
            entry = await store.read(path, consistent=True)
            assert entry is not None and entry.version == version
            assert await store.read(path) is not None
            assert await store.read_fields("secret", path, ("n",))
        assert store._client.home != first.address
    finally:
        await store.close()


async def test_a_list_of_all_nodes_rides_through_a_sealed_node(
    healthy_cluster: OpenBaoRaftCluster,
) -> None:
    """The configured node is sealed (it answers 503 to everything): reads, consistent reads and
    check-and-set writes go on through the other nodes, and go back to it once unsealed."""
    first, second = healthy_cluster.standbys()
    leader = healthy_cluster.leader()
    token = keyturn_token(healthy_cluster)
    store = store_for(first.address, token, second.address, leader.address)
    try:
        path = state_path()
        assert await store.write(path, {"n": "1"}, cas=0) == 1
        healthy_cluster.seal_node(first.index)
        try:
            for version in range(2, 12):
                assert await store.write(path, {"n": str(version)}, cas=version - 1) == version
                entry = await store.read(path, consistent=True)
                assert entry is not None and entry.version == version
                assert await store.read(path) is not None
            assert store._client.home != first.address
        finally:
            healthy_cluster.unseal_node(first.index)
    finally:
        await store.close()


async def test_losing_the_active_node_moves_consistent_calls_to_the_new_one(
    healthy_cluster: OpenBaoRaftCluster,
) -> None:
    old_leader = healthy_cluster.leader()
    standby = healthy_cluster.standbys()[0]
    token = keyturn_token(healthy_cluster)
    store = store_for(standby.address, token, *healthy_cluster.addresses)
    try:
        path = state_path()
        version = await store.write(path, {"n": "0"}, cas=0)
        assert store._client.active == old_leader.address
        healthy_cluster.stop_node(old_leader.index)
        # An election; slower on a loaded machine (the suite runs on two workers).
        new_leader = healthy_cluster.wait_for_leader(timeout=60)
        assert new_leader is not old_leader
        # Writes fail (unavailable) only while no node is active; bounded in tries and time.
        for _attempt in range(150):
            try:
                version = await store.write(path, {"n": "1"}, cas=version)
                break
            except VaultCasConflict:
                raise
            except VaultError:
                await asyncio.sleep(0.2)
        else:
            pytest.fail("no write accepted within 30 s of losing the active node")
        for i in range(2, 50):
            version = await store.write(path, {"n": str(i)}, cas=version)
            entry = await store.read(path, consistent=True)
            assert entry is not None and entry.data["n"] == str(i)
        assert store._client.active == new_leader.address
    finally:
        await store.close()


async def test_a_single_server_is_its_own_active_node(openbao: OpenBaoDevServer) -> None:
    store = store_for(openbao.address, openbao.root_token)
    try:
        path = f"single/{uuid.uuid4().hex[:12]}"
        assert await store.write(path, {"a": "1"}, cas=0) == 1
        entry = await store.read(path, consistent=True)
        assert entry is not None and entry.version == 1
        assert store._client.standalone
        assert store._client.active == openbao.address
        with pytest.raises(VaultCasConflict):
            await store.write(path, {"a": "2"}, cas=0)
    finally:
        await store.close()


# -- the daemon ---------------------------------------------------------------------------

CREDENTIALS = [f"c{i}" for i in range(6)]


@pytest.fixture
def sandbox_8s(tmp_path: Path) -> Iterator[SandboxProcess]:
    with SandboxProcess(config={"access_token_lifetime": 8}, workdir=tmp_path / "sb") as sandbox:
        yield sandbox


@pytest.mark.sandbox
def test_a_daemon_pointed_at_a_standby_serves_every_app(
    healthy_cluster: OpenBaoRaftCluster, sandbox_8s: SandboxProcess, tmp_path: Path
) -> None:
    """Six credentials with 8-second tokens for ~40 s, keyturn's address a standby node, apps
    reading through the other standby: no app reads an expired or refused token, and every
    rotated refresh token is presented once (the sandbox revokes a family on reuse)."""
    standby, app_node = healthy_cluster.standbys()
    vault = SimpleNamespace(address=standby.address, root_token=healthy_cluster.root_token)
    deployment = prepare_deployment(
        vault,  # type: ignore[arg-type]
        sandbox_8s,
        tmp_path,
        CREDENTIALS,
        namespace=f"r{uuid.uuid4().hex[:8]}",
        credential={
            "refresh": {"margin": "2s", "min_interval": "500ms"},
            "backoff": {"initial": "200ms", "max": "1s"},
        },
    )
    daemon = DaemonProcess(deployment.config_path, tmp_path).start()
    try:
        samples = sample_apps(deployment, app_node, healthy_cluster.root_token, seconds=40)
    finally:
        assert daemon.stop() == 0
    expired = [s for s in samples if s["expires_at"] <= s["at"]]
    refused = [s for s in samples if s["status"] != 200]
    versions = {name: {s["version"] for s in samples if s["name"] == name} for name in CREDENTIALS}
    tokens = {
        name: sandbox_8s.admin.list_tokens(client["client_id"])
        for name, client in deployment.clients.items()
    }
    revoked = sorted(name for name, issued in tokens.items() if any_revoked(issued))
    log = daemon.log_text()
    print(
        f"\ndaemon via a standby: {len(samples)} app reads, {len(expired)} expired, "
        f"{len(refused)} refused; families revoked: {revoked}; check-and-set refusals by a "
        f"stale node retried: {log.count('vault.cas_rejected_by_stale_node')}"
    )
    assert expired == [] and refused == []
    assert revoked == []
    assert all(len(v) >= 5 for v in versions.values()), versions  # several refresh cycles
    for issued in tokens.values():
        refresh = [t for t in issued if t["kind"] == "refresh"]
        assert sum(t["status"] == "active" for t in refresh) == 1
        assert sum(t["status"] == "used" for t in refresh) >= 4
    assert "refresh_token_rejected" not in log
    assert "published_secret_changed" not in log


def any_revoked(tokens: list[dict[str, object]]) -> bool:
    return any(t["status"] == "revoked" for t in tokens)


def sample_apps(
    deployment: Deployment, node: RaftNode, token: str, *, seconds: float
) -> list[dict[str, object]]:
    """Read every published path through `node` as an app would, and call the service with
    what was read; waits for the first publication of each (bounded)."""
    samples: list[dict[str, object]] = []
    vault = loopback.client(base_url=node.address, headers={"X-Vault-Token": token}, timeout=5)
    service = loopback.client(base_url=deployment.sandbox.base_url, timeout=5)
    published: set[str] = set()
    wait_until = time.monotonic() + 30
    with vault, service:
        while len(published) < len(CREDENTIALS):
            assert time.monotonic() < wait_until, f"published only {sorted(published)}"
            for name in CREDENTIALS:
                answer = vault.get(f"/v1/secret/data/{deployment.publish_to[name]}")
                if answer.status_code == 200:
                    published.add(name)
            time.sleep(0.1)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name in CREDENTIALS:
                answer = vault.get(f"/v1/secret/data/{deployment.publish_to[name]}")
                assert answer.status_code == 200, answer.text
                read = answer.json()["data"]
                data = read["data"]
                status = service.get(
                    "/v1/projects", headers={"Authorization": data["authorization"]}
                ).status_code
                samples.append(
                    {
                        "name": name,
                        "at": time.time(),
                        "version": read["metadata"]["version"],
                        "expires_at": parse_rfc3339(data["expires_at"]),
                        "status": status,
                    }
                )
            time.sleep(0.2)
    return samples
