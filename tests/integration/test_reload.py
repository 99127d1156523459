"""SIGHUP reloads the configuration of a running `keyturn run`."""

from __future__ import annotations

import re
import signal
import time
import uuid
from pathlib import Path

import hvac
import pytest

from keyturn_devkit.harness.deployment import DaemonProcess, prepare_deployment

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

FAST = {
    "refresh": {"margin": "1s", "min_interval": "500ms"},
    "backoff": {"initial": "200ms", "max": "1s"},
}


def version(client: hvac.Client, path: str) -> int | None:
    try:
        read = client.secrets.kv.v2.read_secret_version(path=path, raise_on_deleted_version=True)
    except hvac.exceptions.InvalidPath:
        return None
    return int(read["data"]["metadata"]["version"])


def wait_for(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def credential_block(text: str, name: str) -> str:
    """The [[credentials]] table of `name` in a config text written by prepare_deployment."""
    blocks = re.split(r"(?=^\[\[credentials\]\])", text, flags=re.M)
    return next(b for b in blocks if f'name = "{name}"' in b)


def test_reload_adds_removes_and_changes_credentials(openbao, sandbox_factory, tmp_path: Path):
    sandbox = sandbox_factory({"access_token_lifetime": 3})
    namespace = f"r{uuid.uuid4().hex[:8]}"
    full = prepare_deployment(
        openbao,
        sandbox,
        tmp_path / "full",
        ["alpha", "beta"],
        namespace=namespace,
        credential=FAST,
    )
    text = full.config_path.read_text()
    config = tmp_path / "keyturn.toml"
    config.write_text(text.replace(credential_block(text, "beta"), ""))  # alpha only
    client = full.vault_client()
    daemon = DaemonProcess(config, tmp_path).start()
    try:
        wait_for(lambda: version(client, full.publish_to["alpha"]) is not None)
        assert version(client, full.publish_to["beta"]) is None

        # Add beta, remove alpha.
        config.write_text(text.replace(credential_block(text, "alpha"), ""))
        daemon.send(signal.SIGHUP)
        daemon.wait_for_log("config.reloaded", timeout=10)
        wait_for(lambda: version(client, full.publish_to["beta"]) is not None)
        time.sleep(1)  # any run of alpha in progress at the reload has finished by now
        alpha_after = version(client, full.publish_to["alpha"])
        time.sleep(4)  # longer than a refresh cycle: a removed credential is not refreshed
        assert version(client, full.publish_to["alpha"]) == alpha_after  # its data stays
        assert '"added": ["beta"]' in daemon.log_text()
        assert '"removed": ["alpha"]' in daemon.log_text()

        # Change beta (another probe path): it runs again at once.
        before = version(client, full.publish_to["beta"]) or 0
        config.write_text(
            config.read_text().replace('probe = "/v1/projects"', 'probe = "/v1/users"')
        )
        daemon.send(signal.SIGHUP)
        wait_for(lambda: daemon.log_text().count("config.reloaded") == 2)
        assert '"changed": ["beta"]' in daemon.log_text()
        wait_for(lambda: (version(client, full.publish_to["beta"]) or 0) > before, timeout=5)
    finally:
        assert daemon.stop() == 0


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda t: t.replace('provider = "sandbox"', 'provider = "nowhere"'), "nowhere"),
        (lambda t: t + "\n[[credentials]]\nname = 5\n", "credentials"),
        (lambda t: t.replace('instance_id = "test"', 'instance_id = "other"'), "need a restart"),
    ],
)
def test_an_invalid_reload_is_refused_and_the_running_config_stays(
    openbao, sandbox_factory, tmp_path: Path, edit, reason: str
) -> None:
    sandbox = sandbox_factory({"access_token_lifetime": 2})
    deployment = prepare_deployment(
        openbao,
        sandbox,
        tmp_path,
        ["gamma"],
        namespace=f"r{uuid.uuid4().hex[:8]}",
        credential=FAST,
    )
    client = deployment.vault_client()
    daemon = DaemonProcess(deployment.config_path, tmp_path).start()
    try:
        wait_for(lambda: version(client, deployment.publish_to["gamma"]) is not None)
        deployment.config_path.write_text(edit(deployment.config_path.read_text()))
        daemon.send(signal.SIGHUP)
        daemon.wait_for_log("config.reload_refused", timeout=10)
        refused = [line for line in daemon.log_text().splitlines() if "reload_refused" in line]
        assert len(refused) == 1
        assert reason in refused[0]
        before = version(client, deployment.publish_to["gamma"]) or 0
        wait_for(lambda: (version(client, deployment.publish_to["gamma"]) or 0) >= before + 2)
    finally:
        assert daemon.stop() == 0
