"""`VaultStore(on_operation=...)` against a real OpenBao: each call reports its documented words.

Feeds a real `PrometheusObserver`, so this also proves the callback fits the observer and that
`keyturn_vault_operations_total` carries what an operator would expect after each call.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import hvac
import pytest
from prometheus_client import CollectorRegistry

from keyturn.clock import SystemClock
from keyturn.errors import SecretReferenceError, VaultCasConflict, VaultPermissionDenied
from keyturn.observability.metrics import PrometheusObserver
from keyturn.secret import Secret
from keyturn.vault import VaultAuth, VaultConnection, VaultStore
from keyturn_devkit.dev.openbao import OpenBaoDevServer

pytestmark = pytest.mark.openbao


class Recorder:
    def __init__(self, observer: PrometheusObserver) -> None:
        self.observer = observer
        self.seen: list[tuple[str, str]] = []

    def __call__(self, operation: str, result: str, seconds: float) -> None:
        assert seconds >= 0
        self.seen.append((operation, result))
        self.observer.vault_operation(operation, result, seconds)

    def take(self) -> list[tuple[str, str]]:
        seen, self.seen = self.seen, []
        return seen


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def recorder(registry: CollectorRegistry) -> Recorder:
    return Recorder(PrometheusObserver(registry, SystemClock()))


def _store(address: str, token: str, recorder: Recorder) -> VaultStore:
    return VaultStore(
        VaultConnection(address=address, max_workers=2, timeout=5.0),
        VaultAuth("token", token=Secret(token)),
        clock=SystemClock(),
        on_operation=recorder,
    )


@pytest.fixture
async def store(openbao: OpenBaoDevServer, recorder: Recorder) -> AsyncIterator[VaultStore]:
    store = _store(openbao.address, openbao.root_token, recorder)
    yield store
    await store.close()


async def test_every_store_call_reports_its_operation_and_result(
    store: VaultStore, recorder: Recorder, registry: CollectorRegistry
) -> None:
    path = f"metrics/{uuid.uuid4().hex[:12]}"
    assert await store.read(path) is None
    assert recorder.take() == [("login", "success"), ("read", "not_found")]

    assert await store.write(path, {"a": "1"}, cas=0, custom_metadata={"x": "y"}) == 1
    assert recorder.take() == [("write", "success"), ("write", "success")]  # data, metadata
    with pytest.raises(VaultCasConflict):
        await store.write(path, {"a": "2"}, cas=0)  # 0: only if absent
    assert recorder.take() == [("write", "cas_conflict")]

    await store.read(path)
    await store.read_metadata(path)
    await store.read_fields("secret", path, ("a",))
    with pytest.raises(SecretReferenceError):
        await store.read_fields("secret", f"{path}-missing", ("a",))
    await store.capabilities([path])
    await store.health()
    await store.delete_all(path)
    assert recorder.take() == [
        ("read", "success"),
        ("read_metadata", "success"),
        ("read_field", "success"),
        ("read_field", "not_found"),
        ("capabilities", "success"),
        ("lookup", "success"),
        ("delete", "success"),
    ]
    count = registry.get_sample_value(
        "keyturn_vault_operations_total", {"operation": "write", "result": "cas_conflict"}
    )
    assert count == 1


async def test_a_policy_denial_is_permission_denied(
    openbao: OpenBaoDevServer, recorder: Recorder
) -> None:
    root = hvac.Client(url=openbao.address, token=openbao.root_token)
    name = f"metrics-{uuid.uuid4().hex[:12]}"
    root.sys.create_or_update_policy(
        name, 'path "secret/data/elsewhere/*" { capabilities = ["read"] }'
    )
    token = root.auth.token.create(policies=[name], ttl="10m")["auth"]["client_token"]
    store = _store(openbao.address, token, recorder)
    try:
        with pytest.raises(VaultPermissionDenied):
            await store.write("metrics/denied", {"a": "1"}, cas=0)
    finally:
        await store.close()
    # the 403 makes the store ask whether its token died (a look-up): it did not
    assert recorder.take() == [
        ("login", "success"),
        ("write", "permission_denied"),
        ("lookup", "success"),
    ]
