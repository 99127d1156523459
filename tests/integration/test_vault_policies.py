"""The policies shipped in deploy/vault/, loaded into a real OpenBao.

keyturn runs with a token that holds only deploy/vault/keyturn.hcl (not even `default`), an
app's token holding deploy/vault/app.hcl reads its own published path and nothing else, and
`keyturn check` names every capability a short policy lacks, by path. The AppRole set-up of
deploy/vault/README.md is run with the real `bao` CLI, and keyturn logs in with it.

These tests use the default layout (`secret/data/keyturn/...`, `secret/data/apps/...`), the
one the shipped policy is written for: `prepare_deployment(namespace="")`. Credential names
carry a random suffix, so their paths do not collide on the session's shared OpenBao.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import hvac
import hvac.exceptions
import pytest

from keyturn.commands.check import required_capabilities
from keyturn.config import load_config
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.openbao import OpenBaoDevServer, bao_binary
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess, Deployment, prepare_deployment

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
KEYTURN_HCL = ROOT / "deploy" / "vault" / "keyturn.hcl"
APP_HCL = ROOT / "deploy" / "vault" / "app.hcl"
FAST = {
    "refresh": {"margin": "1s", "min_interval": "500ms"},
    "backoff": {"initial": "200ms", "max": "1s"},
}


def suffix() -> str:
    return uuid.uuid4().hex[:8]


def app_policy(publish_to: str) -> str:
    """deploy/vault/app.hcl instantiated as its header says (APP_PATH -> publish_to)."""
    text = APP_HCL.read_text()
    assert text.count("APP_PATH") >= 1
    return text.replace("APP_PATH", publish_to)


def write_policy(root: hvac.Client, text: str) -> str:
    name = f"policy-{suffix()}"
    root.sys.create_or_update_policy(name=name, policy=text)
    return name


def only_policy_token(root: hvac.Client, policy: str, *, default: bool = False) -> str:
    created = root.auth.token.create(
        policies=[policy], no_default_policy=not default, ttl="1h", renewable=True
    )
    return str(created["auth"]["client_token"])


def as_token(vault: OpenBaoDevServer, token: str) -> hvac.Client:
    return hvac.Client(url=vault.address, token=token)


def read(client: hvac.Client, path: str) -> dict:
    return client.secrets.kv.v2.read_secret_version(path=path, raise_on_deleted_version=True)


def capabilities(client: hvac.Client, paths: list[str]) -> dict[str, set[str]]:
    answer = client.sys.get_capabilities(paths=paths)
    return {path: set(answer["data"][path]) for path in paths}


def wait_version(root: hvac.Client, path: str, version: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            secret = read(root, path)
        except hvac.exceptions.InvalidPath:
            secret = None
        if secret is not None and secret["data"]["metadata"]["version"] >= version:
            return secret
        time.sleep(0.1)
    raise TimeoutError(f"{path} did not reach version {version} within {timeout}s")


def keyturn(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keyturn", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def root(openbao: OpenBaoDevServer) -> hvac.Client:
    return as_token(openbao, openbao.root_token)


@pytest.fixture
def deploy(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
) -> Callable[..., Deployment]:
    def make(names: list[str], **overrides: object) -> Deployment:
        sandbox = sandbox_factory({"access_token_lifetime": 3})
        overrides.setdefault("credential", FAST)
        return prepare_deployment(
            openbao,
            sandbox,
            tmp_path,
            names,
            namespace="",  # the default layout, as deploy/vault/keyturn.hcl is written
            **overrides,  # type: ignore[arg-type]
        )

    return make


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(deployment: Deployment) -> DaemonProcess:
        daemon = DaemonProcess(deployment.config_path, tmp_path).start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def use_token(deployment: Deployment, token: str) -> None:
    """Replace the token_file (prepare_deployment writes the root token there)."""
    token_file = deployment.config_path.parent / "vault-token"
    assert str(token_file) in deployment.config_path.read_text()
    token_file.write_text(token)


def test_keyturn_runs_with_only_its_policy_and_apps_read_only_their_own_path(
    openbao: OpenBaoDevServer, root: hvac.Client, deploy, daemons
) -> None:
    alpha, beta = f"pol-a-{suffix()}", f"pol-b-{suffix()}"
    # watch_interval: the external-change sweep reads every published path's metadata too.
    deployment = deploy([alpha, beta], keyturn={"watch_interval": "1s"})
    keyturn_token = only_policy_token(root, write_policy(root, KEYTURN_HCL.read_text()))
    use_token(deployment, keyturn_token)
    keyturn_client = as_token(openbao, keyturn_token)
    assert "default" not in keyturn_client.auth.token.lookup_self()["data"]["policies"]

    # The policy grants exactly what `keyturn check` computes for this configuration: not a
    # capability less, and not one more (no delete, no list).
    needed = required_capabilities(load_config(deployment.config_path))
    assert capabilities(keyturn_client, sorted(needed)) == {p: set(c) for p, c in needed.items()}
    outside = [
        "secret/data/other/thing",
        "secret/metadata/keyturn/state/x",
        "secret/metadata/keyturn/inputs/x",
        "secret/metadata/apps",
        "secret/destroy/apps/x",
        "secret/delete/apps/x",
        "sys/policies/acl/keyturn",
        "auth/token/create",
    ]
    assert capabilities(keyturn_client, outside) == {p: {"deny"} for p in outside}
    assert capabilities(keyturn_client, ["secret/data/keyturn/inputs/x"])[
        "secret/data/keyturn/inputs/x"
    ] == {"read"}

    daemon = daemons(deployment)
    published = {
        name: wait_version(root, deployment.publish_to[name], 3)  # several refreshes (CAS)
        for name in (alpha, beta)
    }
    time.sleep(1.5)  # at least one watch sweep (metadata reads) with the same token
    assert daemon.stop() == 0
    log = daemon.log_text().lower()
    assert "permission denied" not in log
    assert "permission_denied" not in log
    assert "daemon.started" in log

    # App alpha, with deploy/vault/app.hcl for its path (and the `default` policy every
    # token normally carries), reads its token and the custom metadata with it ...
    app_token = only_policy_token(
        root, write_policy(root, app_policy(deployment.publish_to[alpha])), default=True
    )
    app = as_token(openbao, app_token)
    own = read(app, deployment.publish_to[alpha])
    assert own["data"] == read(root, deployment.publish_to[alpha])["data"]  # the daemon stopped
    assert own["data"]["metadata"]["version"] >= published[alpha]["data"]["metadata"]["version"]
    assert own["data"]["data"]["authorization"].startswith("Bearer ")
    assert own["data"]["metadata"]["custom_metadata"]["managed-by"] == "keyturn"
    assert own["data"]["metadata"]["custom_metadata"]["credential"] == alpha

    # ... and nothing else: not beta's path, not keyturn's private state, not the inputs.
    forbidden = [
        deployment.publish_to[beta],
        f"{deployment.state_prefix}/{alpha}",
        deployment.input_paths[alpha],
    ]
    for path in forbidden:
        with pytest.raises(hvac.exceptions.Forbidden):
            read(app, path)
    with pytest.raises(hvac.exceptions.Forbidden):
        app.secrets.kv.v2.create_or_update_secret(
            path=deployment.publish_to[alpha], secret={"access_token": "forged"}
        )
    with pytest.raises(hvac.exceptions.Forbidden):
        app.secrets.kv.v2.list_secrets(path="apps")
    with pytest.raises(hvac.exceptions.Forbidden):
        app.secrets.kv.v2.read_secret_metadata(path=deployment.publish_to[beta])
    own_path = f"secret/data/{deployment.publish_to[alpha]}"
    assert capabilities(app, [own_path]) == {own_path: {"read"}}


def without_block(policy: str, path: str) -> str:
    """`policy` without the `path "<path>" { ... }` block."""
    pattern = re.compile(r'path "' + re.escape(path) + r'" \{[^}]*\}\n', re.MULTILINE)
    shorter, count = pattern.subn("", policy)
    assert count == 1, f"no block for {path} in the policy"
    return shorter


def read_only(policy: str, path: str) -> str:
    pattern = re.compile(r'(path "' + re.escape(path) + r'" \{\s*capabilities = )\[[^\]]*\]')
    shorter, count = pattern.subn(r'\1["read"]', policy)
    assert count == 1, f"no block for {path} in the policy"
    return shorter


def test_check_names_every_capability_a_short_policy_lacks(root: hvac.Client, deploy) -> None:
    name = f"pol-c-{suffix()}"
    deployment = deploy([name])
    full = KEYTURN_HCL.read_text()
    short = read_only(without_block(full, "secret/metadata/apps/*"), "secret/data/keyturn/state/*")
    use_token(deployment, only_policy_token(root, write_policy(root, short)))

    result = keyturn("check", "-c", str(deployment.config_path))
    assert result.returncode == 1, result.stdout + result.stderr
    publish_to = deployment.publish_to[name]
    assert sorted(result.stderr.splitlines()) == [
        f"vault: secret/data/{deployment.state_prefix}/{name}: policy lacks create, update",
        f"vault: secret/metadata/{publish_to}: policy lacks create, read, update",
    ]

    use_token(deployment, only_policy_token(root, write_policy(root, full)))
    result = keyturn("check", "-c", str(deployment.config_path))
    assert result.returncode == 0, result.stderr
    *notes, verdict = result.stdout.splitlines()
    assert verdict == f"{deployment.config_path}: ok (1 credentials)"
    # The deployment's provider has no revoke_path: said, without failing the check.
    assert [note.split(":")[0] for note in notes] == ["note"]
    assert "providers['sandbox'] has no revoke_path" in notes[0]
    assert result.stderr == ""


def bao(vault: OpenBaoDevServer, *args: str, stdin: str | None = None) -> str:
    """The real `bao` CLI as an operator runs it; the root token travels in the environment."""
    env = {**os.environ, "BAO_ADDR": vault.address, "BAO_TOKEN": vault.root_token}
    result = subprocess.run(
        [bao_binary(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, f"bao {args[:3]}: {result.stderr}"
    return result.stdout


def test_approle_setup_as_documented(
    openbao: OpenBaoDevServer, root: hvac.Client, deploy, daemons, tmp_path: Path
) -> None:
    """deploy/vault/README.md's AppRole steps, with a mount path of the test's own."""
    name = f"pol-r-{suffix()}"
    deployment = deploy([name])
    mount, policy = f"approle-{suffix()}", f"keyturn-{suffix()}"
    bao(openbao, "policy", "write", policy, str(KEYTURN_HCL))
    bao(openbao, "auth", "enable", f"-path={mount}", "approle")
    # Short token TTLs so the test sees renewals and a fresh login with the same secret_id.
    bao(
        openbao,
        "write",
        f"auth/{mount}/role/keyturn",
        f"token_policies={policy}",
        "token_no_default_policy=true",
        "token_ttl=6s",
        "token_max_ttl=12s",
        "secret_id_ttl=0",
        "secret_id_num_uses=0",
    )
    role_id_file, secret_id_file = tmp_path / "role_id", tmp_path / "secret_id"
    role_id_file.write_text(
        bao(openbao, "read", "-field=role_id", f"auth/{mount}/role/keyturn/role-id")
    )
    secret_id_file.write_text(
        bao(openbao, "write", "-f", "-field=secret_id", f"auth/{mount}/role/keyturn/secret-id")
    )
    role_id_file.chmod(0o600)
    secret_id_file.chmod(0o600)

    config = deployment.config_path.read_text()
    token_file_auth = re.search(r"^auth = \{ method = \"token_file\".*\}$", config, re.MULTILINE)
    assert token_file_auth is not None
    approle = (
        f'auth = {{ method = "approle", role_id = "file:{role_id_file}", '
        f'secret_id = "file:{secret_id_file}", mount = "{mount}" }}'
    )
    deployment.config_path.write_text(config.replace(token_file_auth.group(0), approle))
    (deployment.config_path.parent / "vault-token").unlink()  # no token on disk at all

    check = keyturn("check", "-c", str(deployment.config_path))
    assert check.returncode == 0, check.stderr

    daemon = daemons(deployment)
    wait_version(root, deployment.publish_to[name], 1)
    # Past the token's max TTL (12 s) keyturn must log in again with the same secret_id ...
    deadline = time.monotonic() + 30
    while daemon.log_text().count('"vault_login"') < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    logins = daemon.log_text().count('"vault_login"')
    # ... and keep publishing with the new token.
    version = read(root, deployment.publish_to[name])["data"]["metadata"]["version"]
    newest = wait_version(root, deployment.publish_to[name], version + 2)
    assert daemon.stop() == 0
    log = daemon.log_text()
    assert logins >= 2, log
    assert "approle" in log
    assert "permission denied" not in log.lower()
    assert newest["data"]["metadata"]["custom_metadata"]["managed-by"] == "keyturn"
    secret_id = secret_id_file.read_text().strip()
    assert secret_id not in log


COMPOSE = ROOT / "deploy" / "compose"


def test_the_compose_init_step_sets_up_what_keyturn_and_the_apps_need(
    sandbox_factory: Callable[..., SandboxProcess], tmp_path: Path
) -> None:
    """deploy/compose/init.py and deploy/compose/keyturn.toml, without Docker.

    In the compose file every service shares one loopback; here OpenBao and the sandbox are
    on this machine's. The init step runs against a dedicated OpenBao (it claims the names
    `keyturn`, `approle`, `app-reporting`), then keyturn runs from the compose configuration
    with the addresses and file paths overridden from the environment.
    """
    settings = tomllib.loads((COMPOSE / "sandbox.toml").read_text())
    sandbox = sandbox_factory(settings)
    login_dir = tmp_path / "login"
    with OpenBaoDevServer() as vault:
        env = {
            **os.environ,
            "BAO_ADDR": vault.address,
            "BAO_TOKEN": vault.root_token,
            "SANDBOX_URL": sandbox.base_url,
            "SANDBOX_BOOTSTRAP": str(sandbox.bootstrap_path),
            "POLICY_DIR": str(ROOT / "deploy" / "vault"),
            "LOGIN_DIR": str(login_dir),
        }
        for run in (1, 2):  # a second run (compose `up` again) changes nothing that matters
            init = subprocess.run(
                [sys.executable, str(COMPOSE / "init.py")],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert init.returncode == 0, init.stderr
            assert ("kept the OAuth client" in init.stdout) == (run == 2), init.stdout
        secret_id = (login_dir / "secret_id").read_text().strip()
        assert secret_id not in init.stdout + init.stderr
        assert sandbox.admin_token not in init.stdout + init.stderr
        assert (login_dir / "secret_id").stat().st_mode & 0o777 == 0o600

        overrides = {
            "KEYTURN_VAULT_ADDRESS": vault.address,
            "KEYTURN_VAULT_AUTH_ROLE_ID": f"file:{login_dir / 'role_id'}",
            "KEYTURN_VAULT_AUTH_SECRET_ID": f"file:{login_dir / 'secret_id'}",
            "KEYTURN_PROVIDERS_SANDBOX_BASE_URL": sandbox.base_url,
            "KEYTURN_METRICS_LISTEN": "127.0.0.1:0",
        }
        config = COMPOSE / "keyturn.toml"
        check = subprocess.run(
            [sys.executable, "-m", "keyturn", "check", "-c", str(config)],
            env={**os.environ, **overrides},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert check.returncode == 0, check.stderr

        root = as_token(vault, vault.root_token)
        with DaemonProcess(config, tmp_path, env=overrides) as daemon:
            reporting = wait_version(root, "apps/reporting/sandbox", 1)
            billing = wait_version(root, "apps/billing/sandbox-key", 1)
            assert daemon.stop() == 0
        assert "permission denied" not in daemon.log_text().lower()

        # Each app's policy (from app.hcl) reads its own path, not the other app's, and the
        # value it reads works against the service.
        for policy, path, own, other in (
            ("app-reporting", "apps/reporting/sandbox", reporting, "apps/billing/sandbox-key"),
            ("app-billing", "apps/billing/sandbox-key", billing, "apps/reporting/sandbox"),
        ):
            app = as_token(vault, only_policy_token(root, policy, default=True))
            assert read(app, path)["data"] == read(root, path)["data"]
            for denied in (other, "keyturn/state/reporting", "keyturn/inputs/sandbox-admin"):
                with pytest.raises(hvac.exceptions.Forbidden):
                    read(app, denied)
            answer = HTTP.get(
                f"{sandbox.base_url}/v1/users",
                headers={"Authorization": own["data"]["data"]["authorization"]},
                timeout=5,
            )
            assert answer.status_code == 200
