"""Whole-process behaviour: a full session whose log must hold none of the secrets it issued,
the command line's exits for bad configuration, and the bootstrap printout without a file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.sandbox import SandboxProcess

pytestmark = pytest.mark.sandbox


def _session(sandbox: SandboxProcess) -> list[str]:
    """Exercise every flow, including failures that echo secrets back; return every secret."""
    boot = sandbox.bootstrap
    oauth = boot["oauth_client"]
    secrets = [boot["admin_token"], boot["api_key"]["key"], oauth["client_secret"]]
    admin = sandbox.admin
    with loopback.client(base_url=sandbox.base_url, timeout=10) as http:

        def token(**body: str) -> dict[str, str]:
            response = http.post("/oauth/token", json=body)
            issued: dict[str, str] = response.json()
            secrets.extend(issued[k] for k in ("access_token", "refresh_token") if k in issued)
            return issued

        cc = token(grant_type="client_credentials", **oauth)
        form = http.post(
            "/oauth/token",
            data={"grant_type": "client_credentials"},
            auth=(oauth["client_id"], oauth["client_secret"]),
        ).json()
        secrets.extend([form["access_token"], form["refresh_token"]])
        refreshed = token(grant_type="refresh_token", refresh_token=cc["refresh_token"], **oauth)
        token(grant_type="refresh_token", refresh_token=cc["refresh_token"], **oauth)  # reuse
        for credential in (boot["api_key"]["key"], cc["access_token"], refreshed["access_token"]):
            http.get("/v1/users", headers={"Authorization": f"Bearer {credential}"})
            http.get(f"/v1/projects?access_token={credential}")

        key = admin.create_api_key("session", "log check")
        app = admin.create_oauth_app("session-app")
        rotated = admin.rotate_client_secret(app["client_id"], overlap_seconds=0)
        secrets.extend([key["key"], app["client_secret"], rotated["client_secret"]])
        token(
            grant_type="client_credentials",
            client_id=app["client_id"],
            client_secret=app["client_secret"],
        )  # the expired secret: invalid_client
        admin.revoke_api_key(key["key_id"])
        http.get("/v1/projects", headers={"Authorization": f"Bearer {key['key']}"})
        http.post(
            "/oauth/revoke",
            data={"token": form["refresh_token"]},
            auth=(oauth["client_id"], oauth["client_secret"]),
        )
        admin.revoke_token(refreshed["refresh_token"])
        # Malformed requests that carry secrets in them.
        http.post(
            "/oauth/token",
            content=f'{{"client_secret": "{oauth["client_secret"]}"',
            headers={"Content-Type": "application/json"},
        )
        http.post(
            "/oauth/token",
            content=f"client_secret={oauth['client_secret']}&x=1&x=2",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        http.get(f"/v1/{boot['api_key']['key']}")
        # A confused client with its secret in the client_id field.
        http.post(
            "/oauth/token",
            data={
                "grant_type": "client_credentials",
                "client_id": oauth["client_secret"],
                "client_secret": "x",
            },
        )
        http.get("/admin/usage", headers={"Authorization": f"Bearer {boot['api_key']['key']}"})
        admin.set_faults({"token": {"error_rate": 1}})
        token(grant_type="client_credentials", **oauth)
        admin.clear_faults()
        admin.update_settings(rate_limits={"users": {"requests": 1, "per_seconds": 60}})
        for _ in range(2):
            http.get("/v1/users", headers={"Authorization": f"Bearer {boot['api_key']['key']}"})
        admin.usage()
        admin.list_tokens()
    return secrets


def test_a_full_session_logs_no_secret_it_issued(tmp_path: Path) -> None:
    sandbox = SandboxProcess(workdir=tmp_path, log_level="debug").start()
    try:
        secrets = _session(sandbox)
    finally:
        assert sandbox.stop() == 0
    log = sandbox.log_text()
    events = [json.loads(line) for line in log.splitlines() if line.strip()]
    requests = [e for e in events if e.get("event") == "request"]
    assert len(requests) >= 30  # the access log did record the session
    assert {"client_id", "key_id", "oauth_error", "fault"} <= {k for e in requests for k in e}
    assert len(secrets) >= 12
    for secret in secrets:
        assert secret not in log
        assert secret[-24:] not in log  # not even a fragment


def test_a_bad_config_file_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "sandbox.toml"
    config.write_text("access_token_lifetime = -5\n[rate_limits]\ntoken = 3\n")
    result = subprocess.run(
        [sys.executable, "-m", "keyturn_devkit.sandbox", "--port", "0", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert f"{config}: access_token_lifetime: expected an integer" in result.stderr
    assert f"{config}: rate_limits.token: expected a table" in result.stderr


def test_without_a_bootstrap_file_the_credentials_are_printed_once(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "keyturn_devkit.sandbox", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        header = process.stdout.readline()
        assert "shown once" in header
        lines = [process.stdout.readline()]
        while lines[-1] not in ("}\n", ""):
            lines.append(process.stdout.readline())
        data = json.loads("".join(lines))
        response = HTTP.get(
            f"{data['base_url']}/v1/users",
            headers={"Authorization": f"Bearer {data['api_key']['key']}"},
        )
        assert response.status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    assert process.returncode == 0
    assert data["admin_token"] not in out + err


def test_the_keyturn_command_dispatches_to_the_sandbox(tmp_path: Path) -> None:
    bootstrap = tmp_path / "bootstrap.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keyturn",
            "sandbox",
            "--port",
            "0",
            "--bootstrap-out",
            str(bootstrap),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(300):
            if bootstrap.exists() or process.poll() is not None:
                break
            time.sleep(0.05)
        assert bootstrap.exists(), process.stderr.read() if process.stderr else ""
        base_url = json.loads(bootstrap.read_text())["base_url"]
        assert HTTP.get(f"{base_url}/healthz").status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=10)
    assert process.returncode == 0
