"""HTTP from the harness to the servers it runs on 127.0.0.1.

`httpx.get()` and each new `httpx.Client()` build a TLS context that loads the system's CA
bundle (about 20 ms of CPU), even for an http:// URL. The harness polls its servers many times
a second, so that was the largest CPU cost of the integration tests. `client()` shares one
context; `HTTP` is one client for one-off requests. It keeps no connection alive: each request
opens its own, as `httpx.get()` did, so a server that closes idle connections (or was restarted
on the same port) is never caught mid-race.
"""

from __future__ import annotations

from typing import Any

import httpx

_TLS = httpx.create_ssl_context()


def client(**kwargs: Any) -> httpx.Client:
    """`httpx.Client(**kwargs)` with the shared TLS context."""
    return httpx.Client(verify=_TLS, **kwargs)


HTTP = client(timeout=5.0, limits=httpx.Limits(max_keepalive_connections=0))
