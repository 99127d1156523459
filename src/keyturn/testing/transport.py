"""`vault_answer`: the `requests.Response` a fake transport under hvac hands back, so unit
tests of the Vault client exercise hvac's and keyturn's own response handling on a canned
answer (no socket)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import requests


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
