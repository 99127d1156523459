"""A signing key rotated through RFC 7592 registration management against panva/oidc-provider
(keyturn_devkit.dev.oidc_provider: dynamic registration, registration access tokens rotated on
each update), in a real OpenBao, by `keyturn run`:

1. the test registers a client (RFC 7591) with a key pair of its own, and hands that key pair
   and the registration response (its metadata and registration access token) to keyturn
   (`keyturn import-signing-key`);
2. the daemon rotates the key twice (a few seconds each) while an `oauth_client` credential
   authenticates with the published key (`private_key_jwt`, `client_key` a reference to the
   signing key's `private_key`) and an app reads its token and calls the resource server;
3. throughout, the registration never holds more than two keys, and at the end only the key in
   use; the first registration access token is dead (rotated away) and keyturn's last one works;
   the server saw each registration access token presented at most once (it counts them by
   sha256: GET /__dev/registration-presentations).
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import hvac
import pytest

from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.client_keys import private_key_pem, public_jwks
from keyturn_devkit.dev.oidc_provider import OidcProvider
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.harness.apps import AppSampler
from keyturn_devkit.harness.configs import write_signing_key_and_client
from keyturn_devkit.harness.deployment import DaemonProcess
from keyturn_devkit.harness.key_rotation import run_keyturn, status_rows

pytestmark = [pytest.mark.openbao, pytest.mark.slow]

KEY = "billing-signing-key"
APP = "billing-app"
MAX_AGE = 9.0  # seconds a signing key is used
GRACE = 3.0  # seconds the old public key stays registered
TTL = 6  # seconds an access token lives
STATE_PREFIX = "signkey/keyturn/state"


@dataclass
class Setup:
    op: OidcProvider
    vault: OpenBaoDevServer
    config: Path
    workdir: Path
    client_id: str
    client_uri: str
    first_token: str
    first_key: str
    registered: dict[str, Any]

    def root(self) -> hvac.Client:
        return hvac.Client(url=self.vault.address, token=self.vault.root_token)

    def record(self, name: str) -> dict[str, str]:
        entry = self.root().secrets.kv.v2.read_secret_version(
            path=f"{STATE_PREFIX}/{name}", raise_on_deleted_version=True
        )
        return dict(entry["data"]["data"])

    def registration(self) -> dict[str, Any]:
        """The signing key's own part of its record (the registration access token and the
        key ids the server held at keyturn's last read or write)."""
        return dict(json.loads(self.record(KEY).get("kind_record", "{}")))


@pytest.fixture(scope="module")
def setup(openbao: OpenBaoDevServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("signkey")
    first_key = private_key_pem("ES256")
    with OidcProvider(workdir, access_token_ttl=TTL, registration=True) as op:
        with op.client() as http:
            answer = http.post(
                "/reg",
                json={
                    "token_endpoint_auth_method": "private_key_jwt",
                    "jwks": public_jwks((first_key, "ES256")),
                    "grant_types": ["client_credentials"],
                    "response_types": [],
                    "redirect_uris": [],
                },
            )
        assert answer.status_code == 201, answer.text
        registered = answer.json()
        config = write_signing_key_and_client(
            workdir,
            issuer=op.issuer,
            vault=openbao.address,
            root_token=openbao.root_token,
            prefix="signkey",
            client_id=registered["client_id"],
            key=KEY,
            app=APP,
            rotation=f'{{ max_age = "{MAX_AGE}s", grace = "{GRACE}s" }}',
            registration=(
                '{ method = "rfc7592", client_uri = '
                f'"{registered["registration_client_uri"]}" }}'
            ),
        )
        yield Setup(
            op,
            openbao,
            config,
            workdir,
            registered["client_id"],
            registered["registration_client_uri"],
            registered["registration_access_token"],
            first_key,
            registered,
        )


def _present(setup: Setup, token: str) -> httpx.Response:
    """A registration read (RFC 7592 §2.1) with `token`, as the test: oidc-provider rotates
    the token on updates only, so a read leaves it as it was."""
    with loopback.client(timeout=5.0) as http:
        return http.get(setup.client_uri, headers={"Authorization": f"Bearer {token}"})


def test_a_key_rotated_twice_through_rfc7592_while_tokens_keep_working(setup: Setup) -> None:
    # The registration response brings the token and the metadata the first update sends back.
    handed = json.dumps({"private_key": setup.first_key, "registration": setup.registered})
    imported = run_keyturn("import-signing-key", "-c", str(setup.config), KEY, stdin=handed)
    assert imported.returncode == 0, imported.stderr
    first_kid = setup.record(KEY)["key_id"]
    assert setup.registration()["registered"] == [first_kid]

    apps = AppSampler(
        setup.vault.address,
        setup.vault.root_token,
        setup.op.resource_url,
        {APP: f"signkey/apps/{APP}"},
        probe="/",
        interval=0.25,
    )
    registered: list[list[str]] = []
    kids: list[str] = [first_kid]
    with DaemonProcess(setup.config, setup.workdir) as daemon:
        apps.start(limit=90)
        apps.wait_version(APP, 1, timeout=20)
        started = time.time()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            record = setup.record(KEY)
            registered.append(setup.registration().get("registered", []))
            if record.get("key_id") not in (None, kids[-1]):
                kids.append(record["key_id"])
            if len(kids) == 3 and record.get("rotation_phase") == "idle":
                break
            time.sleep(0.2)
        apps.stop()
    # Read once the daemon stopped: a third rotation (due MAX_AGE after the second) must not
    # begin while the test looks.
    rows = status_rows(setup.config)
    log = daemon.log_text()
    # Before the test presents any token itself.
    presented = setup.op.registration_presentations(setup.client_id)

    assert len(kids) == 3, (kids, rows[KEY])
    reads = apps.snapshot(since=started)
    assert reads, apps.summary()
    assert apps.expired(since=started) == [], apps.summary()
    assert apps.refused(since=started) == [], [str(r) for r in apps.refused()]
    # At most the old key and the new one at any time; only the new one after the grace.
    assert max(len(kids_seen) for kids_seen in registered) <= 2, registered
    assert setup.registration()["registered"] == [kids[-1]]
    assert rows[KEY]["key_id"] == kids[-1]
    assert rows[KEY]["details"] == {"registered": kids[-1]}
    # (Its token may have expired since the daemon stopped: its last run is what counts.)
    assert rows[APP]["last_error"] in (None, "") and rows[APP]["consecutive_failures"] == 0
    # Each registration access token was presented at most once: updates only (two keys added,
    # two removed), each sending back the metadata of the answer before, with no read.
    assert {method for method, _ in presented} == {"PUT"} and len(presented) >= 4, presented
    uses = Counter(digest for _, digest in presented)
    assert max(uses.values()) == 1, uses
    held = setup.registration()["metadata"]
    assert "registration_access_token" not in held and "registration_client_uri" not in held
    assert [key["kid"] for key in held["jwks"]["keys"]] == [kids[-1]]
    # The first registration access token was rotated away; the one keyturn keeps works, and
    # the server holds exactly the key in use.
    assert _present(setup, setup.first_token).status_code == 401
    current = _present(setup, setup.registration()["access_token"])
    assert current.status_code == 200, current.text
    assert [key["kid"] for key in current.json()["jwks"]["keys"]] == [kids[-1]]
    # No registration request was refused, and no private key reached the log.
    assert "registration_refused" not in log
    assert "registration_update.error" not in setup.op.log_path.read_text()
    published = setup.root().secrets.kv.v2.read_secret_version(
        path=f"signkey/apps/{KEY}", raise_on_deleted_version=True
    )["data"]["data"]
    assert published["kid"] == kids[-1]
    for pem in (setup.first_key, published["private_key"]):
        assert pem.splitlines()[1] not in log


# -- a SIGKILL at each journal point ---------------------------------------------------------

CRASH_KEY = "crash-signing-key"
CRASH_MAX_AGE = 3.0
CRASH_GRACE = 1.0


@dataclass
class Crash:
    setup: Setup
    config: Path
    client_uri: str
    daemons: int = 0

    def daemon(self, pause_at: str | None = None) -> DaemonProcess:
        self.daemons += 1
        workdir = self.setup.workdir / f"crash-{self.daemons}"
        workdir.mkdir()
        entry = ("keyturn", "run") if pause_at is None else (PAUSED_DAEMON, pause_at)
        return DaemonProcess(self.config, workdir, entry=entry).start()

    def record(self) -> dict[str, str]:
        return self.setup.record(CRASH_KEY)

    def token(self) -> str:
        return str(json.loads(self.record()["kind_record"])["access_token"])

    def server_kids(self) -> list[str]:
        """The key ids the server holds, read with the token keyturn keeps (a read: not
        rotated), while no daemon runs."""
        with loopback.client(timeout=5.0) as http:
            answer = http.get(self.client_uri, headers={"Authorization": f"Bearer {self.token()}"})
        assert answer.status_code == 200, answer.text
        return [key["kid"] for key in answer.json()["jwks"]["keys"]]


PAUSED_DAEMON = "keyturn_devkit.harness.paused_daemon"


@pytest.fixture(scope="module")
def crash(setup: Setup) -> Crash:
    """A second client, registered with a key keyturn makes itself from a seeded token (the
    `access_token` input), rotated with lifetimes of seconds."""
    with setup.op.client() as http:
        answer = http.post(
            "/reg",
            json={
                "token_endpoint_auth_method": "private_key_jwt",
                "jwks": {"keys": []},
                "grant_types": ["client_credentials"],
                "response_types": [],
                "redirect_uris": [],
            },
        )
    assert answer.status_code == 201, answer.text
    registered = answer.json()
    seed = setup.workdir / "crash-rat"
    seed.write_text(registered["registration_access_token"])
    seed.chmod(0o600)
    config = setup.workdir / "crash.toml"
    uri = registered["registration_client_uri"]
    head = setup.config.read_text().split("[[credentials]]")[0]
    config.write_text(
        head
        + f"""
[[credentials]]
name = "{CRASH_KEY}"
provider = "op"
kind = "signing_key"
client_id = "{registered["client_id"]}"
algorithm = "EdDSA"
publish_to = "signkey/apps/{CRASH_KEY}"
rotation = {{ max_age = "{CRASH_MAX_AGE}s", grace = "{CRASH_GRACE}s" }}
registration = {{ method = "rfc7592", client_uri = "{uri}", access_token = "file:{seed}" }}
backoff = {{ initial = "1s", max = "2s" }}
"""
    )
    crash = Crash(setup, config, registered["registration_client_uri"])
    first = crash.daemon()
    try:
        _wait(lambda: crash.record().get("rotation_phase") == "idle" and "key_id" in crash.record())
    finally:
        first.stop()
    assert crash.server_kids() == [crash.record()["key_id"]]
    return crash


def _wait(done: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if done():
                return
        except (hvac.exceptions.InvalidPath, KeyError):
            pass
        time.sleep(0.1)
    raise TimeoutError("not reached in time")


@pytest.mark.parametrize(
    "point",
    [
        "creating",
        "created",
        "pending",
        "registered",
        "verified",
        "published",
        "retiring",
        "revoked",
    ],
)
def test_a_sigkill_at_each_journal_point_resumes_without_a_lost_key(
    crash: Crash, point: str
) -> None:
    before = crash.record()["key_id"]
    paused = crash.daemon(pause_at=point)
    paused.wait_for_log('"test.paused"', timeout=CRASH_MAX_AGE + 15)
    assert paused.stop(signal.SIGKILL) == -signal.SIGKILL
    at_kill = crash.record()
    # The key the journal has in use is registered; besides it only the one it replaces (until
    # removed) or the new one (once stored): never a key keyturn does not hold.
    held = crash.server_kids()
    assert len(held) <= 2 and at_kill["key_id"] in held, (point, held)
    assert set(held) <= {before, at_kill.get("pending_key_id"), at_kill.get("key_id")}, (
        point,
        held,
        at_kill.get("rotation_phase"),
    )
    resumed = crash.daemon()
    try:
        _wait(
            lambda: (
                crash.record()["key_id"] != before
                and crash.record().get("rotation_phase") == "idle"
            )
        )
    finally:
        resumed.stop()
    # The server holds what the journal says, no more (no orphan) and no less (none lost),
    # and the token keyturn keeps works. (The resumed daemon may have begun the next rotation
    # before it stopped: its lifetimes are seconds.)
    journal = crash.record()
    after = journal["key_id"]
    held = crash.server_kids()
    previous = journal.get("previous_key_id") if journal["rotation_phase"] == "retiring" else None
    must = {after} | ({previous} if previous else set())
    may = must | ({journal["pending_key_id"]} if "pending_key_id" in journal else set())
    assert must <= set(held) <= may and len(held) <= 2, (point, held, journal["rotation_phase"])
    published = crash.setup.root().secrets.kv.v2.read_secret_version(
        path=f"signkey/apps/{CRASH_KEY}", raise_on_deleted_version=True
    )["data"]["data"]
    assert published["kid"] == after
    logs = paused.log_text() + resumed.log_text()
    assert "registration_refused" not in logs and "rotation.orphan" not in logs
