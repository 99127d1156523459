"""A first run on a real Vault (OpenBao dev server): the mistakes an operator makes on day one.

- `vault.mount` names no mount, or a KV version 1 mount: `keyturn check` says so in one line
  with the command that fixes it, and `keyturn run` refuses to start before writing anything
  (on KV v1 every write would succeed as junk under `<mount>/data/...`).
- An AppRole login refused by Vault: keyturn repeats Vault's reason (a CIDR restriction, a bad
  secret_id), names the configuration entries the refused inputs came from, never their values,
  and says when the auth mount itself is wrong.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import hvac
import hvac.exceptions
import pytest

from keyturn_devkit.dev.openbao import OpenBaoDevServer, bao_binary
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import Deployment, prepare_deployment

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox]


def suffix() -> str:
    return uuid.uuid4().hex[:8]


def keyturn(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keyturn", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def bao(vault: OpenBaoDevServer, *args: str) -> str:
    """The real `bao` CLI as an operator runs it (the root token in the environment)."""
    env = {**os.environ, "BAO_ADDR": vault.address, "BAO_TOKEN": vault.root_token}
    result = subprocess.run(
        [bao_binary(), *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )
    assert result.returncode == 0, f"bao {args[:3]}: {result.stderr}"
    return result.stdout


@pytest.fixture
def deploy(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
) -> Callable[[], Deployment]:
    """One oauth_client credential whose inputs are in `secret/` (KV v2), as usual."""

    def make() -> Deployment:
        return prepare_deployment(
            openbao, sandbox_factory(), tmp_path, [f"c{suffix()}"], namespace=f"t{suffix()}"
        )

    return make


def set_vault(deployment: Deployment, **keys: str) -> None:
    """Add (or replace) keys of the `[vault]` table, as TOML source text."""
    text = deployment.config_path.read_text()
    for key, value in keys.items():
        text = re.sub(rf"^{key} = .*\n", "", text, flags=re.MULTILINE)
        text = text.replace("[vault]\n", f"[vault]\n{key} = {value}\n", 1)
    deployment.config_path.write_text(text)


def use_token(deployment: Deployment, token: str) -> None:
    (deployment.config_path.parent / "vault-token").write_text(token)


def listing(root: hvac.Client, mount: str) -> list[str]:
    """Everything at the top of `mount` (a LIST), [] when it holds nothing."""
    try:
        answer = root.adapter.request("LIST", f"v1/{mount}/")
    except hvac.exceptions.InvalidPath:
        return []
    return list(answer["data"]["keys"]) if answer else []


# ---- the KV mount ---------------------------------------------------------------------------


def test_check_names_a_missing_mount_in_one_line(deploy: Callable[[], Deployment]) -> None:
    deployment = deploy()
    mount = f"nokv-{suffix()}"
    set_vault(deployment, mount=f'"{mount}"')
    result = keyturn("check", "-c", str(deployment.config_path))
    assert result.returncode == 1, result.stdout
    assert result.stderr.splitlines() == [
        f"vault: {mount}/ (vault.mount): no secrets engine is mounted there; keyturn needs KV "
        f"v2: bao secrets enable -path={mount} kv-v2 (or: vault secrets enable -path={mount} "
        "kv-v2)"
    ]
    assert result.stdout == ""


@pytest.fixture
def policy_token(vault_client: hvac.Client) -> Callable[[str], str]:
    """A token holding only the given policy (not even `default`)."""

    def make(policy: str) -> str:
        name = f"first-run-{suffix()}"
        vault_client.sys.create_or_update_policy(name=name, policy=policy)
        created = vault_client.auth.token.create(policies=[name], no_default_policy=True, ttl="1h")
        return str(created["auth"]["client_token"])

    return make


def test_a_missing_mount_is_told_apart_from_a_denied_one_with_a_least_privilege_token(
    policy_token: Callable[[str], str], deploy: Callable[[], Deployment]
) -> None:
    """Vault answers 403 for a missing mount and for one the token holds nothing under."""
    deployment = deploy()
    name = next(iter(deployment.publish_to))
    namespace = deployment.publish_to[name].split("/")[0]
    mount = f"nokv-{suffix()}"
    set_vault(deployment, mount=f'"{mount}"')
    inputs_and_self = [
        f'path "secret/data/{namespace}/keyturn/inputs/*" {{ capabilities = ["read"] }}',
        'path "auth/token/lookup-self" { capabilities = ["read"] }',
        'path "sys/capabilities-self" { capabilities = ["update"] }',
        f'path "sys/internal/ui/mounts/{mount}" {{ capabilities = ["read"] }}',
    ]
    under_mount = [
        f'path "{mount}/data/{namespace}/*" {{ capabilities = ["create", "update", "read"] }}',
        f'path "{mount}/metadata/{namespace}/*" '
        '{ capabilities = ["create", "update", "read", "list"] }',
    ]
    policy = "\n".join(inputs_and_self + under_mount)
    use_token(deployment, policy_token(policy))
    result = keyturn("check", "-c", str(deployment.config_path))
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(f"vault: {mount}/ (vault.mount): no secrets engine is mounted there")

    # A token that holds nothing under the mount: Vault will not say, and neither does keyturn
    # guess; it names the capability problem (and the paths the policy lacks).
    use_token(deployment, policy_token("\n".join(inputs_and_self)))
    result = keyturn("check", "-c", str(deployment.config_path))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert (
        f"vault: {mount}/ (vault.mount): Vault refused to describe the mount "
        f"(sys/internal/ui/mounts/{mount}: permission denied) because the token holds no "
        f"capability under {mount}/, so whether it is KV v2 cannot be checked"
    ) in lines
    assert not any("no secrets engine" in line for line in lines)
    assert (
        f"vault: {mount}/data/{deployment.publish_to[name]}: policy lacks create, read, update"
        in lines
    )


def test_a_kv_v1_mount_is_refused_by_check_and_run_and_nothing_is_written(
    openbao: OpenBaoDevServer, vault_client: hvac.Client, deploy: Callable[[], Deployment]
) -> None:
    deployment = deploy()
    mount = f"kv1-{suffix()}"
    vault_client.sys.enable_secrets_engine("kv", path=mount, options={"version": "1"})
    set_vault(deployment, mount=f'"{mount}"')

    check = keyturn("check", "-c", str(deployment.config_path))
    assert check.returncode == 1
    assert check.stderr.splitlines() == [
        f"vault: {mount}/ (vault.mount) is a KV version 1 mount; keyturn needs KV v2: "
        f"bao kv enable-versioning {mount}/ (or: vault kv enable-versioning {mount}/) "
        "upgrades it in place"
    ]

    run = keyturn("run", "-c", str(deployment.config_path))
    assert run.returncode == 1
    failed = [json.loads(line) for line in run.stderr.splitlines() if "daemon.failed" in line]
    assert len(failed) == 1, run.stderr
    assert failed[0]["error"].startswith(f"{mount}/ (vault.mount) is a KV version 1 mount")
    assert "daemon.started" not in run.stderr
    (name,) = deployment.publish_to
    refresh = keyturn("refresh", "-c", str(deployment.config_path), name)  # one-shots alike
    assert refresh.returncode == 1
    assert f"{mount}/ (vault.mount) is a KV version 1 mount" in refresh.stderr
    assert listing(vault_client, mount) == []  # no lease, no state, no "data/..." junk

    # The command check gave fixes it.
    bao(openbao, "kv", "enable-versioning", f"{mount}/")
    check = keyturn("check", "-c", str(deployment.config_path))
    assert check.returncode == 0, check.stderr


def test_run_refuses_a_missing_mount_at_once(deploy: Callable[[], Deployment]) -> None:
    deployment = deploy()
    mount = f"nokv-{suffix()}"
    set_vault(deployment, mount=f'"{mount}"')
    run = keyturn("run", "-c", str(deployment.config_path))  # not a retry loop: it ends
    assert run.returncode == 1
    assert f"{mount}/ (vault.mount): no secrets engine is mounted there" in run.stderr
    assert "daemon.started" not in run.stderr


def test_check_names_the_kv_v1_mount_of_a_reference_once(
    vault_client: hvac.Client, deploy: Callable[[], Deployment]
) -> None:
    deployment = deploy()
    name = next(iter(deployment.publish_to))
    mount = f"kv1-{suffix()}"
    vault_client.sys.enable_secrets_engine("kv", path=mount, options={"version": "1"})
    vault_client.secrets.kv.v1.create_or_update_secret(
        path="inputs", secret={"client_secret": "x"}, mount_point=mount
    )
    text = deployment.config_path.read_text()
    reference = f"vault:{mount}/inputs#client_secret"
    text = re.sub(r'^client_secret = ".*"$', f'client_secret = "{reference}"', text, flags=re.M)
    deployment.config_path.write_text(text)
    result = keyturn("check", "-c", str(deployment.config_path))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"vault: {mount}/ (credentials[{name!r}].client_secret = {reference}) is a KV version 1 "
        f"mount; keyturn needs KV v2: bao kv enable-versioning {mount}/ (or: vault kv "
        f"enable-versioning {mount}/) upgrades it in place"
    ]


# ---- Vault's reasons for a refused login ----------------------------------------------------


def approle(
    root: hvac.Client, deployment: Deployment, tmp_path: Path, **role: str
) -> tuple[dict[str, str], str]:
    """An AppRole whose tokens may do what keyturn does in `secret/`, and keyturn's config
    switched to it: role_id from a file, secret_id from the environment. Returns the
    environment to run keyturn with, and the auth mount."""
    mount, policy = f"approle-{suffix()}", f"first-run-{suffix()}"
    root.sys.create_or_update_policy(
        name=policy,
        policy='path "secret/*" { capabilities = ["create", "update", "read", "list"] }',
    )
    root.sys.enable_auth_method("approle", path=mount)
    root.write(f"auth/{mount}/role/keyturn", token_policies=policy, **role)
    role_id = root.read(f"auth/{mount}/role/keyturn/role-id")["data"]["role_id"]
    secret_id = root.write(f"auth/{mount}/role/keyturn/secret-id")["data"]["secret_id"]
    role_file = tmp_path / "role_id"
    role_file.write_text(role_id)
    variable = f"KEYTURN_TEST_SECRET_ID_{suffix().upper()}"
    text = deployment.config_path.read_text()
    auth = re.search(r"^auth = \{.*\}$", text, re.MULTILINE)
    assert auth is not None
    approle_auth = (
        f'auth = {{ method = "approle", role_id = "file:{role_file}", '
        f'secret_id = "env:{variable}", mount = "{mount}" }}'
    )
    deployment.config_path.write_text(text.replace(auth.group(0), approle_auth))
    return {variable: secret_id}, mount


def sources(env: Mapping[str, str], tmp_path: Path) -> str:
    (variable,) = env
    return (
        f"role_id from vault.auth.role_id (file:{tmp_path / 'role_id'}), "
        f"secret_id from vault.auth.secret_id (env:{variable})"
    )


def test_a_login_refused_by_secret_id_bound_cidrs_repeats_vaults_reason(
    vault_client: hvac.Client, deploy: Callable[[], Deployment], tmp_path: Path
) -> None:
    deployment = deploy()
    env, mount = approle(vault_client, deployment, tmp_path, secret_id_bound_cidrs="10.9.0.0/16")
    result = keyturn("check", "-c", str(deployment.config_path), env=env)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"vault: vault approle login at auth/{mount}: login rejected (HTTP 400: source address "
        '"127.0.0.1" unauthorized by CIDR restrictions on the role); ' + sources(env, tmp_path)
    ]
    (secret_id,) = env.values()
    assert secret_id not in result.stdout + result.stderr

    # The daemon says the same in its one line, and stops.
    run = keyturn("run", "-c", str(deployment.config_path), env=env)
    assert run.returncode == 1
    assert "unauthorized by CIDR restrictions on the role" in run.stderr
    assert secret_id not in run.stderr


def test_a_token_bound_to_other_addresses_is_named_at_login(
    vault_client: hvac.Client, deploy: Callable[[], Deployment], tmp_path: Path
) -> None:
    """token_bound_cidrs lets the login through; every use of the token is then refused."""
    deployment = deploy()
    env, mount = approle(vault_client, deployment, tmp_path, token_bound_cidrs="10.9.0.0/16")
    result = keyturn("check", "-c", str(deployment.config_path), env=env)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"vault: vault approle login at auth/{mount}: Vault issued a token and then refused it "
        "(HTTP 403: permission denied); the role's token_bound_cidrs may exclude this address, "
        "or the token's policies lack read on auth/token/lookup-self"
    ]


def test_a_wrong_secret_id_names_where_it_came_from_and_not_its_value(
    vault_client: hvac.Client, deploy: Callable[[], Deployment], tmp_path: Path
) -> None:
    deployment = deploy()
    env, mount = approle(vault_client, deployment, tmp_path)
    (variable,) = env
    wrong = {variable: "wrong-secret-id-" + suffix()}
    result = keyturn("check", "-c", str(deployment.config_path), env=wrong)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"vault: vault approle login at auth/{mount}: login rejected (HTTP 400: invalid role or "
        f"secret ID); {sources(env, tmp_path)}"
    ]
    assert wrong[variable] not in result.stderr
    assert (tmp_path / "role_id").read_text() not in result.stderr

    # With the right one, the same configuration is ready.
    result = keyturn("check", "-c", str(deployment.config_path), env=env)
    assert result.returncode == 0, result.stderr


def test_a_wrong_auth_mount_says_no_auth_method_is_mounted_there(
    vault_client: hvac.Client, deploy: Callable[[], Deployment], tmp_path: Path
) -> None:
    deployment = deploy()
    env, mount = approle(vault_client, deployment, tmp_path)
    typo = f"{mount}-typo"
    text = deployment.config_path.read_text().replace(f'mount = "{mount}"', f'mount = "{typo}"')
    deployment.config_path.write_text(text)
    result = keyturn("check", "-c", str(deployment.config_path), env=env)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"vault: vault approle login at auth/{typo}: login rejected (HTTP 403: permission "
        f"denied); likely no auth method is mounted at auth/{typo} (check vault.auth.mount)"
    ]
