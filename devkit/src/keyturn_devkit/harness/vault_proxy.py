"""A small HTTP proxy between keyturn and a real Vault/OpenBao that fails chosen requests.

It listens on 127.0.0.1 (a free port), runs its own event loop in a thread, forwards every
request to `upstream` as it came (method, path, query, headers, body), and answers instead
with a given status when a rule says so, or forwards the request and then hangs up without
its answer (a node that stopped mid-call):

    with FaultyVaultProxy(openbao.address) as proxy:
        proxy.fail_once(lambda request, history: request.method == "POST" and ..., status=500)
        proxy.lose_answer_once(lambda request, history: ...)  # carried out, answer never sent
        ... keyturn's `vault.address = proxy.url` ...
        proxy.requests          # every request seen: method, path, JSON body, status answered

A rule sees the request and every earlier request (`history`), so it can pick "the first state
write after a token request went out" from what keyturn wrote before.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

import aiohttp
from aiohttp import web

from keyturn_devkit.dev.process import ManagedServer

# Hop-by-hop headers (RFC 9110 §7.6.1) and those aiohttp sets itself.
_SKIP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
)


@dataclass(frozen=True, slots=True)
class ProxiedRequest:
    at: float  # time.time() when it arrived
    method: str
    path: str
    body: Any  # parsed JSON, or None
    status: int | None = None  # what the client got (None: no answer, upstream or proxy hung up)
    injected: bool = False  # the status came from a rule, not from upstream

    def data(self) -> dict[str, Any]:
        """The KV v2 `data` object of a write, or {}."""
        if isinstance(self.body, dict) and isinstance(self.body.get("data"), dict):
            return dict(self.body["data"])
        return {}


Match = Callable[[ProxiedRequest, list[ProxiedRequest]], bool]


@dataclass
class _Rule:
    match: Match
    status: int | None  # None: forward, then hang up without the answer
    times: int


@dataclass
class FaultyVaultProxy(ManagedServer):
    upstream: str
    requests: list[ProxiedRequest] = field(default_factory=list)
    port: int = 0
    _rules: list[_Rule] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stopped: asyncio.Event | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_once(self, match: Match, status: int = 500, times: int = 1) -> None:
        """Answer `status` (instead of forwarding) to the next `times` requests that match."""
        with self._lock:
            self._rules.append(_Rule(match, status, times))

    def lose_answer_once(self, match: Match, times: int = 1) -> None:
        """Forward the next `times` requests that match, then close the connection without
        the upstream's answer: the request was carried out, the client cannot know it."""
        with self._lock:
            self._rules.append(_Rule(match, None, times))

    def injected(self) -> list[ProxiedRequest]:
        with self._lock:
            return [r for r in self.requests if r.injected]

    def snapshot(self) -> list[ProxiedRequest]:
        with self._lock:
            return list(self.requests)

    # -- life --------------------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> Self:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), daemon=True, name="vault-proxy"
        )
        self._thread.start()
        if not ready.wait(timeout) or not self.port:
            raise RuntimeError("the Vault proxy did not start")
        return self

    def stop(self) -> None:
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        finally:
            loop.close()

    async def _main(self, ready: threading.Event) -> None:
        self._stopped = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            self._session = session
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = int(runner.addresses[0][1]) if runner.addresses else 0
            ready.set()
            try:
                await self._stopped.wait()
            finally:
                await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        seen = ProxiedRequest(time.time(), request.method, request.path, body)
        rule = self._decide(seen)
        if rule is not None and rule.status is not None:
            self._record(ProxiedRequest(seen.at, seen.method, seen.path, body, rule.status, True))
            return web.json_response(
                {"errors": ["injected by the test's proxy"]}, status=rule.status
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _SKIP}
        assert self._session is not None
        try:
            async with self._session.request(
                request.method,
                self.upstream.rstrip("/") + request.path_qs,
                headers=headers,
                data=raw or None,
                allow_redirects=False,
            ) as upstream:
                payload = await upstream.read()
                reply = web.Response(
                    status=upstream.status,
                    body=payload,
                    headers={k: v for k, v in upstream.headers.items() if k.lower() not in _SKIP},
                )
        except (aiohttp.ClientError, TimeoutError):
            self._record(seen)
            return web.json_response({"errors": ["upstream unreachable"]}, status=502)
        if rule is not None:  # carried out upstream; the client gets no answer at all
            self._record(ProxiedRequest(seen.at, seen.method, seen.path, body, None, True))
            assert request.transport is not None
            request.transport.abort()
            return reply  # never sent: the connection is gone
        self._record(ProxiedRequest(seen.at, seen.method, seen.path, body, upstream.status))
        return reply

    def _decide(self, request: ProxiedRequest) -> _Rule | None:
        with self._lock:
            history = list(self.requests)
            for rule in self._rules:
                if rule.times > 0 and rule.match(request, history):
                    rule.times -= 1
                    return rule
        return None

    def _record(self, request: ProxiedRequest) -> None:
        with self._lock:
            self.requests.append(request)
