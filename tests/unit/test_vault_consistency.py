"""Where Vault calls go on a cluster, and how a check-and-set conflict is proven; no sockets.

A fake `requests` transport plays the nodes of a cluster (or one server). The same behaviour
against a real 3-node OpenBao: tests/integration/test_replicated_vault.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import urllib3.exceptions
from requests.adapters import BaseAdapter

from keyturn.clock import FakeClock
from keyturn.errors import VaultCasConflict, VaultUnavailable
from keyturn.secret import Secret
from keyturn.testing.transport import vault_answer
from keyturn.testing.vault import FakeVaultStore
from keyturn.vault.auth import VaultAuth
from keyturn.vault.client import (
    ELECTION_PAUSE,
    ELECTION_RETRIES,
    StorageIndex,
    VaultClient,
    VaultConnection,
    not_sent,
)
from keyturn.vault.hvac_store import VaultStore


@dataclass
class Seen:
    node: str
    method: str
    path: str
    headers: dict[str, str]


Answer = tuple[int, dict[str, Any] | None, dict[str, str]] | Exception


@dataclass
class FakeCluster(BaseAdapter):
    """Answers `handler(node, method, path, headers)`; `node` is scheme://host:port."""

    handler: Callable[[str, str, str, dict[str, str]], Answer]
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    def send(self, request: requests.PreparedRequest, *args: object, **kwargs: object) -> Any:
        parts = urlsplit(request.url or "")
        node = f"{parts.scheme}://{parts.netloc}"
        headers = dict(request.headers)
        self.seen.append(Seen(node, request.method or "", parts.path, headers))
        answer = self.handler(node, request.method or "", parts.path, headers)
        if isinstance(answer, Exception):
            raise answer
        status, body, extra = answer
        return vault_answer(request, status, body, headers=extra)

    def close(self) -> None:
        pass

    def data_calls(self) -> list[Seen]:
        return [s for s in self.seen if not s.path.endswith("/sys/leader")]


def index(value: int, cluster: str = "c1") -> str:
    return base64.b64encode(json.dumps({"cluster": cluster, "value": str(value)}).encode()).decode()


def refused() -> requests.ConnectionError:
    reason = urllib3.exceptions.NewConnectionError(None, "refused")  # type: ignore[arg-type]
    return requests.ConnectionError(urllib3.exceptions.MaxRetryError(None, "/", reason))  # type: ignore[arg-type]


STANDBY, OTHER, ACTIVE = "http://s1:8200", "http://s2:8200", "http://a:8200"
LEADER = {"ha_enabled": True, "is_self": False, "leader_address": ACTIVE}
READ_OK = {"data": {"data": {"k": "v"}, "metadata": {"version": 1}}}


def client(cluster: FakeCluster, address: str = STANDBY, *nodes: str) -> VaultClient:
    connection = VaultConnection(address=address, nodes=nodes)
    made = VaultClient(connection, clock=FakeClock(), transport=cluster)
    made.set_token(Secret("t"))
    return made


async def read(made: VaultClient, *, consistent: bool) -> dict[str, Any] | None:
    return await made.request(
        "GET",
        "v1/secret/data/x",
        kind="read",
        operation="read",
        path="secret/x",
        consistent=consistent,
    )


async def write(made: VaultClient) -> dict[str, Any] | None:
    return await made.request(
        "POST",
        "v1/secret/data/x",
        kind="write",
        operation="write",
        path="secret/x",
        json={"data": {"k": "v"}},
        consistent=True,
    )


async def test_a_single_server_gets_every_call_as_before() -> None:
    def handler(node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        if path == "/v1/sys/leader":
            return 200, {"ha_enabled": False}, {}
        return 200, READ_OK, {"X-Vault-Index": index(7)}

    cluster = FakeCluster(handler)
    made = client(cluster, "http://vault:8200")
    try:
        await read(made, consistent=True)
        await write(made)
        await read(made, consistent=False)
    finally:
        await made.close()
    assert {s.node for s in cluster.seen} == {"http://vault:8200"}
    assert made.standalone and made.active == "http://vault:8200"
    assert [s.path for s in cluster.seen].count("/v1/sys/leader") == 1
    plain = cluster.data_calls()[-1]
    assert "X-Vault-Index" not in plain.headers and "X-Vault-Inconsistent" not in plain.headers


async def test_consistent_calls_go_to_the_active_node_and_plain_reads_stay() -> None:
    def handler(node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        if path == "/v1/sys/leader":
            return 200, LEADER, {}
        return 200, READ_OK, {"X-Vault-Index": index(10 if node == ACTIVE else 3)}

    cluster = FakeCluster(handler)
    made = client(cluster)
    try:
        await read(made, consistent=True)
        await write(made)
        await read(made, consistent=False)
        await read(made, consistent=True)
    finally:
        await made.close()
    nodes = [(s.method, s.node) for s in cluster.data_calls()]
    assert nodes == [("GET", ACTIVE), ("POST", ACTIVE), ("GET", STANDBY), ("GET", ACTIVE)]
    assert not made.standalone
    # The newest index (the active node's, not the standby's older one) rides on consistent
    # calls, with the header that makes a node that is behind forward instead of answering.
    last = cluster.data_calls()[-1].headers
    assert last["X-Vault-Index"] == index(10)
    assert last["X-Vault-Inconsistent"] == "forward-active-node"
    assert "X-Vault-Index" not in cluster.data_calls()[2].headers
    assert all(s.headers.get("X-Vault-Token") == "t" for s in cluster.data_calls())
    assert "X-Vault-Token" not in cluster.seen[0].headers  # sys/leader is asked without it


async def test_the_active_node_is_asked_for_again_after_a_while() -> None:
    def handler(node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        return (200, LEADER, {}) if path == "/v1/sys/leader" else (200, READ_OK, {})

    cluster = FakeCluster(handler)
    made = client(cluster)
    clock = made._clock
    assert isinstance(clock, FakeClock)
    try:
        await read(made, consistent=True)
        await read(made, consistent=True)
        clock.advance(11)
        await read(made, consistent=True)
    finally:
        await made.close()
    assert [s.path for s in cluster.seen].count("/v1/sys/leader") == 2


async def test_a_plain_http_leader_is_not_trusted_with_an_https_token() -> None:
    def handler(node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        if path == "/v1/sys/leader":
            return 200, {**LEADER, "leader_address": "http://a:8200"}, {}
        return 200, READ_OK, {}

    cluster = FakeCluster(handler)
    made = client(cluster, "https://s1:8200")
    try:
        await read(made, consistent=True)
    finally:
        await made.close()
    assert [s.node for s in cluster.data_calls()] == ["https://s1:8200"]


async def test_an_unreachable_node_of_the_list_is_skipped_for_every_call() -> None:
    def handler(node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        if node == STANDBY:
            return refused()
        if path == "/v1/sys/leader":
            return 200, LEADER, {}
        return 200, READ_OK, {}

    cluster = FakeCluster(handler)
    made = client(cluster, STANDBY, OTHER, ACTIVE)
    try:
        assert await read(made, consistent=False) == READ_OK
        assert made.home == OTHER
        assert await write(made) == READ_OK
    finally:
        await made.close()
    assert [s.node for s in cluster.data_calls()] == [STANDBY, OTHER, ACTIVE]


async def test_an_unreachable_active_node_falls_back_to_the_configured_one() -> None:
    def handler(node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        if node == ACTIVE:
            return refused()
        if path == "/v1/sys/leader":
            return 200, LEADER, {}
        return 200, READ_OK, {}

    cluster = FakeCluster(handler)
    made = client(cluster)
    try:
        assert await read(made, consistent=True) == READ_OK
    finally:
        await made.close()
    assert [s.node for s in cluster.data_calls()] == [ACTIVE, STANDBY]


@pytest.mark.parametrize(
    "failure",
    [
        requests.ConnectionError("Connection aborted."),
        (500, {"errors": ["internal error"]}, {}),
    ],
    ids=["connection-aborted", "any-other-500"],
)
async def test_a_write_whose_fate_is_unknown_is_not_sent_again(failure: Answer) -> None:
    def handler(node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        if path == "/v1/sys/leader":
            return 200, LEADER, {}
        return failure  # it may have been carried out

    cluster = FakeCluster(handler)
    made = client(cluster, STANDBY, OTHER)
    try:
        with pytest.raises(VaultUnavailable):
            await write(made)
    finally:
        await made.close()
    assert len(cluster.data_calls()) == 1


NO_LEADER = (500, {"errors": ["local node not active but active cluster node not found"]}, {})


async def write_while_the_clock_runs(made: VaultClient, clock: FakeClock) -> Any:
    """The write, with the fake clock moved on while it waits (the calls run in threads)."""
    task = asyncio.create_task(write(made))
    while not task.done():
        await asyncio.sleep(0.005)
        clock.advance(ELECTION_PAUSE)
    return await task


@pytest.mark.parametrize("elections", [2, ELECTION_RETRIES + 1])
async def test_a_write_during_an_election_waits_for_the_new_leader(elections: int) -> None:
    answers = [NO_LEADER] * elections + [(200, {"data": {"version": 2}}, {})]

    def handler(node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        if path == "/v1/sys/leader":
            return 200, LEADER, {}
        return answers.pop(0)

    cluster = FakeCluster(handler)
    clock = FakeClock()
    made = VaultClient(
        VaultConnection(address=STANDBY, nodes=(OTHER,)), clock=clock, transport=cluster
    )
    made.set_token(Secret("t"))
    try:
        if elections <= ELECTION_RETRIES:
            assert await write_while_the_clock_runs(made, clock) == {"data": {"version": 2}}
        else:  # an election that does not end: the failure the caller sees, after the waits
            with pytest.raises(VaultUnavailable, match="HTTP 500"):
                await write_while_the_clock_runs(made, clock)
    finally:
        await made.close()
    assert len(cluster.data_calls()) == min(elections + 1, ELECTION_RETRIES + 1)


async def test_an_index_the_server_cannot_read_is_dropped() -> None:
    def handler(node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        if path == "/v1/sys/leader":
            return 200, LEADER, {}
        if "X-Vault-Index" in headers:
            return 400, {"errors": ['failed to decode "X-Vault-Index"']}, {}
        return 200, READ_OK, {}

    cluster = FakeCluster(handler)
    made = client(cluster)
    made.index.update("opaque-from-elsewhere", write=True)
    try:
        assert await read(made, consistent=True) == READ_OK
    finally:
        await made.close()
    assert made.index.header is None
    assert len(cluster.data_calls()) == 2


def test_the_storage_index_keeps_the_newest() -> None:
    kept = StorageIndex()
    kept.update(index(5), write=False)
    kept.update(index(3), write=True)
    assert kept.header == index(5)
    kept.update(index(9), write=False)
    assert kept.value == 9
    kept.update(index(1, cluster="c2"), write=False)  # another cluster: start again
    assert (kept.cluster, kept.value) == ("c2", 1)
    kept.update("v1:opaque", write=False)  # an opaque index is kept from writes only
    assert kept.cluster == "c2"
    kept.update("v1:opaque", write=True)
    assert kept.header == "v1:opaque"


def test_not_sent_means_no_connection_was_made() -> None:
    assert not_sent(refused())
    assert not_sent(requests.ConnectTimeout("connect timeout"))
    assert not not_sent(requests.ConnectionError("Connection aborted."))
    assert not not_sent(requests.ReadTimeout("read timeout"))
    assert not not_sent(None)


# -- check-and-set conflicts, proven before they are reported --------------------------------


def store_on(cluster: FakeCluster) -> VaultStore:
    connection = VaultConnection(address=STANDBY)
    return VaultStore(
        connection, VaultAuth("token", token=Secret("t")), clock=FakeClock(), transport=cluster
    )


LOOKUP = {"data": {"ttl": 0, "renewable": False, "accessor": "acc"}}


def store_control(path: str) -> Answer | None:
    """What a store's cluster answers besides KV calls: the leader, the token's look-up."""
    if path == "/v1/sys/leader":
        return 200, LEADER, {}
    if path.endswith("lookup-self"):
        return 200, LOOKUP, {}
    return None


def kv_calls(cluster: FakeCluster) -> list[Seen]:
    """The store's KV calls, in order (without the leader and token look-ups)."""
    return [s for s in cluster.data_calls() if "lookup" not in s.path]


def kv(state: dict[str, int], *, stale_rejections: int) -> Callable[..., Answer]:
    """A KV path at version `state["version"]` on the active node; the first
    `stale_rejections` writes are refused as a node that is one version behind would."""

    def handler(node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        if (control := store_control(path)) is not None:
            return control
        if method == "GET":
            meta = {"version": state["version"], "created_time": "2026-01-01T00:00:00Z"}
            return 200, {"data": {"data": {"k": "v"}, "metadata": meta}}, {}
        if state["rejections"] < stale_rejections:
            state["rejections"] += 1
            return (
                400,
                {"errors": ["check-and-set parameter did not match the current version"]},
                {},
            )
        state["version"] += 1
        return 200, {"data": {"version": state["version"]}}, {}

    return handler


async def test_a_conflict_from_a_node_that_was_behind_is_retried() -> None:
    state = {"version": 3, "rejections": 0}
    cluster = FakeCluster(kv(state, stale_rejections=1))
    store = store_on(cluster)
    try:
        assert await store.write("keyturn/state/x", {"k": "v"}, cas=3) == 4
    finally:
        await store.close()
    calls = [(s.method, s.node) for s in kv_calls(cluster)]
    assert calls == [("POST", ACTIVE), ("GET", ACTIVE), ("POST", ACTIVE)]


async def test_a_real_conflict_is_reported_after_one_consistent_read() -> None:
    state = {"version": 5, "rejections": 0}
    cluster = FakeCluster(kv(state, stale_rejections=99))
    store = store_on(cluster)
    try:
        with pytest.raises(VaultCasConflict):
            await store.write("keyturn/state/x", {"k": "v"}, cas=3)
    finally:
        await store.close()
    calls = [s.method for s in kv_calls(cluster)]
    assert calls == ["POST", "GET"]


async def test_a_conflict_that_persists_is_reported_after_a_few_tries() -> None:
    state = {"version": 3, "rejections": 0}
    cluster = FakeCluster(kv(state, stale_rejections=99))
    store = store_on(cluster)
    try:
        with pytest.raises(VaultCasConflict):
            await store.write("keyturn/state/x", {"k": "v"}, cas=3)
    finally:
        await store.close()
    posts = [s for s in cluster.data_calls() if s.method == "POST"]
    assert len(posts) == 4  # the write and three more, each after a consistent read


# -- a check-and-set write whose answer was lost -----------------------------------------------

CAS_REFUSED = (400, {"errors": ["check-and-set parameter did not match the current version"]}, {})


@dataclass
class LossyKv:
    """One KV path on the active node whose first write's answer is lost: the connection
    breaks after the write was carried out (`lands`) or before; `other` is what another
    writer put there meanwhile, if anything."""

    version: int
    data: dict[str, Any]
    lands: bool
    other: dict[str, Any] | None = None
    lost: int = 0
    sent: list[dict[str, Any]] = field(default_factory=list)  # each write's body, in order

    def __call__(self, node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        if (control := store_control(path)) is not None:
            return control
        if method == "GET":
            meta = {"version": self.version, "created_time": "2026-01-01T00:00:00Z"}
            return 200, {"data": {"data": self.data, "metadata": meta}}, {}
        sent = self.sent.pop(0)
        if self.lost == 0:
            self.lost += 1
            if self.lands:
                self.version, self.data = self.version + 1, sent["data"]
            if self.other is not None:
                self.version, self.data = self.version + 1, self.other
            return requests.ConnectionError("Connection aborted.", "RemoteDisconnected")
        if sent["options"].get("cas") not in (None, self.version):
            return CAS_REFUSED
        self.version, self.data = self.version + 1, sent["data"]
        return 200, {"data": {"version": self.version}}, {}


class RecordingCluster(FakeCluster):
    """A FakeCluster that hands each write's JSON body to the handler (`LossyKv.sent`)."""

    def send(self, request: requests.PreparedRequest, *args: object, **kwargs: object) -> Any:
        if request.method == "POST" and isinstance(self.handler, LossyKv) and request.body:
            self.handler.sent.append(json.loads(request.body))
        return super().send(request, *args, **kwargs)


@pytest.mark.parametrize("lands", [True, False], ids=["had-landed", "never-landed"])
async def test_a_check_and_set_write_whose_answer_was_lost_is_known_as_written(
    lands: bool,
) -> None:
    kv = LossyKv(version=3, data={"k": "old"}, lands=lands)
    cluster = RecordingCluster(kv)
    store = store_on(cluster)
    try:
        assert await store.write("keyturn/state/x", {"k": "new"}, cas=3) == 4
    finally:
        await store.close()
    assert (kv.version, kv.data) == (4, {"k": "new"})  # written once, either way
    # Landed: the resend is refused (cas=3, the path is at 4) and one read shows our data.
    assert [s.method for s in kv_calls(cluster)] == (
        ["POST", "POST", "GET"] if lands else ["POST", "POST"]
    )


async def test_a_lost_answer_and_another_writers_version_is_a_conflict() -> None:
    kv = LossyKv(version=3, data={"k": "old"}, lands=False, other={"k": "theirs"})
    cluster = RecordingCluster(kv)
    store = store_on(cluster)
    try:
        with pytest.raises(VaultCasConflict):
            await store.write("keyturn/state/x", {"k": "new"}, cas=3)
    finally:
        await store.close()
    assert (kv.version, kv.data) == (4, {"k": "theirs"})
    assert [s.method for s in kv_calls(cluster)] == ["POST", "POST", "GET"]


async def test_an_unconditional_write_whose_answer_was_lost_is_not_sent_again() -> None:
    kv = LossyKv(version=3, data={"k": "old"}, lands=True)
    cluster = RecordingCluster(kv)
    store = store_on(cluster)
    try:
        with pytest.raises(VaultUnavailable, match="cannot reach vault"):
            await store.write("keyturn/plan/x", {"k": "new"}, cas=None)
    finally:
        await store.close()
    assert [s.method for s in kv_calls(cluster)] == ["POST"]


async def test_custom_metadata_whose_answer_was_lost_is_sent_once_more() -> None:
    metadata_posts: list[str] = []

    def handler(node: str, method: str, path: str, headers: dict[str, str]) -> Answer:
        if (control := store_control(path)) is not None:
            return control
        if "/metadata/" in path:
            metadata_posts.append(path)
            if len(metadata_posts) == 1:
                return requests.ConnectionError("Connection aborted.", "RemoteDisconnected")
            return 204, None, {}
        return 200, {"data": {"version": 4}}, {}

    cluster = FakeCluster(handler)
    store = store_on(cluster)
    try:
        written = await store.write("apps/x", {"k": "v"}, cas=3, custom_metadata={"m": "1"})
    finally:
        await store.close()
    assert written == 4
    calls = [(s.method, s.path.split("/")[3]) for s in kv_calls(cluster)]
    assert calls == [("POST", "data"), ("POST", "metadata"), ("POST", "metadata")]


# -- the fake store ----------------------------------------------------------------------


async def test_the_fake_can_play_a_lagging_standby() -> None:
    store = FakeVaultStore()
    await store.write("p", {"n": "1"}, cas=0)
    await store.write("p", {"n": "2"}, cas=1)
    store.stale_by = 1
    plain = await store.read("p")
    current = await store.read("p", consistent=True)
    assert plain is not None and (plain.version, plain.data["n"]) == (1, "1")
    assert current is not None and (current.version, current.data["n"]) == (2, "2")
    meta = await store.read_metadata("p")
    assert meta is not None and meta.current_version == 1 and set(meta.versions) == {1}
    assert (await store.read_metadata("p", consistent=True)).current_version == 2  # type: ignore[union-attr]
    assert (await store.read_fields("secret", "p", ("n",)))["n"].reveal() == "1"
    fields = await store.read_fields("secret", "p", ("n",), consistent=True)
    assert fields["n"].reveal() == "2"
    with pytest.raises(VaultCasConflict):
        await store.write("p", {"n": "3"}, cas=1)  # check-and-set is judged on current data
    assert store.reads == [
        ("read", "p", False),
        ("read", "p", True),
        ("read_metadata", "p", False),
        ("read_metadata", "p", True),
        ("read_field", "p", False),
        ("read_field", "p", True),
    ]
    await store.write("q", {"n": "1"}, cas=0)
    assert await store.read("q") is None  # not yet on the lagging copy
    assert await store.read_metadata("q") is None
