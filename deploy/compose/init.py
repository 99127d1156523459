"""One-shot set-up for deploy/docker-compose.yml: the part a platform team does by hand.

Runs in the keyturn image (Python and httpx are there) once OpenBao and the sandbox are up,
with OpenBao's root token in BAO_TOKEN. It

1. registers an OAuth application in the sandbox (its dashboard's admin API) and stores the
   client id and secret in Vault as keyturn's inputs, with the sandbox's admin token (for the
   rotators);
2. writes the policies of deploy/vault/: `keyturn`, and one per app from the app.hcl template
   (`app-reporting` may read apps/reporting/sandbox, `app-billing` apps/billing/sandbox-key);
3. enables AppRole, creates the role `keyturn` (only the `keyturn` policy, bound to
   127.0.0.1: keyturn shares the pod's loopback with OpenBao) and writes its role_id and a
   secret_id, mode 0600, where keyturn's configuration reads them (file: references).

Running it again is harmless: what exists is kept (a new secret_id is written each time).
It prints what it did, never a secret. Settings come from the environment (defaults are the
compose file's): BAO_ADDR, BAO_TOKEN, SANDBOX_URL, SANDBOX_BOOTSTRAP, POLICY_DIR, LOGIN_DIR.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

MOUNT = "secret"
APPROLE = "approle"
ROLE = "keyturn"
# The apps of deploy/compose/keyturn.toml: policy name -> the publish_to it may read.
APPS = {
    "app-reporting": "apps/reporting/sandbox",
    "app-billing": "apps/billing/sandbox-key",
}
OAUTH_INPUT = "keyturn/inputs/reporting"
ADMIN_INPUT = "keyturn/inputs/sandbox-admin"


class Vault:
    def __init__(self, address: str, token: str) -> None:
        self._http = httpx.Client(
            base_url=f"{address.rstrip('/')}/v1/", headers={"X-Vault-Token": token}, timeout=10
        )

    def call(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = ()) -> Any:
        response = self._http.request(method, path, json=body)
        if response.status_code in ok:
            return None
        if response.status_code >= 400:
            errors = response.json().get("errors") if response.content else None
            raise SystemExit(f"init: vault {method} {path}: HTTP {response.status_code} {errors}")
        return response.json() if response.content else None

    def kv_read(self, path: str) -> dict[str, str] | None:
        body = self.call("GET", f"{MOUNT}/data/{path}", ok=(404,))
        return None if body is None else body["data"]["data"]

    def kv_write(self, path: str, data: dict[str, str]) -> None:
        self.call("POST", f"{MOUNT}/data/{path}", {"data": data})


def wait_until(what: str, ready: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"init: {what} not ready after {timeout:.0f}s")
        time.sleep(0.5)


def write_private(path: Path, value: str) -> None:
    """Write a secret file readable by its owner only (keyturn runs as the same uid)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")
    partial.replace(path)


def oauth_inputs(vault: Vault, sandbox: httpx.Client) -> str:
    """Register the OAuth app (unless the one in Vault still exists) and store its inputs."""
    current = vault.kv_read(OAUTH_INPUT)
    if current is not None:
        known = sandbox.get(f"/admin/oauth-apps/{current['client_id']}")
        if known.status_code == 200:
            return f"kept the OAuth client {current['client_id']}"
    created = sandbox.post(
        "/admin/oauth-apps",
        json={"name": "reporting", "redirect_uri": "https://reporting.example/callback"},
    )
    created.raise_for_status()
    app = created.json()
    vault.kv_write(
        OAUTH_INPUT, {"client_id": app["client_id"], "client_secret": app["client_secret"]}
    )
    return f"registered the OAuth client {app['client_id']}"


def policies(vault: Vault, policy_dir: Path) -> None:
    vault.call(
        "PUT", f"sys/policies/acl/{ROLE}", {"policy": (policy_dir / "keyturn.hcl").read_text()}
    )
    template = (policy_dir / "app.hcl").read_text()
    for name, publish_to in APPS.items():
        vault.call(
            "PUT", f"sys/policies/acl/{name}", {"policy": template.replace("APP_PATH", publish_to)}
        )


def approle(vault: Vault, login_dir: Path) -> None:
    mounts = vault.call("GET", "sys/auth")["data"]
    if f"{APPROLE}/" not in mounts:
        vault.call("POST", f"sys/auth/{APPROLE}", {"type": "approle"})
    vault.call(
        "POST",
        f"auth/{APPROLE}/role/{ROLE}",
        {
            "token_policies": [ROLE],
            "token_no_default_policy": True,
            "token_ttl": "1h",
            "token_max_ttl": "4h",
            # keyturn reads its secret_id once, at start, and logs in with it again whenever
            # its token reaches its max TTL: the secret_id must outlive the process.
            "secret_id_num_uses": 0,
            "secret_id_ttl": "720h",
            # keyturn reaches OpenBao over the pod's loopback, and nothing else may log in.
            "secret_id_bound_cidrs": ["127.0.0.1/32"],
            "token_bound_cidrs": ["127.0.0.1/32"],
        },
    )
    role_id = vault.call("GET", f"auth/{APPROLE}/role/{ROLE}/role-id")["data"]["role_id"]
    secret_id = vault.call("POST", f"auth/{APPROLE}/role/{ROLE}/secret-id", {})["data"]["secret_id"]
    write_private(login_dir / "role_id", role_id)
    write_private(login_dir / "secret_id", secret_id)


def main() -> int:
    address = os.environ.get("BAO_ADDR", "http://127.0.0.1:8200")
    token = os.environ.get("BAO_TOKEN", "")
    if not token:
        print("init: BAO_TOKEN (OpenBao's root token) is not set", file=sys.stderr)
        return 1
    sandbox_url = os.environ.get("SANDBOX_URL", "http://127.0.0.1:8787")
    bootstrap_path = Path(os.environ.get("SANDBOX_BOOTSTRAP", "/run/sandbox/bootstrap.json"))
    policy_dir = Path(os.environ.get("POLICY_DIR", "/opt/keyturn-compose/vault"))
    login_dir = Path(os.environ.get("LOGIN_DIR", "/var/lib/keyturn"))

    wait_until(
        "OpenBao", lambda: httpx.get(f"{address}/v1/sys/health", timeout=2).status_code == 200
    )
    wait_until("the sandbox's bootstrap file", bootstrap_path.exists)
    admin_token = json.loads(bootstrap_path.read_text())["admin_token"]
    vault = Vault(address, token)
    with httpx.Client(
        base_url=sandbox_url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=10
    ) as sandbox:
        print(f"init: {oauth_inputs(vault, sandbox)}; inputs in {MOUNT}/{OAUTH_INPUT}")
    vault.kv_write(ADMIN_INPUT, {"token": admin_token})
    print(f"init: the sandbox's admin token (for the rotators) in {MOUNT}/{ADMIN_INPUT}")
    policies(vault, policy_dir)
    print(f"init: policies {ROLE}, {', '.join(APPS)}")
    approle(vault, login_dir)
    print(f"init: AppRole {APPROLE}/role/{ROLE}; role_id and secret_id in {login_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
