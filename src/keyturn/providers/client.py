"""One pooled async HTTP client per provider: token requests, probes, RFC 7009 revocation.

httpx errors are translated here (network → ProviderUnavailable, 5xx → ProviderUnavailable,
429 → RateLimited, both with Retry-After, RFC 6749 error bodies → OAuthError), so nothing
above this module sees httpx, and nothing but a KeyturnError leaves it whatever the provider
sends. Each request runs under a total deadline (`timeout`) and its body is read with a size
bound on the decoded bytes. Secrets are revealed only into the request being built.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import re
from collections.abc import Iterator, Mapping
from typing import Literal
from urllib.parse import quote

import httpx

from keyturn.clock import Clock
from keyturn.config import ProviderConfig
from keyturn.errors import MalformedResponse, OAuthError, ProviderError
from keyturn.providers.client_auth import ClientKey, describe_refusal
from keyturn.providers.http import (
    ProviderHttp,
    raise_if_transient,
    send_bounded,
)
from keyturn.providers.params import NO_PARAMS, TokenParams
from keyturn.providers.recovery import Recovery
from keyturn.providers.tokens import TokenResponse, parse_error_response, parse_token_response
from keyturn.ratelimit import TokenBucket
from keyturn.secret import Secret

GrantType = Literal["client_credentials", "refresh_token"]
# What a client proves itself with: its client secret, or a key or certificate.
ClientSecret = Secret | ClientKey
TokenTypeHint = Literal["refresh_token", "access_token"]

# What an HTTP header value may hold (RFC 9110 §5.5: visible ASCII, space and tab).
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
# The request could not be built from these values (never the provider's fault alone).
_BUILD_ERRORS = (httpx.InvalidURL, UnicodeError, ValueError)
# A server's Date this far from keyturn's clock explains a refused assertion (exp, iat).
_SKEW_WORTH_SAYING = 30.0


def basic_credentials(client_id: str, client_secret: Secret) -> str:
    """RFC 6749 §2.3.1: form-urlencode each part, then HTTP Basic."""
    pair = f"{quote(client_id, safe='')}:{quote(client_secret.reveal(), safe='')}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


class ProviderClient:
    """Talks to one provider (as configured in `[[providers]]`). Create once, share across
    credentials, `aclose()` at shutdown."""

    def __init__(
        self,
        provider: ProviderConfig,
        *,
        clock: Clock,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.provider = provider
        self._clock = clock
        self._bucket = TokenBucket(provider.rate_limit, clock) if provider.rate_limit else None
        # The provider's outages as its credentials see them (shared by all of them).
        self.recovery = Recovery(provider.rate_limit)
        self._http = ProviderHttp(
            base_url=provider.base_url,
            timeout=provider.timeout,
            max_connections=provider.max_connections,
            transport=transport,
        )
        self._transport = transport
        # Mutual TLS: one pool per client certificate (RFC 8705), by its thumbprint.
        self._mtls: dict[str, ProviderHttp] = {}

    def __repr__(self) -> str:
        return f"ProviderClient({self.provider.name!r}, {self.provider.base_url!r})"

    @property
    def http(self) -> ProviderHttp:
        """The provider's pooled connections, for a kind's own calls to it (a signing key's
        registration endpoint)."""
        return self._http

    async def aclose(self) -> None:
        await self._http.aclose()
        for http in self._mtls.values():
            await http.aclose()

    async def request_token(
        self,
        credential: str,
        *,
        grant_type: GrantType,
        client_id: str,
        client_secret: ClientSecret,
        refresh_token: Secret | None = None,
        scope: str | None = None,
        params: TokenParams = NO_PARAMS,
    ) -> TokenResponse:
        """POST the token endpoint; returns a parsed success or raises a ProviderError (an
        error about the credential's own `params` names them: `TokenParams.blame`). A
        `ClientKey` instead of a client secret authenticates without one (and may make a
        client_credentials request a JWT bearer grant)."""
        fields: dict[str, str | list[str]] = {"grant_type": grant_type}
        if grant_type == "refresh_token":
            if refresh_token is None:
                raise ValueError("a refresh_token grant needs a refresh token")
            fields["refresh_token"] = refresh_token.reveal()
        if scope:
            fields["scope"] = scope
        keyless = isinstance(client_secret, ClientKey)
        params.add_to(fields, "form" if keyless else self.provider.token_request)
        headers, sent = self._client_auth(fields, client_id, client_secret)
        path = self.provider.token_path
        if self.provider.token_request == "json" and not keyless:
            request = self._build(credential, "POST", path, json=fields, headers=headers)
        else:
            # RFC 7523 and RFC 8705 requests are form bodies (RFC 6749 §4.4.2).
            request = self._build(credential, "POST", path, data=fields, headers=headers)
        status, response_headers, body = await self._send(
            request,
            credential,
            track_sending=grant_type == "refresh_token",
            client=client_secret,
        )
        if 200 <= status < 300:
            return parse_token_response(body, credential)
        secrets = (sent, refresh_token, *params.secrets())
        try:
            with self._keyless_refusal(
                client_secret, client_id, credential, status, response_headers
            ):
                self._raise_for(path, status, response_headers, body, credential, secrets)
        except OAuthError as error:
            raise params.blame(error) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def revoke_token(
        self,
        credential: str,
        *,
        token: Secret,
        token_type_hint: TokenTypeHint,
        client_id: str,
        client_secret: ClientSecret,
    ) -> bool:
        """RFC 7009: ask the provider to revoke `token`; False if it has no revoke_path.

        The request is a form body (RFC 7009 §2.1 requires one, whatever `token_request` says)
        authenticated like the token request. Any 2xx is success (§2.2: 200 whether or not the
        token was known; the body is ignored). 503/5xx and 429 raise ProviderUnavailable and
        RateLimited with Retry-After (§2.2.1); an RFC 6749 error body raises OAuthError (e.g.
        `unsupported_token_type`, `invalid_client`); anything else MalformedResponse.
        """
        path = self.provider.revoke_path
        if path is None:
            return False
        fields: dict[str, str | list[str]] = {
            "token": token.reveal(),
            "token_type_hint": token_type_hint,
        }
        headers, sent = self._client_auth(fields, client_id, client_secret)
        request = self._build(credential, "POST", path, data=fields, headers=headers)
        status, response_headers, body = await self._send(
            request, credential, track_sending=False, client=client_secret
        )
        if 200 <= status < 300:
            return True
        self._raise_for(
            path,
            status,
            response_headers,
            body,
            credential,
            (sent, token),
            endpoint="revocation endpoint",
        )
        raise AssertionError("unreachable")  # pragma: no cover

    async def probe(
        self,
        credential: str,
        path: str,
        authorization: Secret,
        also: Mapping[str, Secret] | None = None,
    ) -> int:
        """GET `path` with the given Authorization value (and the headers `also`, e.g. the
        credential's own value when Authorization carries another's token); returns the status.

        Network errors and 5xx raise ProviderUnavailable (the probe says nothing about the
        credential then); 429 raises RateLimited; any other status is returned.
        """
        sent: dict[str, str] = {}
        for name, secret in {"Authorization": authorization, **(also or {})}.items():
            value = secret.reveal()
            if not _HEADER_VALUE.fullmatch(value):
                raise MalformedResponse(
                    "cannot be sent in an HTTP header (a character outside visible ASCII)",
                    field=name.lower(),
                    credential=credential,
                )
            sent[name] = value
        request = self._build(credential, "GET", path, headers=sent)
        status, headers, _body = await self._send(request, credential, track_sending=False)
        raise_if_transient(
            status, headers, now=self._clock.time(), where=path, credential=credential
        )
        return status

    def _client_auth(
        self, fields: dict[str, str | list[str]], client_id: str, client_secret: ClientSecret
    ) -> tuple[dict[str, str], Secret | None]:
        """RFC 6749 §2.3.1 as configured (Basic, or client_id/client_secret added to
        `fields`), or a `ClientKey`'s way; the headers, and the secret sent (never echoed)."""
        headers: dict[str, str] = {"Cache-Control": "no-store"}
        if isinstance(client_secret, ClientKey):
            audience = self.provider.assertion_audience
            sent = client_secret.fields_for(
                fields, client_id, audience=audience, now=self._clock.time()
            )
            return headers, sent
        if self.provider.client_auth == "basic":
            headers["Authorization"] = basic_credentials(client_id, client_secret)
        else:
            fields["client_id"] = client_id
            fields["client_secret"] = client_secret.reveal()
        return headers, client_secret

    @contextlib.contextmanager
    def _keyless_refusal(
        self,
        client: ClientSecret,
        client_id: str,
        credential: str,
        status: int,
        headers: httpx.Headers,
    ) -> Iterator[None]:
        """A refusal of a key or certificate says what was sent (iss, aud, alg, kid) and, when
        the server's Date is far from keyturn's clock, the skew; a bare 401/403 is taken as the
        invalid_client it means, so that an operator is alerted."""
        try:
            yield
        except ProviderError as error:
            if not isinstance(client, ClientKey) or error.retryable:
                raise
            if isinstance(error, OAuthError):
                code, said = error.error, error.description
            elif isinstance(error, MalformedResponse) and status in (401, 403):
                code, said = "invalid_client", f"HTTP {status} with no error body"
            else:
                raise
            if code not in ("invalid_client", "unauthorized_client", "invalid_grant"):
                raise
            sent = describe_refusal(client, client_id, self.provider.assertion_audience)
            detail = f"{said}; " if said else ""
            raise OAuthError(
                code,
                credential=credential,
                description=f"{detail}sent {sent}{self._skew(headers)}",
                status=status,
            ) from None

    def _skew(self, headers: httpx.Headers) -> str:
        """How far the server's clock (its Date header) is from keyturn's, if worth saying."""
        date = headers.get("Date")
        if not date:
            return ""
        try:
            theirs = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return ""
        skew = theirs - self._clock.time()
        if abs(skew) < _SKEW_WORTH_SAYING:
            return ""
        way = "ahead of" if skew > 0 else "behind"
        return (
            f"; the server's clock is {abs(skew):.0f}s {way} keyturn's (its Date header): "
            "the assertion's iat/exp look wrong to it, fix the clock (NTP)"
        )

    def _build(
        self,
        credential: str,
        method: str,
        path: str,
        *,
        json: dict[str, str | list[str]] | None = None,
        data: dict[str, str | list[str]] | None = None,
        headers: dict[str, str],
    ) -> httpx.Request:
        try:
            return self._http.build_request(method, path, json=json, data=data, headers=headers)
        except _BUILD_ERRORS as exc:
            # The message of a UnicodeError or ValueError can quote the value: not chained.
            raise MalformedResponse(
                f"{method} {path}: the request cannot be built from these values "
                f"({type(exc).__name__})",
                field="request",
                credential=credential,
            ) from None

    async def _send(
        self,
        request: httpx.Request,
        credential: str,
        *,
        track_sending: bool,
        client: ClientSecret | None = None,
    ) -> tuple[int, httpx.Headers, bytes]:
        """`track_sending`: whether a lost answer must be told from a request that never left
        (`ProviderUnavailable.answer_lost`): only a refresh token grant needs it (a refresh
        token that may have been used is burned); see `send_bounded`."""
        if self._bucket is not None:
            await self._bucket.acquire()

        def oversized(description: str) -> MalformedResponse:
            return MalformedResponse(description, field="body", credential=credential)

        return await send_bounded(
            self._http_for(client),
            request,
            limit=self.provider.max_response_bytes,
            where=request.url.path,
            credential=credential,
            oversized=oversized,
            deadline=self.provider.timeout,
            track_sending=track_sending,
        )

    def _http_for(self, client: ClientSecret | None) -> ProviderHttp:
        """The pool that presents `client`'s certificate (mutual TLS), or the provider's."""
        tls = client.tls_context() if isinstance(client, ClientKey) else None
        if tls is None or client is None or not isinstance(client, ClientKey):
            return self._http
        assert client.tls is not None
        thumbprint = client.tls.thumbprint
        if thumbprint not in self._mtls:
            provider = self.provider
            self._mtls[thumbprint] = ProviderHttp(
                base_url=provider.base_url,
                timeout=provider.timeout,
                max_connections=min(provider.max_connections, 4),
                transport=self._transport,
                tls=tls,
            )
        return self._mtls[thumbprint]

    def _raise_for(
        self,
        where: str,
        status: int,
        headers: httpx.Headers,
        body: bytes,
        credential: str,
        sent: tuple[Secret | None, ...],
        *,
        endpoint: str = "token endpoint",
    ) -> None:
        raise_if_transient(
            status, headers, now=self._clock.time(), where=where, credential=credential
        )
        error = parse_error_response(body, status, credential, sent, endpoint=endpoint)
        if error is None:
            raise MalformedResponse(
                f"HTTP {status} without an RFC 6749 error body", field="body", credential=credential
            )
        raise error
