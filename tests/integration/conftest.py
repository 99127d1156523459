"""Fixtures for the integration tests: fault scenes, and a cluster of OpenBao nodes.

`scenes` makes fault scenes (`keyturn_devkit.harness.scene`: a deployment with its own
sandbox under its own namespace of the dev server, its daemons, an app sampler) and closes
them at the test's end. `raft_cluster` starts one 3-node OpenBao cluster on Raft storage per
test module (about ten seconds) and stops it after the module's last test; `healthy_cluster`
hands it to a test with every node running, unsealed and in sync (a test that stopped or
sealed a node leaves it to be brought back here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.raft import OpenBaoRaftCluster
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.scene import SceneMaker


@pytest.fixture
def scenes(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
) -> Iterator[SceneMaker]:
    maker = SceneMaker(openbao, sandbox_factory, tmp_path)
    yield maker
    maker.close()


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
