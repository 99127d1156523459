"""`MetricsServer`: the daemon's HTTP face, on `[metrics]` host and port.

    GET /metrics   the registry in the Prometheus text format (OpenMetrics if asked for)
    GET /healthz   200 while `alive()` says so, else 503: {"alive": bool, "reason": str}
    GET /readyz    200 while `ready()` says so, else 503: {"ready": bool, "problems": [...]}
    GET /usage     with `[usage]`: who reads each credential (`keyturn usage`, `status`), from
                   `usage(names, summary)`; `?credential=NAME` (repeated) picks credentials,
                   `?summary=1` leaves out the consumers' list; 404 without `[usage]`

Rendering the registry of 10,000 credentials takes a while, so it runs on a worker thread and
the event loop keeps scheduling meanwhile. `ready()` is bounded by `ready_timeout`; when it
fails or times out the answer is 503 with a line saying so (an exception's type, never its
text). Port 0 binds a free port; `port` tells which. A port that cannot be bound is a
`KeyturnError` naming the address.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from keyturn.config import MetricsSettings
from keyturn.errors import KeyturnError
from keyturn.logs import get_logger
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
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/usage", self._usage_view)
        return app

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the metrics server is already started")
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._settings.host, self._settings.port)
            await site.start()
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
        address = runner.addresses[0]
        self._port = int(address[1])
        log.info("metrics.listening", host=self._settings.host, port=self._port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
            log.info("metrics.stopped")

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
        if self._usage is None:
            body: dict[str, Any] = {"error": "keyturn runs without a [usage] table"}
            return web.json_response(body, status=404, headers=NO_STORE)
        names = request.query.getall("credential", []) or None
        summary = request.query.get("summary", "") in ("1", "true")
        return web.json_response(self._usage(names, summary), headers=NO_STORE)
