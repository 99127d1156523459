"""What each `VaultStore` call puts on the wire, through hvac, seen at the transport (no socket):
the method, the path (quoted, slashes kept), the JSON body, the token and the headers of a
consistent call. The same calls against a real OpenBao: tests/integration/test_vault_contract.py.
"""

from __future__ import annotations

import json
from typing import Any

import requests

from keyturn.clock import FakeClock
from keyturn.secret import Secret
from keyturn.testing.transport import VaultReply, VaultTransport
from keyturn.vault.auth import VaultAuth
from keyturn.vault.client import VaultConnection
from keyturn.vault.hvac_store import VaultStore

NOW = "2026-01-02T03:04:05.123456789Z"
META = {
    "current_version": 3,
    "oldest_version": 1,
    "custom_metadata": {"owner": "keyturn"},
    "versions": {"3": {"created_time": NOW, "deletion_time": "", "destroyed": False}},
    "created_time": NOW,
    "updated_time": NOW,
}


def vault(request: requests.PreparedRequest) -> VaultReply:
    """A single OpenBao server, answering what each path answers."""
    path = request.path_url
    if path == "/v1/sys/leader":
        return 200, {"ha_enabled": False}
    if path == "/v1/auth/token/lookup-self":
        return 200, {"data": {"ttl": 0, "renewable": False, "accessor": "acc"}}
    if path.startswith("/v1/secret/data/") and request.method == "GET":
        if path.endswith("/gone"):
            return 404, {"errors": []}
        meta = {"version": 3, "created_time": NOW, "custom_metadata": None}
        return 200, {"data": {"data": {"k": "v"}, "metadata": meta}}, {"X-Vault-Index": "i"}
    if path.startswith("/v1/secret/data/"):
        return 200, {"data": {"version": 4, "created_time": NOW}}
    if path.startswith("/v1/secret/metadata/") and request.method == "GET":
        return 200, {"data": META}
    if path.startswith("/v1/secret/metadata/") and request.method == "LIST":
        return 200, {"data": {"keys": ["a", "b/"]}}
    if path.startswith("/v1/secret/metadata/"):
        return 204, None
    if path.startswith("/v1/secret/detailed-metadata/"):
        return 200, {"data": {"keys": ["a"], "key_info": {"a": META}}}
    if path == "/v1/sys/capabilities-self":
        return 200, {"data": {"secret/data/a": ["read"]}}
    if path.startswith("/v1/sys/internal/ui/mounts/"):
        return 200, {"data": {"type": "kv", "options": {"version": "2"}, "path": "secret/"}}
    return 404, {"errors": []}


def body(request: requests.PreparedRequest) -> Any:
    return json.loads(request.body) if request.body else None


async def test_each_store_call_goes_through_hvac_as_vault_expects() -> None:
    transport = VaultTransport(vault)
    store = VaultStore(
        VaultConnection("http://vault.test:8200", namespace="team"),
        VaultAuth("token", token=Secret("s.tok")),
        clock=FakeClock(),
        transport=transport,
    )
    try:
        entry = await store.read("apps/a b", consistent=True)
        missing = await store.read("apps/gone")
        version = await store.write(
            "apps/x", {"k": Secret("v")}, cas=3, custom_metadata={"owner": "keyturn"}
        )
        metadata = await store.read_metadata("apps/x")
        keys = await store.list_keys("apps")
        page = await store.list_metadata("apps", after="a", limit=5)
        fields = await store.read_fields("secret", "apps/x", ["k"])
        caps = await store.capabilities(["secret/data/a"])
        mount = await store.mount_config("secret")
        await store.delete_all("apps/x")
    finally:
        await store.close()
    assert entry is not None and entry.version == 3 and entry.data == {"k": "v"}
    assert missing is None
    assert version == 4
    assert metadata is not None and metadata.current_version == 3
    assert keys == ["a", "b/"]
    assert page is not None and [key for key, _ in page] == ["a"]
    assert fields["k"].reveal() == "v"
    assert caps == {"secret/data/a": frozenset({"read"})}
    assert mount["type"] == "kv"
    calls = [(r.method, r.path_url, body(r)) for r in transport.sent]
    assert calls == [
        ("GET", "/v1/auth/token/lookup-self", None),  # the static token's "login"
        ("GET", "/v1/sys/leader", None),  # a consistent call: where is the active node?
        ("GET", "/v1/secret/data/apps/a%20b", None),
        ("GET", "/v1/secret/data/apps/gone", None),
        ("POST", "/v1/secret/data/apps/x", {"options": {"cas": 3}, "data": {"k": "v"}}),
        ("POST", "/v1/secret/metadata/apps/x", {"custom_metadata": {"owner": "keyturn"}}),
        ("GET", "/v1/secret/metadata/apps/x", None),
        ("LIST", "/v1/secret/metadata/apps", None),
        ("LIST", "/v1/secret/detailed-metadata/apps/?after=a&limit=5", None),
        ("GET", "/v1/secret/data/apps/x", None),
        ("POST", "/v1/sys/capabilities-self", {"paths": ["secret/data/a"]}),
        ("GET", "/v1/sys/internal/ui/mounts/secret", None),
        ("DELETE", "/v1/secret/metadata/apps/x", None),
    ]
    for request in transport.sent:
        assert request.headers["X-Vault-Request"] == "true"
        assert request.headers["X-Vault-Namespace"] == "team"
        if request.path_url != "/v1/sys/leader":
            assert request.headers["X-Vault-Token"] == "s.tok"
        else:
            assert "X-Vault-Token" not in request.headers
    # The read gave an index; the write after it (consistent) carries it, a plain read not.
    write = transport.sent[4]
    assert write.headers["X-Vault-Index"] == "i"
    assert write.headers["X-Vault-Inconsistent"] == "forward-active-node"
    assert "X-Vault-Index" not in transport.sent[3].headers


async def test_logins_go_through_hvacs_auth_methods_without_a_token() -> None:
    def login(request: requests.PreparedRequest) -> VaultReply:
        if request.path_url.endswith("/login"):
            return 200, {"auth": {"client_token": "s.new", "lease_duration": 60}}
        return 200, {"data": {"ttl": 60}}

    transport = VaultTransport(login)
    store = VaultStore(
        VaultConnection("http://vault.test:8200"),
        VaultAuth("approle", role_id=Secret("r"), secret_id=Secret("s"), auth_mount="ar"),
        clock=FakeClock(),
        transport=transport,
    )
    try:
        await store.keeper.login()
    finally:
        await store.close()
    sent, looked_up = transport.sent
    assert (sent.method, sent.path_url, body(sent)) == (
        "POST",
        "/v1/auth/ar/login",
        {"role_id": "r", "secret_id": "s"},
    )
    assert "X-Vault-Token" not in sent.headers
    assert looked_up.path_url == "/v1/auth/token/lookup-self"
    assert looked_up.headers["X-Vault-Token"] == "s.new"


async def test_vaults_clock_is_asked_through_hvac_without_a_token() -> None:
    """The wall-clock guard's reference: `sys/health` on the home node, answered by a standby
    or a sealed node too, with no token; a wrong or missing answer reads as "not known"."""
    answers: list[VaultReply] = [
        (200, {"server_time_utc": 1_795_000_000, "standby": True}),
        (200, {"server_time_utc": "soon"}),
        (503, {"errors": ["sealed"]}),
        requests.ConnectionError("refused"),
    ]
    transport = VaultTransport(lambda _request: answers.pop(0))
    store = VaultStore(
        VaultConnection("http://vault.test:8200"),
        VaultAuth("token", token=Secret("s.tok")),
        clock=FakeClock(),
        transport=transport,
    )
    try:
        times = [await store.server_time() for _ in range(4)]
    finally:
        await store.close()
    assert times == [1_795_000_000.0, None, None, None]
    asked = transport.sent[0]
    assert (asked.method, asked.path_url) == (
        "GET",
        "/v1/sys/health?standbyok=True&sealedcode=200&uninitcode=200",
    )
    assert all("X-Vault-Token" not in request.headers for request in transport.sent)
