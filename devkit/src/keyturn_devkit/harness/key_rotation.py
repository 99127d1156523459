"""End-to-end rotation against a dev OpenBao and the sandbox, for the integration tests.

- `SANDBOX_ROTATORS`: the worked example of docs/configuration.md (http rotators for the
  sandbox's API keys and client secrets), `exec_rotator(...)` an exec rotator entry;
- `write_exec_rotator`: an exec rotator script that drives the sandbox's admin API, reading
  its parameters as JSON on stdin (and the admin URL and token from a file beside it);
- `prepare_key_deployment`: `prepare_deployment` plus `api_key` credentials and rotators;
- `KeySampler`: reads a published API key (or access token) the way an app does and calls the
  service with it;
- `run_keyturn` and `status_rows`: the CLI as a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hvac

from keyturn.clock import parse_rfc3339
from keyturn.commands.status import EXIT_NOT_OK, EXIT_OK
from keyturn_devkit.dev import loopback
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import Deployment, _table, prepare_deployment
from keyturn_devkit.sandbox import snippets

ADMIN_TOKEN_VARIABLE = snippets.ADMIN_TOKEN_VARIABLE

# The worked example of docs/configuration.md, against the deployment's provider "sandbox"
# (what the dashboard shows too).
SANDBOX_ROTATORS = snippets.ROTATORS

EXEC_SCRIPT = '''#!{python}
"""keyturn exec rotator over the sandbox's admin API (integration tests).

Parameters arrive as one JSON object on stdin; the admin URL and token come from
exec-rotator.json beside this file. argv[1] picks a behaviour for `create`: ok, exit-1, slow
(sleeps a minute), slow-ok (creates after 2 s), garbage, unknown-key (a key the sandbox never
issued). Every call is appended to
exec-rotator-calls.jsonl (without secrets, with the names of any KEYTURN_/VAULT_/BAO_
variables it inherited).
"""
import json
import os
import pathlib
import secrets
import sys
import time
import urllib.error
import urllib.request

here = pathlib.Path(__file__).resolve().parent
settings = json.loads((here / "exec-rotator.json").read_text())
mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
params = json.loads(sys.stdin.read())
with (here / "exec-rotator-calls.jsonl").open("a") as calls:
    leaked = sorted(k for k in os.environ if k.upper().startswith(("KEYTURN_", "VAULT_", "BAO_")))
    calls.write(json.dumps({{"mode": mode, "argv": sys.argv[1:], "env": leaked, **params}}) + "\\n")


def admin(method, path, body=None):
    """One call to the sandbox's admin API: (status, JSON answer or None). urllib, not httpx:
    a plain-http call needs no TLS context, and the tests start this script dozens of times."""
    request = urllib.request.Request(
        settings["base_url"].rstrip("/") + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={{"Authorization": "Bearer " + settings["admin_token"],
                 "Content-Type": "application/json"}},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return 404, None
        raise


action = params["action"]
if action == "create":
    if mode == "exit-1":
        print("the key service said no", file=sys.stderr)
        sys.exit(1)
    if mode == "slow":
        time.sleep(60)
    if mode == "slow-ok":
        time.sleep(2)
    if mode == "garbage":
        print("<html>502 Bad Gateway</html>")
        sys.exit(0)
    if mode == "unknown-key":
        value = "ktsb_key_" + secrets.token_urlsafe(32)
        print(json.dumps({{"key": value, "key_id": "key_unknown_" + params["rotation_id"]}}))
        sys.exit(0)
    status, created = admin(
        "POST", "/admin/api-keys", {{"name": params["key_name"], "description": "exec rotator"}}
    )
    if status == 404:
        sys.exit("POST /admin/api-keys: 404")
    print(json.dumps({{"key": created["key"], "key_id": created["key_id"]}}))
elif action == "revoke":
    admin("DELETE", "/admin/api-keys/" + params["key_id"])  # 404: already gone
elif action == "find":
    keys = admin("GET", "/admin/api-keys")[1]["api_keys"]
    print(json.dumps({{"key_ids": [k["key_id"] for k in keys if k["name"] == params["key_name"]]}}))
else:
    print("unknown action " + action, file=sys.stderr)
    sys.exit(2)
'''


def write_exec_rotator(workdir: Path, sandbox: SandboxProcess) -> Path:
    """Write the exec rotator script (executable) and its settings file; returns the script."""
    workdir.mkdir(parents=True, exist_ok=True)
    settings = workdir / "exec-rotator.json"
    settings.write_text(
        json.dumps({"base_url": sandbox.base_url, "admin_token": sandbox.admin_token})
    )
    settings.chmod(0o600)
    script = workdir / "exec-rotator.py"
    script.write_text(EXEC_SCRIPT.format(python=sys.executable))
    script.chmod(0o700)
    return script


def exec_calls(script: Path) -> list[dict[str, Any]]:
    """Every call the exec rotator script received so far (its stdin objects, plus `mode`)."""
    path = script.parent / "exec-rotator-calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def exec_rotator(name: str, script: Path, mode: str = "ok", timeout: str = "10s") -> str:
    """A `[[rotators]]` entry of type exec running `script` with `mode` as its argument."""
    return (
        f'\n[[rotators]]\nname = "{name}"\ntype = "exec"\n'
        f'command = {json.dumps([str(script), mode])}\ntimeout = "{timeout}"\n'
    )


@dataclass
class ApiKeySpec:
    """One `api_key` credential: its rotator and rotation policy; `initial` adopts a key made
    in the sandbox beforehand (passed through an `env:` reference, with its id)."""

    rotator: str
    max_age: str
    grace: str
    verify_attempts: int | None = None
    initial: bool = False
    backoff: Mapping[str, str] | None = None


@dataclass
class KeyDeployment:
    deployment: Deployment
    env: dict[str, str] = field(default_factory=dict)  # for the daemon and the CLI
    initial: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> key, key_id

    @property
    def config_path(self) -> Path:
        return self.deployment.config_path

    @property
    def sandbox(self) -> SandboxProcess:
        return self.deployment.sandbox

    def state(self, name: str) -> dict[str, str]:
        """keyturn's private record for `name` (read with the root token)."""
        read = self.deployment.vault_client().secrets.kv.v2.read_secret_version(
            path=f"{self.deployment.state_prefix}/{name}", raise_on_deleted_version=True
        )
        return dict(read["data"]["data"])


def initial_key_variable(name: str) -> str:
    return "INITIAL_KEY_" + name.upper().replace("-", "_")


def prepare_key_deployment(
    vault: OpenBaoDevServer,
    sandbox: SandboxProcess,
    workdir: Path,
    *,
    namespace: str,
    api_keys: Mapping[str, ApiKeySpec],
    rotators: str = SANDBOX_ROTATORS,
    oauth_clients: Iterable[str] = (),
    oauth_credential: Mapping[str, Any] | None = None,
    provider: Mapping[str, Any] | None = None,
) -> KeyDeployment:
    """`prepare_deployment` for `oauth_clients` (with `oauth_credential`'s keys), then the
    `api_keys` credentials (published at `<namespace>/apps/<name>/key`) and the `rotators`
    TOML appended to its keyturn.toml."""
    deployment = prepare_deployment(
        vault,
        sandbox,
        workdir,
        list(oauth_clients),
        namespace=namespace,
        credential=oauth_credential,
        provider=provider,
    )
    result = KeyDeployment(deployment, env={ADMIN_TOKEN_VARIABLE: sandbox.admin_token})
    sections = [deployment.config_path.read_text()]
    for name, spec in api_keys.items():
        publish_to = f"{namespace}/apps/{name}/key"
        deployment.publish_to[name] = publish_to
        rotation: dict[str, Any] = {
            "max_age": spec.max_age,
            "grace": spec.grace,
            "rotator": spec.rotator,
        }
        if spec.verify_attempts is not None:
            rotation["verify_attempts"] = spec.verify_attempts
        values: dict[str, Any] = {
            "name": name,
            "provider": "sandbox",
            "kind": "api_key",
            "publish_to": publish_to,
            "probe": "/v1/users",
            "rotation": rotation,
        }
        if spec.backoff is not None:
            values["backoff"] = dict(spec.backoff)
        if spec.initial:
            created = sandbox.admin.create_api_key(f"initial-{name}", "adopted by keyturn")
            result.initial[name] = {"key": created["key"], "key_id": created["key_id"]}
            variable = initial_key_variable(name)
            result.env[variable] = created["key"]
            values["initial_key"] = f"env:{variable}"
            values["initial_key_id"] = created["key_id"]
        sections.append(_table("[[credentials]]", values))
    sections.append(rotators)
    deployment.config_path.write_text("\n".join(sections))
    return result


@dataclass(frozen=True, slots=True)
class KeySample:
    at: float
    version: int
    key_id: str  # "" for an OAuth token
    value: str  # the published api_key or access_token
    status: int  # what the service answered to it, right after it was read
    # For a replaced key called again: seconds from the publish of its successor to the call.
    after_publish: float | None = None


class KeySampler:
    """Reads published paths as an app would, and calls the service with each value read.

    `field` is what apps use: `api_key` (API keys) or `access_token` (OAuth credentials).
    When a published API key changes, the previous key is called again at once (in `replaced`,
    with the seconds since its successor was published): an app that read it a moment ago must
    still be served, in the key's grace period. (A replaced access token is not: it may expire
    a moment later, as planned.)
    """

    def __init__(
        self, deployment: Deployment, probe: str = "/v1/users", field: str = "api_key"
    ) -> None:
        self.deployment = deployment
        self.probe = probe
        self.field = field
        self.samples: dict[str, list[KeySample]] = {}
        self.replaced: dict[str, list[KeySample]] = {}
        self._vault = deployment.vault_client()
        self._http = loopback.client(base_url=deployment.sandbox.base_url, timeout=5)

    def close(self) -> None:
        self._http.close()
        self._vault.adapter.close()

    def _call(self, value: str) -> int:
        headers = {"Authorization": f"Bearer {value}"}
        return self._http.get(self.probe, headers=headers).status_code

    def read(self, name: str) -> KeySample | None:
        try:
            read = self._vault.secrets.kv.v2.read_secret_version(
                path=self.deployment.publish_to[name], raise_on_deleted_version=True
            )
        except hvac.exceptions.InvalidPath:
            return None
        data = read["data"]["data"]
        value = data[self.field]
        assert data["authorization"] == f"Bearer {value}"
        version = read["data"]["metadata"]["version"]
        sample = KeySample(time.time(), version, data.get("key_id", ""), value, self._call(value))
        samples = self.samples.setdefault(name, [])
        if self.field == "api_key" and samples and samples[-1].value != value:
            old = samples[-1]
            published = parse_rfc3339(read["data"]["metadata"]["created_time"])
            status = self._call(old.value)
            now = time.time()
            again = KeySample(now, old.version, old.key_id, old.value, status, now - published)
            self.replaced.setdefault(name, []).append(again)
        samples.append(sample)
        return sample

    def wait_for(
        self,
        name: str,
        until: Callable[[KeySample], bool] = lambda _: True,
        timeout: float = 20,
        interval: float = 0.1,
    ) -> KeySample:
        """Sample `name` until a sample satisfies `until` (bounded by `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sample = self.read(name)
            if sample is not None and until(sample):
                return sample
            time.sleep(interval)
        raise TimeoutError(f"{name}: nothing published as expected within {timeout}s")

    def run(
        self,
        names: Iterable[str],
        seconds: float,
        interval: float = 0.1,
        until: Callable[[], bool] | None = None,
    ) -> None:
        """Sample `names` for `seconds`; with `until`, stop as soon as it is true, and raise
        TimeoutError if it never is."""
        names = list(names)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name in names:
                self.read(name)
            if until is not None and until():
                return
            time.sleep(interval)
        if until is not None:
            raise TimeoutError(f"condition not met within {seconds}s")

    def key_ids(self, name: str) -> list[str]:
        """The distinct key ids published for `name`, in the order they were first read."""
        return list(dict.fromkeys(s.key_id for s in self.samples.get(name, [])))


def run_keyturn(
    *args: str, env: Mapping[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m keyturn ARGS` with `env` added to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "keyturn", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def status_rows(
    config_path: Path, env: Mapping[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """`keyturn status --json`, one row per credential."""
    result = run_keyturn("status", "-c", str(config_path), "--json", env=env)
    if result.returncode not in (EXIT_OK, EXIT_NOT_OK):
        raise RuntimeError(f"keyturn status failed ({result.returncode}): {result.stderr}")
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return {row["credential"]: row for row in rows}


def keyturn_keys(sandbox: SandboxProcess, credential: str) -> list[dict[str, Any]]:
    """The sandbox's API keys that keyturn created for `credential` (named
    `keyturn-<credential>-<rotation_id>`), revoked ones included."""
    named = re.compile(rf"keyturn-{re.escape(credential)}-[0-9a-f]{{12}}")
    return [k for k in sandbox.admin.list_api_keys() if named.fullmatch(k["name"])]
