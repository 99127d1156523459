"""Running a sandbox: bootstrap credentials, listening, the bootstrap file, graceful shutdown.

The bootstrap file appears only once the socket is listening, so "the file exists" is the
readiness signal scripts and tests wait for. It is written to a temporary name with mode 0600
and renamed into place: a reader never sees half a file, and other users never see it at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from keyturn.clock import Clock, SystemClock
from keyturn.logs import get_logger
from keyturn_devkit.sandbox.app import create_app
from keyturn_devkit.sandbox.config import Settings
from keyturn_devkit.sandbox.context import Sandbox
from keyturn_devkit.sandbox.model import PREFIX_ADMIN_TOKEN, new_secret

log = get_logger("keyturn.sandbox")


def base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def make_bootstrap(sandbox: Sandbox, url: str) -> dict[str, Any]:
    """One API key and one OAuth client to start from, with the admin token and base URL."""
    key, key_value = sandbox.state.create_api_key("bootstrap", "created when the sandbox started")
    app, _, secret = sandbox.state.register_app("bootstrap", "http://127.0.0.1/callback")
    return {
        "base_url": url,
        "admin_token": sandbox.admin_token.reveal(),
        "api_key": {"key_id": key.key_id, "key": key_value.reveal()},
        "oauth_client": {"client_id": app.client_id, "client_secret": secret.reveal()},
    }


def write_bootstrap(path: Path, data: dict[str, Any]) -> None:
    """Atomically (temporary file, then rename) and readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)  # O_CREAT's mode is ignored if the file already existed
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def print_bootstrap(data: dict[str, Any], stream: TextIO) -> None:
    """Without --bootstrap-out the credentials are shown once, on stdout (never in the log)."""
    stream.write("keyturn sandbox bootstrap credentials (shown once):\n")
    stream.write(json.dumps(data, indent=2) + "\n")
    stream.flush()


async def serve(
    settings: Settings,
    host: str,
    port: int,
    bootstrap_out: Path | None,
    *,
    clock: Clock | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until `stop` is set (SIGTERM/SIGINT set it when no event is given)."""
    clock = clock or SystemClock()
    sandbox = Sandbox.create(settings, clock, new_secret(PREFIX_ADMIN_TOKEN))
    runner = web.AppRunner(create_app(sandbox), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        bound_port = int(runner.addresses[0][1])
        url = base_url(host, bound_port)
        data = make_bootstrap(sandbox, url)
        if bootstrap_out is not None:
            write_bootstrap(bootstrap_out, data)
        else:
            print_bootstrap(data, sys.stdout)
        log.info(
            "sandbox listening",
            base_url=url,
            bootstrap_key_id=data["api_key"]["key_id"],
            bootstrap_client_id=data["oauth_client"]["client_id"],
            bootstrap_file=str(bootstrap_out) if bootstrap_out else None,
        )
        del data
        if stop is None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        log.info("sandbox stopping")
    finally:
        await runner.cleanup()
