"""`keyturn demo`: everything embedded, nothing to configure.

Starts a dev OpenBao and the sandbox service on loopback, registers OAuth clients in the
sandbox, stores their inputs in Vault, writes a configuration, runs the daemon with token
lifetimes of a few seconds, and prints live what each app sees: the token's version turning
over before its expiry, each one accepted by the service. The apps get the value three ways:
app1 through the `keyturn_client` library (cached until `refresh_at`, retried once on a
401/403), the last app from a file keyturn writes on this host (a sink), the others by reading
Vault themselves.

Files go to `--workdir` (default `.demo/`): keyturn.toml, keyturn.log (the daemon's JSON
log), env.sh (addresses and demo credentials for the README's curl examples; mode 0600).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import hvac

from keyturn.clock import SystemClock, parse_rfc3339
from keyturn.config import Config, CredentialConfig, load_config
from keyturn.daemon import run_daemon
from keyturn.logs import configure_logging
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import prepare_deployment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=Path(".demo"))
    parser.add_argument("--credentials", type=int, default=3, help="how many OAuth clients")
    parser.add_argument("--lifetime", type=int, default=6, help="access token lifetime (s)")
    parser.add_argument(
        "--duration", type=float, default=0, help="stop after this many seconds (0: Ctrl-C)"
    )


def run(args: argparse.Namespace) -> int:
    workdir: Path = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / "keyturn.log").open("a") as log_stream:
        configure_logging("info", stream=log_stream)
        with (
            OpenBaoDevServer() as vault,
            SandboxProcess(
                config={"access_token_lifetime": args.lifetime}, workdir=workdir / "sandbox"
            ) as sandbox,
        ):
            config_path = _prepare(workdir, vault, sandbox, args.credentials)
            _banner(workdir, vault, sandbox)
            return asyncio.run(_live(config_path, vault, sandbox, args.duration))


def _prepare(workdir: Path, vault: OpenBaoDevServer, sandbox: SandboxProcess, count: int) -> Path:
    """Register OAuth clients, store their inputs in Vault, write keyturn.toml (the last
    credential with a file sink) and env.sh."""
    deployment = prepare_deployment(
        vault,
        sandbox,
        workdir,
        [f"app{i + 1}" for i in range(count)],
        keyturn={"instance_id": "demo"},
        credential={
            "refresh": {"margin": "1s", "min_interval": "1s"},
            "backoff": {"initial": "500ms", "max": "5s"},
        },
        use_bootstrap_client=True,
    )
    if count >= 2:  # the last app reads a file on this host instead of Vault
        with deployment.config_path.open("a") as config:
            config.write(
                "\n[[credentials.sinks]]\n"
                f'path = "{_sink_path(workdir, count)}"\n'
                'format = "json"\n'
                'mode = "0600"\n'
            )
    bootstrap = sandbox.bootstrap
    env = {
        "VAULT_ADDR": vault.address,
        "VAULT_TOKEN": vault.root_token,
        "BAO_ADDR": vault.address,
        "BAO_TOKEN": vault.root_token,
        "SANDBOX_URL": sandbox.base_url,
        "SANDBOX_ADMIN_TOKEN": sandbox.admin_token,
        "API_KEY": bootstrap["api_key"]["key"],
        "CLIENT_ID": bootstrap["oauth_client"]["client_id"],
        "CLIENT_SECRET": bootstrap["oauth_client"]["client_secret"],
        "KEYTURN_CONFIG": str(deployment.config_path),
    }
    env_path = workdir / "env.sh"
    env_path.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    env_path.chmod(0o600)
    return deployment.config_path


def _sink_path(workdir: Path, count: int) -> Path:
    return workdir / f"app{count}.json"


def _banner(workdir: Path, vault: OpenBaoDevServer, sandbox: SandboxProcess) -> None:
    print(
        f"""keyturn demo
  OpenBao (dev):  {vault.address}
  sandbox:        {sandbox.base_url}
  dashboard:      {sandbox.base_url}/dashboard  (sign in with $SANDBOX_ADMIN_TOKEN from env.sh)
  config:         {workdir / "keyturn.toml"}
  daemon log:     {workdir / "keyturn.log"}
In another shell:  source {workdir / "env.sh"}   then try the README's curl examples.
Ctrl-C stops everything.
""",
        flush=True,
    )


async def _live(
    config_path: Path, server: OpenBaoDevServer, sandbox: SandboxProcess, duration: float
) -> int:
    config = load_config(config_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    started = asyncio.Event()
    daemon = asyncio.create_task(run_daemon(config, stop, started=started))
    await started.wait()
    clock = SystemClock()
    deadline = clock.monotonic() + duration if duration else None
    vault = hvac.Client(url=server.address, token=server.root_token)
    apps = [
        _app(credential, index, config, vault)
        for index, credential in enumerate(config.credentials)
    ]
    async with httpx.AsyncClient(base_url=sandbox.base_url, timeout=3.0) as http:
        while not stop.is_set() and not daemon.done():
            cells = [await app(http, clock) for app in apps]
            print("  |  ".join(cells), flush=True)
            if deadline is not None and clock.monotonic() >= deadline:
                stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
    return await daemon


# One demo app: calls the service once with the credential as it gets it; returns its cell.
App = Callable[[httpx.AsyncClient, SystemClock], Awaitable[str]]


def _app(credential: CredentialConfig, index: int, config: Config, vault: hvac.Client) -> App:
    """app1 uses the client library, the last app (of two or more) reads its file sink, the
    others read Vault themselves."""
    if index == 0:
        return _library_app(credential, vault)
    if credential.sinks:
        return _sink_app(credential, credential.sinks[0].path)
    return _vault_app(credential, vault)


def _cell(name: str, how: str, version: object, left: float, status: int) -> str:
    verdict = "accepted" if status == 200 else f"HTTP {status}"
    return f"{name} ({how}): v{version} expires in {left:4.1f}s {verdict}"


def _library_app(credential: CredentialConfig, vault: hvac.Client) -> App:
    try:
        from keyturn_client import Credential, CredentialUnavailable  # noqa: PLC0415
        from keyturn_client.httpx import KeyturnAuth  # noqa: PLC0415
    except ImportError:  # keyturn installed alone (`make demo` installs both)
        return _vault_app(credential, vault)
    held = Credential(credential.publish_to, client=vault)
    auth = KeyturnAuth(held)

    async def call(http: httpx.AsyncClient, clock: SystemClock) -> str:
        try:
            response = await http.get("/v1/projects", auth=auth)
        except (CredentialUnavailable, httpx.HTTPError) as exc:  # e.g. not yet published
            return f"{credential.name} (keyturn_client): {type(exc).__name__}"
        left = (held.expires_at or clock.time()) - clock.time()
        return _cell(credential.name, "keyturn_client", held.version, left, response.status_code)

    return call


def _sink_app(credential: CredentialConfig, path: Path) -> App:
    async def call(http: httpx.AsyncClient, clock: SystemClock) -> str:
        try:
            data = json.loads(await asyncio.to_thread(path.read_text))
        except (OSError, ValueError):
            return f"{credential.name} (file sink): (not yet written)"
        response = await http.get("/v1/projects", headers={"Authorization": data["authorization"]})
        left = parse_rfc3339(data["expires_at"]) - clock.time()
        return _cell(credential.name, "file sink", data["version"], left, response.status_code)

    return call


def _vault_app(credential: CredentialConfig, vault: hvac.Client) -> App:
    async def call(http: httpx.AsyncClient, clock: SystemClock) -> str:
        try:
            read = await asyncio.to_thread(
                vault.secrets.kv.v2.read_secret_version,
                path=credential.publish_to,
                raise_on_deleted_version=True,
            )
        except hvac.exceptions.InvalidPath:
            return f"{credential.name} (Vault read): (not yet published)"
        data, version = read["data"]["data"], read["data"]["metadata"]["version"]
        response = await http.get("/v1/projects", headers={"Authorization": data["authorization"]})
        left = parse_rfc3339(data["expires_at"]) - clock.time()
        return _cell(credential.name, "Vault read", version, left, response.status_code)

    return call
