"""docs/vault.md, "Setting up Vault for keyturn", followed as written on a real OpenBao server.

The server is not a dev server: Raft storage, a TLS listener with a certificate from a
throwaway CA, initialised and unsealed, nothing mounted (`keyturn_devkit.dev.tls.OpenBaoTLSServer`).
Every `sh` block of the section runs, in order, in one bash script, with only the example
values replaced (`EXAMPLES`): the Vault address, `/etc/keyturn`, keyturn's network, the client
id. The client secret is typed on stdin, as the docs ask. The configuration is the section's
TOML block, with the sandbox in place of the example provider. Then:

- the script's own last command, `keyturn check`, says ok;
- `keyturn run` publishes a token from the sandbox that an app token holding the
  `app-reporting` policy (made by the docs from deploy/vault/app.hcl) reads;
- the Python snippet of "What apps should do" recovers from a provider that revokes the
  previous access token at refresh and answers 403 for it (the sandbox's
  `revoke_previous_access_token_on_refresh` and `invalid_token_status = 403`);
- and the same set-up in a namespace ("In a namespace") works the same way.

An `sh` block right after `<!-- alternative: … -->` is an alternative to the one before it,
not a step, and is not run.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import hvac
import hvac.exceptions
import pytest

from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.dev.tls import OpenBaoTLSServer
from keyturn_devkit.harness.deployment import DaemonProcess

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
VAULT_DOC = ROOT / "docs" / "vault.md"
SECTION = "## Setting up Vault for keyturn"
APPS_SECTION = "## What apps should do"
NAMESPACE_HEADING = "### In a namespace"
ALTERNATIVE = "<!-- alternative:"

# The example values of the docs, and what stands for each in this test.
EXAMPLE_ADDRESS = "https://vault.example.com:8200"
EXAMPLE_ETC = "/etc/keyturn"
EXAMPLE_RUN_CREDENTIALS = "/run/credentials/keyturn.service/"
EXAMPLE_CIDR = "10.0.4.17/32"
EXAMPLE_CLIENT_ID = "client_5c0b7e1a9d2f"
EXAMPLE_PROVIDER = 'base_url = "https://api.acme.example"'
EXAMPLE_APP_CA = "/etc/ssl/vault-ca.pem"
PUBLISH_TO = "apps/reporting/acme"


# -- reading the docs ------------------------------------------------------------------------


def section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def code_blocks(text: str, language: str) -> list[str]:
    """The fenced blocks of `language`, in order, without those marked as alternatives."""
    blocks = []
    for match in re.finditer(rf"^```{language}\n(.*?)^```$", text, re.DOTALL | re.MULTILINE):
        before = text[: match.start()].rstrip().rsplit("\n", 1)[-1]
        if not before.startswith(ALTERNATIVE):
            blocks.append(match.group(1))
    return blocks


def setup_docs() -> tuple[list[str], list[str], str, str]:
    """(the steps' sh blocks, the namespace's sh blocks, the TOML, the namespace TOML)."""
    text = section(VAULT_DOC.read_text(), SECTION)
    for example in (EXAMPLE_ADDRESS, EXAMPLE_ETC, EXAMPLE_RUN_CREDENTIALS, EXAMPLE_CIDR):
        assert example in text, f"the docs no longer show {example!r}: update this test"
    for example in (EXAMPLE_CLIENT_ID, EXAMPLE_PROVIDER):
        assert example in text, f"the docs no longer show {example!r}: update this test"
    steps, _, namespace = text.partition(NAMESPACE_HEADING + "\n")
    assert namespace, f"no {NAMESPACE_HEADING!r} in {SECTION!r}"
    [toml] = code_blocks(steps, "toml")
    [namespace_toml] = code_blocks(namespace, "toml")
    return code_blocks(steps, "sh"), code_blocks(namespace, "sh"), toml, namespace_toml


def app_snippet() -> str:
    [snippet] = code_blocks(section(VAULT_DOC.read_text(), APPS_SECTION), "python")
    return snippet


# -- the environment the docs are followed in ------------------------------------------------


class Site:
    """One machine following the docs: its /etc/keyturn, its working directory (a copy of
    the checkout's deploy/vault and the CA certificate it was handed), its shell."""

    def __init__(self, root: Path, vault: OpenBaoTLSServer, sandbox: SandboxProcess) -> None:
        self.vault = vault
        self.sandbox = sandbox
        self.etc = root / "etc" / "keyturn"
        self.workdir = root / "checkout"
        shutil.copytree(ROOT / "deploy" / "vault", self.workdir / "deploy" / "vault")
        shutil.copy(vault.ca_cert, self.workdir / "vault-ca.pem")
        self.client = sandbox.admin.create_oauth_app("reporting")

    def substitute(self, text: str) -> str:
        for example, ours in (
            (EXAMPLE_ADDRESS, self.vault.address),
            # In this order: a value put in is never replaced again.
            (EXAMPLE_ETC, str(self.etc)),
            (EXAMPLE_RUN_CREDENTIALS, f"{self.etc}/"),  # what systemd's LoadCredential= does
            (EXAMPLE_CIDR, "127.0.0.1/32"),
            (EXAMPLE_CLIENT_ID, self.client["client_id"]),
            (EXAMPLE_PROVIDER, f'base_url = "{self.sandbox.base_url}"\nallow_insecure_http = true'),
        ):
            text = text.replace(example, ours)
        return text

    def write_config(self, toml: str) -> Path:
        self.etc.mkdir(parents=True, exist_ok=True)
        path = self.etc / "keyturn.toml"
        # The daemon's metrics on a free port: other tests run beside this one.
        path.write_text(self.substitute(toml) + '\n[metrics]\nlisten = "127.0.0.1:0"\n')
        return path

    def run(self, blocks: list[str]) -> subprocess.CompletedProcess[str]:
        """The blocks as one bash script, the client secret typed on stdin. The shell is
        logged in to Vault as an administrator (BAO_TOKEN) and nothing else: BAO_ADDR and
        BAO_CACERT come from the docs."""
        script = self.workdir / "setup.sh"
        script.write_text("\n".join(self.substitute(block) for block in blocks))
        env = self.vault.cli_env()
        del env["BAO_ADDR"], env["BAO_CACERT"]
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run(
            ["bash", "-euo", "pipefail", str(script)],
            input=self.client["client_secret"] + "\n",
            cwd=self.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


@pytest.fixture(scope="module")
def vault() -> Iterator[OpenBaoTLSServer]:
    with OpenBaoTLSServer() as server:
        yield server


@pytest.fixture
def site(
    vault: OpenBaoTLSServer, sandbox_factory: Callable[..., SandboxProcess], tmp_path: Path
) -> Callable[[dict[str, Any]], Site]:
    def make(sandbox_config: dict[str, Any]) -> Site:
        return Site(tmp_path, vault, sandbox_factory(sandbox_config))

    return make


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[[Path], DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(config: Path) -> DaemonProcess:
        daemon = DaemonProcess(config, tmp_path).start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def root_client(vault: OpenBaoTLSServer, namespace: str | None = None) -> hvac.Client:
    return hvac.Client(
        url=vault.address, token=vault.root_token, verify=str(vault.ca_cert), namespace=namespace
    )


def app_token(vault: OpenBaoTLSServer, namespace: str | None = None) -> str:
    """A token for the app, holding the policy the docs wrote for it (and `default`)."""
    created = root_client(vault, namespace).auth.token.create(policies=["app-reporting"], ttl="5m")
    return str(created["auth"]["client_token"])


def wait_version(client: hvac.Client, version: int, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            secret = client.secrets.kv.v2.read_secret_version(
                path=PUBLISH_TO, mount_point="secret", raise_on_deleted_version=True
            )
        except hvac.exceptions.InvalidPath:
            secret = None
        if secret is not None and secret["data"]["metadata"]["version"] >= version:
            return dict(secret["data"])
        if time.monotonic() > deadline:
            raise TimeoutError(f"{PUBLISH_TO} did not reach version {version} in {timeout}s")
        time.sleep(0.05)


def version_holding(client: hvac.Client, authorization: str) -> int:
    """The KV version of PUBLISH_TO whose `authorization` is the one given."""
    version = int(wait_version(client, 1)["metadata"]["version"])
    while version > 0:
        secret = client.secrets.kv.v2.read_secret_version(
            path=PUBLISH_TO, mount_point="secret", version=version, raise_on_deleted_version=True
        )
        if secret["data"]["data"]["authorization"] == authorization:
            return version
        version -= 1
    raise AssertionError("no version of the published path holds the app's value")


def assert_setup_worked(site: Site, result: subprocess.CompletedProcess[str]) -> None:
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, output
    assert f"{site.etc}/keyturn.toml: ok (1 credentials)" in result.stdout, output
    assert site.client["client_secret"] not in output
    for name in ("role_id", "secret_id"):  # the docs' umask 077
        assert stat.S_IMODE((site.etc / name).stat().st_mode) == 0o600, name


def assert_app_reads_only_its_path(vault: OpenBaoTLSServer, namespace: str | None) -> None:
    app = hvac.Client(
        url=vault.address,
        token=app_token(vault, namespace),
        verify=str(vault.ca_cert),
        namespace=namespace,
    )
    published = wait_version(app, 1)["data"]
    assert published["token_type"] == "Bearer"
    assert published["authorization"] == f"Bearer {published['access_token']}"
    for private in ("keyturn/inputs/reporting", "keyturn/state/reporting"):
        with pytest.raises(hvac.exceptions.Forbidden):
            app.secrets.kv.v2.read_secret_version(
                path=private, mount_point="secret", raise_on_deleted_version=True
            )


# -- the tests -------------------------------------------------------------------------------


def test_the_docs_set_up_a_tls_raft_openbao_that_keyturn_runs_on(
    site: Callable[[dict[str, Any]], Site],
    vault: OpenBaoTLSServer,
    daemons: Callable[[Path], DaemonProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps, _, toml, _ = setup_docs()
    # A provider like django-oauth-toolkit: a refresh kills the token it replaces, and a dead
    # token gets 403. 4 s tokens: keyturn refreshes at about 2 s.
    here = site(
        {
            "access_token_lifetime": 4,
            "revoke_previous_access_token_on_refresh": True,
            "invalid_token_status": 403,
        }
    )
    config = here.write_config(toml)
    assert_setup_worked(here, here.run(steps))

    daemon = daemons(config)
    assert_app_reads_only_its_path(vault, None)

    # The app of "What apps should do", as written there, with this test's Vault.
    monkeypatch.setenv("VAULT_TOKEN", app_token(vault))
    snippet = app_snippet()
    assert EXAMPLE_ADDRESS in snippet and EXAMPLE_APP_CA in snippet
    snippet = snippet.replace(EXAMPLE_ADDRESS, vault.address)
    snippet = snippet.replace(EXAMPLE_APP_CA, str(vault.ca_cert))
    app: dict[str, Any] = {}
    exec(compile(snippet, f"{VAULT_DOC}: {APPS_SECTION}", "exec"), app)

    root = root_client(vault)
    url = f"{here.sandbox.base_url}/v1/projects"
    with httpx.Client(timeout=10) as http:
        wait_version(root, 1)
        assert app["call"](http, "GET", url).status_code == 200
        held = app["current"]["authorization"]
        # keyturn refreshes with the refresh token: the value the app holds dies at once,
        # before its expires_at.
        wait_version(root, version_holding(root, held) + 1)
        stale = http.get(url, headers={"Authorization": held})
        assert stale.status_code == 403, stale.text
        assert time.time() < app["current"]["expires_at"]
        answer = app["call"](http, "GET", url)  # re-reads Vault and retries once
        assert answer.status_code == 200, answer.text
        assert app["current"]["authorization"] != held

    assert daemon.stop() == 0
    log = daemon.log_text()
    assert "daemon.started" in log
    assert "permission denied" not in log.lower()
    assert here.client["client_secret"] not in log


def test_the_docs_set_up_keyturn_in_a_namespace(
    site: Callable[[dict[str, Any]], Site],
    vault: OpenBaoTLSServer,
    daemons: Callable[[Path], DaemonProcess],
) -> None:
    steps, namespace_steps, toml, namespace_toml = setup_docs()
    match = re.fullmatch(r'\[vault\]\nnamespace = "([\w/-]+)"\n', namespace_toml)
    assert match, f"the namespace's TOML block changed: {namespace_toml!r}"
    namespace = match.group(1)
    here = site({"access_token_lifetime": 4})
    assert toml.startswith("[vault]\n")
    config = here.write_config(namespace_toml + toml.removeprefix("[vault]\n"))
    # Step 1 (the address and the CA), the namespace, then steps 2 to 8 inside it.
    assert_setup_worked(here, here.run([steps[0], *namespace_steps, *steps[1:]]))

    # Everything is in the namespace, nothing in the root namespace's inputs.
    inside = root_client(vault, namespace)
    inputs = inside.secrets.kv.v2.read_secret_version(
        path="keyturn/inputs/reporting", mount_point="secret", raise_on_deleted_version=True
    )["data"]["data"]
    assert inputs == {
        "client_id": here.client["client_id"],
        "client_secret": here.client["client_secret"],  # exactly: no newline from the shell
    }
    assert "app-reporting" in inside.sys.list_policies()["data"]["policies"]

    daemon = daemons(config)
    assert_app_reads_only_its_path(vault, namespace)
    published = wait_version(inside, 2)["data"]  # and refreshed
    with httpx.Client(timeout=10) as http:
        answer = http.get(
            f"{here.sandbox.base_url}/v1/projects",
            headers={"Authorization": published["authorization"]},
        )
    assert answer.status_code == 200, answer.text
    assert daemon.stop() == 0
