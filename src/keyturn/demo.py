"""`keyturn demo`: everything embedded, nothing to configure.

Starts a dev OpenBao and the sandbox service on loopback, registers OAuth clients in the
sandbox, stores their inputs in Vault, writes a configuration, runs the daemon with token
lifetimes of a few seconds, and prints live what an app reading Vault sees: the token's
version turning over before its expiry, each one accepted by the service.

Files go to `--workdir` (default `.demo/`): keyturn.toml, keyturn.log (the daemon's JSON
log), env.sh (addresses and demo credentials for the README's curl examples; mode 0600).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import signal
import sys
from pathlib import Path

import httpx
import hvac

from keyturn.clock import SystemClock, parse_rfc3339
from keyturn.config import Config, load_config
from keyturn.daemon import run_daemon
from keyturn.dev.openbao import OpenBaoDevServer
from keyturn.dev.sandbox import SandboxProcess
from keyturn.logs import configure_logging
from keyturn.testing.deployment import prepare_deployment


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
    """Register OAuth clients, store their inputs in Vault, write keyturn.toml and env.sh."""
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


def _banner(workdir: Path, vault: OpenBaoDevServer, sandbox: SandboxProcess) -> None:
    print(
        f"""keyturn demo
  OpenBao (dev):  {vault.address}
  sandbox:        {sandbox.base_url}
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
    async with httpx.AsyncClient(base_url=sandbox.base_url, timeout=3.0) as http:
        while not stop.is_set() and not daemon.done():
            await _print_app_view(config, vault, http, clock)
            if deadline is not None and clock.monotonic() >= deadline:
                stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
    return await daemon


async def _print_app_view(
    config: Config, vault: hvac.Client, http: httpx.AsyncClient, clock: SystemClock
) -> None:
    """Read each published path as an app would and call the service with it."""
    cells = []
    for credential in config.credentials:
        try:
            read = await asyncio.to_thread(
                vault.secrets.kv.v2.read_secret_version,
                path=credential.publish_to,
                raise_on_deleted_version=True,
            )
        except hvac.exceptions.InvalidPath:
            cells.append(f"{credential.name}: (not yet published)")
            continue
        data, version = read["data"]["data"], read["data"]["metadata"]["version"]
        left = parse_rfc3339(data["expires_at"]) - clock.time()
        response = await http.get("/v1/projects", headers={"Authorization": data["authorization"]})
        verdict = "accepted" if response.status_code == 200 else f"HTTP {response.status_code}"
        cells.append(f"{credential.name}: v{version} expires in {left:4.1f}s {verdict}")
    print("  |  ".join(cells), flush=True)
    sys.stdout.flush()
