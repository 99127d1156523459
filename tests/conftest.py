"""Fixtures that start real servers on loopback: OpenBao (dev mode) and the sandbox service.

No test depends on a server started by hand: each fixture starts its own on free ports and
stops it afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hvac
import pytest

from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess


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
