"""One pooled async HTTP client per provider: token requests and probes.

httpx errors are translated here (network → ProviderUnavailable, 5xx → ProviderUnavailable,
429 → RateLimited with Retry-After, RFC 6749 error bodies → OAuthError), so nothing above
this module sees httpx. Bodies are read with a size bound. Secrets are revealed only into the
request being built.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote

import httpx

from keyturn.clock import Clock
from keyturn.errors import MalformedResponse
from keyturn.providers.http import (
    pooled_client,
    raise_if_transient,
    send_bounded,
)
from keyturn.providers.ratelimit import TokenBucket
from keyturn.providers.tokens import TokenResponse, parse_error_response, parse_token_response
from keyturn.secret import Secret

GrantType = Literal["client_credentials", "refresh_token"]


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """What the client needs to know about a provider (mapped from the configuration)."""

    name: str
    base_url: str
    token_path: str = "/oauth/token"
    token_request: Literal["json", "form"] = "json"
    client_auth: Literal["body", "basic"] = "body"
    timeout: float = 10.0
    max_connections: int = 100
    rate_limit: float | None = None
    max_response_bytes: int = 65536


def basic_credentials(client_id: str, client_secret: Secret) -> str:
    """RFC 6749 §2.3.1: form-urlencode each part, then HTTP Basic."""
    pair = f"{quote(client_id, safe='')}:{quote(client_secret.reveal(), safe='')}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


class ProviderClient:
    """Talks to one provider. Create once, share across credentials, `aclose()` at shutdown."""

    def __init__(
        self,
        settings: ProviderSettings,
        *,
        clock: Clock,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._bucket = TokenBucket(settings.rate_limit, clock) if settings.rate_limit else None
        self._http = pooled_client(
            base_url=settings.base_url,
            timeout=settings.timeout,
            max_connections=settings.max_connections,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"ProviderClient({self.settings.name!r}, {self.settings.base_url!r})"

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request_token(
        self,
        credential: str,
        *,
        grant_type: GrantType,
        client_id: str,
        client_secret: Secret,
        refresh_token: Secret | None = None,
        scope: str | None = None,
    ) -> TokenResponse:
        """POST the token endpoint; returns a parsed success or raises a ProviderError."""
        fields: dict[str, str] = {"grant_type": grant_type}
        if grant_type == "refresh_token":
            if refresh_token is None:
                raise ValueError("a refresh_token grant needs a refresh token")
            fields["refresh_token"] = refresh_token.reveal()
        if scope:
            fields["scope"] = scope
        headers: dict[str, str] = {"Cache-Control": "no-store"}
        if self.settings.client_auth == "basic":
            headers["Authorization"] = basic_credentials(client_id, client_secret)
        else:
            fields["client_id"] = client_id
            fields["client_secret"] = client_secret.reveal()
        if self.settings.token_request == "json":
            request = self._http.build_request(
                "POST", self.settings.token_path, json=fields, headers=headers
            )
        else:
            request = self._http.build_request(
                "POST", self.settings.token_path, data=fields, headers=headers
            )
        status, response_headers, body = await self._send(request, credential)
        if 200 <= status < 300:
            return parse_token_response(body, credential)
        self._raise_for(status, response_headers, body, credential, (client_secret, refresh_token))
        raise AssertionError("unreachable")  # pragma: no cover

    async def probe(self, credential: str, path: str, authorization: Secret) -> int:
        """GET `path` with the given Authorization value; returns the status.

        Network errors and 5xx raise ProviderUnavailable (the probe says nothing about the
        credential then); 429 raises RateLimited; any other status is returned.
        """
        request = self._http.build_request(
            "GET", path, headers={"Authorization": authorization.reveal()}
        )
        status, headers, _body = await self._send(request, credential)
        raise_if_transient(
            status, headers, now=self._clock.time(), where=path, credential=credential
        )
        return status

    async def _send(
        self, request: httpx.Request, credential: str
    ) -> tuple[int, httpx.Headers, bytes]:
        if self._bucket is not None:
            await self._bucket.acquire()

        def oversized(description: str) -> MalformedResponse:
            return MalformedResponse(description, field="body", credential=credential)

        return await send_bounded(
            self._http,
            request,
            limit=self.settings.max_response_bytes,
            where=request.url.path,
            credential=credential,
            oversized=oversized,
        )

    def _raise_for(
        self,
        status: int,
        headers: httpx.Headers,
        body: bytes,
        credential: str,
        sent: tuple[Secret | None, ...],
    ) -> None:
        where = self.settings.token_path
        raise_if_transient(
            status, headers, now=self._clock.time(), where=where, credential=credential
        )
        error = parse_error_response(body, status, credential, sent)
        if error is None:
            raise MalformedResponse(
                f"HTTP {status} without an RFC 6749 error body", field="body", credential=credential
            )
        raise error
