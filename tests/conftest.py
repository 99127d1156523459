"""Fixtures that start real servers on loopback: OpenBao (dev mode) and the sandbox service;
and `crd_errors`, which checks a custom resource against its CRD's schema (tests/data/crds).

No test depends on a server started by hand: each fixture starts its own on free ports and
stops it afterwards.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hvac
import jsonschema
import pytest

from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess

# The modules that take longest (seconds on a clean clone, 4-5 workers), started first. With
# `--dist loadfile` a worker takes one module at a time and xdist otherwise starts the modules
# with the most tests first: the unit modules, leaving a two-minute scenario to start last and
# end the run alone. Measured with `pytest --durations=0`; a module missing here only starts
# later.
LONGEST_FIRST = (
    "integration/test_image.py",  # 136-170 (the image built from nothing; 330 when busy)
    "integration/test_instances.py",  # 312
    "integration/test_faults.py",  # 238
    "integration/test_detectors.py",  # 232
    "integration/test_signing_key.py",  # 94-182 (oidc-provider; eight SIGKILLs)
    "integration/test_signing_key_jwks.py",  # 144-153 (oidc-provider keeps a jwks_uri 60 s; asleep)
    "integration/test_daemon.py",  # 133
    "integration/test_edge_drops.py",  # 110 (one test)
    "integration/test_rotation_crash.py",  # 110
    "integration/test_rotation.py",  # 101
    "integration/test_replicated_vault.py",  # 94
    "integration/test_edge.py",  # 86
    "client/test_client_integration.py",  # 86
    "integration/test_vault_first_run.py",  # 58
    "integration/test_refresh_token_import.py",  # 57
    "integration/test_client_auth.py",  # 43-62
    "integration/test_release.py",  # 42 (64 on a busy machine)
    "integration/test_token_params.py",  # 56 (on a busy machine)
    "integration/test_glewlwyd.py",  # 37-46 (9-19 of it the RFC 7592 rotation)
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first (`LONGEST_FIRST`), then the other integration tests, then the rest;
    the order inside a module is kept."""
    tests = Path(__file__).parent
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    missing = [name for name in LONGEST_FIRST if not (tests / name).exists()]
    assert not missing, f"LONGEST_FIRST names modules that do not exist: {missing}"

    def key(item: pytest.Item) -> tuple[int, int]:
        module = item.path.relative_to(tests).as_posix()
        if module in rank:
            return (0, rank[module])
        return (1, 0) if not module.startswith("unit/") else (2, 0)

    items.sort(key=key)


@pytest.fixture(scope="session")
def openbao() -> Iterator[OpenBaoDevServer]:
    """One real OpenBao dev server for the session; tests use distinct paths."""
    with OpenBaoDevServer(audit_log=True) as server:
        yield server


@pytest.fixture
def vault_client(openbao: OpenBaoDevServer) -> hvac.Client:
    """A root hvac client on the session's OpenBao (for arranging and inspecting)."""
    return hvac.Client(url=openbao.address, token=openbao.root_token)


@pytest.fixture
def sandbox_factory(tmp_path: Path) -> Iterator[Callable[..., SandboxProcess]]:
    """Start sandboxes with a given configuration (TOML text or dict); all stop at teardown."""
    started: list[SandboxProcess] = []

    def start(config: dict[str, Any] | None = None) -> SandboxProcess:
        workdir = tmp_path / f"sandbox-{len(started)}"
        process = SandboxProcess(config=config, workdir=workdir).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def sandbox(sandbox_factory: Callable[..., SandboxProcess]) -> SandboxProcess:
    """A sandbox with default settings, fresh for each test."""
    return sandbox_factory()


# ---- custom resources against their CRDs (no cluster) -----------------------------------


def strict(schema: Any) -> Any:
    """A copy of an OpenAPI v3 schema in which every object that lists its properties refuses
    any other (what `kubectl apply --validate=strict` does; an API server would prune them)."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for sub in node.get("properties", {}).values():
            walk(sub)
        for key in ("items", "additionalProperties", "not"):
            walk(node.get(key))
        for key in ("allOf", "anyOf", "oneOf"):
            for sub in node.get(key, []):
                walk(sub)

    walk(schema)
    return schema


CRDS = Path(__file__).parent / "data" / "crds"


def crd_schema(document: dict[str, Any]) -> dict[str, Any]:
    group, _, version = document["apiVersion"].partition("/")
    path = CRDS / f"{group}_{version}_{document['kind']}.json"
    assert path.exists(), f"no schema for {document['apiVersion']} {document['kind']}"
    return strict(json.loads(path.read_text()))


def crd_problems(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(crd_schema(document))
    return sorted(
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(document)
    )


@pytest.fixture(scope="session")
def crd_errors() -> Callable[[dict[str, Any]], list[str]]:
    """What is wrong with a custom resource, by its CRD's schema in tests/data/crds made strict
    (tests/data/crds/README.md): sorted lines `<path>: <message>`, none when it is valid."""
    return crd_problems
