"""`keyturn check --live` against a real OpenBao and the sandbox over loopback HTTP.

A live check uses each credential as the daemon would (a client_credentials token request and
the probe for an oauth_client; the probe with the current key for an api_key) and nothing more:
no published path or state record gets a new version, no alert goes out, and the token it
obtained is revoked where the provider offers it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import hvac
import hvac.exceptions
import pytest

from keyturn.clock import rfc3339
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess, Deployment, prepare_deployment
from keyturn_devkit.harness.key_rotation import (
    SANDBOX_ROTATORS,
    ApiKeySpec,
    KeyDeployment,
    prepare_key_deployment,
    run_keyturn,
)
from keyturn_devkit.harness.receiver import AlertReceiver

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox]

REVOKE = {"revoke_path": "/oauth/revoke"}


def suffix() -> str:
    return uuid.uuid4().hex[:8]


def versions(root: hvac.Client, deployment: Deployment) -> dict[str, int | None]:
    """The current KV version of every published path and state record (None: absent)."""
    paths = [*deployment.publish_to.values()]
    paths += [f"{deployment.state_prefix}/{name}" for name in deployment.publish_to]
    found: dict[str, int | None] = {}
    for path in paths:
        try:
            meta = root.secrets.kv.v2.read_secret_metadata(path=path)
        except hvac.exceptions.InvalidPath:
            found[path] = None
        else:
            found[path] = meta["data"]["current_version"]
    return found


@pytest.fixture
def deploy(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
) -> Callable[[], Deployment]:
    def make() -> Deployment:
        return prepare_deployment(
            openbao,
            sandbox_factory(),
            tmp_path,
            [f"c{suffix()}"],
            namespace=f"t{suffix()}",
            provider=REVOKE,
        )

    return make


@pytest.fixture
def receiver() -> Iterator[AlertReceiver]:
    with AlertReceiver() as running:
        yield running


def with_alert_hook(deployment: Deployment, receiver: AlertReceiver) -> None:
    text = deployment.config_path.read_text()
    hook = f'\n[[alerts]]\nname = "live-test"\ntype = "webhook"\nurl = "{receiver.hook_url}"\n'
    deployment.config_path.write_text(text + hook + 'min_severity = "info"\n')


def test_a_good_credential_passes_and_leaves_nothing_behind(
    deploy: Callable[[], Deployment],
) -> None:
    deployment = deploy()
    (name,) = deployment.publish_to
    root = deployment.vault_client()
    config = str(deployment.config_path)

    plain = run_keyturn("check", "-c", config)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == [f"{config}: ok (1 credentials)"]  # as before --live

    live = run_keyturn("check", "-c", config, "--live")
    assert live.returncode == 0, live.stderr
    assert live.stdout.splitlines() == [
        f"credentials[{name!r}]: token issued and accepted by probe /v1/projects",
        f"{config}: ok (1 credentials)",
    ]
    assert live.stderr == ""
    assert set(versions(root, deployment).values()) == {None}  # nothing published or stored
    # The check's own grant was revoked (RFC 7009): no live token of it is left at the provider.
    tokens = deployment.sandbox.admin.list_tokens(deployment.clients[name]["client_id"])
    assert tokens
    assert {t["status"] for t in tokens} == {"revoked"}


def test_a_wrong_client_secret_on_a_credential_that_never_worked(
    deploy: Callable[[], Deployment],
) -> None:
    deployment = deploy()
    (name,) = deployment.publish_to
    root = deployment.vault_client()
    wrong = "wrong-secret-" + suffix()
    root.secrets.kv.v2.create_or_update_secret(
        path=deployment.input_paths[name],
        secret={"client_id": deployment.clients[name]["client_id"], "client_secret": wrong},
    )
    config = str(deployment.config_path)
    assert run_keyturn("check", "-c", config).returncode == 0  # only a real request can tell

    live = run_keyturn("check", "-c", config, "--live")
    assert live.returncode == 1
    inputs = f"vault:secret/{deployment.input_paths[name]}"
    assert live.stderr.splitlines() == [
        f"credentials[{name!r}]: first token request refused (invalid_client): check the "
        f"client_secret reference {inputs}#client_secret (client_id from {inputs}#client_id)"
    ]
    assert f"{config}: ok" not in live.stdout
    assert wrong not in live.stdout + live.stderr
    assert set(versions(root, deployment).values()) == {None}


def test_a_refused_credential_that_worked_before_was_changed_elsewhere(
    deploy: Callable[[], Deployment], receiver: AlertReceiver
) -> None:
    deployment = deploy()
    (name,) = deployment.publish_to
    with_alert_hook(deployment, receiver)
    root = deployment.vault_client()
    config = str(deployment.config_path)
    refreshed = run_keyturn("refresh", "-c", config, name)
    assert refreshed.returncode == 0, refreshed.stderr
    state = root.secrets.kv.v2.read_secret_version(
        path=f"{deployment.state_prefix}/{name}", raise_on_deleted_version=True
    )["data"]["data"]
    last_success = rfc3339(float(state["last_success"]))
    before = versions(root, deployment)
    assert None not in before.values()

    # Someone rotates the client secret in the provider's dashboard, with no overlap.
    client_id = deployment.clients[name]["client_id"]
    deployment.sandbox.admin.rotate_client_secret(client_id, overlap_seconds=0)
    live = run_keyturn("check", "-c", config, "--live")
    assert live.returncode == 1
    inputs = f"vault:secret/{deployment.input_paths[name]}"
    assert live.stderr.splitlines() == [
        f"credentials[{name!r}]: token request refused (invalid_client), though it last "
        f"succeeded at {last_success}: the client secret ({inputs}#client_secret) may have been "
        "changed or revoked outside keyturn"
    ]
    assert versions(root, deployment) == before  # nothing published, no state record written
    assert receiver.deliveries() == []  # and no alert (the daemon's detector raises one)


@pytest.fixture
def key_deployment(
    openbao: OpenBaoDevServer, sandbox_factory: Callable[..., SandboxProcess], tmp_path: Path
) -> KeyDeployment:
    """Two api_key credentials: `adopted` starts from a key made beforehand (initial_key,
    manual rotator); `fresh` has none until its rotator creates one."""
    return prepare_key_deployment(
        openbao,
        sandbox_factory(),
        tmp_path,
        namespace=f"t{suffix()}",
        api_keys={
            "adopted": ApiKeySpec("by-hand", max_age="1h", grace="1s", initial=True),
            "fresh": ApiKeySpec("sandbox-keys", max_age="1h", grace="1s"),
        },
        rotators=SANDBOX_ROTATORS + '\n[[rotators]]\nname = "by-hand"\ntype = "manual"\n',
    )


def test_an_api_key_is_probed_with_its_current_key(
    key_deployment: KeyDeployment, tmp_path: Path
) -> None:
    deployment, env = key_deployment.deployment, key_deployment.env
    root = deployment.vault_client()
    config = str(deployment.config_path)
    initial = key_deployment.initial["adopted"]

    # Before the first run: the initial key is what the daemon will adopt; `fresh` has none.
    live = run_keyturn("check", "-c", config, "--live", env=env)
    assert live.returncode == 0, live.stderr
    (variable,) = (k for k, v in env.items() if v == initial["key"])
    assert live.stdout.splitlines() == [
        f"credentials['adopted']: initial_key (env:{variable}) accepted by probe /v1/users",
        "credentials['fresh']: no key yet: keyturn creates one on its first run; nothing to probe",
        f"{config}: ok (2 credentials)",
    ]

    with DaemonProcess(deployment.config_path, tmp_path, env=env) as daemon:
        for path in deployment.publish_to.values():
            _wait_published(root, path)
        assert daemon.stop() == 0
    before = versions(root, deployment)

    live = run_keyturn("check", "-c", config, "--live", env=env)
    assert live.returncode == 0, live.stderr
    assert live.stdout.splitlines() == [
        "credentials['adopted']: the current key accepted by probe /v1/users",
        "credentials['fresh']: the current key accepted by probe /v1/users",
        f"{config}: ok (2 credentials)",
    ]
    assert versions(root, deployment) == before

    deployment.sandbox.admin.revoke_api_key(initial["key_id"])
    live = run_keyturn("check", "-c", config, "--live", env=env)
    assert live.returncode == 1
    assert live.stderr.splitlines() == [
        "credentials['adopted']: the current key rejected by probe /v1/users (HTTP 401)"
    ]
    assert initial["key"] not in live.stdout + live.stderr
    assert versions(root, deployment) == before


def _wait_published(root: hvac.Client, path: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            root.secrets.kv.v2.read_secret_metadata(path=path)
        except hvac.exceptions.InvalidPath:
            time.sleep(0.1)
        else:
            return
    raise TimeoutError(f"{path} not published within {timeout}s")
