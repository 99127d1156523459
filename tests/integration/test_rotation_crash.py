"""Promise 3: a SIGKILL at any step of a key rotation resumes without a lost or orphaned key.

For every point of the rotation state machine (`keyturn.jobs.rotation.CHECKPOINTS`) the test runs
a real `keyturn run` against a real OpenBao and the sandbox, rotating an API key with the http
rotator of docs/configuration.md's worked example:

1. a first daemon creates and publishes the first key, and is stopped (SIGTERM);
2. a second daemon, started through `keyturn_devkit.harness.paused_daemon <point>` (the daemon
   with a checkpoint that stops there), begins the second rotation (the first with a previous
   key, so `retiring` and `revoked` exist), logs `test.paused` there, and is killed with SIGKILL;
3. a third daemon resumes: the interrupted rotation completes, the previous key is revoked
   after its grace, and the next scheduled rotation runs normally too.

From the first publish to the end, a thread reads the published path as an app does and
calls the service with what it read (every read must find a key the service accepts), and
keeps every version of the journal it sees, for the invariants checked at the end.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import hvac
import pytest

from keyturn.jobs.rotation import CHECKPOINTS
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess, Deployment, prepare_deployment

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

CREDENTIAL = "crash-key"
MAX_AGE = 3.0  # seconds: the next rotation is due this long after a key is published
PAUSED_DAEMON = "keyturn_devkit.harness.paused_daemon"  # `keyturn run`, stopped at one checkpoint
GRACE = 1.0  # seconds the previous key stays valid after the new one is published

# Where the journal in Vault stands while the daemon is paused (then killed) at each point:
# the last *saved* phase. `verified` is only staged (a re-verification costs nothing), so a
# kill there or at `published` resumes from `pending`.
JOURNAL_AT_PAUSE = {
    "creating": "creating",
    "created": "creating",
    "pending": "pending",
    "verified": "pending",
    "published": "pending",
    "retiring": "retiring",
    "revoked": "retiring",
}


def _rotator_and_credential(publish_to: str) -> str:
    """The worked example of docs/configuration.md, with lifetimes of seconds."""
    body = json.dumps({"name": "{key_name}", "description": "rotated by keyturn"})
    create = f'method = "POST", path = "/admin/api-keys", body = {json.dumps(body)}'
    find = 'method = "GET", path = "/admin/api-keys", items = "/api_keys", name = "/name"'
    return f"""
[[rotators]]
name = "sandbox-keys"
type = "http"
provider = "sandbox"
auth = "env:SANDBOX_ADMIN_TOKEN"
create = {{ {create}, value = "/key", id = "/key_id" }}
revoke = {{ method = "DELETE", path = "/admin/api-keys/{{key_id}}" }}
find = {{ {find}, id = "/key_id" }}

[[credentials]]
name = "{CREDENTIAL}"
provider = "sandbox"
kind = "api_key"
publish_to = "{publish_to}"
probe = "/v1/users"
rotation = {{ max_age = "{MAX_AGE}s", grace = "{GRACE}s", rotator = "sandbox-keys" }}
"""


@dataclass
class Read:
    at: float
    version: int | None
    key_id: str | None
    status: int | str  # the service's answer to the key read, or what went wrong


@dataclass
class Crash:
    """One deployment with one rotating API key, its daemons, and views of Vault and the
    sandbox. Every journal read is kept (by KV version) for the invariants checked at the end."""

    deployment: Deployment
    workdir: Path
    daemons: list[DaemonProcess] = field(default_factory=list)
    journals: dict[int, dict[str, str]] = field(default_factory=dict)
    reads: list[Read] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def publish_to(self) -> str:
        return self.deployment.publish_to[CREDENTIAL]

    def daemon(self, pause_at: str | None = None) -> DaemonProcess:
        env = {"SANDBOX_ADMIN_TOKEN": self.deployment.sandbox.admin_token}
        entry = ("keyturn", "run") if pause_at is None else (PAUSED_DAEMON, pause_at)
        workdir = self.workdir / f"daemon-{len(self.daemons)}"
        workdir.mkdir()
        daemon = DaemonProcess(self.deployment.config_path, workdir, env=env, entry=entry)
        self.daemons.append(daemon)
        return daemon.start()

    # -- Vault and the sandbox, read as root and admin ----------------------------------------

    def journal(self) -> tuple[dict[str, str], int]:
        """keyturn's private record of the credential and its KV version ({} and 0: none)."""
        try:
            entry = self.deployment.vault_client().secrets.kv.v2.read_secret_version(
                path=f"{self.deployment.state_prefix}/{CREDENTIAL}", raise_on_deleted_version=True
            )
        except hvac.exceptions.InvalidPath:
            return {}, 0
        state, version = entry["data"]["data"], entry["data"]["metadata"]["version"]
        self.journals[version] = state
        return state, version

    def published(self, version: int | None = None) -> tuple[dict[str, str], int]:
        """What apps read (or read at `version`), and its KV version."""
        entry = self.deployment.vault_client().secrets.kv.v2.read_secret_version(
            path=self.publish_to, version=version, raise_on_deleted_version=True
        )
        return entry["data"]["data"], entry["data"]["metadata"]["version"]

    def issued(self) -> dict[str, dict[str, Any]]:
        """Every key the sandbox issued for this credential (by the rotator's naming), by id."""
        prefix = f"keyturn-{CREDENTIAL}-"
        keys = self.deployment.sandbox.admin.list_api_keys()
        return {k["key_id"]: k for k in keys if k["name"].startswith(prefix)}

    def wait(self, what: str, until: Callable[[dict[str, str]], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state: dict[str, str] = {}
        while time.monotonic() < deadline:
            state, _ = self.journal()
            if until(state):
                return
            time.sleep(0.05)
        raise TimeoutError(f"never {what} within {timeout}s; journal: {_public(state)}")

    def retired(self, key_id: str) -> Callable[[dict[str, str]], bool]:
        """The rotation that replaced `key_id` is over: the journal no longer names it, and
        the sandbox has it revoked."""

        def done(state: dict[str, str]) -> bool:
            if "key_id" not in state or key_id in (state["key_id"], state.get("previous_key_id")):
                return False
            return bool(self.issued()[key_id]["status"] == "revoked")

        return done

    def idle_snapshot(self, timeout: float) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """The journal and the sandbox's keys at one moment when no rotation is in flight: the
        journal is idle, and unchanged (same KV version) across the listing of the keys, so no
        key can have been created meanwhile (a creation is preceded by a saved `creating`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before, version = self.journal()
            keys = self.issued()
            _, version_after = self.journal()
            if version == version_after and before.get("rotation_phase") == "idle":
                return before, keys
            time.sleep(0.05)
        raise TimeoutError(f"no idle moment within {timeout}s")

    def events(self) -> list[dict[str, Any]]:
        """Every structured log line of every daemon run."""
        events = []
        for daemon in self.daemons:
            for line in daemon.log_text().splitlines():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # not a structured line (e.g. a traceback): the asserts show it
        return events

    # -- an app, and a watch on the journal, in a thread ----------------------------------------

    def read_as_app(self) -> Read:
        """Read the published key as an app does, and call the service with it."""
        try:
            data, version = self.published()
        except hvac.exceptions.InvalidPath:
            return Read(time.time(), None, None, "nothing published")
        status: int | str
        try:
            status = HTTP.get(
                f"{self.deployment.sandbox.base_url}/v1/users",
                headers={"Authorization": data["authorization"]},
                timeout=5,
            ).status_code
        except httpx.HTTPError as error:
            status = type(error).__name__
        return Read(time.time(), version, data.get("key_id"), status)

    def _watch(self, deadline: float) -> None:
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.reads.append(self.read_as_app())
            self.journal()
            self._stop.wait(0.05)

    def start_watching(self, limit: float = 90) -> None:
        self._thread = threading.Thread(
            target=self._watch, args=(time.monotonic() + limit,), daemon=True
        )
        self._thread.start()

    def stop_watching(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def _public(state: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in state.items() if k not in ("key", "pending_key")}


@pytest.fixture
def crash(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
) -> Iterator[Crash]:
    sandbox = sandbox_factory()
    deployment = prepare_deployment(
        openbao, sandbox, tmp_path, [], namespace=f"c{uuid.uuid4().hex[:8]}"
    )
    publish_to = f"{deployment.state_prefix.removesuffix('keyturn/state')}apps/{CREDENTIAL}/key"
    deployment.publish_to[CREDENTIAL] = publish_to
    with deployment.config_path.open("a") as config:
        config.write(_rotator_and_credential(publish_to))
    setup = Crash(deployment, tmp_path)
    yield setup
    setup.stop_watching()
    for daemon in setup.daemons:
        daemon.stop(signal.SIGKILL)


@pytest.mark.parametrize("point", CHECKPOINTS)
def test_a_sigkill_at_any_step_of_a_rotation_resumes_without_losing_a_key(
    crash: Crash, point: str
) -> None:
    # 1. The first key, created and published by a daemon that then stops cleanly.
    first_daemon = crash.daemon()
    crash.wait(
        "a first key", lambda s: s.get("rotation_phase") == "idle" and "key_id" in s, timeout=15
    )
    crash.start_watching()  # from the first publish to the end, daemons alive or not
    assert first_daemon.stop() == 0
    first, _ = crash.journal()
    first_key = first["key_id"]
    assert first["rotation_phase"] == "idle", _public(first)  # the second rotation is to come
    assert crash.published()[0]["key_id"] == first_key

    # 2. The second rotation, paused at `point` and killed there.
    paused = crash.daemon(pause_at=point)
    paused.wait_for_log('"test.paused"', timeout=MAX_AGE + 15)
    pauses = [e for e in crash.events() if e.get("event") == "test.paused"]
    assert [(e["credential"], e["point"]) for e in pauses] == [(CREDENTIAL, point)]
    assert paused.stop(signal.SIGKILL) == -signal.SIGKILL

    at_crash, _ = crash.journal()
    assert at_crash["rotation_phase"] == JOURNAL_AT_PAUSE[point], _public(at_crash)
    key_name = f"keyturn-{CREDENTIAL}-{at_crash['rotation_id']}"
    issued = crash.issued()
    active = {k for k, v in issued.items() if v["status"] == "active"}
    # What the crash left at the provider: every live key is in the journal, except, after
    # `created`, the one key of the journaled rotation that was never stored.
    known = {at_crash.get(f) for f in ("key_id", "previous_key_id", "pending_key_id")}
    orphans = active - known
    if point == "created":
        assert [issued[k]["name"] for k in orphans] == [key_name], issued
    else:
        assert orphans == set(), issued
    if point == "published":  # apps already read the new key; the journal does not say so
        assert crash.published()[0]["key_id"] == at_crash["pending_key_id"]
    if point == "revoked":  # the previous key is revoked; the journal does not say so
        assert issued[at_crash["previous_key_id"]]["status"] == "revoked"

    # 3. A restart finishes the interrupted rotation and retires the first key after grace…
    crash.daemon()
    crash.wait("retired the first key", crash.retired(first_key), timeout=MAX_AGE + 15)
    named = [k for k, v in crash.issued().items() if v["name"] == key_name]
    assert set(named) >= orphans and len(named) == len(orphans) + 1, named
    (second_key,) = set(named) - orphans  # one key made it, whatever the crash left
    if point in ("retiring", "revoked"):
        assert second_key == at_crash["key_id"]  # it was already current at the crash
    elif point in ("pending", "verified", "published"):
        assert second_key == at_crash["pending_key_id"]  # the stored key, not a new one
    # …and goes on rotating as usual: the next rotation is a normal one.
    crash.wait("retired the second key", crash.retired(second_key), timeout=MAX_AGE + 15)
    state, keys = crash.idle_snapshot(timeout=2 * MAX_AGE)
    published, published_version = crash.published()
    crash.stop_watching()

    # Exactly one key is current: the journal's, the published one, the only active one.
    current = state["key_id"]
    assert current not in (first_key, second_key)
    assert published["key_id"] == current
    assert state.get("previous_key_id") is None and state.get("pending_key_id") is None
    assert "rotation_error" not in state, state["rotation_error"]
    assert sorted(k for k, v in keys.items() if v["status"] == "active") == [current], keys
    # None orphaned or lost: each rotation made one key (plus what a crash left, revoked), and
    # every key but the current one is revoked, after its grace.
    names = [v["name"] for v in keys.values()]
    assert all(names.count(n) == 1 for n in set(names) - {key_name}), names
    assert names.count(key_name) == 1 + len(orphans), names
    assert {first_key, second_key} | orphans <= set(keys)

    # The journal always names the KV version that holds its current key: otherwise the next
    # publish conflicts with keyturn's own write, and raises a false alarm.
    for version, journaled in sorted(crash.journals.items()):
        if journaled.get("rotation_phase") in ("retiring", "idle") and "key_id" in journaled:
            assert "published_version" in journaled, _public(journaled)
            holds = crash.published(int(journaled["published_version"]))[0]["key_id"]
            assert holds == journaled["key_id"], (
                f"journal v{version} names published v{journaled['published_version']} for "
                f"key {journaled['key_id']}, but that version holds {holds}",
                _public(journaled),
            )
    assert state["published_version"] == str(published_version)

    # Apps never lacked a working key, not even while no daemon was running.
    reads = crash.reads
    assert reads and reads[-1].at - reads[0].at > MAX_AGE, "the app hardly ran"
    failed = [r for r in reads if r.status != 200]
    assert failed == [], failed[:5]
    seen = {r.key_id for r in reads}
    assert orphans.isdisjoint(seen)  # a key never stored was never published
    assert {first_key, second_key} <= seen

    # Resuming after keyturn's own writes is not someone else's: no false alarm.
    events = crash.events()
    assert [e for e in events if e.get("event") == "suspicious"] == []
    orphan_logs = {e["key_id"] for e in events if e.get("event") == "rotation.orphan_revoked"}
    assert orphan_logs == orphans
