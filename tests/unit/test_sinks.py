"""Local sinks over fakes: FakeVaultStore holds what keyturn published, FakeClock paces retries,
files are real files in tmp_path and `on_publish` commands are real child processes (small
Python scripts run with sys.executable that record what they were given)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import structlog
from prometheus_client import CollectorRegistry

from keyturn.clock import FakeClock, rfc3339
from keyturn.config import Config, parse_config
from keyturn.errors import ConfigError, VaultUnavailable
from keyturn.events import Published, Restored
from keyturn.kinds.api_key import published_fields as api_key_published_fields
from keyturn.kinds.oauth_client.refresh import published_fields as oauth_published_fields
from keyturn.logs import configure_logging
from keyturn.observability.metrics import PrometheusObserver
from keyturn.secret import Secret
from keyturn.sinks import SinkManager, parse_record, render, write_atomically
from keyturn.testing.vault import FakeVaultStore

TOKEN = "at_THE-ACCESS-TOKEN-never-shown"
NEWER = "at_THE-NEWER-TOKEN-never-shown"
KEY = "ktsb_key_THE-API-KEY-never-shown"
VAULT_TOKEN = "hvs.the-vault-token-never-shown"
ENVIRON = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "KEEP_ME": "visible",
    "VAULT_TOKEN": VAULT_TOKEN,
    "BAO_TOKEN": "bao-token-never-shown",
    "KEYTURN_VAULT_AUTH_TOKEN": "override-never-shown",
}
SECRETS = [TOKEN, NEWER, KEY, VAULT_TOKEN, "bao-token-never-shown", "override-never-shown"]
REPORTING = "apps/reporting/acme"
BILLING = "apps/billing/key"

CONFIG = """\
[vault]
address = "https://vault.example.com"
auth = {{ method = "token", token = "env:VAULT_TOKEN" }}

[[providers]]
name = "acme"
base_url = "https://acme.example.com"

[[credentials]]
name = "reporting"
provider = "acme"
kind = "oauth_client"
client_id = "reporting-app"
client_secret = "env:REPORTING_SECRET"
publish_to = "{reporting_path}"
sinks = [{reporting}]

[[credentials]]
name = "billing-key"
provider = "acme"
kind = "api_key"
publish_to = "{billing_path}"
probe = "/v1/users"
rotation = {{ max_age = "30d", rotator = "by-hand" }}
sinks = [{billing}]

[[rotators]]
name = "by-hand"
type = "manual"
"""


def config(reporting: str = "", billing: str = "") -> Config:
    text = CONFIG.format(
        reporting=reporting, billing=billing, reporting_path=REPORTING, billing_path=BILLING
    )
    return parse_config(text, "/etc/keyturn/keyturn.toml", {})


def sink(path: Path, fmt: str = "json", mode: str = "0640", extra: str = "") -> str:
    return f'{{ path = "{path}", format = "{fmt}", mode = "{mode}"{extra} }}'


def hook(script: Path, timeout: str = "10s") -> str:
    command = json.dumps([sys.executable, str(script), "--app", "reporting"])
    return f', on_publish = {{ command = {command}, timeout = "{timeout}" }}'


# A hook records its argv, environment and stdin, and what the sink's file held when it ran.
HOOK = """\
import json, os, sys, time
params = json.loads(sys.stdin.read())
with open(params["path"], "rb") as f:
    seen = f.read().decode()
record = {{"argv": sys.argv[1:], "env": dict(os.environ), "stdin": params, "file": seen}}
with open({log!r}, "a") as f:
    f.write(json.dumps(record) + "\\n")
"""


def hook_script(tmp_path: Path, body: str = "", name: str = "hook.py") -> Path:
    script = tmp_path / name
    log = str(tmp_path / f"{name}.log")
    script.write_text(HOOK.format(log=log) + textwrap.dedent(body))
    return script


def hook_runs(script: Path) -> list[dict[str, object]]:
    log = script.parent / f"{script.name}.log"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


class World:
    """A fake Vault on a fake clock, and a sink manager over a configuration. Every manager
    made in a test is stopped at its end (`_stop_every_manager`)."""

    made: ClassVar[list[SinkManager]] = []

    def __init__(self, cfg: Config) -> None:
        self.clock = FakeClock()
        self.store = FakeVaultStore(clock=self.clock)
        self.results: list[tuple[str, str]] = []
        self.manager = SinkManager(
            cfg,
            store=self.store,
            clock=self.clock,
            environ=ENVIRON,
            on_result=lambda name, result: self.results.append((name, result)),
        )
        World.made.append(self.manager)

    def restarted(self, cfg: Config) -> SinkManager:
        """Another process's manager over the same Vault (a restart)."""
        manager = SinkManager(cfg, store=self.store, clock=self.clock, environ=ENVIRON)
        World.made.append(manager)
        return manager

    async def publish(self, token: str = TOKEN, lifetime: float = 600.0) -> int:
        now = self.clock.time()
        fields = oauth_published_fields(Secret(token), now, now + lifetime, now + 400)
        return await self.store.write(REPORTING, fields, cas=None)

    async def publish_key(self, key: str = KEY) -> int:
        now = self.clock.time()
        fields = api_key_published_fields(Secret(key), "key_7", now, now + 30 * 86400)
        return await self.store.write(BILLING, fields, cas=None)


@pytest.fixture(autouse=True)
async def _stop_every_manager() -> AsyncIterator[None]:
    yield
    made, World.made = World.made, []
    for manager in made:
        await manager.stop(timeout=5)


@pytest.fixture
def logs() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("debug", stream=stream, fmt="json")
    yield stream
    logging.getLogger().handlers.clear()
    structlog.reset_defaults()


def events(stream: io.StringIO, name: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [line for line in lines if line.get("event") == name]


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# -- the three formats ---------------------------------------------------------------------------


async def test_a_json_sink_holds_every_published_field_its_version_and_credential(
    tmp_path: Path,
) -> None:
    path = tmp_path / "reporting.json"
    world = World(config(reporting=sink(path, "json", "0640")))
    version = await world.publish()
    [report] = await world.manager.sync("reporting")
    assert (report.result, report.version) == ("written", version)
    now = world.clock.time()
    assert json.loads(path.read_text()) == {
        "access_token": TOKEN,
        "authorization": f"Bearer {TOKEN}",
        "token_type": "Bearer",
        "expires_at": rfc3339(now + 600),
        "issued_at": rfc3339(now),
        "refresh_at": rfc3339(now + 400),
        "credential": "reporting",
        "version": version,
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert world.results == [("reporting", "written")]
    # The published path is read consistently: a lagging standby never rolls a file back.
    assert world.store.reads == [("read", REPORTING, True)]


async def test_a_raw_sink_holds_the_bare_token_or_key(tmp_path: Path) -> None:
    token_file, key_file = tmp_path / "token", tmp_path / "key"
    world = World(config(reporting=sink(token_file, "raw"), billing=sink(key_file, "raw", "0600")))
    await world.publish()
    await world.publish_key()
    await world.manager.sync("reporting")
    await world.manager.sync("billing-key")
    assert token_file.read_bytes() == TOKEN.encode()
    assert key_file.read_bytes() == KEY.encode()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


async def test_an_env_sink_reads_back_in_a_shell_with_every_field(tmp_path: Path) -> None:
    path = tmp_path / "reporting.env"
    world = World(config(reporting=sink(path, "env", extra=', env_prefix = "REPORTING_"')))
    # A token may hold any visible ASCII character (RFC 6749 VSCHAR): quoting must survive it.
    awkward = "at_\"quoted\" $HOME `id` \\back 'single'"
    version = await world.publish(awkward)
    await world.manager.sync("reporting")
    text = path.read_text()
    assert text.startswith("REPORTING_ACCESS_TOKEN=")
    assert f"REPORTING_VERSION={version}\n" in text
    assert "REPORTING_TOKEN_TYPE=Bearer\n" in text  # plain values stay unquoted
    shell = await asyncio.to_thread(
        subprocess.run,
        [
            "sh",
            "-c",
            '. "$1"; printf "%s\\n%s\\n%s" "$REPORTING_ACCESS_TOKEN" '
            '"$REPORTING_AUTHORIZATION" "$REPORTING_EXPIRES_AT"',
            "sh",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": ENVIRON["PATH"], "HOME": "/nowhere"},
    )
    shown = shell.stdout.split("\n")
    now = world.clock.time()
    assert shown == [awkward, f"Bearer {awkward}", rfc3339(now + 600)]


async def test_an_api_key_env_sink_names_its_fields(tmp_path: Path) -> None:
    path = tmp_path / "billing.env"
    world = World(config(billing=sink(path, "env")))
    await world.publish_key()
    await world.manager.sync("billing-key")
    names = [line.split("=", 1)[0] for line in path.read_text().splitlines()]
    assert names == [
        "KEYTURN_API_KEY",
        "KEYTURN_AUTHORIZATION",
        "KEYTURN_CREATED_AT",
        "KEYTURN_KEY_ID",
        "KEYTURN_ROTATE_AFTER",
        "KEYTURN_VERSION",
    ]


# -- writing -------------------------------------------------------------------------------------


def test_a_write_replaces_the_file_by_rename_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_bytes(b"old")
    os.link(path, tmp_path / "reader-holds-the-old-file")
    write_atomically(path, b"new", 0o640)
    # The old inode was never written to: a reader that opened it still reads the whole old
    # file, and the new content arrived as another file.
    assert (tmp_path / "reader-holds-the-old-file").read_bytes() == b"old"
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reader-holds-the-old-file", "token"]


async def test_a_symlink_at_the_path_is_replaced_not_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not keyturn's")
    path = tmp_path / "token"
    path.symlink_to(elsewhere)
    world = World(config(reporting=sink(path, "raw")))
    await world.publish()
    await world.manager.sync("reporting")
    assert not path.is_symlink()
    assert path.read_text() == TOKEN
    assert elsewhere.read_text() == "not keyturn's"


async def test_an_unchanged_file_is_not_written_again_nor_its_command_run(tmp_path: Path) -> None:
    path = tmp_path / "reporting.json"
    script = hook_script(tmp_path)
    world = World(config(reporting=sink(path, extra=hook(script))))
    await world.publish()
    await world.manager.sync("reporting")
    inode = path.stat().st_ino
    [again] = await world.manager.sync("reporting")
    assert again.result == "unchanged"
    assert path.stat().st_ino == inode
    assert len(hook_runs(script)) == 1
    # A file whose mode was changed is put right.
    path.chmod(0o600)
    [fixed] = await world.manager.sync("reporting")
    assert fixed.result == "written"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


async def test_temporary_files_a_crash_left_are_removed_at_the_first_pass(tmp_path: Path) -> None:
    path = tmp_path / "token"
    leftover = tmp_path / ".token.abc123.keyturn-tmp"
    leftover.write_text("half a token")
    unrelated = tmp_path / ".other.abc123.keyturn-tmp"
    unrelated.write_text("someone else's")
    world = World(config(reporting=sink(path, "raw")))
    await world.publish()
    await world.manager.sync("reporting")
    assert not leftover.exists()
    assert unrelated.exists()


# -- on_publish ----------------------------------------------------------------------------------


async def test_the_command_gets_credential_version_and_expiry_on_stdin_never_the_value(
    tmp_path: Path,
) -> None:
    path = tmp_path / "reporting.json"
    script = hook_script(tmp_path)
    world = World(config(reporting=sink(path, extra=hook(script))))
    version = await world.publish()
    await world.manager.sync("reporting")
    [run] = hook_runs(script)
    now = world.clock.time()
    assert run["stdin"] == {
        "credential": "reporting",
        "kind": "oauth_client",
        "provider": "acme",
        "version": version,
        "path": str(path),
        "format": "json",
        "expires_at": rfc3339(now + 600),
        "refresh_at": rfc3339(now + 400),
    }
    assert run["argv"] == ["--app", "reporting"]
    # It runs after the file is in place.
    assert json.loads(str(run["file"]))["version"] == version
    env = run["env"]
    assert isinstance(env, dict)
    assert env["KEEP_ME"] == "visible"
    assert not [k for k in env if k.upper().startswith(("KEYTURN_", "VAULT_", "BAO_"))]
    assert not [k for k, v in env.items() if any(s in v for s in SECRETS)]


async def test_an_api_keys_command_is_told_its_rotate_after(tmp_path: Path) -> None:
    script = hook_script(tmp_path)
    world = World(config(billing=sink(tmp_path / "key", "raw", extra=hook(script))))
    await world.publish_key()
    await world.manager.sync("billing-key")
    [run] = hook_runs(script)
    stdin = run["stdin"]
    assert isinstance(stdin, dict)
    rotate_after = rfc3339(world.clock.time() + 30 * 86400)
    assert (stdin["kind"], stdin["expires_at"], stdin["refresh_at"]) == (
        "api_key",
        rotate_after,
        rotate_after,
    )


async def test_a_failing_command_is_reported_with_its_stderr_without_the_secret(
    tmp_path: Path, logs: io.StringIO
) -> None:
    path = tmp_path / "token"
    # The command reads the token from the file and prints it in its complaint.
    script = hook_script(
        tmp_path,
        'print("reload refused for " + seen, file=sys.stderr)\nsys.exit(3)\n',
    )
    world = World(config(reporting=sink(path, "raw", extra=hook(script))))
    await world.publish()
    [report] = await world.manager.sync("reporting")
    assert report.result == "hook_failed"
    assert path.read_text() == TOKEN  # the file was written all the same
    assert report.error == (
        f"reporting: sink {path}: on_publish: {sys.executable} exited with code 3: "
        "reload refused for [redacted]"
    )
    assert world.results == [("reporting", "hook_failed")]
    [logged] = events(logs, "sink.hook_failed")
    assert (logged["credential"], logged["sink"], logged["level"]) == (
        "reporting",
        str(path),
        "warning",
    )
    # Not run again for the same file: it runs after the next write.
    [again] = await world.manager.sync("reporting")
    assert again.result == "unchanged"
    assert len(hook_runs(script)) == 1
    assert TOKEN not in logs.getvalue()


async def test_a_command_past_its_timeout_is_killed_with_its_whole_process_group(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = hook_script(
        tmp_path,
        f"""
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
        """,
    )
    world = World(config(reporting=sink(tmp_path / "token", "raw", extra=hook(script, "500ms"))))
    await world.publish()
    started = time.monotonic()
    [report] = await world.manager.sync("reporting")
    assert time.monotonic() - started < 10
    assert report.result == "hook_failed"
    assert report.error is not None
    assert "timed out after 0.5s (its process group was killed)" in report.error
    grandchild = int(pid_file.read_text())
    await eventually(lambda: not alive(grandchild))


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status  # a zombie waiting for init is dead


async def test_a_command_that_cannot_start_is_a_hook_failure(tmp_path: Path) -> None:
    extra = ', on_publish = { command = ["/nonexistent/reload"] }'
    world = World(config(reporting=sink(tmp_path / "token", "raw", extra=extra)))
    await world.publish()
    [report] = await world.manager.sync("reporting")
    assert report.result == "hook_failed"
    assert report.error is not None
    assert "on_publish: cannot run /nonexistent/reload: No such file or directory" in report.error


# -- bad input and failures ----------------------------------------------------------------------


async def test_a_record_without_expires_at_is_named_and_the_file_left_alone(
    tmp_path: Path, logs: io.StringIO
) -> None:
    path, other = tmp_path / "reporting.json", tmp_path / "billing-key"
    path.write_text("what was there")
    world = World(config(reporting=sink(path), billing=sink(other, "raw")))
    await world.publish()
    fields = dict((await world.store.read(REPORTING)).data)  # type: ignore[union-attr]
    del fields["expires_at"]
    version = world.store.external_write(REPORTING, fields)
    await world.publish_key()
    [report] = await world.manager.sync("reporting")
    assert report.result == "invalid_record"
    assert report.error == (
        f"reporting: sink {path}: the published record (version {version}) has no expires_at; "
        "the file is left as it was"
    )
    assert path.read_text() == "what was there"
    [logged] = events(logs, "sink.invalid_record")
    assert logged["error"] == report.error
    # The other credential's sink is served as ever.
    [written] = await world.manager.sync("billing-key")
    assert written.result == "written"
    assert ("reporting", "invalid_record") in world.results
    assert TOKEN not in logs.getvalue()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"access_token": ""}, "has no access_token"),
        ({"expires_at": "tomorrow"}, "has an expires_at that is not an RFC 3339 time"),
        (
            {"authorization": f"Bearer {TOKEN}\nEVIL=1"},
            "has a field 'authorization' with a control",
        ),
    ],
)
async def test_a_record_keyturn_cannot_trust_is_refused_without_echoing_it(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    world = World(config(reporting=sink(tmp_path / "reporting.env", "env")))
    await world.publish()
    fields = dict((await world.store.read(REPORTING)).data)  # type: ignore[union-attr]
    world.store.external_write(REPORTING, {**fields, **change})
    [report] = await world.manager.sync("reporting")
    assert report.result == "invalid_record"
    assert report.error is not None
    assert message in report.error
    assert TOKEN not in report.error
    assert not (tmp_path / "reporting.env").exists()


async def test_a_missing_directory_is_reported_then_retried_until_it_exists(
    tmp_path: Path, logs: io.StringIO
) -> None:
    directory = tmp_path / "run" / "keyturn"
    path = directory / "token"
    world = World(config(reporting=sink(path, "raw")))
    await world.publish()
    world.manager.start()
    await eventually(lambda: ("reporting", "write_failed") in world.results)
    [logged] = events(logs, "sink.write_failed")
    assert logged["error"] == (
        f"reporting: sink {path}: cannot write the file: its directory {directory} does not "
        "exist (No such file or directory)"
    )
    assert logged["level"] == "error"
    directory.mkdir(parents=True)
    await eventually(lambda: world.clock.sleepers == 1)
    world.clock.advance(1.0)  # the first retry comes after 1 s
    await eventually(lambda: ("reporting", "written") in world.results)
    assert path.read_text() == TOKEN
    await world.manager.stop(timeout=5)
    assert TOKEN not in logs.getvalue()


async def test_a_path_that_is_a_directory_is_a_clear_write_failure(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.mkdir()
    world = World(config(reporting=sink(path, "raw")))
    await world.publish()
    [report] = await world.manager.sync("reporting")
    assert report.result == "write_failed"
    assert report.error == f"reporting: sink {path}: cannot write the file: Is a directory"


async def test_a_vault_read_failure_is_retried_with_backoff(tmp_path: Path) -> None:
    path = tmp_path / "token"
    world = World(config(reporting=sink(path, "raw")))
    await world.publish()
    world.store.fail_next(VaultUnavailable("vault is sealed"))
    world.manager.start()
    await eventually(lambda: ("reporting", "read_failed") in world.results)
    assert not path.exists()
    await eventually(lambda: world.clock.sleepers == 1)
    world.clock.advance(1.0)
    await eventually(path.exists)
    assert path.read_text() == TOKEN
    await world.manager.stop(timeout=5)


async def test_nothing_published_yet_writes_nothing(tmp_path: Path) -> None:
    world = World(config(reporting=sink(tmp_path / "token", "raw")))
    assert await world.manager.sync("reporting") == []
    assert not (tmp_path / "token").exists()


# -- the workers: latest wins, start-up, isolation -----------------------------------------------


async def test_latest_wins_versions_published_during_a_pass_are_skipped_to_the_newest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "reporting.json"
    release = tmp_path / "release"
    script = hook_script(
        tmp_path,
        f"""
        while not os.path.exists({str(release)!r}):
            time.sleep(0.02)
        """,
    )
    world = World(config(reporting=sink(path, extra=hook(script))))
    first = await world.publish()
    world.manager.start()
    await eventually(lambda: len(hook_runs(script)) == 1)  # the command of v1 is running
    await world.publish(NEWER)
    world.manager.notify("reporting")
    latest = await world.publish(NEWER + "-3")
    world.manager.notify("reporting")
    release.touch()
    await asyncio.wait_for(world.manager.settled(), timeout=10)
    assert [run["stdin"]["version"] for run in hook_runs(script)] == [first, latest]  # type: ignore[index]
    assert json.loads(path.read_text())["version"] == latest
    await world.manager.stop(timeout=5)


async def test_at_start_a_stale_file_is_caught_up_without_a_publish(tmp_path: Path) -> None:
    path = tmp_path / "reporting.json"
    script = hook_script(tmp_path)
    cfg = config(reporting=sink(path, extra=hook(script)))
    world = World(cfg)
    await world.publish()
    await world.manager.sync("reporting")
    stale = path.read_bytes()
    latest = await world.publish(NEWER)  # published, then keyturn died before the sink wrote
    path.write_bytes(stale)
    path.chmod(0o640)
    restarted = world.restarted(cfg)
    restarted.start()
    await asyncio.wait_for(restarted.settled(), timeout=10)
    assert json.loads(path.read_text())["version"] == latest
    assert [run["stdin"]["version"] for run in hook_runs(script)][-1] == latest  # type: ignore[index]
    runs = len(hook_runs(script))
    await restarted.stop(timeout=5)
    # A file found current at start is left alone, and its command is not run.
    again = world.restarted(cfg)
    inode = path.stat().st_ino
    again.start()
    await asyncio.wait_for(again.settled(), timeout=10)
    assert path.stat().st_ino == inode
    assert len(hook_runs(script)) == runs
    await again.stop(timeout=5)


async def test_a_hanging_command_holds_up_neither_events_nor_other_credentials(
    tmp_path: Path,
) -> None:
    script = hook_script(tmp_path, "time.sleep(60)\n")
    world = World(
        config(
            reporting=sink(tmp_path / "token", "raw", extra=hook(script, "30s")),
            billing=sink(tmp_path / "key", "raw"),
        )
    )
    await world.publish()
    world.manager.start()
    await eventually(lambda: len(hook_runs(script)) == 1)
    observer = world.manager.observer()
    started = time.monotonic()
    observer(Published("reporting", "acme", "oauth_client", 1.0, 2.0))
    observer(Restored("billing-key", "acme", "api_key", 3.0, 4.0, None, 0))
    # Events only wake a worker; a safety bound, far under the 60 s the command hangs for.
    assert time.monotonic() - started < 5
    await world.publish_key()
    observer(Published("billing-key", "acme", "api_key", 5.0, 6.0))
    await eventually((tmp_path / "key").exists)
    assert (tmp_path / "key").read_text() == KEY
    started = time.monotonic()
    await world.manager.stop(timeout=0.5)  # the hanging command is killed at the deadline
    assert time.monotonic() - started < 5


async def test_a_slow_command_never_holds_up_another_file_of_the_credential(
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    script = hook_script(
        tmp_path,
        f"""
        while not os.path.exists({str(release)!r}):
            time.sleep(0.02)
        """,
    )
    first, second = tmp_path / "first.json", tmp_path / "second"
    world = World(config(reporting=sink(first, extra=hook(script)) + ", " + sink(second, "raw")))
    await world.publish()
    world.manager.start()
    await eventually(lambda: len(hook_runs(script)) == 1)
    await eventually(second.exists)  # while the first file's command still runs
    assert second.read_text() == TOKEN
    release.touch()
    await asyncio.wait_for(world.manager.settled(), timeout=10)
    assert world.results == [("reporting", "written"), ("reporting", "written")]


async def test_journal_times_not_seen_before_wake_the_sinks(tmp_path: Path) -> None:
    """Another instance (or `keyturn refresh`) published: this process learns of it from the
    journal at its next run of the credential, and its files follow."""
    path = tmp_path / "token"
    world = World(config(reporting=sink(path, "raw")))
    await world.publish()
    world.manager.start()
    await asyncio.wait_for(world.manager.settled(), timeout=10)
    observer = world.manager.observer()
    observer(Restored("reporting", "acme", "oauth_client", 10.0, 20.0, None, 0))
    await asyncio.wait_for(world.manager.settled(), timeout=10)
    reads = len(world.store.reads)
    observer(Restored("reporting", "acme", "oauth_client", 10.0, 20.0, None, 0))  # seen: no read
    await asyncio.wait_for(world.manager.settled(), timeout=10)
    assert len(world.store.reads) == reads
    await world.publish(NEWER)
    observer(Restored("reporting", "acme", "oauth_client", 30.0, 40.0, None, 0))
    await eventually(lambda: path.read_text() == NEWER)
    await world.manager.stop(timeout=5)


async def test_a_reload_follows_added_changed_and_removed_sinks(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    world = World(config(reporting=sink(first, "raw")))
    await world.publish()
    world.manager.start()
    await eventually(first.exists)
    world.manager.configure(config(reporting=sink(second, "json")))
    await eventually(second.exists)
    assert json.loads(second.read_text())["access_token"] == TOKEN
    world.manager.configure(config())
    assert world.manager.credentials == []
    await world.publish(NEWER)
    world.manager.notify("reporting")
    await asyncio.sleep(0.1)
    assert json.loads(second.read_text())["access_token"] == TOKEN
    await world.manager.stop(timeout=5)


async def test_stop_lets_a_pass_under_way_finish(tmp_path: Path) -> None:
    path = tmp_path / "token"
    script = hook_script(tmp_path, "time.sleep(0.5)\n")
    world = World(config(reporting=sink(path, "raw", extra=hook(script))))
    await world.publish()
    world.manager.start()
    await eventually(lambda: len(hook_runs(script)) == 1)
    await world.manager.stop(timeout=10)
    assert world.results == [("reporting", "written")]


# -- metrics -------------------------------------------------------------------------------------


async def test_results_are_counted_in_keyturn_sink_writes_total(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    store = FakeVaultStore(clock=clock)
    metrics = PrometheusObserver(registry, clock)
    bad = tmp_path / "missing" / "token"
    manager = SinkManager(
        config(reporting=sink(tmp_path / "token", "raw") + ", " + sink(bad, "raw")),
        store=store,
        clock=clock,
        environ=ENVIRON,
        on_result=metrics.sink_write,
    )
    World.made.append(manager)
    now = clock.time()
    await store.write(
        REPORTING, oauth_published_fields(Secret(TOKEN), now, now + 60, now + 40), cas=None
    )
    await manager.sync("reporting")

    def count(result: str) -> float | None:
        labels = {"credential": "reporting", "result": result}
        return registry.get_sample_value("keyturn_sink_writes_total", labels)

    assert (count("written"), count("write_failed")) == (1.0, 1.0)


# -- configuration -------------------------------------------------------------------------------

SINK0 = 'credentials["reporting"].sinks[0]'


@pytest.mark.parametrize(
    ("value", "where", "message"),
    [
        (
            '{ path = "run/token", format = "raw" }',
            f"{SINK0}.path",
            'got "run/token", a relative path; expected an absolute path of a file',
        ),
        (
            '{ path = "/run/../etc/token", format = "raw" }',
            f"{SINK0}.path",
            'got "/run/../etc/token", which has a "//", "." or ".." segment',
        ),
        (
            '{ path = "/run/keyturn/", format = "raw" }',
            f"{SINK0}.path",
            'got "/run/keyturn/", which ends in "/" (a directory)',
        ),
        ('{ path = "env:TOKEN_FILE", format = "raw" }', f"{SINK0}.path", "got a reference"),
        ('{ format = "raw" }', f"{SINK0}.path", "missing; expected an absolute path"),
        (
            '{ path = "/run/token", format = "yaml" }',
            f"{SINK0}.format",
            'got "yaml"; expected one of "raw", "json", "env"',
        ),
        ('{ path = "/run/token" }', f"{SINK0}.format", 'missing; expected one of "raw"'),
        (
            '{ path = "/run/token", format = "raw", mode = "0644" }',
            f"{SINK0}.mode",
            'got "0644", which gives others access to the secret; expected a file mode',
        ),
        (
            '{ path = "/run/token", format = "raw", mode = "1640" }',
            f"{SINK0}.mode",
            'got "1640"; expected a file mode as a string of octal digits',
        ),
        (
            '{ path = "/run/token", format = "raw", mode = "0240" }',
            f"{SINK0}.mode",
            'got "0240", which the owner cannot read',
        ),
        (
            '{ path = "/run/token", format = "raw", mode = 640 }',
            f"{SINK0}.mode",
            "got the number 640; expected a file mode",
        ),
        (
            '{ path = "/run/token", format = "raw", env_prefix = "APP_" }',
            f"{SINK0}.env_prefix",
            'is set for format "raw", which has no variables; expected env_prefix only with',
        ),
        (
            '{ path = "/run/token", format = "env", env_prefix = "1APP" }',
            f"{SINK0}.env_prefix",
            'got "1APP"; expected a prefix of letters, digits and "_"',
        ),
        (
            '{ path = "/run/token", format = "raw", on_publish = { command = [] } }',
            f"{SINK0}.on_publish.command",
            "got an array; expected a non-empty array of strings, the program first",
        ),
        (
            '{ path = "/t", format = "raw", on_publish = { command = "systemctl reload" } }',
            f"{SINK0}.on_publish.command",
            'got "systemctl reload"; expected a non-empty array of strings',
        ),
        (
            '{ path = "/run/token", format = "raw", on_publish = { command = ["bin/reload"] } }',
            f"{SINK0}.on_publish.command",
            'got "bin/reload" as the program, a relative path',
        ),
        (
            '{ path = "/t", format = "raw", on_publish = { command = ["/r"], timeout = "2h" } }',
            f"{SINK0}.on_publish.timeout",
            'got "2h", which is out of range; expected a duration greater than zero, at most 1h',
        ),
        (
            '{ path = "/t", format = "raw", on_publish = { command = ["/r"], shell = true } }',
            f"{SINK0}.on_publish.shell",
            "unknown key for on_publish; expected one of: command, timeout",
        ),
        (
            '{ path = "/run/token", format = "raw", owner = "app" }',
            f"{SINK0}.owner",
            "unknown key; expected one of: path, format, mode, env_prefix, on_publish",
        ),
        ('"/run/token"', SINK0, 'got "/run/token"; expected a table'),
    ],
)
def test_a_bad_sink_is_one_problem_naming_credential_and_key(
    value: str, where: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config(reporting=value)
    [problem] = caught.value.problems
    assert problem.startswith(f"/etc/keyturn/keyturn.toml: {where}: "), problem
    assert message in problem, problem


def test_sinks_must_be_an_array_of_tables() -> None:
    text = CONFIG.format(
        reporting="", billing="", reporting_path=REPORTING, billing_path=BILLING
    ).replace("sinks = []", 'sinks = "/run/token"', 1)
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "k.toml", {})
    assert caught.value.problems == [
        'k.toml: credentials["reporting"].sinks: got "/run/token"; expected an array of '
        'tables, e.g. [[credentials.sinks]] or sinks = [{ path = "/run/keyturn/app.env", '
        'format = "env" }]'
    ]


def test_two_sinks_may_not_write_one_file() -> None:
    with pytest.raises(ConfigError) as caught:
        config(reporting=sink(Path("/run/t"), "raw"), billing=sink(Path("/run/t"), "json"))
    assert caught.value.problems == [
        '/etc/keyturn/keyturn.toml: credentials["billing-key"].sinks[0].path: "/run/t" is also '
        'the path of credentials["reporting"].sinks[0]; expected each sink to write its own file'
    ]


def test_a_full_sink_loads_with_its_defaults() -> None:
    cfg = config(
        reporting='{ path = "/run/keyturn/r.env", format = "env", mode = "0o640", '
        'env_prefix = "REPORTING_", on_publish = { command = ["systemctl", "try-restart", "r"] } }',
        billing='{ path = "/run/keyturn/key", format = "raw" }',
    )
    [env_sink] = cfg.credential("reporting").sinks
    assert (env_sink.path, env_sink.format, env_sink.mode, env_sink.env_prefix) == (
        Path("/run/keyturn/r.env"),
        "env",
        0o640,
        "REPORTING_",
    )
    assert env_sink.on_publish is not None
    assert env_sink.on_publish.command == ("systemctl", "try-restart", "r")
    assert env_sink.on_publish.timeout == 10.0
    [raw] = cfg.credential("billing-key").sinks
    assert (raw.mode, raw.env_prefix, raw.on_publish) == (0o600, "KEYTURN_", None)


def test_render_never_lets_a_value_leave_through_repr(tmp_path: Path) -> None:
    """The record's secret fields are `Secret`s: a repr or log of it shows no value."""
    now = 1_800_000_000.0
    data = oauth_published_fields(Secret(TOKEN), now, now + 60, now + 40)
    record = parse_record(
        {k: v.reveal() if isinstance(v, Secret) else v for k, v in data.items()},
        4,
        credential="reporting",
        kind="oauth_client",
    )
    assert TOKEN not in repr(record)
    [raw] = config(reporting=sink(tmp_path / "t", "raw")).credential("reporting").sinks
    assert render(record, raw) == TOKEN.encode()
