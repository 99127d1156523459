"""Token-request parameters and refresh-token lifetimes end to end: the daemon against a real
OpenBao and the sandbox over loopback HTTP, with form bodies.

The sandbox is set up as a strict identity server: it serves one API (`allowed_targets`),
refuses parameters it does not know, issues JWT-shaped access tokens whose `aud` says what was
granted, answers `refresh_expires_in`, and caps a token family at three days. One credential
asks for that API by `audience` and `resource`; one sends a parameter the server refuses; one
asks for nothing. The first is served with the audience it asked for and its family's end is
known everywhere an operator looks; the second fails with a line naming the key, backs off and
raises `credential_failing`; the third is served throughout.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keyturn.clock import parse_rfc3339
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess, Deployment, prepare_deployment
from keyturn_devkit.harness.key_rotation import run_keyturn, status_rows
from keyturn_devkit.harness.receiver import AlertReceiver

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox]

API = "https://api.example.test/"
FAMILY = 3 * 86400
SANDBOX = {
    "access_token_lifetime": 3,
    "allowed_targets": [API],
    "refuse_unknown_parameters": True,
    "jwt_access_tokens": True,
    "include_refresh_expires_in": True,
    "refresh_token_family_lifetime": FAMILY,
}
# Each credential's own keys, inserted after its name (prepare_deployment writes the rest).
OWN_KEYS = {
    "good": f'audience = "{API}"\nresource = ["{API}"]\n',
    "bad": 'token_params = { organization = "org_42" }\n',
    "plain": "",
}


def claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} within {timeout}s")
        time.sleep(0.1)


@pytest.fixture
def deployment(
    openbao: OpenBaoDevServer, sandbox_factory: Callable[..., SandboxProcess], tmp_path: Path
) -> Deployment:
    tag = f"t{uuid.uuid4().hex[:8]}"
    deployed = prepare_deployment(
        openbao,
        sandbox_factory(SANDBOX),
        tmp_path,
        [f"{name}-{tag}" for name in OWN_KEYS],
        namespace=tag,
        provider={"token_request": "form", "refresh_token_max_lifetime": "30d"},
        credential={
            "refresh": {"margin": "1s", "min_interval": "500ms"},
            "backoff": {"initial": "200ms", "max": "1s"},
        },
    )
    text = deployed.config_path.read_text()
    for name, keys in OWN_KEYS.items():
        line = f'name = "{name}-{tag}"\n'
        text = text.replace(line, line + keys)
    deployed.config_path.write_text(text)
    return deployed


@pytest.fixture
def receiver() -> Iterator[AlertReceiver]:
    with AlertReceiver() as running:
        yield running


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[[Deployment], DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(deployed: Deployment) -> DaemonProcess:
        process = DaemonProcess(deployed.config_path, tmp_path).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def metrics_port(process: DaemonProcess) -> int:
    process.wait_for_log("metrics.listening", timeout=10)
    for line in process.log_text().splitlines():
        if "metrics.listening" in line:
            return int(json.loads(line)["port"])
    raise AssertionError("no metrics.listening line")


def test_parameters_are_sent_refusals_named_and_the_family_end_known(
    deployment: Deployment,
    daemon: Callable[[Deployment], DaemonProcess],
    receiver: AlertReceiver,
) -> None:
    good, bad, plain = deployment.publish_to
    hook = f'\n[[alerts]]\nname = "hook"\ntype = "webhook"\nurl = "{receiver.hook_url}"\n'
    deployment.config_path.write_text(deployment.config_path.read_text() + hook)
    config = str(deployment.config_path)
    root = deployment.vault_client()

    # keyturn check --live: one line each; the refused parameter named.
    live = run_keyturn("check", "-c", config, "--live")
    assert live.returncode == 1
    assert (
        f"credentials[{good!r}]: token issued with audience, resource accepted and accepted by "
        "probe /v1/projects"
    ) in live.stdout.splitlines()
    [refusal] = [line for line in live.stderr.splitlines() if bad in line]
    assert "invalid_request (unknown parameter organization)" in refusal
    assert "the server refused token_params.organization" in refusal

    started = time.time()
    process = daemon(deployment)

    def published(name: str) -> dict[str, Any]:
        read = root.secrets.kv.v2.read_secret_version(
            path=deployment.publish_to[name], raise_on_deleted_version=True
        )
        return dict(read["data"]["data"])

    def record(name: str) -> dict[str, Any]:
        path = f"{deployment.state_prefix}/{name}"
        read = root.secrets.kv.v2.read_secret_version(path=path, raise_on_deleted_version=True)
        return dict(read["data"]["data"])

    def refreshed_twice() -> bool:
        tokens = deployment.sandbox.admin.list_tokens(deployment.clients[good]["client_id"])
        return sum(t["kind"] == "refresh" and t["status"] == "used" for t in tokens) >= 2

    wait_until(refreshed_twice, 20, "two refresh_token grants for the good credential")
    # The audience asked for, as the server granted it, with every grant.
    token = str(published(good)["access_token"])
    assert claims(token)["aud"] == API
    state = record(good)
    assert state["granted_audience"] == API
    assert "refresh_token" in state  # never shown; its end is
    family_started = float(state["refresh_family_started"])
    assert started - 1 <= family_started <= time.time()
    # The server's countdown to its 3-day cap reads as one fixed end across refreshes.
    assert abs(float(state["refresh_token_expires_at"]) - (family_started + FAMILY)) <= 5

    # The refused parameter: a failing run naming it, backing off; the others served.
    alert = receiver.wait_alert("credential_failing", bad, timeout=20)
    assert "the server refused token_params.organization" in alert["summary"]
    rows = status_rows(deployment.config_path)
    assert rows[bad]["phase"] == "failing"
    assert rows[bad]["consecutive_failures"] >= 3
    assert "the server refused token_params.organization" in rows[bad]["last_error"]
    assert rows[bad]["refresh_token_ends_at"] is None
    assert rows[plain]["phase"] == "ok" and rows[good]["phase"] == "ok"
    assert (
        claims(str(published(plain)["access_token"]))["aud"]
        == deployment.clients[plain]["client_id"]
    )
    ends = parse_rfc3339(rows[good]["refresh_token_ends_at"])
    assert abs(ends - (family_started + FAMILY)) <= 5  # earlier than the provider's 30 days

    # The metric an alert rule watches.
    port = metrics_port(process)
    exposition = HTTP.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    [sample] = [
        line
        for line in exposition.splitlines()
        if line.startswith("keyturn_refresh_token_expiry_timestamp_seconds{")
        and f'credential="{good}"' in line
    ]
    assert abs(float(sample.rsplit(" ", 1)[1]) - (family_started + FAMILY)) <= 5
    assert f'keyturn_refresh_token_expiry_timestamp_seconds{{credential="{bad}"' not in exposition
    # Nothing of a token in the log.
    log = process.log_text()
    assert token not in log and token.split(".")[2] not in log


def test_a_rotator_authenticates_with_the_token_kept_for_another_credential(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
    daemon: Callable[[Deployment], DaemonProcess],
) -> None:
    """No admin token anywhere in the configuration: the client-secret rotator calls the
    sandbox's admin API with the access token keyturn keeps for an admin client (scope
    `sandbox:admin`). Each refresh of that token revokes the one before, so the daemon's
    second rotation works only if it reads the token afresh."""
    tag = f"t{uuid.uuid4().hex[:8]}"
    sandbox = sandbox_factory(
        {
            "access_token_lifetime": 3,
            "default_scope": "users:read projects:read sandbox:admin",
            "admin_scope": "sandbox:admin",
            "revoke_previous_access_token_on_refresh": True,
        }
    )
    admin, billing = f"admin-{tag}", f"billing-{tag}"
    deployed = prepare_deployment(
        openbao,
        sandbox,
        tmp_path,
        [admin, billing],
        namespace=tag,
        credential={
            "refresh": {"margin": "1s", "min_interval": "500ms"},
            "backoff": {"initial": "200ms", "max": "1s"},
        },
    )
    rotator = (
        '\n[[rotators]]\nname = "secrets"\ntype = "http"\nprovider = "sandbox"\n'
        f'auth = "credential:{admin}"\n'
        'create = { method = "POST", path = "/admin/oauth-apps/{client_id}/rotate-secret", '
        'body = \'{"overlap_seconds": 60}\', value = "/client_secret", id = "/secret_id" }\n'
        'revoke = { method = "DELETE", path = "/admin/oauth-apps/{client_id}/secrets/{key_id}" }\n'
    )
    own = {
        admin: 'scope = "sandbox:admin projects:read"\n',
        billing: 'scope = "users:read projects:read"\n'
        'rotation = { max_age = "4s", grace = "1s", rotator = "secrets" }\n',
    }
    text = deployed.config_path.read_text()
    for name, keys in own.items():
        line = f'name = "{name}"\n'
        text = text.replace(line, line + keys)
    deployed.config_path.write_text(text + rotator)
    assert "ktsb_admin_" not in deployed.config_path.read_text()

    process = daemon(deployed)
    billing_id = deployed.clients[billing]["client_id"]

    def secrets_made() -> int:
        return len(sandbox.admin.get_oauth_app(billing_id)["secrets"])

    # The first rotation may wait for the admin token's first publish (backing off); two
    # rotations then go through, several admin refreshes apart.
    wait_until(lambda: secrets_made() >= 3, 40, "two rotations of the billing client secret")
    rows = status_rows(deployed.config_path)
    assert rows[billing]["phase"] == "ok" and rows[admin]["phase"] == "ok"
    admin_tokens = sandbox.admin.list_tokens(deployed.clients[admin]["client_id"])
    replaced = [t for t in admin_tokens if t["revoke_reason"] == "replaced at refresh"]
    assert len(replaced) >= 2  # the admin token changed under the rotator, and it kept up
    assert process.log_text().count("rotation.") > 0
