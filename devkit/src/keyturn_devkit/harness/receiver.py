"""A webhook receiver on loopback for tests that run the daemon as a process.

`AlertReceiver` serves aiohttp in a thread of its own (so a synchronous test can sleep, poll
Vault and run subprocesses while alerts arrive), answers every `POST` with 200 and keeps each
request's path and raw body. The daemon's `[[alerts]]` webhook hook points at `hook_url`.

    with AlertReceiver() as receiver:
        ...  # url = receiver.hook_url in the daemon's configuration
        alert = receiver.wait_alert("client_rejected", "reporting", timeout=10)
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web


@dataclass(frozen=True, slots=True)
class Delivery:
    """One POST as received: its path and raw body (searched for secrets by the tests)."""

    path: str
    body: bytes
    received_at: float

    def json(self) -> Any:
        return json.loads(self.body)


class AlertReceiver:
    """Records every POST to `http://127.0.0.1:<port>/…` and answers 200."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._lock = threading.Lock()
        self._deliveries: list[Delivery] = []
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def hook_url(self) -> str:
        """The URL for a generic `webhook` hook."""
        return f"{self.url}/hook"

    def start(self, timeout: float = 10.0) -> AlertReceiver:
        self._thread = threading.Thread(target=self._run, name="alert-receiver", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the alert receiver did not start within {timeout}s")
        if self._error is not None:
            raise RuntimeError("the alert receiver failed to start") from self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> AlertReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported to start(); the thread just ends
            self._error = error
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, 0)
            await site.start()
            self.port = int(runner.addresses[0][1])
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        with self._lock:
            self._deliveries.append(Delivery(request.path, body, time.time()))
        return web.json_response({"status": "ok"})

    # -- reading ------------------------------------------------------------------------------

    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def alerts(self, path: str = "/hook") -> list[dict[str, Any]]:
        """The `alert` objects of the generic webhook payloads received on `path`."""
        return [d.json()["alert"] for d in self.deliveries() if d.path == path]

    def matching(
        self, detector: str, credential: str, status: str = "firing", path: str = "/hook"
    ) -> list[dict[str, Any]]:
        return [
            a
            for a in self.alerts(path)
            if a["detector"] == detector and a["credential"] == credential and a["status"] == status
        ]

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                seen = [(a["detector"], a["credential"], a["status"]) for a in self.alerts()]
                raise TimeoutError(f"{what} within {timeout}s; alerts received: {seen}")
            time.sleep(0.05)

    def wait_alert(
        self, detector: str, credential: str, *, status: str = "firing", timeout: float = 15.0
    ) -> dict[str, Any]:
        """The first alert of `detector` about `credential` with `status`, once it arrived."""
        self.wait_for(
            lambda: bool(self.matching(detector, credential, status)),
            timeout,
            f"no {status} {detector} alert for {credential!r}",
        )
        return self.matching(detector, credential, status)[0]
