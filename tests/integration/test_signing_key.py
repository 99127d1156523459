"""A signing key rotated through RFC 7592 registration management against panva/oidc-provider
(keyturn_devkit.dev.oidc_provider: dynamic registration, registration access tokens rotated on
each update), in a real OpenBao, by `keyturn run`:

1. the test registers a client (RFC 7591) with a key pair of its own, and hands that key pair
   and the registration access token to keyturn (`keyturn import-signing-key`);
2. the daemon rotates the key twice (a few seconds each) while an `oauth_client` credential
   authenticates with the published key (`private_key_jwt`, `client_key` a reference to the
   signing key's `private_key`) and an app reads its token and calls the resource server;
3. throughout, the registration never holds more than two keys, and at the end only the key in
   use; the first registration access token is dead (rotated away) and keyturn's last one works.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import hvac
import pytest

from keyturn_devkit.dev.client_keys import private_key_pem, public_jwks
from keyturn_devkit.dev.oidc_provider import OidcProvider
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.harness.apps import AppSampler
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
        token_file = workdir / "vault-token"
        token_file.write_text(openbao.root_token)
        config = workdir / "keyturn.toml"
        config.write_text(
            _config(
                op,
                openbao.address,
                token_file,
                registered["client_id"],
                registered["registration_client_uri"],
            )
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
        )


def _config(op: OidcProvider, vault: str, token_file: Path, client_id: str, uri: str) -> str:
    return f"""
[keyturn]
instance_id = "signkey-test"
state_prefix = "{STATE_PREFIX}"

[vault]
address = "{vault}"
auth = {{ method = "token_file", path = "{token_file}" }}

[metrics]
listen = "127.0.0.1:0"

[[providers]]
name = "op"
base_url = "{op.issuer}"
token_path = "/token"
token_request = "form"
timeout = "3s"
allow_insecure_http = true

[[credentials]]
name = "{KEY}"
provider = "op"
kind = "signing_key"
client_id = "{client_id}"
algorithm = "ES256"
publish_to = "signkey/apps/{KEY}"
rotation = {{ max_age = "{MAX_AGE}s", grace = "{GRACE}s" }}
registration = {{ method = "rfc7592", client_uri = "{uri}" }}
backoff = {{ initial = "1s", max = "4s" }}

[[credentials]]
name = "{APP}"
provider = "op"
kind = "oauth_client"
client_id = "{client_id}"
client_auth = "private_key_jwt"
client_key = "vault:secret/signkey/apps/{KEY}#private_key"
client_key_alg = "ES256"
publish_to = "signkey/apps/{APP}"
backoff = {{ initial = "1s", max = "4s" }}
"""


def _present(setup: Setup, token: str) -> httpx.Response:
    """A registration read (RFC 7592 §2.1) with `token`, as the test: oidc-provider rotates
    the token on updates only, so a read leaves it as it was."""
    with httpx.Client(timeout=5.0) as http:
        return http.get(setup.client_uri, headers={"Authorization": f"Bearer {token}"})


def test_a_key_rotated_twice_through_rfc7592_while_tokens_keep_working(setup: Setup) -> None:
    handed = json.dumps(
        {"private_key": setup.first_key, "registration_access_token": setup.first_token}
    )
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
        rows = status_rows(setup.config)
        log = daemon.log_text()

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
    assert rows[APP]["phase"] == "ok", rows[APP]
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
