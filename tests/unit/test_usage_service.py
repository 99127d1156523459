"""The usage monitor as the daemon runs it (`UsageService`): built from a configuration, fed by
a real audit file (polled with a FakeClock), asked by rotations, served on `GET /usage` by the
metrics server, and read by `keyturn usage` and `keyturn status`'s consumers column."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from keyturn.clock import FakeClock, rfc3339
from keyturn.commands import usage as usage_command
from keyturn.commands.usage import UsageUnavailable, consumer_counts, daemon_url, fetch_usage
from keyturn.config import Config, MetricsSettings, parse_config
from keyturn.events import Suspicious
from keyturn.jobs.job import ConsumersOnOld
from keyturn.observability.server import MetricsServer
from keyturn.testing.observer import RecordingObserver
from keyturn.usage.audit import Identity
from keyturn.usage.service import UsageService, layout_of
from keyturn.usage.sources import FileAuditSource
from keyturn_devkit.dev.audit import Reader, line, read_entries, write_entries
from keyturn_devkit.harness.configs import VAULT

T0 = 1_800_000_000.0
KEYTURN = Reader(display_name="approle", role="keyturn")
APP = Reader(display_name="approle", role="reporting", remote_address="10.0.4.21")
BATCH = Reader(display_name="approle", role="batch", remote_address="10.0.4.30")

CONFIG = VAULT + """mount = "secret"

[metrics]
listen = "127.0.0.1:PORT"

[[providers]]
name = "acme"
base_url = "https://acme.example.com"

[[rotators]]
name = "keys"
type = "http"
provider = "acme"
auth = "vault:secret/keyturn/inputs/acme-admin#token"
create = { path = "/keys", value = "/key", id = "/id" }
revoke = { path = "/keys/{key_id}" }

[[credentials]]
name = "reporting-key"
provider = "acme"
kind = "api_key"
publish_to = "apps/reporting/key"
probe = "/v1/users"
rotation = { max_age = "30d", rotator = "keys", wait_for_consumers = true, max_grace = "2d" }
consumers = ["approle/reporting", "approle/batch"]

[[credentials]]
name = "billing"
provider = "acme"
kind = "oauth_client"
client_id = "billing-app"
client_secret = "vault:secret/keyturn/inputs/billing#client_secret"
publish_to = "apps/billing/token"

[usage]
source = "file"
file = "AUDIT"
position_file = "POSITION"
learning = 0
"""


def configuration(tmp_path: Path, port: int = 9797) -> Config:
    text = (
        CONFIG.replace("PORT", str(port))
        .replace("AUDIT", str(tmp_path / "audit.log"))
        .replace("POSITION", str(tmp_path / "position.json"))
    )
    (tmp_path / "keyturn.toml").write_text(text)
    return parse_config(text, str(tmp_path / "keyturn.toml"), {"VAULT_TOKEN": "unused"})


class World:
    """A service over a real audit file, written as Vault would, polled by hand."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = FakeClock(T0)
        self.observer = RecordingObserver()
        self.audit = tmp_path / "audit.log"
        self.audit.write_bytes(b"")
        self.config = configuration(tmp_path)
        own = Identity.from_lookup({"display_name": "approle", "meta": {"role_name": "keyturn"}})
        self.service = UsageService(self.config, own=own, observer=self.observer, clock=self.clock)

    def append(self, *entries: dict[str, object]) -> None:
        with self.audit.open("ab") as handle:
            for entry in entries:
                handle.write(line(entry))

    def read(self, reader: Reader, version: int, path: str = "apps/reporting/key") -> None:
        self.append(*read_entries(reader, path, at=self.clock.time(), version=version))

    def write(self, version: int, path: str = "apps/reporting/key") -> None:
        self.append(*write_entries(KEYTURN, path, at=self.clock.time(), version=version))

    def poll(self) -> None:
        source = self.service.source
        assert isinstance(source, FileAuditSource)
        while source.poll():
            pass


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    made = World(tmp_path)
    await made.service.start()
    yield made
    await made.service.stop()


def test_the_layout_watches_published_paths_state_and_vault_inputs(tmp_path: Path) -> None:
    layout = layout_of(configuration(tmp_path))
    assert layout.classify("secret", "apps/reporting/key") == ("published", "reporting-key")
    assert layout.classify("secret", "keyturn/state/billing") == ("state", "billing")
    assert layout.classify("secret", "keyturn/inputs/billing") == ("input", "billing")
    # a rotator's admin credential, named after the first credential that uses it
    assert layout.classify("secret", "keyturn/inputs/acme-admin") == ("input", "reporting-key")
    assert layout.credentials["reporting-key"].consumers == ("approle/reporting", "approle/batch")
    assert layout.credentials["billing"].consumers is None


async def test_reads_are_counted_and_a_rotation_learns_who_is_on_the_old_key(
    world: World,
) -> None:
    world.write(1)  # keyturn's own write: the version published
    world.read(APP, 1)
    world.read(BATCH, 1)
    world.clock.advance(60)
    world.write(2)
    world.read(APP, 2)
    world.poll()
    tracker = world.service.tracker
    assert tracker.current_version("reporting-key") == 2
    world.clock.advance(3600)
    now = world.clock.time()
    window = 86400.0
    # keyturn has read the log for an hour only: it cannot rule out readers before that
    answer = world.service.waiting_for("reporting-key", 1, window, now)
    assert answer.names == ("approle/batch",)
    assert answer.unsure is not None and answer.unsure.startswith(
        f"keyturn has read Vault's audit log only since {rfc3339(T0)}"
    )
    assert world.service.waiting_for("reporting-key", 1, 600.0, now) == ConsumersOnOld((), None)
    world.clock.advance(window)
    world.read(BATCH, 2)
    world.poll()
    assert world.service.waiting_for("reporting-key", 1, window, world.clock.time()) == (
        ConsumersOnOld((), None)
    )
    assert world.observer.of(Suspicious) == []  # both are on the allow list


async def test_a_source_that_cannot_be_read_makes_the_answer_unsure(world: World) -> None:
    world.audit.unlink()
    world.poll()
    world.clock.advance(10)  # past the rotate grace: the file is gone, not rotated
    world.poll()
    answer = world.service.waiting_for("reporting-key", 1, 60.0, world.clock.time() + 86400)
    assert answer.unsure is not None
    assert answer.unsure.startswith("the file audit source cannot be read (")
    assert [s.detector for s in world.observer.of(Suspicious)] == ["usage_source_down"]


async def test_what_jobs_tell_it_is_the_current_version(world: World) -> None:
    hooks = world.service.hooks()
    hooks.published("billing", 7)
    hooks.published("billing", 6)  # an older run's view never goes back
    assert world.service.tracker.current_version("billing") == 7


async def test_a_reload_takes_the_new_allow_lists(world: World, tmp_path: Path) -> None:
    intruder = Reader(display_name="token-laptop", remote_address="192.0.2.7")
    world.read(intruder, 1)
    world.poll()
    [alert] = world.observer.of(Suspicious)
    assert (alert.detector, alert.severity) == ("unexpected_reader", "critical")
    text = (tmp_path / "keyturn.toml").read_text()
    text = text.replace('consumers = ["approle/reporting", "approle/batch"]', "")
    world.service.use_config(parse_config(text, "k.toml", {"VAULT_TOKEN": "x"}))
    assert world.service.monitor.layout.credentials["reporting-key"].consumers is None


async def test_the_view_has_names_versions_and_times_and_no_address(world: World) -> None:
    world.write(1)
    world.read(APP, 1)
    world.clock.advance(5)
    world.write(2)
    world.read(BATCH, 2)
    world.poll()
    view = world.service.view()
    assert view["source"] == {"kind": "file", "up": True, "problem": None}
    assert view["observed_since"] == rfc3339(T0)
    reporting, billing = view["credentials"]
    assert reporting == {
        "credential": "reporting-key",
        "current_version": 2,
        "consumer_count": 2,
        "consumers": [
            {
                "consumer": "approle/batch",
                "reads": 1,
                "first_read": rfc3339(T0 + 5),
                "last_read": rfc3339(T0 + 5),
                "last_version": 2,
                "current": True,
            },
            {
                "consumer": "approle/reporting",
                "reads": 1,
                "first_read": rfc3339(T0),
                "last_read": rfc3339(T0),
                "last_version": 1,
                "current": False,
            },
        ],
    }
    assert billing == {
        "credential": "billing",
        "current_version": None,
        "consumer_count": 0,
        "consumers": [],
    }
    assert "10.0.4" not in json.dumps(view)
    summary = world.service.view(["billing"], summary=True)
    assert summary["credentials"] == [
        {"credential": "billing", "current_version": None, "consumer_count": 0}
    ]


async def test_the_metrics_server_serves_it_and_keyturn_usage_reads_it(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world.write(1)
    world.read(APP, 1)
    world.poll()
    server = MetricsServer(
        MetricsSettings("127.0.0.1", 0),
        CollectorRegistry(),
        alive=lambda: (True, "ok"),
        ready=ready,
        usage=lambda names, summary: world.service.view(names, summary=summary),
    )
    await server.start()
    try:
        config = configuration(tmp_path, server.port)
        async with httpx.AsyncClient(base_url=server.url) as http:
            answer = await http.get("/usage", params={"credential": "billing", "summary": "1"})
        assert answer.status_code == 200
        assert answer.headers["Cache-Control"] == "no-store"
        assert answer.json()["credentials"] == [
            {"credential": "billing", "current_version": None, "consumer_count": 0}
        ]
        view = await asyncio.to_thread(fetch_usage, config, ["reporting-key"])
        assert [c["consumer"] for c in view["credentials"][0]["consumers"]] == ["approle/reporting"]
        assert await asyncio.to_thread(consumer_counts, config) == {
            "reporting-key": 1,
            "billing": 0,
        }
        args = argparse.Namespace(config=tmp_path / "keyturn.toml", json=False, names=[])
        capsys.readouterr()  # the server's own log lines
        assert await asyncio.to_thread(usage_command.run, args) == 0
        table = capsys.readouterr().out.splitlines()
        header = ["CREDENTIAL", "CONSUMER", "READS", "LAST", "READ", "VERSION", "CURRENT"]
        assert table[0].split() == header
        assert table[1].split()[:3] == ["reporting-key", "approle/reporting", "1"]
        assert table[1].split()[-2:] == ["1", "yes"]
        assert table[2].split() == ["billing", "-", "0", "-", "-", "-"]
        args = argparse.Namespace(
            config=tmp_path / "keyturn.toml", json=True, names=["reporting-key"]
        )
        assert await asyncio.to_thread(usage_command.run, args) == 0
        [entry] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        assert entry["credential"] == "reporting-key" and entry["current_version"] == 1
    finally:
        await server.stop()


async def ready() -> tuple[bool, list[str]]:
    return True, []


async def test_without_usage_the_endpoint_is_404_and_the_command_says_so(tmp_path: Path) -> None:
    server = MetricsServer(
        MetricsSettings("127.0.0.1", 0), CollectorRegistry(), alive=lambda: (True, ""), ready=ready
    )
    await server.start()
    try:
        config = configuration(tmp_path, server.port)
        with pytest.raises(UsageUnavailable) as caught:
            await asyncio.to_thread(fetch_usage, config)
        assert str(caught.value) == (
            f"the daemon at {server.url}/usage runs without a [usage] table (restart it after "
            "adding one)"
        )
        assert await asyncio.to_thread(consumer_counts, config) is None
    finally:
        await server.stop()


def test_a_daemon_that_cannot_be_reached_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    config = configuration(tmp_path, 9)
    with pytest.raises(UsageUnavailable) as caught:
        fetch_usage(config, transport=httpx.MockTransport(refused))
    assert str(caught.value) == (
        "cannot reach the daemon at http://127.0.0.1:9/usage (ConnectError): is `keyturn run` "
        "running with this configuration?"
    )
    args = argparse.Namespace(config=tmp_path / "keyturn.toml", json=False, names=["nope"])
    assert usage_command.run(args) == 1
    assert capsys.readouterr().err.strip() == (
        f"keyturn usage: no credential named 'nope' in {tmp_path / 'keyturn.toml'}"
    )


def test_where_the_daemon_is() -> None:
    assert daemon_url(MetricsSettings("0.0.0.0", 9797)) == "http://127.0.0.1:9797"
    assert daemon_url(MetricsSettings("::", 9797)) == "http://[::1]:9797"
    assert daemon_url(MetricsSettings("10.0.0.5", 80)) == "http://10.0.0.5:80"
    with pytest.raises(UsageUnavailable, match="port 0"):
        daemon_url(MetricsSettings("127.0.0.1", 0))
