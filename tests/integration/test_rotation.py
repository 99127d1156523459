"""Key and client-secret rotation end to end: `keyturn run` against a real OpenBao and the
sandbox, with each rotator (http, exec, manual).

Rotation policies are a few seconds long so several rotations fit in a test. A sampler reads
the published path the way an app does and calls the service with every key it reads; when the
key changes it calls the service with the previous one too (it is in its grace period). At the
end the sandbox's own key list is compared with keyturn's journal: no key is left orphaned.

Rotator failures share one daemon (a module-scoped run) with one credential per failure and a
healthy credential beside them; each case asserts on its own credential.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keyturn.clock import parse_rfc3339
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess
from keyturn_devkit.harness.key_rotation import (
    SANDBOX_ROTATORS,
    ApiKeySpec,
    KeyDeployment,
    KeySampler,
    exec_calls,
    exec_rotator,
    keyturn_keys,
    prepare_key_deployment,
    run_keyturn,
    status_rows,
    write_exec_rotator,
)

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

# Variables the exec rotator must never inherit (keyturn strips KEYTURN_, VAULT_ and BAO_).
MARKERS = {"VAULT_ROTATION_TEST_MARKER": "1", "BAO_ROTATION_TEST_MARKER": "1"}


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[[KeyDeployment], DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(deployment: KeyDeployment) -> DaemonProcess:
        env = {**deployment.env, **MARKERS}
        daemon = DaemonProcess(deployment.config_path, tmp_path, env=env).start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture
def sampler_for() -> Iterator[Callable[[KeyDeployment], KeySampler]]:
    samplers: list[KeySampler] = []

    def make(deployment: KeyDeployment) -> KeySampler:
        sampler = KeySampler(deployment.deployment)
        samplers.append(sampler)
        return sampler

    yield make
    for sampler in samplers:
        sampler.close()


def namespace() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def assert_always_accepted(sampler: KeySampler, name: str) -> None:
    samples = sampler.samples.get(name, [])
    assert samples, f"{name}: the sampler read nothing"
    refused = [(s.at, s.key_id, s.status) for s in samples if s.status != 200]
    assert refused == [], f"{name}: an app read a key the service refused: {refused[:3]}"
    # Judged within the grace period only (every key here has at least 1 s): on a busy
    # machine the sampler may call a replaced key again later than that, when a refusal is due.
    replaced = [s for s in sampler.replaced.get(name, []) if (s.after_publish or 0.0) < 0.9]
    refused = [(s.at, s.key_id, s.status) for s in replaced if s.status != 200]
    assert refused == [], f"{name}: a key was refused right after it was replaced: {refused[:3]}"


def assert_no_orphans(deployment: KeyDeployment, name: str, published: list[str]) -> None:
    """With keyturn stopped: every key the sandbox issued under keyturn's naming is revoked or
    accounted for by the journal (the current key; the previous one, in its grace; the pending
    one; a key named after a rotation still `creating`, which `find` revokes when it resumes),
    and apps read the current key (or the pending one, if keyturn stopped between publishing it
    and recording that)."""
    state = deployment.state(name)
    phase = state["rotation_phase"]
    keys = {k["key_id"]: k for k in keyturn_keys(deployment.sandbox, name)}
    assert set(published) <= set(keys), f"{name}: apps read keys keyturn did not name"
    current = state["key_id"]
    assert keys[current]["status"] == "active"
    accounted = {current}
    if phase == "retiring":
        accounted.add(state["previous_key_id"])
    if phase in ("pending", "verified"):
        accounted.add(state["pending_key_id"])
        assert published[-1] in (current, state["pending_key_id"])
    else:
        assert published[-1] == current
    if phase == "creating":
        leftover = f"keyturn-{name}-{state['rotation_id']}"
        accounted |= {i for i, k in keys.items() if k["name"] == leftover}
    others = {i: k["status"] for i, k in keys.items() if i not in accounted}
    assert set(others.values()) <= {"revoked"}, f"{name}: orphaned keys: {others}"


# -- rotation end to end ----------------------------------------------------------------------


@pytest.mark.parametrize("rotator", ["http", "exec"])
def test_api_keys_rotate_end_to_end(
    rotator: str,
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
    daemons: Callable[[KeyDeployment], DaemonProcess],
    sampler_for: Callable[[KeyDeployment], KeySampler],
) -> None:
    sandbox = sandbox_factory()
    if rotator == "http":
        rotators, rotator_name = SANDBOX_ROTATORS, "sandbox-keys"
    else:
        script = write_exec_rotator(tmp_path / "exec", sandbox)
        rotators, rotator_name = exec_rotator("sandbox-exec", script), "sandbox-exec"
    deployment = prepare_key_deployment(
        openbao,
        sandbox,
        tmp_path,
        namespace=namespace(),
        api_keys={"orders": ApiKeySpec(rotator_name, max_age="2s", grace="1s")},
        rotators=rotators,
    )
    daemon = daemons(deployment)
    sampler = sampler_for(deployment)
    sampler.wait_for("orders")
    # Until the fourth key (three rotations) is published and the third key is retired: about
    # 10 s, more on a busy machine where each exec rotation starts two processes.
    sampler.run(
        ["orders"],
        seconds=40,
        until=lambda: (
            len(sampler.key_ids("orders")) >= 4
            and daemon.log_text().count('"rotation.retired"') >= 3
        ),
    )
    assert daemon.stop() == 0
    sampler.read("orders")  # what apps read now, with the daemon stopped

    published = sampler.key_ids("orders")
    assert len(published) >= 4, f"expected several rotations, saw {published}"
    assert_always_accepted(sampler, "orders")
    assert len(sampler.replaced["orders"]) >= 3
    assert_no_orphans(deployment, "orders", published)
    keys = {k["key_id"]: k for k in keyturn_keys(sandbox, "orders")}
    assert len({k["name"] for k in keys.values()}) == len(keys)  # one rotation_id per key
    revoked = {i for i, k in keys.items() if k["status"] == "revoked"}
    assert set(published[:3]) <= revoked  # each after its grace (it was served until then)
    versions = [s.version for s in sampler.samples["orders"]]
    assert versions == sorted(versions)

    if rotator == "exec":
        calls = exec_calls(script)
        creates = [c for c in calls if c["action"] == "create"]
        assert {k["name"] for k in keys.values()} <= {c["key_name"] for c in creates}
        finds = [c for c in calls if c["action"] == "find"]
        assert {c["rotation_id"] for c in finds} >= {c["rotation_id"] for c in creates}
        assert revoked <= {c["key_id"] for c in calls if c["action"] == "revoke"} <= set(keys)
        assert all(c["argv"] == ["ok"] and c["env"] == [] for c in calls), calls[:2]
        assert all(c["kind"] == "api_key" and c["client_id"] is None for c in calls)


def test_client_secret_rotation_keeps_tokens_flowing(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
    daemons: Callable[[KeyDeployment], DaemonProcess],
) -> None:
    sandbox = sandbox_factory({"access_token_lifetime": 3})
    deployment = prepare_key_deployment(
        openbao,
        sandbox,
        tmp_path,
        namespace=namespace(),
        api_keys={},
        oauth_clients=["reporting"],
        oauth_credential={
            "refresh": {"margin": "1s", "min_interval": "500ms"},
            "backoff": {"initial": "200ms", "max": "1s"},
            "rotation": {"max_age": "3s", "grace": "1500ms", "rotator": "sandbox-client-secrets"},
        },
        provider={"revoke_path": "/oauth/revoke"},
    )
    client_id = deployment.deployment.clients["reporting"]["client_id"]
    [input_secret] = [s["secret_id"] for s in sandbox.admin.get_oauth_app(client_id)["secrets"]]
    daemon = daemons(deployment)
    sampler = KeySampler(deployment.deployment, probe="/v1/projects", field="access_token")
    try:
        sampler.wait_for("reporting")

        def rotations() -> int:
            return daemon.log_text().count('"rotation.published"')

        # First rotation: the input secret's id is unknown to keyturn, so it cannot revoke it
        # after the grace; an operator does. From then on every token comes from the new one.
        sampler.run(["reporting"], seconds=12, until=lambda: rotations() >= 1)
        sampler.run(
            ["reporting"], seconds=6, until=lambda: '"rotation.retired"' in daemon.log_text()
        )
        sandbox.admin.revoke_client_secret(client_id, input_secret)
        # Second rotation: the first rotated secret is revoked by keyturn after the grace.
        sampler.run(
            ["reporting"],
            seconds=12,
            until=lambda: daemon.log_text().count('"rotation.retired"') >= 2,
        )
    finally:
        sampler.close()
    assert daemon.stop() == 0

    assert_always_accepted(sampler, "reporting")
    samples = sampler.samples["reporting"]
    assert len({s.value for s in samples}) >= 4  # tokens kept being refreshed throughout
    assert max(b.at - a.at for a, b in itertools.pairwise(samples)) < 2  # the sampler kept up
    state = deployment.state("reporting")
    secrets = {s["secret_id"]: s for s in sandbox.admin.get_oauth_app(client_id)["secrets"]}
    assert secrets[input_secret]["status"] == "revoked"
    current = state["key_id"]
    assert secrets[current]["status"] == "active"
    in_grace = {state["previous_key_id"]} if state["rotation_phase"] == "retiring" else set()
    rotated = set(secrets) - {input_secret, current} - in_grace
    assert rotated, "expected at least one rotated secret to have been retired"
    assert {secrets[i]["status"] for i in rotated} == {"revoked"}
    log = daemon.log_text()
    assert '"rotation.previous_without_id"' in log  # the input secret, logged for a person
    assert "invalid_client" not in log
    # Each verification grant's refresh token was revoked (RFC 7009), not left alive for its
    # lifetime: the only live refresh token is the one keyturn holds.
    refresh = [t for t in sandbox.admin.list_tokens(client_id) if t["kind"] == "refresh"]
    revoked_by_keyturn = [t for t in refresh if t["revoke_reason"] == "refresh token revoked"]
    assert len(revoked_by_keyturn) >= rotations() >= 2
    assert [t for t in refresh if t["status"] == "active"] == [
        t for t in refresh if t["status"] == "active" and t["family_id"] == live_family(refresh)
    ]
    assert len({t["family_id"] for t in refresh if t["status"] == "active"}) <= 1


def live_family(tokens: list[dict[str, object]]) -> object:
    """The family of the newest active refresh token (keyturn's own chain)."""
    active = [t for t in tokens if t["status"] == "active"]
    return max(active, key=lambda t: str(t["issued_at"]))["family_id"] if active else None


def test_manual_rotation_waits_for_import_key(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
    daemons: Callable[[KeyDeployment], DaemonProcess],
    sampler_for: Callable[[KeyDeployment], KeySampler],
) -> None:
    sandbox = sandbox_factory()
    deployment = prepare_key_deployment(
        openbao,
        sandbox,
        tmp_path,
        namespace=namespace(),
        api_keys={"ledger": ApiKeySpec("by-hand", max_age="2s", grace="1s", initial=True)},
        rotators='\n[[rotators]]\nname = "by-hand"\ntype = "manual"\n',
    )
    initial = deployment.initial["ledger"]["key_id"]
    daemon = daemons(deployment)
    sampler = sampler_for(deployment)
    sampler.wait_for("ledger", lambda s: s.key_id == initial)

    # Due after max_age: the daemon announces that it waits for a person, keeps the key.
    daemon.wait_for_log('"rotation.awaiting_manual"', timeout=10)
    row = status_rows(deployment.config_path)["ledger"]
    assert row["rotation_phase"] == "creating"
    assert "ledger: rotator by-hand: waiting for `keyturn import-key" in row["rotation_error"]
    assert row["rotates_at"] is not None  # when it announces again
    assert row["key_id"] == initial
    assert sampler.read("ledger") is not None

    made = sandbox.admin.create_api_key("made-in-the-dashboard")
    result = run_keyturn(
        "import-key",
        "-c",
        str(deployment.config_path),
        "ledger",
        "--key-id",
        made["key_id"],
        stdin=made["key"] + "\n",
    )
    assert result.returncode == 0, result.stderr
    assert f"ledger: rotated; new key {made['key_id']} in use" in result.stdout
    assert made["key"] not in result.stdout + result.stderr
    sampler.wait_for("ledger", lambda s: s.key_id == made["key_id"], timeout=2)
    row = status_rows(deployment.config_path)["ledger"]
    assert row["rotation_phase"] == "retiring"
    assert row["rotation_error"] is None
    assert row["key_id"] == made["key_id"]

    # After the grace the manual rotator cannot revoke: it logs that a person must. The
    # daemon planned its next look for its re-announcement; a restart looks at once.
    time.sleep(1.5)
    daemon.stop()
    daemon.start()
    daemon.wait_for_log('"rotation.revoke_by_hand"', timeout=10)
    sampler.run(["ledger"], seconds=0.5)
    assert_always_accepted(sampler, "ledger")
    assert sampler.key_ids("ledger") == [initial, made["key_id"]]
    keys = {k["key_id"]: k["status"] for k in sandbox.admin.list_api_keys()}
    assert keys[initial] == "active"  # not revoked: that is the person's job
    assert keys[made["key_id"]] == "active"
    assert f'"key_id": "{initial}"' in daemon.log_text()
    assert keyturn_keys(sandbox, "ledger") == []  # keyturn created nothing itself


def test_rotate_command_beside_a_running_daemon(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
    daemons: Callable[[KeyDeployment], DaemonProcess],
    sampler_for: Callable[[KeyDeployment], KeySampler],
) -> None:
    sandbox = sandbox_factory()
    deployment = prepare_key_deployment(
        openbao,
        sandbox,
        tmp_path,
        namespace=namespace(),
        api_keys={"billing": ApiKeySpec("sandbox-keys", max_age="1h", grace="30s")},
    )
    daemons(deployment)
    sampler = sampler_for(deployment)
    first = sampler.wait_for("billing")
    row = status_rows(deployment.config_path)["billing"]
    assert row["rotation_phase"] == "idle"
    assert parse_rfc3339(row["rotates_at"]) == pytest.approx(time.time() + 3600, abs=30)

    result = run_keyturn("rotate", "-c", str(deployment.config_path), "billing", env=deployment.env)
    assert result.returncode == 0, result.stderr
    second = sampler.wait_for("billing", lambda s: s.key_id != first.key_id, timeout=2)
    assert f"billing: rotated; new key {second.key_id} in use" in result.stdout
    assert "the previous key is revoked after" in result.stdout
    assert second.status == 200
    assert_always_accepted(sampler, "billing")
    assert sampler.replaced["billing"][0].key_id == first.key_id  # the old one: still served
    row = status_rows(deployment.config_path)["billing"]
    assert row["rotation_phase"] == "retiring"
    assert row["key_id"] == second.key_id
    assert parse_rfc3339(row["rotates_at"]) == pytest.approx(time.time() + 30, abs=10)
    keys = {k["key_id"]: k["status"] for k in keyturn_keys(sandbox, "billing")}
    assert keys == {first.key_id: "active", second.key_id: "active"}

    # A second `rotate` inside the grace is refused: the previous key is still in use.
    again = run_keyturn("rotate", "-c", str(deployment.config_path), "billing", env=deployment.env)
    assert again.returncode == 1
    assert "grace period" in again.stderr
    assert sampler.read("billing").key_id == second.key_id  # type: ignore[union-attr]


def test_the_daemon_revokes_a_key_rotated_by_the_command_after_its_grace(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
    daemons: Callable[[KeyDeployment], DaemonProcess],
    sampler_for: Callable[[KeyDeployment], KeySampler],
) -> None:
    """`keyturn rotate` beside a running daemon: "the daemon revokes the old key after the
    grace" (commands/rotate.py) - not when the daemon's own plan, made from the old key's age,
    comes round (up to `max_age` later)."""
    sandbox = sandbox_factory()
    deployment = prepare_key_deployment(
        openbao,
        sandbox,
        tmp_path,
        namespace=namespace(),
        api_keys={"payroll": ApiKeySpec("sandbox-keys", max_age="1h", grace="2s")},
    )
    daemons(deployment)
    sampler = sampler_for(deployment)
    first = sampler.wait_for("payroll")
    result = run_keyturn("rotate", "-c", str(deployment.config_path), "payroll", env=deployment.env)
    assert result.returncode == 0, result.stderr
    second = sampler.wait_for("payroll", lambda s: s.key_id != first.key_id, timeout=2)

    def revoked() -> bool:
        return sandbox.admin.get_api_key(first.key_id)["status"] == "revoked"

    try:
        sampler.run(["payroll"], seconds=2 + 6, interval=0.2, until=revoked)
    except TimeoutError:
        row = status_rows(deployment.config_path)["payroll"]
        pytest.fail(
            f"the old key was still active 8 s after a rotation with a 2 s grace; status: "
            f"rotation_phase={row['rotation_phase']} rotates_at={row['rotates_at']}"
        )
    assert_always_accepted(sampler, "payroll")
    assert sampler.read("payroll").key_id == second.key_id  # type: ignore[union-attr]
    assert status_rows(deployment.config_path)["payroll"]["rotation_phase"] == "idle"


def test_sigterm_lets_a_rotation_in_flight_finish(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
    daemons: Callable[[KeyDeployment], DaemonProcess],
    sampler_for: Callable[[KeyDeployment], KeySampler],
) -> None:
    """`keyturn run`: "SIGTERM and SIGINT stop new work, let in-flight runs finish (their Vault
    writes included) for up to `keyturn.shutdown_timeout`". A rotation whose rotator takes 2 s
    is in flight when SIGTERM arrives; it must end with its key stored and published."""
    sandbox = sandbox_factory()
    script = write_exec_rotator(tmp_path / "exec", sandbox)
    deployment = prepare_key_deployment(
        openbao,
        sandbox,
        tmp_path,
        namespace=namespace(),
        api_keys={"slowpoke": ApiKeySpec("exec-slow-ok", max_age="1h", grace="1s")},
        rotators=exec_rotator("exec-slow-ok", script, "slow-ok"),
    )
    daemon = daemons(deployment)
    deadline = time.monotonic() + 10
    while not any(c["action"] == "create" for c in exec_calls(script)):
        assert time.monotonic() < deadline, "the rotator was never asked to create a key"
        time.sleep(0.05)
    assert daemon.stop() == 0  # SIGTERM while the rotator is creating the key
    log = daemon.log_text()
    assert "CancelledError" not in log, "SIGTERM cancelled the rotation in flight"
    state = deployment.state("slowpoke")
    assert state["rotation_phase"] == "idle", state["rotation_phase"]
    [key] = keyturn_keys(sandbox, "slowpoke")
    assert state["key_id"] == key["key_id"]
    published = sampler_for(deployment).read("slowpoke")
    assert published is not None
    assert published.key_id == key["key_id"]


# -- rotator failures -------------------------------------------------------------------------
#
# One daemon, one healthy credential rotating every 2 s, and one credential per failure, each
# with an adopted (initial) key and a rotation due after 1 s that cannot succeed. The run is
# shared by the tests below (module scope); each case asserts on its own credential.

FAILURE_ROTATORS = """
[[providers]]
name = "blackhole"
base_url = "{blackhole}"
allow_insecure_http = true
timeout = "1s"

[[rotators]]
name = "keys-5xx"
type = "http"
provider = "sandbox"
auth = "env:SANDBOX_ADMIN_TOKEN"
create = {{ path = "/oauth/revoke", body = '{{"name": "{{key_name}}"}}', value = "/key", id = "/key_id" }}
revoke = {{ path = "/admin/api-keys/{{key_id}}" }}
find = {{ path = "/admin/api-keys", items = "/api_keys", name = "/name", id = "/key_id" }}

[[rotators]]
name = "keys-timeout"
type = "http"
provider = "blackhole"
auth = "env:SANDBOX_ADMIN_TOKEN"
create = {{ path = "/admin/api-keys", body = '{{"name": "{{key_name}}"}}', value = "/key", id = "/key_id" }}
revoke = {{ path = "/admin/api-keys/{{key_id}}" }}

[[rotators]]
name = "keys-malformed"
type = "http"
provider = "sandbox"
auth = "env:SANDBOX_ADMIN_TOKEN"
create = {{ method = "GET", path = "/healthz", value = "/key", id = "/key_id" }}
revoke = {{ path = "/admin/api-keys/{{key_id}}" }}

[[rotators]]
name = "keys-wrong-auth"
type = "http"
provider = "sandbox"
auth = "env:NOT_THE_ADMIN_TOKEN"
create = {{ path = "/admin/api-keys", body = '{{"name": "{{key_name}}"}}', value = "/key", id = "/key_id" }}
revoke = {{ path = "/admin/api-keys/{{key_id}}" }}
"""  # noqa: E501 - TOML inline tables are one line

# credential -> (rotator, the text status and logs must show)
FAILURES = {
    "http-5xx": ("keys-5xx", "create (POST /oauth/revoke): HTTP 503"),
    "http-timeout": ("keys-timeout", "create (POST /admin/api-keys): timed out after 1s"),
    "http-malformed": ("keys-malformed", "create response has nothing at /key"),
    "http-wrong-auth": ("keys-wrong-auth", "create: the provider refused the rotator's auth"),
    "exec-exit-1": ("exec-exit-1", "create: exited with code 1: the key service said no"),
    "exec-timeout": ("exec-slow", "timed out after 1s"),  # create, or find on a busy machine
    "exec-garbage": ("exec-garbage", "create: stdout is not one JSON object"),
    "verify-401": ("exec-unknown-key", "rejected by probe /v1/users (HTTP 401); nothing published"),
}
BACKOFF = {"initial": "1s", "max": "2s"}


SECRET = "secret-401"  # an oauth_client whose rotator makes client secrets nobody accepts


@dataclass
class FailureRun:
    deployment: KeyDeployment
    sampler: KeySampler  # the API keys
    tokens: KeySampler  # SECRET's access tokens
    script: Path
    rows: dict[str, dict[str, Any]]  # `keyturn status` once the daemon stopped
    running: dict[str, dict[str, Any]]  # `keyturn status` just before it stopped
    log: str
    failures: dict[str, list[tuple[float, int, str]]]  # credential -> (time, count, error)


def failure_events(log: str) -> dict[str, list[tuple[float, int, str]]]:
    events: dict[str, list[tuple[float, int, str]]] = {}
    for line in log.splitlines():
        if '"credential.failed"' not in line:
            continue
        event = json.loads(line)
        at = parse_rfc3339(event["timestamp"])
        record = (at, event["consecutive_failures"], event["error"])
        events.setdefault(event["credential"], []).append(record)
    return events


@pytest.fixture(scope="module")
def failure_run(
    openbao: OpenBaoDevServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FailureRun]:
    workdir = tmp_path_factory.mktemp("failures")
    # Tokens live 10 s and are refreshed at the latest 4 s before expiry: the rotation that
    # runs before the refresh in the same job run (exec commands take a while on a busy
    # machine) cannot push the refresh past expiry.
    sandbox = SandboxProcess({"access_token_lifetime": 10}, workdir=workdir / "sandbox").start()
    # A listening socket that never answers: the http rotator's time-out.
    blackhole = socket.create_server(("127.0.0.1", 0), backlog=64)
    try:
        script = write_exec_rotator(workdir / "exec", sandbox)
        host, port = blackhole.getsockname()
        rotators = (
            SANDBOX_ROTATORS
            + FAILURE_ROTATORS.format(blackhole=f"http://{host}:{port}")
            + exec_rotator("exec-exit-1", script, "exit-1")
            + exec_rotator("exec-slow", script, "slow", timeout="1s")
            + exec_rotator("exec-garbage", script, "garbage")
            + exec_rotator("exec-unknown-key", script, "unknown-key")
        )
        specs = {"steady": ApiKeySpec("sandbox-keys", max_age="2s", grace="1s")}
        for name, (rotator, _) in FAILURES.items():
            specs[name] = ApiKeySpec(
                rotator,
                max_age="1s",
                grace="500ms",
                initial=True,
                backoff=BACKOFF,
                verify_attempts=2 if name == "verify-401" else None,
            )
        deployment = prepare_key_deployment(
            openbao,
            sandbox,
            workdir,
            namespace=namespace(),
            api_keys=specs,
            rotators=rotators,
            oauth_clients=[SECRET],
            oauth_credential={
                "refresh": {"margin": "4s", "min_interval": "500ms"},
                "backoff": BACKOFF,
                "rotation": {
                    "max_age": "1s",
                    "grace": "500ms",
                    "rotator": "exec-unknown-key",
                    "verify_attempts": 2,
                },
            },
        )
        deployment.env["NOT_THE_ADMIN_TOKEN"] = "ktsb_admin_" + "x" * 43
        # /oauth/revoke answers 503 (keys-5xx creates there); nothing else in this run calls it.
        sandbox.admin.set_faults({"revoke": {"error_rate": 1.0}})
        daemon = DaemonProcess(
            deployment.config_path, workdir, env={**deployment.env, **MARKERS}
        ).start()
        keys = KeySampler(deployment.deployment)
        tokens = KeySampler(deployment.deployment, probe="/v1/projects", field="access_token")
        try:
            for name in specs:
                keys.wait_for(name, timeout=10)
            tokens.wait_for(SECRET, timeout=10)

            def enough() -> bool:
                failed = failure_events(daemon.log_text())
                retried = all(len(failed.get(name, [])) >= 2 for name in [*FAILURES, SECRET])
                return retried and len(keys.key_ids("steady")) >= 5

            # Until every failing credential has failed twice (the second time after a backoff)
            # and the healthy one has rotated four times.
            deadline = time.monotonic() + 30
            while not enough():
                assert time.monotonic() < deadline, "not every failure was retried within 30 s"
                for name in specs:
                    keys.read(name)
                tokens.read(SECRET)
                time.sleep(0.1)
            # SECRET's 10 s token may expire between the stop and a `status` read after it.
            running = status_rows(deployment.config_path)
            assert daemon.stop() == 0
            for name in specs:
                keys.read(name)  # what apps read now, with the daemon stopped
            tokens.read(SECRET)
            rows = status_rows(deployment.config_path)
        finally:
            daemon.stop()
            keys.close()
            tokens.close()
        log = daemon.log_text()
        yield FailureRun(deployment, keys, tokens, script, rows, running, log, failure_events(log))
    finally:
        blackhole.close()
        sandbox.stop()


@pytest.mark.parametrize("name", list(FAILURES))
def test_a_rotator_failure_leaves_the_current_key_in_place(
    failure_run: FailureRun, name: str
) -> None:
    run, (_, expected) = failure_run, FAILURES[name]
    initial = run.deployment.initial[name]["key_id"]
    # Apps kept reading the adopted key, and the service kept accepting it.
    assert run.sampler.key_ids(name) == [initial]
    assert_always_accepted(run.sampler, name)
    keys = {k["key_id"]: k["status"] for k in run.deployment.sandbox.admin.list_api_keys()}
    assert keys[initial] == "active"
    # A clear error, naming the credential and the rotator, in status and in the logs.
    row = run.rows[name]
    assert row["key_id"] == initial
    assert row["rotation_phase"] in ("creating", "pending")
    assert row["rotation_error"] is not None
    assert row["rotation_error"].startswith(f"{name}: ")
    assert expected in row["rotation_error"]
    assert row["rotates_at"] is not None  # the retry
    # Retried, with backoff (no hot loop).
    failures = run.failures[name]
    assert len(failures) >= 2, failures
    assert [count for _, count, _ in failures] == list(range(1, len(failures) + 1))
    assert all(expected in error for _, _, error in failures)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(failures)]
    assert min(gaps) >= 0.9, gaps
    # Nothing keyturn created for it is left behind unrevoked.
    assert [k for k in keyturn_keys(run.deployment.sandbox, name) if k["status"] != "revoked"] == []


def test_status_does_not_call_an_overdue_api_key_expired(failure_run: FailureRun) -> None:
    """An API key does not expire by time: past its rotation date (its rotation keeps failing)
    it is still the working key apps read (docs/runbook.md, KeyturnCredentialNotReady), so
    `keyturn status` must not show it as `expired`."""
    deployment = failure_run.deployment.deployment
    for name in ("http-5xx", "exec-exit-1"):
        published = deployment.vault_client().secrets.kv.v2.read_secret_version(
            path=deployment.publish_to[name], raise_on_deleted_version=True
        )["data"]["data"]
        assert parse_rfc3339(published["rotate_after"]) < time.time()  # overdue
        assert failure_run.sampler.samples[name][-1].status == 200  # and working
        row = failure_run.rows[name]
        assert row["phase"] == "ok", f"{name}: phase {row['phase']!r} for a working key"


def test_verification_failures_revoke_the_rejected_key_and_start_over(
    failure_run: FailureRun,
) -> None:
    calls = [c for c in exec_calls(failure_run.script) if c["credential"] == "verify-401"]
    creates = [c for c in calls if c["action"] == "create"]
    revokes = [c for c in calls if c["action"] == "revoke"]
    # verify_attempts = 2: the first key was refused twice, then revoked, and a new rotation
    # (a new rotation_id, so a new key name) began.
    assert creates, calls
    assert revokes, calls
    assert revokes[0]["key_id"] == f"key_unknown_{creates[0]['rotation_id']}"
    assert revokes[0]["rotation_id"] == creates[0]["rotation_id"]
    state = failure_run.deployment.state("verify-401")
    assert state["rotation_id"] != creates[0]["rotation_id"]
    assert len({c["rotation_id"] for c in creates}) == len(creates)
    assert failure_run.log.count('"rotation.verification_failed"') >= 2
    assert '"detector": "fresh_credential_rejected"' in failure_run.log


def test_a_failing_credential_does_not_stop_the_others(failure_run: FailureRun) -> None:
    published = failure_run.sampler.key_ids("steady")
    assert len(published) >= 5, published
    assert_always_accepted(failure_run.sampler, "steady")
    assert_no_orphans(failure_run.deployment, "steady", published)
    row = failure_run.rows["steady"]
    assert row["rotation_error"] is None
    assert row["last_error"] is None
    assert "steady" not in failure_run.failures


def test_an_exec_rotator_past_its_timeout_is_killed(failure_run: FailureRun) -> None:
    script = str(failure_run.script)
    running = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if script in cmdline.read_bytes().decode(errors="replace"):
                running.append(cmdline.parent.name)
        except OSError:
            continue  # the process ended while we looked
    assert running == [], f"exec rotator processes left running: {running}"


def test_the_exec_rotator_gets_its_parameters_on_stdin_only(failure_run: FailureRun) -> None:
    calls = exec_calls(failure_run.script)
    assert {c["argv"][0] for c in calls} == {"exit-1", "slow", "garbage", "unknown-key"}
    assert all(c["env"] == [] for c in calls), "a KEYTURN_/VAULT_/BAO_ variable reached it"
    assert all(len(c["argv"]) == 1 for c in calls)  # nothing about the rotation in argv
    for call in calls:
        assert call["key_name"] == f"keyturn-{call['credential']}-{call['rotation_id']}"
        if call["credential"] == SECRET:
            client_id = failure_run.deployment.deployment.clients[SECRET]["client_id"]
            assert (call["kind"], call["client_id"]) == ("oauth_client", client_id)
        else:
            assert (call["kind"], call["client_id"]) == ("api_key", None)
    assert any(c["credential"] == SECRET for c in calls)


def test_a_refused_client_secret_leaves_tokens_flowing(failure_run: FailureRun) -> None:
    """The client-secret rotator returns a secret the sandbox never issued: the verification
    (a token request with it) is refused with invalid_client, and the refresh goes on with the
    secret in use."""
    assert_always_accepted(failure_run.tokens, SECRET)
    assert len({s.value for s in failure_run.tokens.samples[SECRET]}) >= 2  # still refreshed
    assert failure_run.running[SECRET]["phase"] == "ok"
    row = failure_run.rows[SECRET]
    assert row["rotation_phase"] in ("creating", "pending")
    assert row["rotation_error"].startswith(f"{SECRET}: ")
    assert "invalid_client" in row["rotation_error"]
    assert len(failure_run.failures[SECRET]) >= 2
    client_id = failure_run.deployment.deployment.clients[SECRET]["client_id"]
    secrets = failure_run.deployment.sandbox.admin.get_oauth_app(client_id)["secrets"]
    assert [s["status"] for s in secrets] == ["active"]  # the input secret, untouched
    tokens = failure_run.deployment.sandbox.admin.list_tokens(client_id)
    assert [t for t in tokens if t["status"] == "revoked"] == []


def test_a_refused_client_secret_counts_toward_verify_attempts(failure_run: FailureRun) -> None:
    """`verify_attempts` (here 2): "verification failures of one new key before keyturn revokes
    it and creates another" (docs/configuration.md). For a client secret the verification is a
    token request; invalid_client is its refusal, as a probe's 401 is for an API key."""
    calls = [c for c in exec_calls(failure_run.script) if c["credential"] == SECRET]
    creates = [c for c in calls if c["action"] == "create"]
    assert creates, calls
    assert len(failure_run.failures[SECRET]) >= 2
    revokes = [c["key_id"] for c in calls if c["action"] == "revoke"]
    first = f"key_unknown_{creates[0]['rotation_id']}"
    assert first in revokes, (
        f"the refused client secret {first} was still pending after "
        f"{len(failure_run.failures[SECRET])} refusals, never revoked"
    )


def test_rotation_retries_follow_the_credentials_backoff(failure_run: FailureRun) -> None:
    """`[credentials.backoff]` (here initial 1 s, max 2 s) says how long to wait after a
    failure, for an api_key as for an oauth_client (docs/configuration.md)."""
    # The http rotators' attempts take milliseconds (an exec command starts a Python process
    # per call, which can take a second or more on a busy machine).
    for name in ("http-5xx", "http-malformed", "http-wrong-auth"):
        failures = failure_run.failures[name]
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(failures)]
        assert gaps, name
        # At most `max` (2 s), plus the attempt itself on a busy machine.
        assert max(gaps) <= 4, f"{name}: waited {gaps} s between retries; backoff max is 2 s"
