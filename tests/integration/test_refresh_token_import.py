"""A starting refresh token, end to end against a real OpenBao and the sandbox over HTTP:
`keyturn import-refresh-token` (a real process, the token on a stdin pipe) beside a running
daemon, and the `refresh_token = "env:…"` input seeded by the daemon.

The sandbox has no authorization endpoint, so a grant made by the test stands in for the
provider's consent flow: it returns a refresh token of a new token family, which a person would
hand to keyturn. Once it is taken, the sandbox stops issuing refresh tokens with
client_credentials, so every refresh token keyturn holds afterwards descends from the one handed
over, and the sandbox's token listing shows each `refresh_token` grant keyturn made with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hvac
import pytest

from keyturn.clock import parse_rfc3339
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess, Deployment, prepare_deployment

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

COMMAND = "import-refresh-token"
# Until the command is registered in keyturn.cli.COMMANDS, the same module's parser and run().
SCRIPT = (
    "import argparse, sys\n"
    "from keyturn.commands import import_refresh_token as command\n"
    "parser = argparse.ArgumentParser(prog='keyturn import-refresh-token')\n"
    "command.add_arguments(parser)\n"
    "sys.exit(command.run(parser.parse_args(sys.argv[1:])))\n"
)


def keyturn(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    from keyturn.cli import COMMANDS  # noqa: PLC0415 - read when the test runs

    argv = [sys.executable, "-m", "keyturn", *args]
    if args and args[0] == COMMAND and COMMAND not in COMMANDS:
        argv = [sys.executable, "-c", SCRIPT, *args[1:]]
    return subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def deploy(
    openbao: OpenBaoDevServer, sandbox_factory: Callable[..., SandboxProcess], tmp_path: Path
) -> Callable[..., Deployment]:
    def make(names: list[str], lifetime: int = 3) -> Deployment:
        sandbox = sandbox_factory({"access_token_lifetime": lifetime})
        return prepare_deployment(
            openbao,
            sandbox,
            tmp_path,
            names,
            namespace=f"t{uuid.uuid4().hex[:8]}",
            credential={
                "refresh": {"margin": "1s", "min_interval": "500ms"},
                "backoff": {"initial": "200ms", "max": "1s"},
            },
        )

    return make


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(deployment: Deployment, env: dict[str, str] | None = None) -> DaemonProcess:
        daemon = DaemonProcess(deployment.config_path, tmp_path, env=env).start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def consent(deployment: Deployment, name: str) -> str:
    """A refresh token of a new family for `name`'s client, as a consent flow would give a
    person; afterwards client_credentials grants come without one."""
    sandbox, client = deployment.sandbox, deployment.clients[name]
    sandbox.admin.update_settings(issue_refresh_token_for_client_credentials=True)
    answer = HTTP.post(
        f"{sandbox.base_url}/oauth/token",
        json={"grant_type": "client_credentials", **client},
        timeout=5,
    )
    answer.raise_for_status()
    sandbox.admin.update_settings(issue_refresh_token_for_client_credentials=False)
    return str(answer.json()["refresh_token"])


def family(deployment: Deployment, token: str) -> dict[str, Any]:
    """The refresh tokens of `token`'s family, by status, and whether any reuse revoked it."""
    sandbox = deployment.sandbox
    family_id = sandbox.admin.introspect_token(token)["family_id"]
    tokens = [t for t in sandbox.admin.list_tokens() if t["family_id"] == family_id]
    refresh = [t for t in tokens if t["kind"] == "refresh"]
    return {
        "used": sum(t["status"] == "used" for t in refresh),
        "active": sum(t["status"] == "active" for t in refresh),
        "revoked": sum(t["status"] == "revoked" for t in tokens),
    }


def state_record(deployment: Deployment, name: str) -> dict[str, str]:
    client = deployment.vault_client()
    read = client.secrets.kv.v2.read_secret_version(
        path=f"{deployment.state_prefix}/{name}", raise_on_deleted_version=True
    )
    return dict(read["data"]["data"])


def published(deployment: Deployment, name: str) -> tuple[int, dict[str, str]] | None:
    client = deployment.vault_client()
    try:
        read = client.secrets.kv.v2.read_secret_version(
            path=deployment.publish_to[name], raise_on_deleted_version=True
        )
    except hvac.exceptions.InvalidPath:  # not published yet
        return None
    return int(read["data"]["metadata"]["version"]), dict(read["data"]["data"])


def wait_for(what: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(0.1)
    raise TimeoutError(message)


def accepted(deployment: Deployment, name: str) -> bool:
    """An app's view: the published token is valid and the service accepts it."""
    value = published(deployment, name)
    if value is None:
        return False
    data = value[1]
    status = HTTP.get(
        f"{deployment.sandbox.base_url}/v1/projects",
        headers={"Authorization": data["authorization"]},
        timeout=5,
    ).status_code
    return status == 200 and parse_rfc3339(data["expires_at"]) > time.time()


def test_an_imported_refresh_token_is_used_beside_a_running_daemon(deploy, daemons) -> None:
    deployment = deploy(["consented"])
    deployment.sandbox.admin.update_settings(issue_refresh_token_for_client_credentials=False)
    daemon = daemons(deployment)
    wait_for(lambda: accepted(deployment, "consented"), 20, "nothing published")
    assert "refresh_token" not in state_record(deployment, "consented")  # none to refresh with
    token = consent(deployment, "consented")

    result = keyturn(COMMAND, "-c", str(deployment.config_path), "consented", stdin=token + "\n")
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("consented: refresh token imported; refreshed with it; expires ")
    assert token not in result.stdout + result.stderr

    # The import used it at once (a refresh_token grant), and keyturn holds its successor. On
    # 3-second tokens the daemon may already have refreshed with that successor by now, so
    # the family has one used token or more; never a revoked one (no reuse).
    now = family(deployment, token)
    assert now["used"] >= 1 and now["active"] == 1 and now["revoked"] == 0, now
    assert deployment.sandbox.admin.introspect_token(token)["status"] == "used"
    record = state_record(deployment, "consented")
    assert record["refresh_token"] != token
    assert token not in json.dumps(record)
    # What the record holds is live (read again if a refresh replaced it between the reads).
    wait_for(
        lambda: (
            deployment.sandbox.admin.introspect_token(
                state_record(deployment, "consented")["refresh_token"]
            )["active"]
            is True
        ),
        5,
        "the record's refresh token is not active",
    )

    # The daemon goes on with refresh_token grants of that family, each token used once.
    time.sleep(5)  # 3-second tokens: at least two more refreshes
    after = family(deployment, token)
    assert after["used"] >= 3, after
    assert after["active"] == 1 and after["revoked"] == 0  # no reuse: no family revoked
    usage = deployment.sandbox.admin.usage()["oauth_clients"]
    assert usage[deployment.clients["consented"]["client_id"]]["refresh_token_reuses"] == 0
    assert '"grant_type": "refresh_token"' in deployment.sandbox.log_text()
    assert accepted(deployment, "consented")
    assert token not in daemon.log_text()


def test_a_refused_import_changes_nothing(deploy) -> None:
    deployment = deploy(["refusing"], lifetime=60)
    config = str(deployment.config_path)
    token = consent(deployment, "refusing")
    assert keyturn(COMMAND, "-c", config, "refusing", stdin=token).returncode == 0
    record_before = state_record(deployment, "refusing")
    version_before = published(deployment, "refusing")

    bogus = "ktsb_rt_" + uuid.uuid4().hex  # never issued (a paste of the wrong line)
    result = keyturn(COMMAND, "-c", config, "refusing", stdin=bogus + "\n")
    assert result.returncode == 1
    assert result.stdout == ""
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "keyturn import-refresh-token: refusing: refresh_token: the provider refused the "
        "imported refresh token (token endpoint returned invalid_grant"
    ), result.stderr
    assert line.endswith("it was not kept")
    assert bogus not in result.stderr
    record = state_record(deployment, "refusing")
    assert bogus not in json.dumps(record)
    assert record["refresh_token"] == record_before["refresh_token"]
    assert record.get("consecutive_failures") == record_before.get("consecutive_failures")
    assert "lease_owner" not in record
    assert published(deployment, "refusing") == version_before

    # What keyturn held still works: `keyturn refresh` uses it with a refresh_token grant.
    used = family(deployment, token)["used"]
    refreshed = keyturn("refresh", "-c", config, "refusing")
    assert refreshed.returncode == 0, refreshed.stderr
    assert family(deployment, token)["used"] == used + 1


def test_the_command_reads_one_line_of_stdin_and_only_for_an_oauth_client(deploy) -> None:
    deployment = deploy(["stdin-only"], lifetime=60)
    config = str(deployment.config_path)
    for stdin in ("", "\n", "first-line\nsecond-line\n", "tab\tinside"):
        result = keyturn(COMMAND, "-c", config, "stdin-only", stdin=stdin)
        assert result.returncode == 1
        assert "expected the refresh token as one line on standard input" in result.stderr
        assert "first-line" not in result.stderr
    missing = keyturn(COMMAND, "-c", config, "nobody", stdin="x")
    assert missing.returncode == 1
    assert "no credential named 'nobody'" in missing.stderr
    # Nothing reached the service or the record.
    usage = deployment.sandbox.admin.usage()["oauth_clients"]
    assert usage[deployment.clients["stdin-only"]["client_id"]]["oauth_requests"] == 0
    assert published(deployment, "stdin-only") is None


def test_the_env_input_seeds_the_daemon_once(deploy, daemons) -> None:
    deployment = deploy(["seeded"])
    variable = f"KT_TEST_RT_{uuid.uuid4().hex[:8].upper()}"
    text = deployment.config_path.read_text()
    deployment.config_path.write_text(
        text.replace('name = "seeded"\n', f'name = "seeded"\nrefresh_token = "env:{variable}"\n')
    )
    token = consent(deployment, "seeded")
    daemon = daemons(deployment, env={variable: token})
    wait_for(lambda: accepted(deployment, "seeded"), 20, "nothing published")
    daemon.wait_for_log('"refresh_token.seeded"', timeout=5)
    # The first grant was a refresh_token grant with the seeded token: none other was made
    # (client_credentials would not have returned a refresh token to keyturn).
    assert deployment.sandbox.admin.introspect_token(token)["status"] == "used"
    record = state_record(deployment, "seeded")
    assert record["refresh_token_input_fingerprint"].startswith("hmac-sha256:")
    assert token not in json.dumps(record)
    assert token not in daemon.log_text()

    # A restart with another value in the variable: keyturn owns the refresh token now and
    # does not read the input again; the new value is never presented.
    daemon.stop()
    other = consent(deployment, "seeded")
    used = family(deployment, token)["used"]
    restarted = daemons(deployment, env={variable: other})
    time.sleep(5)
    assert family(deployment, token)["used"] >= used + 2
    assert deployment.sandbox.admin.introspect_token(other)["status"] == "active"
    assert (
        state_record(deployment, "seeded")["refresh_token_input_fingerprint"]
        == (record["refresh_token_input_fingerprint"])
    )
    assert '"refresh_token.seeded"' not in restarted.log_paths[-1].read_text()
    assert accepted(deployment, "seeded")


def test_an_unresolvable_input_fails_its_credential_only(deploy, daemons) -> None:
    deployment = deploy(["unseeded", "healthy"])
    variable = f"KT_TEST_UNSET_{uuid.uuid4().hex[:8].upper()}"
    text = deployment.config_path.read_text()
    deployment.config_path.write_text(
        text.replace(
            'name = "unseeded"\n', f'name = "unseeded"\nrefresh_token = "env:{variable}"\n'
        )
    )
    daemons(deployment)
    wait_for(lambda: accepted(deployment, "healthy"), 20, "the healthy credential not served")

    def failed_twice() -> bool:
        try:
            record = state_record(deployment, "unseeded")
        except hvac.exceptions.InvalidPath:  # not written yet
            return False
        return int(record.get("consecutive_failures", "0")) >= 2

    wait_for(failed_twice, 10, "no retries with backoff")
    record = state_record(deployment, "unseeded")
    assert record["last_error"] == (
        f"unseeded: refresh_token: env:{variable}: environment variable {variable} is not set"
    )
    assert record["phase"] == "failing"
    assert published(deployment, "unseeded") is None
    # No silent client_credentials grant for it: the configured starting token is missing.
    usage = deployment.sandbox.admin.usage()["oauth_clients"]
    assert usage[deployment.clients["unseeded"]["client_id"]]["oauth_requests"] == 0
    assert accepted(deployment, "healthy")
