"""`rotation.wait_for_consumers` end to end: `keyturn run` with `[usage]` tailing a real
OpenBao's file audit device, rotating two API keys in the sandbox, while two real app tokens
(policies that read the published paths, nothing else) read them.

After each rotation the fast app re-reads at once. For `moves` the slow app re-reads 4 s after
the new key was published: the old key still works past its 1 s grace until then, and is
refused soon after. For `stays` the slow app never re-reads: the old key is revoked at
`max_grace` (14 s), with a `consumers_not_moved` alert naming it. Meanwhile `keyturn status`
names whom a rotation waits for and `keyturn usage` lists both apps. Keys rotate every 24 s;
`consumer_window` (15 s) is covered by the time the first rotation asks, so keyturn can rule
out other readers (the daemon read the audit log from its start).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import hvac
import hvac.exceptions
import pytest

from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.ports import free_port_pair
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess
from keyturn_devkit.harness.key_rotation import (
    ApiKeySpec,
    KeyDeployment,
    prepare_key_deployment,
    run_keyturn,
    status_rows,
)

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

# max_grace leaves room between the slow app's move (after 4 s, then a `status` and a `usage`
# process, a few seconds on a busy machine) and max_grace, so "revoked once moved" shows; the
# next rotation comes well after max_grace, so the last status still sees the first one's end.
MAX_AGE, GRACE, MAX_GRACE, WINDOW = 30.0, 1.0, 20.0, 21.0
SLOW_AFTER = 4.0  # the slow app re-reads `moves` this long after its new key was published


@pytest.fixture
def deployment(openbao: OpenBaoDevServer, sandbox: SandboxProcess, tmp_path: Path) -> KeyDeployment:
    namespace = f"t{uuid.uuid4().hex[:8]}"
    spec = ApiKeySpec("sandbox-keys", max_age=f"{MAX_AGE:g}s", grace=f"{GRACE:g}s")
    deployed = prepare_key_deployment(
        openbao, sandbox, tmp_path, namespace=namespace, api_keys={"moves": spec, "stays": spec}
    )
    text = deployed.config_path.read_text()
    text = text.replace(
        'rotator = "sandbox-keys" }',
        f'rotator = "sandbox-keys", wait_for_consumers = true, consumer_window = "{WINDOW:g}s", '
        f'max_grace = "{MAX_GRACE:g}s" }}',
    )
    text = text.replace('listen = "127.0.0.1:0"', f'listen = "127.0.0.1:{free_port_pair()}"')
    text += (
        f'\n[usage]\nsource = "file"\nfile = "{openbao.audit_log_path}"\n'
        f'position_file = "{tmp_path / "audit-position.json"}"\n'
    )
    deployed.config_path.write_text(text)
    return deployed


def app_token(root: hvac.Client, name: str, paths: list[str]) -> hvac.Client:
    """An app's own token: read on its published paths and nothing else (display name
    `token-<name>`, its consumer name in the audit log)."""
    policy = f"app-{name}-{uuid.uuid4().hex[:6]}"
    rules = "".join(f'path "secret/data/{p}" {{ capabilities = ["read"] }}\n' for p in paths)
    root.sys.create_or_update_policy(name=policy, policy=rules)
    created = root.auth.token.create(
        policies=[policy], display_name=name, no_default_policy=True, ttl="10m"
    )
    return hvac.Client(url=root.url, token=created["auth"]["client_token"])


def read(client: hvac.Client, path: str, version: int | None = None) -> tuple[int, str]:
    answer = client.secrets.kv.v2.read_secret_version(
        path=path, version=version, raise_on_deleted_version=True
    )
    return int(answer["data"]["metadata"]["version"]), answer["data"]["data"]["api_key"]


def accepted(sandbox: SandboxProcess, key: str) -> bool:
    answer = HTTP.get(
        f"{sandbox.base_url}/v1/users", headers={"Authorization": f"Bearer {key}"}, timeout=5
    )
    return answer.status_code == 200


def until(done: Callable[[], bool], timeout: float, step: float = 0.1) -> float:
    """Waits until `done()`; when it was."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout}s")
        time.sleep(step)
    return time.monotonic()


def suspicious(daemon: DaemonProcess, detector: str) -> list[dict[str, object]]:
    events = [json.loads(x) for x in daemon.log_text().splitlines() if x.startswith("{")]
    return [e for e in events if e.get("event") == "suspicious" and e.get("detector") == detector]


def test_the_old_key_is_revoked_once_its_consumers_moved_or_at_max_grace(
    deployment: KeyDeployment, tmp_path: Path
) -> None:
    sandbox = deployment.sandbox
    paths = {name: deployment.deployment.publish_to[name] for name in ("moves", "stays")}
    root = deployment.deployment.vault_client()  # keyturn's own identity (root): not counted
    fast = app_token(root, "fast", list(paths.values()))
    slow = app_token(root, "slow", list(paths.values()))
    daemon = DaemonProcess(deployment.config_path, tmp_path, env=deployment.env).start()
    try:
        until(lambda: all(_version(root, p) == 1 for p in paths.values()), timeout=20)
        old = {name: read(fast, path)[1] for name, path in paths.items()}
        # Both apps read the first keys until they are replaced (a new key every 24 s).
        rotated: dict[str, float] = {}
        deadline = time.monotonic() + MAX_AGE + 10
        while len(rotated) < 2 and time.monotonic() < deadline:
            for name, path in paths.items():
                if name in rotated:
                    continue
                if _version(root, path) == 2:
                    rotated[name] = time.monotonic()
                    read(fast, path)  # the fast app moves at once
                else:
                    read(fast, path)
                    # The slow app reads the key it has been using (version 1): asking for
                    # the latest here could race the rotation and already get the new one.
                    assert read(slow, path, version=1)[1] == old[name]
            time.sleep(0.2)
        assert set(rotated) == {"moves", "stays"}, "no rotation within max_age"
        start = min(rotated.values())

        # Past grace, both old keys still work: token-slow read them and not the new ones.
        time.sleep(max(0.0, start + SLOW_AFTER - 0.5 - time.monotonic()))
        for name in ("moves", "stays"):
            assert accepted(sandbox, old[name]), f"{name}: revoked while token-slow is on it"
        rows = status_rows(deployment.config_path, deployment.env)
        for name in ("moves", "stays"):
            assert rows[name]["rotation_phase"] == "retiring"
            assert rows[name]["waiting_for_consumers"] == ["token-slow"], rows[name]
            assert rows[name]["waiting_reason"] is None
            assert rows[name]["consumers"] == 2
        usage = run_keyturn("usage", "-c", str(deployment.config_path), "--json")
        assert usage.returncode == 0, usage.stderr
        views = {v["credential"]: v for v in map(json.loads, usage.stdout.splitlines())}
        assert views["stays"]["current_version"] == 2
        current = {c["consumer"]: c["current"] for c in views["stays"]["consumers"]}
        assert current == {"token-fast": True, "token-slow": False}
        listen = re.search(r'listen = "([^"]+)"', deployment.config_path.read_text())
        assert listen is not None
        metrics = HTTP.get(f"http://{listen[1]}/metrics", timeout=5).text
        assert "keyturn_usage_source_up 1.0" in metrics
        assert 'keyturn_consumers{credential="stays"} 2.0' in metrics
        assert 'keyturn_consumer_reads_total{consumer="token-slow",credential="stays"}' in metrics

        # token-slow moves to the new `moves` key: its old key goes within a few seconds.
        read(slow, paths["moves"])
        moved = time.monotonic()
        revoked = until(lambda: not accepted(sandbox, old["moves"]), timeout=MAX_GRACE)
        assert revoked - rotated["moves"] < MAX_GRACE - 0.5, "revoked at max_grace, not at once"
        assert revoked - moved < 4.0
        assert accepted(sandbox, old["stays"])  # token-slow still reads that one

        # token-slow never moves off the old `stays` key: revoked at max_grace, and named.
        gone = until(lambda: not accepted(sandbox, old["stays"]), timeout=MAX_GRACE + 5)
        assert gone - rotated["stays"] >= MAX_GRACE - 1.0  # (publish precedes our seeing it)
        until(lambda: bool(suspicious(daemon, "consumers_not_moved")), timeout=5)
        [alert] = suspicious(daemon, "consumers_not_moved")
        assert alert["credential"] == "stays"
        assert alert["severity"] == "warning"
        detail = str(alert["detail"])
        assert detail.startswith(
            f"previous key revoked at max_grace ({MAX_GRACE:g}s after the new one was"
        )
        assert detail.endswith("still read the old value (version 1 or older): token-slow")
        assert status_rows(deployment.config_path, deployment.env)["stays"]["rotation_phase"] in (
            "idle",
            "creating",  # the next rotation (30 s) may be on its way
            "pending",
            "verified",
        )
        assert "ktsb_key_" not in daemon.log_text()  # names and versions only, never a key
    finally:
        assert daemon.stop() == 0


def _version(client: hvac.Client, path: str) -> int | None:
    try:
        answer = client.secrets.kv.v2.read_secret_version(path=path, raise_on_deleted_version=True)
    except hvac.exceptions.InvalidPath:
        return None
    return int(answer["data"]["metadata"]["version"])
