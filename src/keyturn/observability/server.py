"""`MetricsServer`: the daemon's HTTP face (/metrics, /healthz, /readyz, /usage) on `[metrics]`.

With `web_config` it sniffs each connection's first byte for TLS and checks basic auth or a
client certificate (docs/configuration.md). The registry renders on a worker thread so the
loop keeps scheduling; `ready()` is bounded by `ready_timeout`. Paths: docs/metrics.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from asyncio import sslproto
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from keyturn.config import MetricsSettings
from keyturn.errors import KeyturnError
from keyturn.logs import get_logger
from keyturn.observability.guard import BasicAuth, ServerContexts
from keyturn.observability.health import Alive, Ready

log = get_logger("keyturn.metrics")
NO_STORE = {"Cache-Control": "no-store"}
# The usage view (`keyturn.usage.service.UsageService.view`): (credentials or None for all,
# summary) -> a JSON object.
UsageView = Callable[[Sequence[str] | None, bool], dict[str, Any]]
# The registry rendered, in the text format or (True) OpenMetrics, as parts to send in order:
# the daemon's `PrometheusObserver.exposition_parts`, which writes the per-credential gauges
# itself.
Exposition = Callable[[bool], list[bytes]]
# How much of the body is joined and written at a time: one copy of the body in flight, not
# the whole 8 MB of a daemon with 10,000 credentials.
CHUNK = 256 * 1024
# Go's net/http answer to plain HTTP on a TLS port, the one the exporter toolkit gives.
PLAIN_HTTP_ANSWER = (
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
)
TLS_HANDSHAKE = 0x16  # the first byte of a TLS handshake record
HANDSHAKE_TIMEOUT = 10  # seconds
UNAUTHORIZED = {"WWW-Authenticate": "Basic", **NO_STORE}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MetricsServer:
    """Serves /metrics, /healthz and /readyz; `await start()`, later `await stop()`."""

    def __init__(
        self,
        settings: MetricsSettings,
        registry: CollectorRegistry,
        *,
        alive: Alive,
        ready: Ready,
        ready_timeout: float = 5.0,
        usage: UsageView | None = None,
        exposition: Exposition | None = None,
    ) -> None:
        self._settings = settings
        self._usage = usage
        self._registry = registry
        self._exposition = exposition
        self._alive = alive
        self._ready = ready
        self._ready_timeout = ready_timeout
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        web_config = settings.web_config
        self._auth = BasicAuth(web_config.users) if web_config and web_config.users else None
        self._tls = web_config.tls if web_config is not None else None
        self._verifies = self._tls is not None and self._tls.verifies_clients
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"MetricsServer(listen={self._settings.listen!r}, port={self._port})"

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the one chosen for port 0)."""
        if self._port is None:
            raise RuntimeError("the metrics server is not started")
        return self._port

    @property
    def url(self) -> str:
        host = self._settings.host
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104 - a mapping
        scheme = "https" if self._tls is not None else "http"
        return (
            f"{scheme}://[{host}]:{self.port}" if ":" in host else f"{scheme}://{host}:{self.port}"
        )

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/usage", self._usage_view)
        return app

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the metrics server is already started")
        contexts = None
        if self._tls is not None:
            try:
                contexts = ServerContexts(self._tls)
            except (OSError, ssl.SSLError) as exc:
                names = ", ".join(str(path) for path in self._tls.files)
                raise KeyturnError(
                    f"metrics: cannot load the TLS certificate, key or CA ({names}): "
                    f"{getattr(exc, 'strerror', None) or type(exc).__name__}"
                ) from exc
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        try:
            if contexts is None:
                site = web.TCPSite(runner, self._settings.host, self._settings.port)
                await site.start()
                address = runner.addresses[0]
            else:
                address = self._listen_tls(runner, contexts)
        except OSError as exc:
            await runner.cleanup()
            reason = exc.strerror or type(exc).__name__
            raise KeyturnError(
                f"metrics: cannot listen on {self._settings.listen}: {reason}"
            ) from exc
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(address[1])
        log.info(
            "metrics.listening",
            host=self._settings.host,
            port=self._port,
            tls=self._tls is not None,
            basic_auth=self._auth is not None,
        )

    def _listen_tls(self, runner: web.AppRunner, contexts: ServerContexts) -> Any:
        """Listen, and hand each connection that starts a TLS handshake to aiohttp."""
        host, port = self._settings.host, self._settings.port
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.create_server(address, family=family, backlog=128)
        listener.setblocking(False)
        self._listener = listener
        self._spawn(self._accept(listener, runner, contexts))
        return listener.getsockname()

    def _spawn(self, work: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(
        self, listener: socket.socket, runner: web.AppRunner, contexts: ServerContexts
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                connection, _ = await loop.sock_accept(listener)
            except OSError as exc:  # out of file descriptors, say: try again shortly
                log.warning("metrics.accept_failed", error=type(exc).__name__)
                await asyncio.sleep(0.1)
                continue
            self._spawn(self._hand_over(connection, runner, contexts))

    async def _hand_over(
        self, connection: socket.socket, runner: web.AppRunner, contexts: ServerContexts
    ) -> None:
        loop = asyncio.get_running_loop()
        connection.setblocking(False)
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                first = await _peek(loop, connection)
                if first and first[0] == TLS_HANDSHAKE and runner.server is not None:
                    handshake: asyncio.Future[None] = loop.create_future()
                    protocol = _AlertingSSLProtocol(
                        loop,
                        runner.server(),
                        contexts.current(),
                        handshake,
                        server_side=True,
                        ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
                    )
                    await loop.connect_accepted_socket(lambda: protocol, connection)
                    await handshake
                    return
                if first[:1].isalpha():  # a request line: GET /metrics HTTP/1.1
                    await loop.sock_recv(connection, 65536)
                    await loop.sock_sendall(connection, PLAIN_HTTP_ANSWER)
                    # read to the client's end, so closing sends no reset over the answer
                    connection.shutdown(socket.SHUT_WR)
                    async with asyncio.timeout(1.0):
                        while await loop.sock_recv(connection, 65536):
                            pass
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            log.debug("metrics.handshake_failed", error=type(exc).__name__)
            # the transport, if one was made, has closed the socket already
        except Exception as exc:  # one connection's trouble never ends the accept loop
            log.warning("metrics.connection_failed", error=type(exc).__name__)
        connection.close()

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        listener, self._listener = self._listener, None
        if listener is not None:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            listener.close()
        if runner is not None:
            await runner.cleanup()
            log.info("metrics.stopped")

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Basic auth on every path but the open ones (`_usage_view` asks for more)."""
        if request.path in self._settings.open_paths:
            return await handler(request)
        header = request.headers.get("Authorization")
        if self._auth is not None and not await self._auth.check(header):
            log.info("metrics.unauthorized", path=request.path, remote=request.remote)
            body = {"error": "authentication required"}
            return web.json_response(body, status=401, headers=UNAUTHORIZED)
        return await handler(request)

    def _known(self, request: web.Request) -> bool:
        """Whether the request proved who sent it (when web_config lets it): a password of
        `basic_auth_users`, or a client certificate verified against `client_ca_file`."""
        if self._auth is None and not self._verifies:
            return True  # nothing to prove with: `keyturn check` warns when that is exposed
        if self._auth is not None and request.path not in self._settings.open_paths:
            return True  # `_guard` let it through: its password matched
        transport = request.transport
        return bool(self._verifies and transport and transport.get_extra_info("peercert"))

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        loop = asyncio.get_running_loop()
        headers = {"Content-Type": content_type, **NO_STORE}
        if self._exposition is None:
            body = await loop.run_in_executor(None, encoder, self._registry)
            return web.Response(body=body, headers=headers)
        openmetrics = content_type.startswith("application/openmetrics-text")
        parts = await loop.run_in_executor(None, self._exposition, openmetrics)
        response = web.StreamResponse(headers=headers)
        response.content_length = sum(len(part) for part in parts)
        await response.prepare(request)
        chunk: list[bytes] = []
        size = 0
        for part in parts:
            chunk.append(part)
            size += len(part)
            if size >= CHUNK:
                await response.write(b"".join(chunk))
                chunk, size = [], 0
        await response.write(b"".join(chunk))
        await response.write_eof()
        return response

    async def _healthz(self, request: web.Request) -> web.Response:
        try:
            alive, reason = self._alive()
        except Exception as exc:
            log.exception("healthz.failed", error=type(exc).__name__)
            alive, reason = False, f"liveness check failed ({type(exc).__name__})"
        return web.json_response(
            {"alive": alive, "reason": reason}, status=200 if alive else 503, headers=NO_STORE
        )

    async def _readyz(self, request: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(self._ready_timeout):
                ready, problems = await self._ready()
        except TimeoutError:
            ready, problems = False, [f"readiness check timed out after {self._ready_timeout:g} s"]
        except Exception as exc:
            log.exception("readyz.failed", error=type(exc).__name__)
            ready, problems = False, [f"readiness check failed ({type(exc).__name__})"]
        body = {"ready": ready, "problems": [str(p) for p in problems]}
        return web.json_response(body, status=200 if ready else 503, headers=NO_STORE)

    async def _usage_view(self, request: web.Request) -> web.Response:
        """Computed on the event loop, whose thread alone touches the usage tracker."""
        if not self._known(request):
            body: dict[str, Any] = {
                "error": "/usage needs a verified client certificate or a password"
            }
            return web.json_response(body, status=403, headers=NO_STORE)
        if self._usage is None:
            body = {"error": "keyturn runs without a [usage] table"}
            return web.json_response(body, status=404, headers=NO_STORE)
        names = request.query.getall("credential", []) or None
        summary = request.query.get("summary", "") in ("1", "true")
        return web.json_response(self._usage(names, summary), headers=NO_STORE)


class _AlertingSSLProtocol(sslproto.SSLProtocol):
    """asyncio's TLS protocol, which also sends the alert of a failed handshake (asyncio
    drops it): a client without a required certificate hears "certificate required", one
    with a certificate of another CA "unknown ca", not a bare end of connection."""

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        transport, outgoing = self._transport, getattr(self, "_outgoing", None)
        if handshake_exc is not None and isinstance(transport, asyncio.WriteTransport):
            with contextlib.suppress(Exception):
                alert = outgoing.read() if isinstance(outgoing, ssl.MemoryBIO) else b""
                if alert:
                    transport.write(alert)
        super()._on_handshake_complete(handshake_exc)


async def _peek(loop: asyncio.AbstractEventLoop, connection: socket.socket) -> bytes:
    """The connection's first byte, left in place for the TLS handshake (b"" at its end)."""
    while True:
        try:
            return connection.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            pass
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(connection.fileno(), _wake, readable)
        try:
            await readable
        finally:
            loop.remove_reader(connection.fileno())


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
