"""A fake Vault at the transport: `VaultTransport`, a `requests` adapter that unit tests
mount under hvac (`VaultClient(transport=...)`, `VaultStore(transport=...)`) in place of
requests' `HTTPAdapter`, and `vault_answer`, the `requests.Response` such a transport hands
back. Everything above the transport (hvac's methods and adapter, requests' session, keyturn's
routing, retries and error translation) runs as in production; no socket is opened."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import requests
from requests.adapters import BaseAdapter

# What a fake Vault answers: (status, JSON body or None), optionally with headers, or an
# exception raised as requests' own transport raises it (e.g. `requests.ConnectionError`).
VaultReply = tuple[int, Any] | tuple[int, Any, Mapping[str, str]] | BaseException


class VaultTransport(BaseAdapter):
    """Answers each request with `handler(request)` (a `VaultReply`); keeps every request it
    was sent in `sent`."""

    def __init__(self, handler: Callable[[requests.PreparedRequest], VaultReply]) -> None:
        super().__init__()
        self.handler = handler
        self.sent: list[requests.PreparedRequest] = []

    def send(
        self, request: requests.PreparedRequest, *args: object, **kwargs: object
    ) -> requests.Response:
        self.sent.append(request)
        answer = self.handler(request)
        if isinstance(answer, BaseException):
            raise answer
        status, body, *headers = answer
        return vault_answer(request, status, body, headers=headers[0] if headers else None)

    def close(self) -> None:
        pass


def vault_answer(
    request: requests.PreparedRequest,
    status: int,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> requests.Response:
    """The answer to `request`: `body` as JSON (an empty body when None), or `raw` bytes as
    they are with only `headers`; `headers` are added either way."""
    response = requests.Response()
    response.status_code = status
    if raw is None:
        response._content = json.dumps(body).encode() if body is not None else b""
        response.headers["Content-Type"] = "application/json"
    else:
        response._content = raw
    response.headers.update(headers or {})
    response.url = request.url or ""
    response.request = request
    response.encoding = "utf-8"
    return response
