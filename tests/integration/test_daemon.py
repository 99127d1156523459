"""`keyturn run` against a real OpenBao and the sandbox over loopback HTTP.

Token lifetimes are a few seconds so several refresh cycles fit in a test. A sampler reads the
published path the way an app does and calls the service with what it read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hvac
import pytest

from keyturn.clock import parse_rfc3339
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess, Deployment, prepare_deployment

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]


@dataclass
class Sample:
    at: float
    version: int
    expires_at: float
    access_token: str
    status: int


@dataclass
class Sampler:
    """Reads published paths as an app would, and checks each value against the service."""

    deployment: Deployment
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def read(self, name: str) -> Sample | None:
        client = self.deployment.vault_client()
        try:
            read = client.secrets.kv.v2.read_secret_version(
                path=self.deployment.publish_to[name], raise_on_deleted_version=True
            )
        except hvac.exceptions.InvalidPath:
            return None
        data = read["data"]["data"]
        status = HTTP.get(
            f"{self.deployment.sandbox.base_url}/v1/projects",
            headers={"Authorization": data["authorization"]},
            timeout=5,
        ).status_code
        sample = Sample(
            time.time(),
            read["data"]["metadata"]["version"],
            parse_rfc3339(data["expires_at"]),
            data["access_token"],
            status,
        )
        self.samples.setdefault(name, []).append(sample)
        return sample

    def wait_published(self, name: str, timeout: float = 20, min_version: int = 1) -> Sample:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sample = self.read(name)
            if sample is not None and sample.version >= min_version:
                return sample
            time.sleep(0.1)
        raise TimeoutError(f"{name} not published at version {min_version} within {timeout}s")

    def run(self, names: list[str], seconds: float, interval: float = 0.2) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name in names:
                self.read(name)
            time.sleep(interval)


@pytest.fixture
def deploy(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
) -> Callable[..., Deployment]:
    def make(
        names: list[str], sandbox_config: dict | None = None, **overrides: object
    ) -> Deployment:
        sandbox = sandbox_factory(sandbox_config or {"access_token_lifetime": 3})
        overrides.setdefault(
            "credential",
            {
                "refresh": {"margin": "1s", "min_interval": "500ms"},
                "backoff": {"initial": "200ms", "max": "1s"},
            },
        )
        return prepare_deployment(
            openbao,
            sandbox,
            tmp_path,
            names,
            namespace=f"t{uuid.uuid4().hex[:8]}",
            **overrides,  # type: ignore[arg-type]
        )

    return make


@pytest.fixture
def daemons(tmp_path: Path):
    started: list[DaemonProcess] = []

    def start(deployment: Deployment) -> DaemonProcess:
        daemon = DaemonProcess(deployment.config_path, tmp_path).start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def keyturn(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keyturn", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def status(deployment: Deployment) -> dict[str, dict]:
    result = keyturn("status", "-c", str(deployment.config_path), "--json")
    assert result.returncode in (0, 3), result.stderr  # 3: some credential is not ok
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return {row["credential"]: row for row in rows}


def assert_always_valid(samples: list[Sample]) -> None:
    assert samples, "the sampler read nothing"
    for sample in samples:
        assert sample.expires_at > sample.at, f"an app read an expired token: {sample}"
        assert sample.status == 200, f"the service refused a published token: {sample}"


def test_apps_never_read_an_expired_token_across_refresh_cycles(deploy, daemons) -> None:
    deployment = deploy(["alpha", "beta"])
    daemons(deployment)
    sampler = Sampler(deployment)
    for name in ("alpha", "beta"):
        sampler.wait_published(name)
    sampler.run(["alpha", "beta"], seconds=9)
    for name in ("alpha", "beta"):
        samples = sampler.samples[name]
        assert_always_valid(samples)
        assert samples[-1].version - samples[0].version >= 3  # several refresh cycles
    # Each rotated refresh token was used exactly once: a second use would have made the
    # sandbox revoke the whole family (RFC 9700), and revoked tokens would show here.
    for client in deployment.clients.values():
        tokens = deployment.sandbox.admin.list_tokens(client["client_id"])
        refresh = [t for t in tokens if t["kind"] == "refresh"]
        assert [t for t in tokens if t["status"] == "revoked"] == []
        assert sum(t["status"] == "used" for t in refresh) >= 3
        assert sum(t["status"] == "active" for t in refresh) == 1


def test_a_restart_requests_nothing_while_tokens_are_valid(deploy, daemons) -> None:
    deployment = deploy(["gamma", "delta"], sandbox_config={"access_token_lifetime": 120})
    daemon = daemons(deployment)
    sampler = Sampler(deployment)
    before = {name: sampler.wait_published(name) for name in ("gamma", "delta")}
    assert daemon.stop() == 0
    requests_before = _token_requests(deployment)
    daemon.start()
    time.sleep(3)  # every credential's first job runs at start and decides
    assert _token_requests(deployment) == requests_before
    for name, sample in before.items():
        assert sampler.read(name).version == sample.version  # type: ignore[union-attr]


def _restored(daemon: DaemonProcess) -> dict:
    """The last `plan.restored` line of the daemon's log (see keyturn.saved_plan)."""
    lines = [json.loads(line) for line in daemon.log_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "plan.restored"][-1]


def test_a_restart_plans_from_the_saved_plan_and_a_command_s_credential_runs_at_once(
    deploy, daemons
) -> None:
    """A stopped daemon saved its plan in Vault (no secret in it): the next start plans every
    credential from it without a token request. A credential a command worked on while the
    daemon was down is not restored: it runs at once, from its record."""
    deployment = deploy(["theta", "kappa"], sandbox_config={"access_token_lifetime": 120})
    daemon = daemons(deployment)
    sampler = Sampler(deployment)
    for name in ("theta", "kappa"):
        sampler.wait_published(name)
    assert daemon.stop() == 0
    requests_before = _token_requests(deployment)
    daemon.start()
    assert _restored(daemon)["credentials"] == 2
    assert _token_requests(deployment) == requests_before
    assert daemon.stop() == 0
    result = keyturn("refresh", "-c", str(deployment.config_path), "theta")
    assert result.returncode == 0, result.stderr
    refreshed = sampler.wait_published("theta")
    daemon.start()
    assert _restored(daemon)["credentials"] == 1  # kappa; theta's first run reads its record
    assert sampler.read("theta").version == refreshed.version  # type: ignore[union-attr]


def _token_requests(deployment: Deployment) -> int:
    usage = deployment.sandbox.admin.usage()["oauth_clients"]
    return sum(usage[c["client_id"]]["oauth_requests"] for c in deployment.clients.values())


def test_an_outage_shorter_than_the_lifetime_leaves_apps_served(deploy, daemons) -> None:
    deployment = deploy(["eps"], sandbox_config={"access_token_lifetime": 6})
    daemons(deployment)
    sampler = Sampler(deployment)
    sampler.wait_published("eps")
    deployment.sandbox.admin.set_faults({"token": {"outage_seconds": 3}})
    sampler.run(["eps"], seconds=9)
    assert_always_valid(sampler.samples["eps"])


def test_a_longer_outage_shows_in_status_and_recovers_by_itself(deploy, daemons) -> None:
    deployment = deploy(["zeta"], sandbox_config={"access_token_lifetime": 2})
    daemons(deployment)
    sampler = Sampler(deployment)
    first = sampler.wait_published("zeta")
    # 12 s: `keyturn status` (a new process) must read the record while the outage lasts, on a
    # busy machine too.
    deployment.sandbox.admin.set_faults({"token": {"outage_seconds": 12}})
    time.sleep(4)
    row = status(deployment)["zeta"]
    assert row["phase"] in ("failing", "expired")
    assert "503" in row["last_error"]
    assert row["consecutive_failures"] >= 2
    recovered = sampler.wait_published("zeta", timeout=25, min_version=first.version + 2)
    assert recovered.status == 200
    assert recovered.expires_at > time.time()
    assert status(deployment)["zeta"]["phase"] == "ok"


def test_one_bad_credential_does_not_stop_the_others(deploy, daemons) -> None:
    deployment = deploy(["good", "bad"])
    client = deployment.vault_client()
    client.secrets.kv.v2.create_or_update_secret(
        path=deployment.input_paths["bad"],
        secret={"client_id": deployment.clients["bad"]["client_id"], "client_secret": "wrong"},
    )
    daemon = daemons(deployment)
    sampler = Sampler(deployment)
    first = sampler.wait_published("good")
    sampler.wait_published("good", min_version=first.version + 2, timeout=15)
    assert sampler.read("bad") is None  # nothing published for it
    row = status(deployment)["bad"]
    assert row["phase"] == "failing"
    assert "invalid_client" in row["last_error"]
    assert '"detector": "client_rejected"' in daemon.log_text()


def test_form_bodies_basic_auth_and_no_refresh_token(deploy, daemons) -> None:
    deployment = deploy(
        ["rfc"],
        sandbox_config={
            "access_token_lifetime": 2,
            "issue_refresh_token_for_client_credentials": False,
        },
        provider={"token_request": "form", "client_auth": "basic"},
    )
    daemons(deployment)
    sampler = Sampler(deployment)
    first = sampler.wait_published("rfc")
    sampler.wait_published("rfc", min_version=first.version + 2, timeout=15)
    assert_always_valid(sampler.samples["rfc"])
    tokens = deployment.sandbox.admin.list_tokens(deployment.clients["rfc"]["client_id"])
    assert [t for t in tokens if t["kind"] == "refresh"] == []
    assert len([t for t in tokens if t["kind"] == "access"]) >= 3


def test_refresh_command_beside_a_running_daemon(deploy, daemons) -> None:
    deployment = deploy(["eta"], sandbox_config={"access_token_lifetime": 4})
    daemons(deployment)
    sampler = Sampler(deployment)
    first = sampler.wait_published("eta")
    for _ in range(3):
        result = keyturn("refresh", "-c", str(deployment.config_path), "eta")
        assert result.returncode == 0, result.stderr
        assert "eta: refreshed" in result.stdout
    sampler.run(["eta"], seconds=4)
    assert sampler.samples["eta"][-1].version >= first.version + 3
    assert_always_valid(sampler.samples["eta"])
    tokens = deployment.sandbox.admin.list_tokens(deployment.clients["eta"]["client_id"])
    assert [t for t in tokens if t["status"] == "revoked"] == []  # no refresh token reused


def test_invalid_configuration_is_one_clear_line_per_problem(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(
        '[vault]\naddress = "http://127.0.0.1:1"\nauth = { method = "token", token = "env:T" }\n'
        '[[providers]]\nname = "p"\nbase_url = "http://example.com"\n'
        '[[credentials]]\nname = "c"\nprovider = "p"\nkind = "oauth_client"\n'
        'client_id = "x"\nclient_secret = "hunter2-inline"\npublish_to = "apps/c"\n'
    )
    for command in ("run", "check", "status"):
        result = keyturn(command, "-c", str(config))
        assert result.returncode == 1
        lines = result.stderr.strip().splitlines()
        assert any("providers" in line and "https" in line for line in lines), lines
        assert any("client_secret" in line and "env:" in line for line in lines), lines
        assert all(line.startswith(str(config)) for line in lines), lines
        assert "hunter2-inline" not in result.stderr


def test_check_reports_each_problem_and_passes_when_ready(deploy) -> None:
    deployment = deploy(["theta"])
    result = keyturn("check", "-c", str(deployment.config_path))
    assert result.returncode == 0, result.stderr
    client = deployment.vault_client()
    client.secrets.kv.v2.create_or_update_secret(
        path=deployment.input_paths["theta"], secret={"client_id": "only-the-id"}
    )
    result = keyturn("check", "-c", str(deployment.config_path))
    assert result.returncode == 1
    assert "credentials['theta'].client_secret" in result.stderr
    deployment.sandbox.stop()
    result = keyturn("check", "-c", str(deployment.config_path))
    assert "unreachable" in result.stderr


def test_check_refuses_a_token_path_that_is_not_a_token_endpoint(deploy) -> None:
    deployment = deploy(["lambda_"], provider={"token_path": "/v1/oauth/token"})
    result = keyturn("check", "-c", str(deployment.config_path))
    assert result.returncode == 1
    assert "providers['sandbox']" in result.stderr
    assert "/v1/oauth/token answered HTTP 404 without an RFC 6749 error body" in result.stderr


def test_no_secret_in_logs_or_status(deploy, daemons) -> None:
    deployment = deploy(["iota", "kappa"])
    daemon = daemons(deployment)
    sampler = Sampler(deployment)
    for name in ("iota", "kappa"):
        sampler.wait_published(name)
    sampler.run(["iota", "kappa"], seconds=5)
    keyturn("refresh", "-c", str(deployment.config_path), "iota")
    outputs = [
        keyturn("status", "-c", str(deployment.config_path)).stdout,
        keyturn("status", "-c", str(deployment.config_path), "--json").stdout,
    ]
    assert daemon.stop() == 0
    client = deployment.vault_client()
    secrets = {s.access_token for samples in sampler.samples.values() for s in samples}
    secrets |= {c["client_secret"] for c in deployment.clients.values()}
    for name in ("iota", "kappa"):
        state = client.secrets.kv.v2.read_secret_version(
            path=f"{deployment.state_prefix}/{name}", raise_on_deleted_version=True
        )["data"]["data"]
        secrets.add(state["refresh_token"])
    secrets.add(deployment.vault.root_token)
    text = daemon.log_text() + "".join(outputs)
    assert len(secrets) >= 8
    assert "credential.published" in text
    leaked = [s for s in secrets if s in text]
    assert leaked == []
