"""A second identity server nobody here wrote: Glewlwyd 2.7 (Debian's `glewlwyd`, in C), for
client credentials with `private_key_jwt`. The daemon keeps a token fresh in a real OpenBao
while a reader checks every value it reads against Glewlwyd's own JWKS (signature, issuer,
expiry); a client whose key Glewlwyd never registered is refused with a bare 403, which
keyturn reports as invalid_client naming what it sent. A client registered dynamically (RFC
7591) has its key rotated by `keyturn rotate` through Glewlwyd's RFC 7592 registration
management."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import hvac
import hvac.exceptions
import jwt
import pytest

from keyturn_devkit.dev.client_keys import private_key_pem, public_jwks
from keyturn_devkit.dev.glewlwyd import GlewlwydServer
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.harness.deployment import DaemonProcess
from keyturn_devkit.harness.key_rotation import run_keyturn, status_rows

pytestmark = [pytest.mark.openbao, pytest.mark.slow]

TTL = 6
RUN = 12.0
SIGNING_KEY = "glew-signing-key"
GRACE = 2.0  # seconds the old public key stays registered


@pytest.fixture(scope="module")
def deployment(
    openbao: OpenBaoDevServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GlewlwydServer, Path]]:
    workdir = tmp_path_factory.mktemp("glewlwyd")
    key, stranger = private_key_pem("ES256"), private_key_pem("ES256")
    with GlewlwydServer(workdir, access_token_ttl=TTL, registration=True) as idp:
        idp.add_private_key_jwt_client("glew-es256", public_jwks((key, "ES256")))
        idp.add_private_key_jwt_client("glew-stranger", public_jwks((key, "ES256")))
        for name, pem in (("glew.key", key), ("stranger.key", stranger)):
            (workdir / name).write_text(pem)
        token_file = workdir / "vault-token"
        token_file.write_text(openbao.root_token)
        config = workdir / "keyturn.toml"
        config.write_text(
            '[keyturn]\ninstance_id = "test"\nstate_prefix = "glewlwyd/keyturn/state"\n'
            f'[vault]\naddress = "{openbao.address}"\n'
            f'auth = {{ method = "token_file", path = "{token_file}" }}\n'
            '[metrics]\nlisten = "127.0.0.1:0"\n'
            f'[[providers]]\nname = "glewlwyd"\nbase_url = "{idp.base_url}"\n'
            'allow_insecure_http = true\ntoken_path = "/api/oidc/token"\n'
            'token_request = "form"\ntimeout = "3s"\n'
            + "".join(
                f'[[credentials]]\nname = "{name}"\nprovider = "glewlwyd"\n'
                f'kind = "oauth_client"\nclient_id = "{name}"\nclient_auth = "private_key_jwt"\n'
                f'client_key = "file:{workdir / file}"\nscope = "read"\n'
                f'publish_to = "glewlwyd/apps/{name}"\nbackoff = {{ initial = "1s", max = "4s" }}\n'
                for name, file in (("glew-es256", "glew.key"), ("glew-stranger", "stranger.key"))
            )
        )
        yield idp, config


def test_check_live_gets_a_token_and_names_a_refused_key(
    deployment: tuple[GlewlwydServer, Path],
) -> None:
    idp, config = deployment
    result = run_keyturn("check", "-c", str(config), "--live")
    lines = (result.stdout + result.stderr).splitlines()
    assert "credentials['glew-es256']: token issued (no probe configured)" in lines, lines
    (refused,) = [line for line in lines if line.startswith("credentials['glew-stranger']:")]
    assert "invalid_client (HTTP 403 with no error body; sent client assertion" in refused
    assert f"iss=sub=glew-stranger aud={idp.token_url} alg=ES256" in refused
    assert result.returncode == 1


def test_the_daemon_keeps_a_glewlwyd_token_fresh(
    deployment: tuple[GlewlwydServer, Path], openbao: OpenBaoDevServer
) -> None:
    idp, config = deployment
    keys = jwt.PyJWKClient(idp.jwks_url)
    root = hvac.Client(url=openbao.address, token=openbao.root_token)
    reads: list[tuple[float, int, str]] = []  # (when, version, what was wrong or "")
    with DaemonProcess(config, config.parent):
        deadline = time.monotonic() + RUN
        while time.monotonic() < deadline:
            try:
                entry = root.secrets.kv.v2.read_secret_version(
                    path="glewlwyd/apps/glew-es256", raise_on_deleted_version=True
                )
            except hvac.exceptions.InvalidPath:
                time.sleep(0.2)
                continue
            token = entry["data"]["data"]["access_token"]
            problem = ""
            try:
                jwt.decode(
                    token,
                    keys.get_signing_key_from_jwt(token).key,
                    algorithms=["RS256"],
                    issuer=idp.issuer,
                    options={"verify_aud": False},
                )
            except jwt.PyJWTError as error:
                problem = f"{type(error).__name__}: {error}"
            reads.append((time.time(), entry["data"]["metadata"]["version"], problem))
            time.sleep(0.25)
    assert len(reads) > 20
    assert [r for r in reads if r[2]] == []  # every value read was valid when read
    assert len({version for _, version, _ in reads}) >= 2  # refreshed during the run
    state = root.secrets.kv.v2.read_secret_version(
        path="glewlwyd/keyturn/state/glew-stranger", raise_on_deleted_version=True
    )["data"]["data"]
    assert "HTTP 403 with no error body" in json.dumps(state)


def _token_request(idp: GlewlwydServer, client_id: str, pem: str, kid: str) -> httpx.Response:
    """Client credentials, authenticated by an ES256 assertion signed with `pem` as `kid`."""
    now = int(time.time())
    claims = {"iss": client_id, "sub": client_id, "aud": idp.token_url, "iat": now}
    claims |= {"exp": now + 60, "jti": uuid.uuid4().hex}
    assertion = jwt.encode(claims, pem, algorithm="ES256", headers={"kid": kid})
    form = {"grant_type": "client_credentials", "scope": "read", "client_id": client_id}
    form["client_assertion_type"] = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    return HTTP.post(idp.token_url, data={**form, "client_assertion": assertion})


def _registered_kids(uri: str, token: str) -> list[str]:
    """The key ids of the client's registration, read (RFC 7592 §2.1) with `token`."""
    read = HTTP.get(uri, headers={"Authorization": f"Bearer {token}"})
    assert read.status_code == 200, read.text
    return [key["kid"] for key in read.json()["jwks"]["keys"]]


def test_a_dynamically_registered_key_is_rotated_through_rfc7592_management(
    deployment: tuple[GlewlwydServer, Path], openbao: OpenBaoDevServer
) -> None:
    idp, shared = deployment
    first = private_key_pem("ES256")
    jwks = public_jwks((first, "ES256"))
    answer = HTTP.post(
        idp.register_url,
        json={
            "token_endpoint_auth_method": "private_key_jwt",
            "jwks": jwks,
            "grant_types": ["client_credentials"],
            "redirect_uris": ["https://client.keyturn.test/callback"],  # Glewlwyd needs one
        },
    )
    assert answer.status_code == 200, answer.text
    registered = answer.json()
    client_id, uri = registered["client_id"], registered["registration_client_uri"]
    token = registered["registration_access_token"]
    first_kid = jwks["keys"][0]["kid"]
    assert _token_request(idp, client_id, first, first_kid).status_code == 200
    config = shared.parent / "signing-key.toml"
    config.write_text(
        shared.read_text().split("[[credentials]]")[0]
        + f'[[credentials]]\nname = "{SIGNING_KEY}"\nprovider = "glewlwyd"\n'
        f'kind = "signing_key"\nclient_id = "{client_id}"\nalgorithm = "ES256"\n'
        f'scope = "read"\npublish_to = "glewlwyd/apps/{SIGNING_KEY}"\n'
        f'rotation = {{ max_age = "30d", grace = "{GRACE}s" }}\n'
        f'registration = {{ method = "rfc7592", client_uri = "{uri}" }}\n'
    )
    handed = json.dumps({"private_key": first, "registration_access_token": token})
    imported = run_keyturn("import-signing-key", "-c", str(config), SIGNING_KEY, stdin=handed)
    assert imported.returncode == 0, imported.stdout + imported.stderr

    rotated = run_keyturn("rotate", "-c", str(config), SIGNING_KEY)
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    root = hvac.Client(url=openbao.address, token=openbao.root_token)
    published = root.secrets.kv.v2.read_secret_version(
        path=f"glewlwyd/apps/{SIGNING_KEY}", raise_on_deleted_version=True
    )["data"]["data"]
    new, new_kid = published["private_key"], published["kid"]
    assert _registered_kids(uri, token) == [first_kid, new_kid]  # both, through the grace
    time.sleep(GRACE + 0.5)
    retired = run_keyturn("rotate", "-c", str(config), SIGNING_KEY)  # moves past the grace
    assert retired.returncode == 0, retired.stdout + retired.stderr

    # Glewlwyd keeps its registration access token on updates (oidc-provider rotates it): the
    # one handed over still reads the registration, which holds only the new key.
    assert _registered_kids(uri, token) == [new_kid]
    assert _token_request(idp, client_id, new, new_kid).status_code == 200
    assert _token_request(idp, client_id, first, first_kid).status_code in (401, 403)
    assert status_rows(config)[SIGNING_KEY]["key_id"] == new_kid
