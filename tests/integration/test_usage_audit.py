"""Usage from a real OpenBao's audit devices: a `file` device tailed, a `socket` device served.

One OpenBao dev server for the module, with a file audit device declared in its
configuration (OpenBao 2's way; the server also allows `bao audit enable`, used for the
socket device and a second file device below). keyturn logs in with an AppRole holding
deploy/vault/keyturn.hcl, apps with AppRoles holding deploy/vault/app.hcl for their own path.
Every read, write and detector below is provoked for real; the sources poll the real files
and sockets. Credential names carry a random suffix, so the tests' paths do not collide.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import hvac
import hvac.exceptions
import pytest

from keyturn.clock import SystemClock
from keyturn.events import Suspicious
from keyturn.testing.observer import RecordingObserver
from keyturn.usage.audit import AuditEntry, AuditParser, Identity
from keyturn.usage.detectors import DetectorSettings
from keyturn.usage.layout import Layout, Watched
from keyturn.usage.monitor import UsageMonitor
from keyturn.usage.sources import FileAuditSource, SocketAuditSource
from keyturn_devkit.dev.audit import OpenBaoAuditServer

pytestmark = [pytest.mark.openbao]

ROOT = Path(__file__).resolve().parents[2]
KEYTURN_HCL = (ROOT / "deploy" / "vault" / "keyturn.hcl").read_text()
APP_HCL = (ROOT / "deploy" / "vault" / "app.hcl").read_text()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("usage")


@pytest.fixture(scope="module")
def bao(workdir: Path) -> Iterator[OpenBaoAuditServer]:
    with OpenBaoAuditServer(file_path=workdir / "audit.log") as server:
        root = hvac.Client(url=server.address, token=server.root_token)
        root.sys.enable_auth_method("approle")
        root.sys.create_or_update_policy(name="keyturn", policy=KEYTURN_HCL)
        yield server


def approle_login(bao: OpenBaoAuditServer, role: str, policy: str) -> hvac.Client:
    root = hvac.Client(url=bao.address, token=bao.root_token)
    root.write(f"auth/approle/role/{role}", token_policies=policy, token_no_default_policy=True)
    role_id = root.read(f"auth/approle/role/{role}/role-id")["data"]["role_id"]
    secret_id = root.write(f"auth/approle/role/{role}/secret-id")["data"]["secret_id"]
    client = hvac.Client(url=bao.address)
    client.auth.approle.login(role_id=role_id, secret_id=secret_id)
    return client


@dataclass
class Setup:
    """One credential published by keyturn at `path`, an app allowed to read it, the
    monitor watching it, and its alerts."""

    bao: OpenBaoAuditServer
    name: str
    path: str
    keyturn: hvac.Client
    app: hvac.Client
    app_label: str
    monitor: UsageMonitor
    parser: AuditParser
    observer: RecordingObserver
    own: Identity
    settings: DetectorSettings

    def publish(self, value: str) -> int:
        answer = self.keyturn.secrets.kv.v2.create_or_update_secret(
            path=self.path, secret={"api_key": value}
        )
        return int(answer["data"]["version"])

    def read(self, client: hvac.Client, path: str | None = None) -> int:
        answer = client.secrets.kv.v2.read_secret_version(
            path=path or self.path, raise_on_deleted_version=True
        )
        return int(answer["data"]["metadata"]["version"])

    def token(self, display_name: str, policy: str) -> hvac.Client:
        """A token some person created by hand, with its own policy."""
        root = hvac.Client(url=self.bao.address, token=self.bao.root_token)
        name = f"hand-{uuid.uuid4().hex[:8]}"
        root.sys.create_or_update_policy(name=name, policy=policy)
        created = root.auth.token.create(
            policies=[name], display_name=display_name, no_default_policy=True, ttl="10m"
        )
        return hvac.Client(url=self.bao.address, token=created["auth"]["client_token"])

    def restarted(self) -> Setup:
        """The same credential as a restarted keyturn sees it: a new monitor and parser."""
        observer = RecordingObserver()
        layout = self.monitor.layout
        monitor = UsageMonitor(
            layout, own=self.own, observer=observer, clock=SystemClock(), settings=self.settings
        )
        return replace(self, monitor=monitor, parser=AuditParser(layout), observer=observer)

    def alerts(self) -> list[tuple[str, str | None, str]]:
        return [(s.detector, s.credential, s.severity) for s in self.observer.of(Suspicious)]


@pytest.fixture
def setup_factory(bao: OpenBaoAuditServer) -> Callable[..., Setup]:
    keyturn = approle_login(bao, "keyturn", "keyturn")
    own = Identity.from_lookup(keyturn.auth.token.lookup_self()["data"])
    assert own.labels == {"approle/keyturn"}

    def make(consumers: tuple[str, ...] | None = None, **settings: float) -> Setup:
        name = f"c{uuid.uuid4().hex[:8]}"
        path = f"apps/{name}/acme"
        root = hvac.Client(url=bao.address, token=bao.root_token)
        root.sys.create_or_update_policy(
            name=f"app-{name}", policy=APP_HCL.replace("APP_PATH", path)
        )
        app = approle_login(bao, f"app-{name}", f"app-{name}")
        layout = Layout(
            [Watched(name, "acme", path, consumers)],
            inputs=[(name, "secret", f"keyturn/inputs/{name}")],
        )
        observer = RecordingObserver()
        rules = DetectorSettings(**settings)  # type: ignore[arg-type]
        monitor = UsageMonitor(
            layout, own=own, observer=observer, clock=SystemClock(), settings=rules
        )
        label = f"approle/app-{name}"
        parser = AuditParser(layout)
        return Setup(bao, name, path, keyturn, app, label, monitor, parser, observer, own, rules)

    return make


def tail(setup: Setup, path: Path, position: Path | None = None) -> FileAuditSource:
    source = FileAuditSource(
        path, setup.parser, setup.monitor, clock=SystemClock(), position_file=position
    )
    source.poll()  # opens it at its end (or where `position` says)
    return source


def until(source: FileAuditSource, done: Callable[[], bool], timeout: float = 10.0) -> None:
    """Polls the file until `done()` (audit entries reach the file a moment after the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        while source.poll():
            pass
        if done() or time.monotonic() > deadline:
            return
        time.sleep(0.02)


def reads_of(setup: Setup, consumer: str) -> int:
    return sum(
        u.reads for u in setup.monitor.tracker.usage_of(setup.name) if u.consumer == consumer
    )


# -- the file device ---------------------------------------------------------------------------


def test_an_apps_reads_are_counted_with_the_version_it_got(
    setup_factory: Callable[..., Setup], workdir: Path
) -> None:
    setup = setup_factory()
    source = tail(setup, workdir / "audit.log")
    assert source.up
    setup.publish("k1")
    assert setup.read(setup.app) == 1
    version = setup.publish("k2")
    assert setup.read(setup.app) == version == 2
    setup.read(setup.keyturn)  # keyturn's own read: not a consumer
    until(source, lambda: reads_of(setup, setup.app_label) == 2)
    view = setup.monitor.tracker.consumers(setup.name)
    assert view.current_version == 2  # learnt from keyturn's own write in the audit log
    assert [(c.consumer, c.reads, c.last_version, c.current) for c in view.consumers] == [
        (setup.app_label, 2, 2, True)
    ]
    assert setup.alerts() == []
    assert setup.parser.raw_values == 0  # the default log: every value HMAC'd
    version = setup.publish("k3")
    until(source, lambda: setup.monitor.tracker.current_version(setup.name) == 3)
    (consumer,) = setup.monitor.tracker.consumers(setup.name).consumers
    assert consumer.current is False
    now = time.time()
    waiting = setup.monitor.tracker.waiting_for(setup.name, 2, window=600, now=now)
    assert waiting == (setup.app_label,)
    setup.read(setup.app)
    until(source, lambda: reads_of(setup, setup.app_label) == 3)
    assert setup.monitor.tracker.waiting_for(setup.name, 2, window=600, now=time.time()) == ()


def test_an_unexpected_reader_and_a_read_of_keyturns_state_are_reported(
    setup_factory: Callable[..., Setup], workdir: Path
) -> None:
    setup = setup_factory(consumers=("approle/app-*",))
    source = tail(setup, workdir / "audit.log")
    setup.publish("k1")
    state = f"keyturn/state/{setup.name}"
    setup.keyturn.secrets.kv.v2.create_or_update_secret(path=state, secret={"refresh_token": "r"})
    setup.read(setup.app)
    with pytest.raises(hvac.exceptions.Forbidden):  # app.hcl grants nothing under keyturn/
        setup.read(setup.app, state)
    laptop = setup.token(
        "laptop",
        f'path "secret/data/{setup.path}" {{ capabilities = ["read"] }}\n'
        f'path "secret/data/{state}" {{ capabilities = ["read"] }}\n',
    )
    setup.read(laptop)
    setup.read(laptop, state)
    until(source, lambda: len(setup.alerts()) >= 3)
    assert sorted(setup.alerts()) == [
        ("private_state_read", setup.name, "critical"),
        ("private_state_read", setup.name, "warning"),
        ("unexpected_reader", setup.name, "critical"),
    ]
    details = {s.severity + s.detector: s.detail for s in setup.observer.of(Suspicious)}
    assert details["criticalunexpected_reader"].startswith(
        'published value read by "token-laptop" from 127.0.0.1 (version 1)'
    )
    assert details["criticalprivate_state_read"] == (
        f'keyturn\'s state record secret/{state} read by "token-laptop" from 127.0.0.1'
    )
    assert details["warningprivate_state_read"].startswith(
        f'refused read of keyturn\'s state record secret/{state} by "{setup.app_label}"'
    )


def test_a_new_reader_after_learning_a_burst_and_an_out_of_band_write_are_reported(
    setup_factory: Callable[..., Setup], workdir: Path
) -> None:
    setup = setup_factory(learning=0, rate_floor=5, rate_factor=10)
    source = tail(setup, workdir / "audit.log")
    setup.publish("k1")
    for _ in range(6):
        setup.read(setup.app)
    root = hvac.Client(url=setup.bao.address, token=setup.bao.root_token)
    root.secrets.kv.v2.create_or_update_secret(path=setup.path, secret={"api_key": "planted"})
    until(source, lambda: len(setup.alerts()) >= 3)
    assert setup.alerts() == [
        ("unexpected_reader", setup.name, "warning"),  # a new identity, no allow list
        ("unusual_usage", setup.name, "warning"),  # 6 reads > max(10 x baseline 0, 5)
        ("published_path_written", setup.name, "critical"),
    ]
    written = setup.observer.of(Suspicious)[2].detail
    assert written == (
        # The dev server's root token was made by `token create`: display name "token".
        f'write of published path secret/{setup.path} by "token" from 127.0.0.1 (version 2) '
        "seen in the audit log"
    )


def test_rename_rotation_with_a_reopen_loses_and_repeats_no_read(
    setup_factory: Callable[..., Setup], workdir: Path
) -> None:
    setup = setup_factory()
    path = workdir / "audit.log"
    source = tail(setup, path)
    setup.publish("k1")
    reads = 0
    for _ in range(3):
        reads += setup.read(setup.app)
    until(source, lambda: reads_of(setup, setup.app_label) == 3)
    path.rename(workdir / "audit.log.1")  # logrotate without copytruncate ...
    for _ in range(2):
        reads += setup.read(setup.app)  # ... Vault still writes to the renamed file
    setup.bao.reopen_audit_files()  # ... until postrotate's SIGHUP
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        reads += setup.read(setup.app)
        time.sleep(0.05)
    assert path.exists()
    for _ in range(4):
        reads += setup.read(setup.app)
    until(source, lambda: reads_of(setup, setup.app_label) == reads)
    assert reads_of(setup, setup.app_label) == reads >= 9  # each read once: version 1 each
    assert source.up


def test_copy_truncate_loses_and_repeats_no_read(
    setup_factory: Callable[..., Setup], workdir: Path
) -> None:
    setup = setup_factory()
    path = workdir / "audit.log"
    source = tail(setup, path)
    setup.publish("k1")
    for _ in range(3):
        setup.read(setup.app)
    until(source, lambda: reads_of(setup, setup.app_label) == 3)
    shutil.copyfile(path, workdir / "audit.log.copied")  # logrotate's copytruncate
    with path.open("r+b") as handle:
        handle.truncate(0)
    for _ in range(4):
        setup.read(setup.app)
    until(source, lambda: reads_of(setup, setup.app_label) == 7)
    assert reads_of(setup, setup.app_label) == 7
    assert not path.read_bytes().startswith(b"\0")  # OpenBao appends (O_APPEND): no hole


def test_a_restart_of_the_source_counts_no_line_twice_and_misses_none(
    setup_factory: Callable[..., Setup], workdir: Path
) -> None:
    setup = setup_factory()
    path, position = workdir / "audit.log", workdir / f"{setup.name}.position"
    first = tail(setup, path, position)
    setup.publish("k1")
    for _ in range(3):
        setup.read(setup.app)
    until(first, lambda: reads_of(setup, setup.app_label) == 3)
    first.close()  # keyturn stops
    for _ in range(2):
        setup.read(setup.app)  # while keyturn is down
    restarted = setup.restarted()  # a new process: nothing in memory but the position file
    second = tail(restarted, path, position)
    setup.read(setup.app)
    until(second, lambda: reads_of(restarted, setup.app_label) == 3)
    time.sleep(0.3)
    until(second, lambda: False, timeout=0)
    assert reads_of(setup, setup.app_label) + reads_of(restarted, setup.app_label) == 6
    assert reads_of(restarted, setup.app_label) == 3
    second.close()


def test_a_file_device_enabled_later_with_bao_audit_enable(
    setup_factory: Callable[..., Setup], workdir: Path
) -> None:
    setup = setup_factory()
    path = workdir / "second" / "audit.log"
    source = tail(setup, path)
    assert not source.up
    assert source.problem == f"{path}: no such file"
    path.parent.mkdir()
    enabled = setup.bao.bao("audit", "enable", "-path=second", "file", f"file_path={path}")
    assert enabled.returncode == 0, enabled.stderr
    try:
        setup.publish("k1")
        setup.read(setup.app)
        until(source, lambda: reads_of(setup, setup.app_label) == 1)
        assert source.up
        assert reads_of(setup, setup.app_label) == 1  # the file is new: read from its start
    finally:
        setup.bao.bao("audit", "disable", "second")


# -- the socket device -------------------------------------------------------------------------


async def _until(done: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if done():
            return
        await asyncio.sleep(0.02)


async def test_a_socket_device_declared_in_the_servers_configuration(workdir: Path) -> None:
    name = f"c{uuid.uuid4().hex[:8]}"
    path = f"apps/{name}/acme"
    layout = Layout([Watched(name, "acme", path)])
    entries: list[AuditEntry] = []
    source = SocketAuditSource("127.0.0.1:0", AuditParser(layout), entries.append)
    await source.start()  # before OpenBao: it tests the device when it creates it
    try:
        server = OpenBaoAuditServer(socket_address=f"127.0.0.1:{source.port}")
        await asyncio.to_thread(server.start)
        try:
            root = hvac.Client(url=server.address, token=server.root_token)
            await asyncio.to_thread(
                root.secrets.kv.v2.create_or_update_secret, path=path, secret={"k": "v"}
            )
            await asyncio.to_thread(
                root.secrets.kv.v2.read_secret_version, path=path, raise_on_deleted_version=True
            )
            await _until(lambda: len(entries) >= 2)
            kinds = [(type(e).__name__, e.consumer, e.version) for e in entries]
            assert kinds == [("AuditWrite", "token", 1), ("AuditRead", "token", 1)]
        finally:
            await asyncio.to_thread(server.stop)
    finally:
        await source.stop()


async def test_a_socket_device_enabled_with_bao_audit_enable_survives_a_garbage_peer(
    setup_factory: Callable[..., Setup],
) -> None:
    setup = setup_factory()
    source = SocketAuditSource("127.0.0.1:0", setup.parser, setup.monitor)
    await source.start()
    device = f"sock{uuid.uuid4().hex[:6]}"
    enabled = await asyncio.to_thread(
        setup.bao.bao,
        "audit", "enable", f"-path={device}", "socket",
        f"address=127.0.0.1:{source.port}", "socket_type=tcp",
    )  # fmt: skip
    assert enabled.returncode == 0, enabled.stderr
    try:
        await asyncio.to_thread(setup.publish, "k1")
        _, writer = await asyncio.open_connection("127.0.0.1", source.port)
        writer.write(b'\x00garbage\n{"type": "response"\n' + b"z" * 2_000_000 + b"\n")
        await writer.drain()
        writer.close()  # gone without a goodbye
        await asyncio.to_thread(setup.read, setup.app)
        await asyncio.to_thread(setup.read, setup.app)
        await _until(lambda: reads_of(setup, setup.app_label) == 2)
        assert reads_of(setup, setup.app_label) == 2
        (consumer,) = setup.monitor.tracker.consumers(setup.name).consumers
        assert (consumer.last_version, consumer.current) == (1, True)
        await _until(lambda: source.skipped["too_long"] == 1)
        assert source.skipped["not_json"] == 1
        assert source.skipped["truncated"] == 1
        assert source.up
    finally:
        await asyncio.to_thread(setup.bao.bao, "audit", "disable", device)
        await source.stop()
