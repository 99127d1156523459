"""Fixtures for the integration tests that need more than one OpenBao node.

`raft_cluster` starts one 3-node OpenBao cluster on Raft storage per test module (about ten
seconds) and stops it after the module's last test; `healthy_cluster` hands it to a test with
every node running, unsealed and in sync (a test that stopped or sealed a node leaves it to
be brought back here).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from keyturn_devkit.dev.raft import OpenBaoRaftCluster


@pytest.fixture(scope="module")
def raft_cluster() -> Iterator[OpenBaoRaftCluster]:
    with OpenBaoRaftCluster(size=3) as cluster:
        yield cluster


@pytest.fixture
def healthy_cluster(raft_cluster: OpenBaoRaftCluster) -> OpenBaoRaftCluster:
    for node in raft_cluster.nodes:
        if not node.running:
            raft_cluster.start_node(node.index)
        elif (node.health() or {}).get("sealed") is not False:
            raft_cluster.unseal_node(node.index)
    raft_cluster.wait_healthy(timeout=60)
    return raft_cluster
