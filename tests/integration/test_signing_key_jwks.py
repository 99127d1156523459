"""A signing key registered by a JWKS document keyturn publishes (`registration = { method =
"jwks", file = … }`), fetched by panva/oidc-provider as the client's `jwks_uri`, in a real
OpenBao, by `keyturn run`.

The test serves keyturn's file over HTTP on loopback (as any static web server would: no
Cache-Control) and keeps every version the provider fetched, with the time. oidc-provider
keeps a fetched document at least 60 s and cannot be told to keep it less
(node_modules/oidc-provider/lib/models/client.js, `ClientKeyStore.refresh`: `epochTime() + 60`,
which Cache-Control max-age and Expires can only lengthen), and fetches again only when an
assertion does not verify against the copy it holds and that copy is older than that
(lib/helpers/jwt.js, `verify`). So `server_cache = "60s"`, and each key keyturn makes waits
60 s before it signs: the first key, then ONE rotation while an `oauth_client` authenticates
with the published key (`private_key_jwt`) and an app reads its token and calls the resource
server. About 2 min 20 s of wall time, nearly all of it asleep.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import hvac
import pytest

from keyturn.clock import parse_rfc3339
from keyturn_devkit.dev.loopback import serve_json
from keyturn_devkit.dev.oidc_provider import OidcProvider, jwks_uri_client
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.harness.apps import AppSampler
from keyturn_devkit.harness.configs import write_signing_key_and_client
from keyturn_devkit.harness.deployment import DaemonProcess
from keyturn_devkit.harness.key_rotation import status_rows

pytestmark = [pytest.mark.openbao, pytest.mark.slow, pytest.mark.timeout(300)]

KEY = "jwks-signing-key"
APP = "jwks-app"
CLIENT_ID = "jwks-client"
SERVER_CACHE = 60.0  # oidc-provider's least (and here only) cache of a fetched jwks_uri
MAX_AGE = 15.0  # the second key is made this long after the first took over
GRACE = 4.0  # the old key stays in the document this long after the new one took over
TTL = 10  # seconds an access token lives
WRITE_SLACK = 0.5  # more than a Vault write on loopback takes
STATE_PREFIX = "signjwks/keyturn/state"


@dataclass(frozen=True)
class Version:
    """A version of the document: when it was written (the file's mtime) or fetched, and the
    key ids it held."""

    at: float
    kids: tuple[str, ...]


@dataclass
class JwksFile:
    """keyturn's JWKS file, served over HTTP on loopback; each fetch is kept."""

    path: Path
    fetches: list[Version] = field(default_factory=list)
    written: list[Version] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _mtime: int = 0

    def fetched(self) -> bytes | None:
        """The file as a GET finds it (None: not written yet); each fetch is kept."""
        try:
            body = self.path.read_bytes()
        except FileNotFoundError:
            return None
        with self._lock:
            self.fetches.append(Version(time.time(), _kids(body)))
        return body

    def look(self) -> None:
        """Keep the file's version if it changed (keyturn replaces it atomically: its mtime is
        when it was written)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return
        if stat.st_mtime_ns != self._mtime:
            self._mtime = stat.st_mtime_ns
            self.written.append(Version(stat.st_mtime_ns / 1e9, _kids(self.path.read_bytes())))


def _kids(document: bytes) -> tuple[str, ...]:
    return tuple(key["kid"] for key in json.loads(document)["keys"])


@dataclass
class Setup:
    op: OidcProvider
    vault: OpenBaoDevServer
    config: Path
    workdir: Path
    jwks: JwksFile

    def root(self) -> hvac.Client:
        return hvac.Client(url=self.vault.address, token=self.vault.root_token)

    def record(self) -> dict[str, str]:
        try:
            entry = self.root().secrets.kv.v2.read_secret_version(
                path=f"{STATE_PREFIX}/{KEY}", raise_on_deleted_version=True
            )
        except hvac.exceptions.InvalidPath:
            return {}
        return dict(entry["data"]["data"])


@pytest.fixture(scope="module")
def setup(openbao: OpenBaoDevServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("signjwks")
    (workdir / "www").mkdir()
    jwks = JwksFile(workdir / "www" / "jwks.json")
    with serve_json(jwks.fetched) as uri, OidcProvider(
        workdir, clients=[jwks_uri_client(CLIENT_ID, uri)], access_token_ttl=TTL
    ) as op:
        config = write_signing_key_and_client(
            workdir,
            issuer=op.issuer,
            vault=openbao.address,
            root_token=openbao.root_token,
            prefix="signjwks",
            client_id=CLIENT_ID,
            key=KEY,
            app=APP,
            rotation=f'{{ max_age = "{MAX_AGE}s", grace = "{GRACE}s" }}',
            registration=(
                f'{{ method = "jwks", file = "{jwks.path}", '
                f'server_cache = "{SERVER_CACHE}s" }}'
            ),
        )
        yield Setup(op, openbao, config, workdir, jwks)


def test_a_key_rotated_through_a_jwks_uri_the_server_fetches(setup: Setup) -> None:
    apps = AppSampler(
        setup.vault.address,
        setup.vault.root_token,
        setup.op.resource_url,
        {APP: f"signjwks/apps/{APP}"},
        probe="/",
        interval=0.25,
    )
    kids: list[str] = []
    app_version = 0  # the app's token version when the second key took over
    with DaemonProcess(setup.config, setup.workdir) as daemon:
        # The first key waits SERVER_CACHE before it signs, then the second is made MAX_AGE
        # after it took over and waits as long; then the app's next token: about 2 min 20 s.
        deadline = time.monotonic() + 2 * SERVER_CACHE + MAX_AGE + GRACE + 60
        started: float | None = None
        while time.monotonic() < deadline:
            setup.jwks.look()
            record = setup.record()
            if record.get("key_id") not in (None, *kids[-1:]):
                kids.append(record["key_id"])
                if len(kids) == 1:
                    apps.start(limit=150)
                    apps.wait_version(APP, 1, timeout=20)
                    started = time.time()
                else:
                    app_version = apps.snapshot(APP)[-1].version or 0
            # Done when the old key is out and the app has a token obtained since the switch.
            newer = app_version and (apps.snapshot(APP)[-1].version or 0) > app_version
            if len(kids) == 2 and record.get("rotation_phase") == "idle" and newer:
                break
            time.sleep(0.2)
        apps.stop()
    setup.jwks.look()
    rows = status_rows(setup.config)
    log = daemon.log_text()

    assert len(kids) == 2 and started is not None, (kids, rows[KEY], log[-2000:])
    first, second = kids
    # What the app saw: every token read was fresh and every call accepted.
    assert apps.snapshot(since=started), apps.summary()
    assert apps.expired(since=started) == [], apps.summary()
    assert apps.refused(since=started) == [], [str(r) for r in apps.refused()]

    # Every assertion the provider judged was accepted, each signed by a key keyturn made.
    assertions = [a for a in setup.op.client_assertions() if a["client"] == CLIENT_ID]
    assert [a for a in assertions if a["outcome"] != "accepted"] == [], assertions
    assert {a["kid"] for a in assertions} == {first, second}, assertions
    # The oauth_client moved to the new key (read at each request: oidc-provider would have
    # gone on accepting the old one, so no refusal would have told it).
    by_second = [a for a in assertions if a["kid"] == second]
    assert assertions[-1]["kid"] == second and len(by_second) >= 2, assertions[-4:]

    written, fetches = setup.jwks.written, setup.jwks.fetches
    for kid in (first, second):
        signed = min(a["at"] / 1000 for a in assertions if a["kid"] == kid)
        # The document the provider fetched last before the key first signed held it ...
        fetched = [f for f in fetches if f.at <= signed]
        assert fetched and kid in fetched[-1].kids, (kid, signed, fetches)
        # ... and had held it for at least the provider's cache: no copy the provider could
        # still hold lacked it.
        joined = min(w.at for w in written if kid in w.kids)
        assert signed - joined >= SERVER_CACHE, (kid, signed, written)

    # The old key left the document only after the grace (counted from when apps were given
    # the new key, less the time of that Vault write: keyturn counts from just before it),
    # never more than two keys in it, and only the new one at the end.
    published = setup.root().secrets.kv.v2.read_secret_version(
        path=f"signjwks/apps/{KEY}", raise_on_deleted_version=True
    )["data"]
    assert published["data"]["kid"] == second
    took_over = parse_rfc3339(published["metadata"]["created_time"])
    left = min(w.at for w in written if second in w.kids and first not in w.kids)
    assert left - took_over >= GRACE - WRITE_SLACK, (took_over, written)
    assert all(first in w.kids for w in written if w.at < left), written
    assert max(len(w.kids) for w in written) <= 2, written
    assert written[-1].kids == (second,), written
    assert rows[KEY]["key_id"] == second
    assert rows[KEY]["details"] == {"registered": second}
    assert rows[APP]["last_error"] in (None, "") and rows[APP]["consecutive_failures"] == 0
    published_pem = published["data"]["private_key"]
    assert published_pem.splitlines()[1] not in log
