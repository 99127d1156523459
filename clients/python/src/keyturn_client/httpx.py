"""`httpx.Auth` for a keyturn credential (sync and async clients).

    client = httpx.Client(base_url=..., auth=KeyturnAuth(credential))

Each request carries the credential's `Authorization` header. On a 401 or 403 the credential
is re-read from Vault and, when it holds a different value, the request is sent once more
with it (not for a 403 `insufficient_scope`: a new value would lack that scope too). Request
bodies are buffered (`requires_request_body`) so the retry can resend them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator

import httpx

from keyturn_client._credential import Credential
from keyturn_client._http import worth_a_new_value


class KeyturnAuth(httpx.Auth):
    requires_request_body = True

    def __init__(self, credential: Credential) -> None:
        self.credential = credential

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response]:
        sent = self.credential.authorization
        request.headers["Authorization"] = sent
        response = yield request
        if worth_a_new_value(response.status_code, response.headers.get("WWW-Authenticate")):
            replacement = self.credential.on_rejected(sent)
            if replacement is not None:
                request.headers["Authorization"] = replacement
                yield request

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        sent = await self.credential.authorization_async()
        request.headers["Authorization"] = sent
        response = yield request
        if worth_a_new_value(response.status_code, response.headers.get("WWW-Authenticate")):
            replacement = await self.credential.on_rejected_async(sent)
            if replacement is not None:
                request.headers["Authorization"] = replacement
                yield request

    def __repr__(self) -> str:
        return f"KeyturnAuth({self.credential!r})"
