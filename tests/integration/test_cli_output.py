"""What the one-shot commands write where, against a real OpenBao and the sandbox: the result
on stdout, problems on stderr, log events in the `--log-format` asked for; and `keyturn
status`'s exit codes (0 all ok, 3 some credential not ok, 1 could not read, 2 usage)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import hvac
import pytest

from keyturn.clock import parse_rfc3339
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import Deployment, prepare_deployment
from keyturn_devkit.harness.key_rotation import run_keyturn

WRONG_SECRET = f"wrong-secret-{uuid.uuid4().hex}"


@pytest.fixture
def deployment(openbao: OpenBaoDevServer, sandbox: SandboxProcess, tmp_path: Path) -> Deployment:
    """Two OAuth clients, `alpha` and `beta`, never refreshed yet."""
    return prepare_deployment(
        openbao, sandbox, tmp_path, ["alpha", "beta"], namespace=f"t{uuid.uuid4().hex[:8]}"
    )


def break_beta(deployment: Deployment, vault_client: hvac.Client) -> None:
    """beta's client secret in Vault is one the sandbox never issued."""
    vault_client.secrets.kv.v2.create_or_update_secret(
        path=deployment.input_paths["beta"],
        secret={
            "client_id": deployment.clients["beta"]["client_id"],
            "client_secret": WRONG_SECRET,
        },
    )


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_refresh_prints_its_result_on_stdout_and_nothing_else(deployment: Deployment) -> None:
    config = str(deployment.config_path)
    result = run_keyturn("--log-format", "json", "refresh", "-c", config, "alpha")
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("alpha: refreshed; expires ")
    assert parse_rfc3339(line.rsplit(" ", 1)[1]) > 0
    assert json_lines(result.stderr) == []  # warnings only, and there were none
    assert deployment.clients["alpha"]["client_secret"] not in result.stdout + result.stderr


def test_a_failed_refresh_logs_json_lines_and_its_problem_on_stderr(
    deployment: Deployment, vault_client: hvac.Client
) -> None:
    break_beta(deployment, vault_client)
    result = run_keyturn(
        "--log-format", "json", "refresh", "-c", str(deployment.config_path), "beta"
    )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    events = json_lines("\n".join(line for line in lines if line.startswith("{")))
    problems = [line for line in lines if not line.startswith("{")]
    failed = [e for e in events if e["event"] == "credential.failed"]
    assert failed, result.stderr
    assert failed[0]["credential"] == "beta"
    assert failed[0]["level"] == "warning"
    assert all({"timestamp", "level", "logger", "event"} <= set(e) for e in events)
    assert all(e["level"] in ("warning", "error", "critical") for e in events)
    # The command's own line: plain text, naming what went wrong, after the log events.
    assert problems == [lines[-1]]
    assert problems[0].startswith("keyturn refresh: ")
    assert "invalid_client" in problems[0]
    assert WRONG_SECRET not in result.stderr


def test_console_log_format_after_the_command_name(
    deployment: Deployment, vault_client: hvac.Client
) -> None:
    break_beta(deployment, vault_client)
    result = run_keyturn(
        "refresh", "-c", str(deployment.config_path), "beta", "--log-format", "console"
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert not any(line.startswith("{") for line in lines), result.stderr
    failed = [line for line in lines if "credential.failed" in line]
    assert failed, result.stderr
    assert "[warning" in failed[0]
    assert "credential=beta" in failed[0]
    assert "\x1b[" not in result.stderr  # not a terminal: no colours
    assert lines[-1].startswith("keyturn refresh: ")
    assert WRONG_SECRET not in result.stderr


def test_status_exit_codes(deployment: Deployment, vault_client: hvac.Client) -> None:
    config = str(deployment.config_path)

    # Nothing refreshed yet: both pending, which is not ok (3, not argparse's 2).
    result = run_keyturn("status", "-c", config, "--log-format", "json")
    assert result.returncode == 3, result.stderr
    table = result.stdout.splitlines()
    assert table[0].split()[:4] == ["CREDENTIAL", "KIND", "PROVIDER", "PHASE"]
    assert [line.split()[3] for line in table[1:]] == ["pending", "pending"]
    assert json_lines(result.stderr) == []

    # alpha refreshed: alone it is ok (0); with beta, still not ok (3).
    assert run_keyturn("refresh", "-c", config, "alpha").returncode == 0
    result = run_keyturn("--log-format", "json", "status", "-c", config, "alpha", "--json")
    assert result.returncode == 0, result.stderr
    [row] = json_lines(result.stdout)
    assert (row["credential"], row["phase"], row["published_version"]) == ("alpha", "ok", 1)
    assert parse_rfc3339(str(row["expires_at"])) > parse_rfc3339(str(row["last_success"]))
    assert json_lines(result.stderr) == []
    result = run_keyturn("status", "-c", config)
    assert result.returncode == 3
    alpha = next(line for line in result.stdout.splitlines() if line.startswith("alpha "))
    # The last success, relative: "now" within the first second, "… ago" after.
    assert " ok " in alpha and "expires in " in alpha
    assert " ago (" in alpha or " now (" in alpha, alpha

    # beta failing: 3, and the row says why.
    break_beta(deployment, vault_client)
    assert run_keyturn("refresh", "-c", config, "beta").returncode == 1
    result = run_keyturn("status", "-c", config, "beta", "--json")
    assert result.returncode == 3
    [row] = json_lines(result.stdout)
    assert row["phase"] == "failing" and row["consecutive_failures"] == 1
    assert "invalid_client" in str(row["last_error"])

    # A name the configuration does not have: 1, before anything is read.
    result = run_keyturn("status", "-c", config, "alpha", "nope")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == f"keyturn status: no credential named 'nope' in {config}"

    # A usage error stays argparse's 2.
    assert run_keyturn("status", "-c", config, "--no-such-option").returncode == 2


def test_status_is_1_when_it_cannot_read(
    deployment: Deployment, vault_client: hvac.Client, tmp_path: Path
) -> None:
    config = str(deployment.config_path)
    assert run_keyturn("refresh", "-c", config, "alpha").returncode == 0

    # A record that cannot be read: the table still shows every row, and the exit code is 1.
    vault_client.secrets.kv.v2.create_or_update_secret(
        path=f"{deployment.state_prefix}/beta", secret={"phase": "ok", "expires_at": "soon"}
    )
    result = run_keyturn("status", "-c", config, "--json")
    assert result.returncode == 1
    rows = {row["credential"]: row for row in json_lines(result.stdout)}
    assert rows["alpha"]["phase"] == "ok"
    assert rows["beta"]["phase"] == "unknown"
    assert result.stderr.strip() == f"keyturn status: {rows['beta']['last_error']}"
    assert "expires_at" in result.stderr

    # Vault unreachable: 1, nothing on stdout.
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text(
        deployment.config_path.read_text().replace(deployment.vault.address, "http://127.0.0.1:1")
    )
    result = run_keyturn("status", "-c", str(elsewhere))
    assert result.returncode == 1, result.stdout
    assert result.stdout == ""
    assert result.stderr.startswith("keyturn status: ")
