"""HTTP from the harness to the servers it runs on 127.0.0.1.

`httpx.get()` and each new `httpx.Client()` build a TLS context that loads the system's CA
bundle (about 20 ms of CPU), even for an http:// URL. The harness polls its servers many times
a second, so that was the largest CPU cost of the integration tests. `client()` shares one
context; `HTTP` is one client for one-off requests. It keeps no connection alive: each request
opens its own, as `httpx.get()` did, so a server that closes idle connections (or was restarted
on the same port) is never caught mid-race. `serve_json` is the other way round: a document
the servers fetch from the harness.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx

_TLS = httpx.create_ssl_context()


def client(**kwargs: Any) -> httpx.Client:
    """`httpx.Client(**kwargs)` with the shared TLS context."""
    return httpx.Client(verify=_TLS, **kwargs)


HTTP = client(timeout=5.0, limits=httpx.Limits(max_keepalive_connections=0))


@contextlib.contextmanager
def serve_json(body: Callable[[], bytes | None], path: str = "/jwks.json") -> Iterator[str]:
    """Serve `body()` as application/json at `path` on 127.0.0.1 (404 when it returns None),
    in a thread, until the block ends; yields the URL. `body` runs at each GET, so a test can
    serve a file as it is now, or count the fetches."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            document = body() if self.path == path else None
            if document is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(document)))
            self.end_headers()
            self.wfile.write(document)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}{path}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
