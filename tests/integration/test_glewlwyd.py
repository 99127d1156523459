"""A second identity server nobody here wrote: Glewlwyd 2.7 (Debian's `glewlwyd`, in C), for
client credentials with `private_key_jwt`. The daemon keeps a token fresh in a real OpenBao
while a reader checks every value it reads against Glewlwyd's own JWKS (signature, issuer,
expiry); a client whose key Glewlwyd never registered is refused with a bare 403, which
keyturn reports as invalid_client naming what it sent."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import hvac
import hvac.exceptions
import jwt
import pytest

from keyturn_devkit.dev.client_keys import private_key_pem, public_jwks
from keyturn_devkit.dev.glewlwyd import GlewlwydServer
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.harness.deployment import DaemonProcess
from keyturn_devkit.harness.key_rotation import run_keyturn

pytestmark = [pytest.mark.openbao, pytest.mark.slow]

TTL = 6
RUN = 12.0


@pytest.fixture(scope="module")
def deployment(
    openbao: OpenBaoDevServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GlewlwydServer, Path]]:
    workdir = tmp_path_factory.mktemp("glewlwyd")
    key, stranger = private_key_pem("ES256"), private_key_pem("ES256")
    with GlewlwydServer(workdir, access_token_ttl=TTL) as idp:
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
