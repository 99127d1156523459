"""Local sinks with everything real: `keyturn run` as a process, a real OpenBao, the sandbox over
loopback HTTP, real files and a real `on_publish` command.

An app on keyturn's host reads its token from the sink file every 100 ms and calls the sandbox
with it; the command counts reloads. Then keyturn is killed, the file is put back to an old
value, and a restart catches the file up without a new token being requested.
"""

from __future__ import annotations

import json
import re
import signal
import stat
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from keyturn.clock import parse_rfc3339
from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess, Deployment, prepare_deployment

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

VAULT_VARIABLE = "VAULT_TOKEN"  # in keyturn's environment: must never reach the command

# The command: one line per run with what it was told on stdin, its argv and environment.
RELOAD = """\
import json, os, sys
params = json.loads(sys.stdin.read())
with open({log!r}, "a") as f:
    f.write(json.dumps({{"stdin": params, "argv": sys.argv[1:], "env": dict(os.environ)}}) + "\\n")
"""


@dataclass(frozen=True)
class Read:
    at: float
    version: int | None
    expires_at: float | None
    status: int | None
    problem: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.problem) or self.status != 200

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= self.at


@dataclass
class FileApp:
    """An app that reads its credential from the sink file every `interval` seconds and calls
    the service with the `authorization` it read."""

    path: Path
    service_url: str
    interval: float = 0.1
    reads: list[Read] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> FileApp:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="file-app")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        with loopback.client(base_url=self.service_url, timeout=3.0) as http:
            while not self._stop.is_set():
                self.reads.append(self.read_once(http))
                self._stop.wait(self.interval)

    def read_once(self, http: httpx.Client) -> Read:
        at = time.time()
        try:
            document = json.loads(self.path.read_text())
        except (OSError, ValueError) as error:  # missing, or a half-written file
            return Read(at, None, None, None, f"file: {type(error).__name__}")
        self.tokens.add(document["access_token"])
        expires_at = parse_rfc3339(document["expires_at"])
        try:
            answer = http.get("/v1/projects", headers={"Authorization": document["authorization"]})
        except httpx.HTTPError as error:
            return Read(at, document["version"], expires_at, None, f"service: {error!r}")
        return Read(at, document["version"], expires_at, answer.status_code)

    def versions(self) -> list[int]:
        return sorted({r.version for r in self.reads if r.version is not None})


@pytest.fixture
def deploy(
    openbao: OpenBaoDevServer, sandbox_factory: Callable[..., SandboxProcess], tmp_path: Path
) -> Callable[[int], tuple[Deployment, Path]]:
    """One credential `app` with a json sink (and its reload command) and a raw sink."""

    def make(lifetime: int) -> tuple[Deployment, Path]:
        sandbox = sandbox_factory({"access_token_lifetime": lifetime})
        deployment = prepare_deployment(
            openbao,
            sandbox,
            tmp_path,
            ["app"],
            namespace=f"s{uuid.uuid4().hex[:8]}",
            credential={
                "refresh": {"margin": "1s", "min_interval": "500ms"},
                "backoff": {"initial": "200ms", "max": "1s"},
            },
        )
        sinks = tmp_path / "sinks"
        sinks.mkdir()
        script = tmp_path / "reload.py"
        script.write_text(RELOAD.format(log=str(tmp_path / "reloads.jsonl")))
        command = json.dumps([sys.executable, str(script), "--service", "app"])
        # [[credentials.sinks]] belongs to the last [[credentials]] entry: `app`.
        with deployment.config_path.open("a") as config:
            config.write(
                textwrap.dedent(
                    f"""
                    [[credentials.sinks]]
                    path = "{sinks / "app.json"}"
                    format = "json"
                    mode = "0640"
                    on_publish = {{ command = {command}, timeout = "5s" }}

                    [[credentials.sinks]]
                    path = "{sinks / "app.token"}"
                    format = "raw"
                    """
                )
            )
        return deployment, sinks

    return make


@pytest.fixture
def daemon(tmp_path: Path, openbao: OpenBaoDevServer) -> Iterator[Callable[[Path], DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(config_path: Path) -> DaemonProcess:
        process = DaemonProcess(config_path, tmp_path, env={VAULT_VARIABLE: openbao.root_token})
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.stop()


def reloads(tmp_path: Path) -> list[dict[str, object]]:
    log = tmp_path / "reloads.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def published_version(deployment: Deployment) -> int:
    read = deployment.vault_client().secrets.kv.v2.read_secret_version(
        path=deployment.publish_to["app"], raise_on_deleted_version=True
    )
    return int(read["data"]["metadata"]["version"])


def sink_writes(daemon: DaemonProcess) -> dict[str, float]:
    """keyturn_sink_writes_total by result, scraped from the daemon's /metrics."""
    started = next(
        json.loads(line)
        for line in daemon.log_paths[-1].read_text().splitlines()
        if '"daemon.started"' in line
    )
    text = HTTP.get(f"{started['metrics']}/metrics", timeout=5).text
    found = re.findall(r'keyturn_sink_writes_total\{credential="app",result="(\w+)"\} (\S+)', text)
    return {result: float(value) for result, value in found}


def test_an_app_reading_the_sink_file_is_served_across_refreshes(
    deploy: Callable[[int], tuple[Deployment, Path]],
    daemon: Callable[[Path], DaemonProcess],
    tmp_path: Path,
) -> None:
    deployment, sinks = deploy(4)
    process = daemon(deployment.config_path)
    wait_for((sinks / "app.json").exists, 20, "the sink file was never written")
    first = json.loads((sinks / "app.json").read_text())["version"]
    app = FileApp(sinks / "app.json", deployment.sandbox.base_url).start()
    try:
        wait_for(lambda: app.versions()[-1:] >= [first + 3], 40, "three refreshes not seen")
    finally:
        app.stop()
    summary = (
        f"{len(app.reads)} reads of versions {app.versions()}, "
        f"{sum(r.failed for r in app.reads)} failed, {sum(r.expired for r in app.reads)} expired"
    )
    print(summary)
    assert len(app.reads) >= 50, summary
    assert [r for r in app.reads if r.failed or r.expired] == [], summary
    assert len(app.versions()) >= 4, summary

    # The raw sink holds the same token, bare; both files have their modes.
    assert (sinks / "app.token").read_text() in app.tokens
    assert stat.S_IMODE((sinks / "app.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((sinks / "app.token").stat().st_mode) == 0o600

    # The command ran once per write of the json file, after it, told the version and expiry.
    # (It runs after the write: the app may have read the last version a moment before.)
    newest = max(app.versions())
    wait_for(
        lambda: any(run["stdin"]["version"] == newest for run in reloads(tmp_path)),  # type: ignore[index]
        10,
        f"on_publish never ran for version {newest}",
    )
    runs = reloads(tmp_path)
    told = [run["stdin"]["version"] for run in runs]  # type: ignore[index]
    assert told == sorted(set(told)), "one run per version, in order"
    assert set(app.versions()) <= {first, *told}
    last = runs[-1]
    assert last["argv"] == ["--service", "app"]
    stdin = last["stdin"]
    assert isinstance(stdin, dict)
    assert set(stdin) == {
        "credential",
        "kind",
        "provider",
        "version",
        "path",
        "format",
        "expires_at",
        "refresh_at",
    }
    assert (stdin["credential"], stdin["format"]) == ("app", "json")
    env = last["env"]
    assert isinstance(env, dict)
    assert VAULT_VARIABLE not in env
    assert not [k for k in env if k.upper().startswith(("KEYTURN_", "VAULT_", "BAO_"))]

    # No token in keyturn's log or in anything the command was given.
    log, given = process.log_text(), json.dumps(runs)
    for token in app.tokens:
        assert token not in log
        assert token not in given
    # Two sinks, four versions at least: each sink writes in its own task, so the raw one may
    # still be writing the version the app just read from the json one.
    wait_for(
        lambda: sink_writes(process).get("written", 0) >= 2 * 4, 10, "each sink wrote 4 versions"
    )
    counted = sink_writes(process)
    assert set(counted) == {"written"}, counted
    # SIGTERM: the sinks' tasks stop with the daemon, which exits cleanly.
    assert process.stop() == 0
    assert '"daemon.stopped"' in process.log_text()


def test_a_restart_catches_a_stale_sink_file_up_without_a_refresh(
    deploy: Callable[[int], tuple[Deployment, Path]],
    daemon: Callable[[Path], DaemonProcess],
    tmp_path: Path,
) -> None:
    deployment, sinks = deploy(120)
    process = daemon(deployment.config_path)
    wait_for(
        lambda: (sinks / "app.token").exists() and len(reloads(tmp_path)) == 1,
        20,
        "the sink files were never written",
    )
    current = (sinks / "app.json").read_text()
    version = published_version(deployment)
    assert json.loads(current)["version"] == version
    assert process.stop(signal.SIGKILL) != 0

    # As if keyturn had died between a publish and its write: an old value in one file, the
    # other file gone.
    stale = json.loads(current)
    stale.update(version=version - 1, access_token="at_an-old-token")
    (sinks / "app.json").write_text(json.dumps(stale))
    (sinks / "app.token").unlink()
    requests = token_requests(deployment)
    runs = len(reloads(tmp_path))

    process = daemon(deployment.config_path)  # returns once daemon.started is logged
    wait_for(
        lambda: (sinks / "app.json").read_text() == current and (sinks / "app.token").exists(),
        5,
        "the sink files were not caught up at start",
    )
    assert stat.S_IMODE((sinks / "app.json").stat().st_mode) == 0o640
    assert (sinks / "app.token").read_text() == json.loads(current)["access_token"]
    # Nothing was requested or published: the files followed what Vault already held.
    time.sleep(1)
    assert token_requests(deployment) == requests
    assert published_version(deployment) == version
    assert [r["stdin"]["version"] for r in reloads(tmp_path)[runs:]] == [version]  # type: ignore[index]
    assert sink_writes(process) == {"written": 2.0}
    assert '"sink.written"' in process.log_text()


def token_requests(deployment: Deployment) -> int:
    usage = deployment.sandbox.admin.usage()["oauth_clients"]
    return sum(usage[c["client_id"]]["oauth_requests"] for c in deployment.clients.values())
