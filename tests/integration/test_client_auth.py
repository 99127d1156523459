"""Clients without a client secret, against panva/oidc-provider over real HTTPS on loopback
(keyturn_devkit.dev.oidc_provider): private_key_jwt (aud the token endpoint, and the issuer),
self_signed_tls_client_auth with certificate-bound tokens, a refresh-token family kept with
private_key_jwt, and the JWT bearer grant of a Google-style service account. The daemon keeps
them all in a real OpenBao while apps read Vault and call a resource server that verifies
each token (signature, issuer, `aud`, and a bound token's certificate). Beside them, bad
credentials: a 1024-bit RSA key, an expired certificate, a key the server never registered.
They fail with a line naming the credential and what is wrong, raise alerts, and the others
are served all along. `keyturn check --live` says the same in one line each.
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import hvac
import jwt
import pytest

from keyturn_devkit.dev.client_keys import (
    ca_signed_certificate,
    private_key_pem,
    public_jwks,
    self_signed_certificate,
    service_account_json,
)
from keyturn_devkit.dev.loopback import serve_json
from keyturn_devkit.dev.oidc_provider import (
    OidcProvider,
    jwks_uri_client,
    private_key_jwt_client,
    self_signed_tls_client,
)
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.tls import make_throwaway_pki
from keyturn_devkit.harness.apps import AppSampler
from keyturn_devkit.harness.deployment import DaemonProcess
from keyturn_devkit.harness.faketime import FakeWallClock
from keyturn_devkit.harness.key_rotation import run_keyturn, status_rows
from keyturn_devkit.harness.receiver import AlertReceiver

pytestmark = [pytest.mark.openbao, pytest.mark.slow]

TTL = 8  # seconds an access token lives: several refreshes in the run
RUN = 20.0  # seconds the apps read while the daemon runs
GOOD = ("jwt-es256", "jwt-issuer", "mtls", "mtls-ca", "refreshing", "google-sa", "jwks-uri")
BAD = ("short-rsa", "expired-cert", "unregistered")
SA_EMAIL = "reports@keyturn-test.iam.gserviceaccount.com"


@dataclass
class Setup:
    op: OidcProvider
    config: Path
    workdir: Path
    vault: OpenBaoDevServer
    env: dict[str, str]
    mtls_cert: tuple[str, str]
    receiver: AlertReceiver

    def publish_to(self, name: str) -> str:
        return f"clientauth/apps/{name}"


def jwks_published(jwks: dict[str, object]) -> contextlib.AbstractContextManager[str]:
    """A client's JWKS served over HTTP on loopback (what a client publishes for `jwks_uri`)."""
    body = json.dumps(jwks).encode()
    return serve_json(lambda: body)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return f"file:{path}"


@pytest.fixture(scope="module")
def setup(openbao: OpenBaoDevServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("clientauth")
    pki = make_throwaway_pki(workdir / "pki")
    ca_client_key = private_key_pem("ES256")
    ca_client_cert = ca_signed_certificate(
        ca_client_key, pki.ca_cert, pki.ca_cert.parent / "ca.key", common_name="keyturn-ca-client"
    )
    es256, ps256, rs256 = (
        private_key_pem("ES256"),
        private_key_pem("PS256"),
        private_key_pem("RS256"),
    )
    refreshing, sa_key, stranger = (
        private_key_pem("EdDSA"),
        private_key_pem("RS256"),
        private_key_pem("ES256"),
    )
    mtls_cert = self_signed_certificate(rs256)
    expired_key = private_key_pem("ES256")
    expired_cert = self_signed_certificate(expired_key, days=1, starts_in=-3 * 86400)
    clients = [
        private_key_jwt_client("jwt-es256", public_jwks((es256, "ES256"))),
        private_key_jwt_client("jwt-issuer", public_jwks((ps256, "PS256")), alg="PS256"),
        self_signed_tls_client("mtls", public_jwks((rs256, "RS256"), certificate=mtls_cert)),
        private_key_jwt_client("refreshing", public_jwks((refreshing, "EdDSA"))),
        private_key_jwt_client("unregistered", public_jwks((es256, "ES256"))),
        private_key_jwt_client("short-rsa", public_jwks((es256, "ES256"))),
        self_signed_tls_client(
            "expired-cert", public_jwks((expired_key, "ES256"), certificate=expired_cert)
        ),
    ]
    published = private_key_pem("ES256")
    ca_client = {
        "client_id": "mtls-ca",
        "token_endpoint_auth_method": "tls_client_auth",
        "tls_client_auth_subject_dn": "CN=keyturn-ca-client",
        "grant_types": ["client_credentials"],
        "response_types": [],
        "redirect_uris": [],
    }
    sa_jwks = public_jwks((sa_key, "RS256"))
    sa_jwks["keys"][0]["kid"] = "0123456789abcdef"
    with (
        jwks_published(public_jwks((published, "ES256"))) as jwks_uri,
        OidcProvider(
            workdir,
            clients=[*clients, jwks_uri_client("jwks-uri", jwks_uri), ca_client],
            tls=True,
            pki=pki,
            access_token_ttl=TTL,
            service_accounts={SA_EMAIL: sa_jwks},
        ) as op,
        AlertReceiver() as receiver,
    ):
        root = hvac.Client(url=openbao.address, token=openbao.root_token)
        # One key from Vault (as keyturn's inputs usually are), the others from files.
        root.secrets.kv.v2.create_or_update_secret(
            path="clientauth/inputs/jwt-es256", secret={"private_key": es256}
        )
        refs = {
            "ps256": _write(workdir / "ps256.key", ps256),
            "rs256": _write(workdir / "rs256.key", rs256),
            "mtls_cert": _write(workdir / "mtls.crt", mtls_cert),
            "ca_client_key": _write(workdir / "ca-client.key", ca_client_key),
            "ca_client_cert": _write(workdir / "ca-client.crt", ca_client_cert),
            "refreshing": _write(workdir / "eddsa.key", refreshing),
            "sa": _write(
                workdir / "sa.json", service_account_json(sa_key, SA_EMAIL, op.google_token_url)
            ),
            "stranger": _write(workdir / "stranger.key", stranger),
            "published": _write(workdir / "published.key", published),
            "short": _write(workdir / "short.key", private_key_pem("RS256", rsa_bits=1024)),
            "expired_key": _write(workdir / "expired.key", expired_key),
            "expired_cert": _write(workdir / "expired.crt", expired_cert),
            "seed": _write(workdir / "seed", op.seed_refresh_token("refreshing")),
        }
        token_file = workdir / "vault-token"
        token_file.write_text(openbao.root_token)
        config = workdir / "keyturn.toml"
        config.write_text(_config(op, openbao.address, token_file, refs, receiver.hook_url))
        env = {"SSL_CERT_FILE": str(op.ca_cert)}
        yield Setup(
            op,
            config,
            workdir,
            openbao,
            env,
            (str(workdir / "mtls.crt"), str(workdir / "rs256.key")),
            receiver,
        )


def _config(op: OidcProvider, vault: str, token_file: Path, refs: dict[str, str], hook: str) -> str:
    provider = f'base_url = "{op.issuer}"\ntoken_path = "/token"\ntoken_request = "form"\n'
    provider += 'revoke_path = "/token/revocation"\ntimeout = "3s"\n'

    def credential(name: str, provider: str, **keys: str) -> str:
        lines = [f'name = "{name}"', f'provider = "{provider}"', 'kind = "oauth_client"']
        lines.append(f'client_id = "{name}"')
        lines += [f"{key} = {json.dumps(value)}" for key, value in keys.items()]
        lines.append(f'publish_to = "clientauth/apps/{name}"')
        lines.append('backoff = { initial = "1s", max = "4s" }')
        return "\n[[credentials]]\n" + "\n".join(lines) + "\n"

    return (
        '[keyturn]\ninstance_id = "test"\nstate_prefix = "clientauth/keyturn/state"\n'
        f'[vault]\naddress = "{vault}"\nauth = {{ method = "token_file", path = "{token_file}" }}\n'
        '[metrics]\nlisten = "127.0.0.1:0"\n'
        f'[[providers]]\nname = "op"\n{provider}'
        f'[[providers]]\nname = "op-issuer"\n{provider}'
        f'client_assertion_audience = "issuer"\nissuer = "{op.issuer}"\n'
        f'[[providers]]\nname = "google"\nbase_url = "{op.issuer}"\n'
        'token_path = "/__google/token"\ntoken_request = "form"\ntimeout = "3s"\n'
        + credential(
            "jwt-es256",
            "op",
            client_auth="private_key_jwt",
            client_key="vault:secret/clientauth/inputs/jwt-es256#private_key",
            scope="read",
        )
        + credential(
            "jwt-issuer",
            "op-issuer",
            client_auth="private_key_jwt",
            client_key=refs["ps256"],
            client_key_alg="PS256",
        )
        + credential(
            "mtls",
            "op",
            client_auth="self_signed_tls_client_auth",
            client_key=refs["rs256"],
            client_certificate=refs["mtls_cert"],
        )
        + credential(
            "refreshing",
            "op",
            client_auth="private_key_jwt",
            client_key=refs["refreshing"],
            refresh_token=refs["seed"],
        )
        + credential(
            "google-sa",
            "google",
            grant="jwt_bearer",
            service_account=refs["sa"],
            scope="https://www.googleapis.com/auth/devstorage.read_only",
        )
        + credential(
            "mtls-ca",
            "op",
            client_auth="tls_client_auth",
            client_key=refs["ca_client_key"],
            client_certificate=refs["ca_client_cert"],
        )
        + credential("jwks-uri", "op", client_auth="private_key_jwt", client_key=refs["published"])
        + credential("short-rsa", "op", client_auth="private_key_jwt", client_key=refs["short"])
        + credential(
            "expired-cert",
            "op",
            client_auth="self_signed_tls_client_auth",
            client_key=refs["expired_key"],
            client_certificate=refs["expired_cert"],
        )
        + credential(
            "unregistered", "op", client_auth="private_key_jwt", client_key=refs["stranger"]
        )
        + f'\n[[alerts]]\nname = "hook"\ntype = "webhook"\nurl = "{hook}"\nmin_severity = "info"\n'
    )


def test_tokens_kept_fresh_by_every_method_while_apps_call_the_resource_server(
    setup: Setup,
) -> None:
    op = setup.op
    paths = {name: setup.publish_to(name) for name in GOOD if name != "mtls"}
    apps = AppSampler(
        setup.vault.address,
        setup.vault.root_token,
        op.resource_url,
        paths,
        probe="/",
        verify=str(op.ca_cert),
        interval=0.25,
    )
    # The certificate-bound token is usable only with its certificate: that app holds it.
    bound_app = AppSampler(
        setup.vault.address,
        setup.vault.root_token,
        op.resource_url,
        {"mtls": setup.publish_to("mtls")},
        probe="/",
        verify=str(op.ca_cert),
        cert=setup.mtls_cert,
        interval=0.25,
    )
    with DaemonProcess(setup.config, setup.workdir, env=setup.env) as daemon:
        for name in GOOD:
            _wait_published(setup, name)
        started = time.time()
        apps.start(limit=RUN + 10)
        bound_app.start(limit=RUN + 10)
        time.sleep(RUN)
        apps.stop()
        bound_app.stop()
        rows = status_rows(setup.config, env=setup.env)
        log = daemon.log_text()

    for sampler in (apps, bound_app):
        reads = sampler.snapshot(since=started)
        assert reads, sampler.summary()
        assert sampler.expired(since=started) == [], sampler.summary()
        assert sampler.refused(since=started) == [], [str(r) for r in sampler.refused()]
        assert sampler.vault_errors(since=started) == []
    # Each good credential was refreshed several times during the run (TTL 8 s, 20 s).
    for name in GOOD:
        sampler = bound_app if name == "mtls" else apps
        versions = {r.version for r in sampler.snapshot(name, since=started)}
        assert len(versions) >= 2, (name, sampler.summary(name))
        assert rows[name]["last_error"] in (None, ""), rows[name]

    root = hvac.Client(url=setup.vault.address, token=setup.vault.root_token)
    bound = root.secrets.kv.v2.read_secret_version(
        path=setup.publish_to("mtls"), raise_on_deleted_version=True
    )["data"]["data"]
    claims = jwt.decode(bound["access_token"], options={"verify_signature": False})
    assert claims["cnf"]["x5t#S256"] == bound["cnf_x5t_s256"]
    # The bound token is refused on a connection without its certificate.
    without = httpx.get(
        op.resource_url,
        headers={"Authorization": bound["authorization"]},
        verify=ssl.create_default_context(cafile=str(op.ca_cert)),
    )
    assert without.status_code == 401
    assert "certificate-bound token without its certificate" in without.text
    assert bound["client_certificate"] == Path(setup.mtls_cert[0]).read_text().rstrip("\n")
    # The refresh-token family was used and rotated: keyturn holds a newer one than the seed.
    held = root.secrets.kv.v2.read_secret_version(
        path="clientauth/keyturn/state/refreshing", raise_on_deleted_version=True
    )["data"]["data"]
    # (None if a lost answer on a busy machine made keyturn drop it: never the seed again.)
    assert held.get("refresh_token") != (setup.workdir / "seed").read_text().strip()
    google = root.secrets.kv.v2.read_secret_version(
        path=setup.publish_to("google-sa"), raise_on_deleted_version=True
    )["data"]["data"]
    google_claims = jwt.decode(google["access_token"], options={"verify_signature": False})
    assert google_claims["client_id"] == SA_EMAIL
    assert google_claims["scope"] == "https://www.googleapis.com/auth/devstorage.read_only"

    # The bad ones: each says what is wrong, in its status row and the log, never a key.
    assert (
        "client_key: is an RSA key of 1024 bits; expected an RSA key of at least 2048 bits"
        in (rows["short-rsa"]["last_error"])
    )
    assert "client_certificate: expired at " in rows["expired-cert"]["last_error"]
    refused = rows["unregistered"]["last_error"]
    assert "invalid_client" in refused
    assert f"sent client assertion iss=sub=unregistered aud={op.token_url} alg=ES256" in refused
    for name in BAD:
        assert rows[name]["phase"] != "ok", rows[name]
        # Backed off (1 s doubling to 4 s): retried, not in a hot loop, over the ~35 s run.
        assert 2 <= rows[name]["consecutive_failures"] <= 20, rows[name]
    for text in (log, json.dumps(rows)):
        for key_file in ("short.key", "expired.key", "stranger.key", "rs256.key", "eddsa.key"):
            body = (setup.workdir / key_file).read_text().splitlines()[1]
            assert body not in text
    # An operator is told: the refused key at once (client_rejected), the others as they fail.
    alerts = [d.json()["alert"] for d in setup.receiver.deliveries()]
    fired = {(a["credential"], a["detector"]) for a in alerts}
    assert ("unregistered", "client_rejected") in fired, fired
    assert ("short-rsa", "credential_failing") in fired, fired
    assert ("expired-cert", "credential_failing") in fired, fired
    assert not {credential for credential, _ in fired} & set(GOOD), fired


def test_check_live_says_what_is_wrong_in_one_line_each(setup: Setup) -> None:
    result = run_keyturn("check", "-c", str(setup.config), "--live", env=setup.env)
    lines = (result.stdout + result.stderr).splitlines()
    by_name = {
        name: [line for line in lines if line.startswith(f"credentials['{name}']:")]
        for name in GOOD + BAD
    }
    for name in GOOD:
        assert by_name[name] == [f"credentials['{name}']: token issued (no probe configured)"], (
            lines
        )
    assert len(by_name["short-rsa"]) == 1
    assert "client_key: is an RSA key of 1024 bits" in by_name["short-rsa"][0]
    assert "client_certificate: expired at" in by_name["expired-cert"][0]
    assert "token request refused" in by_name["unregistered"][0]
    assert "alg=ES256" in by_name["unregistered"][0]
    assert result.returncode == 1


def _wait_published(setup: Setup, name: str, timeout: float = 30.0) -> None:
    root = hvac.Client(url=setup.vault.address, token=setup.vault.root_token)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            root.secrets.kv.v2.read_secret_version(
                path=setup.publish_to(name), raise_on_deleted_version=True
            )
            return
        except hvac.exceptions.InvalidPath:
            time.sleep(0.2)
    raise TimeoutError(f"{name} not published within {timeout}s")


def test_a_clock_behind_the_servers_is_named_when_the_assertion_is_refused(
    openbao: OpenBaoDevServer, tmp_path: Path
) -> None:
    """keyturn's wall clock 5 minutes slow (libfaketime): its assertions have expired by the
    server's clock; the refusal names what was sent and the skew seen in the server's Date.
    (Plain HTTP: with TLS, the server's fresh certificate would look not yet valid first.)"""
    key = private_key_pem("ES256")
    with OidcProvider(
        tmp_path, clients=[private_key_jwt_client("skewed", public_jwks((key, "ES256")))]
    ) as op:
        token_file = tmp_path / "vault-token"
        token_file.write_text(openbao.root_token)
        config = tmp_path / "keyturn.toml"
        config.write_text(
            '[keyturn]\ninstance_id = "test"\nstate_prefix = "clientauth-skew/state"\n'
            f'[vault]\naddress = "{openbao.address}"\n'
            f'auth = {{ method = "token_file", path = "{token_file}" }}\n'
            f'[[providers]]\nname = "op"\nbase_url = "{op.issuer}"\n'
            'allow_insecure_http = true\ntoken_path = "/token"\ntoken_request = "form"\n'
            '[[credentials]]\nname = "skewed"\nprovider = "op"\nkind = "oauth_client"\n'
            'client_id = "skewed"\nclient_auth = "private_key_jwt"\n'
            f'client_key = "{_write(tmp_path / "skewed.key", key)}"\n'
            'publish_to = "clientauth-skew/apps/skewed"\n'
        )
        clock = FakeWallClock(tmp_path / "faketime")
        clock.step(-300)
        result = run_keyturn("check", "-c", str(config), "--live", env=clock.env())
    lines = (result.stdout + result.stderr).splitlines()
    (refused,) = [line for line in lines if line.startswith("credentials['skewed']:")]
    assert "invalid_client" in refused
    assert f"sent client assertion iss=sub=skewed aud={op.token_url} alg=ES256" in refused
    assert re.search(r"the server's clock is (299|300|301)s ahead of keyturn's", refused), refused
    assert result.returncode == 1
