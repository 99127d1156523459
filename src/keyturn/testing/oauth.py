"""A tiny in-process OAuth server for unit tests, served through httpx.MockTransport."""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import dataclass, field
from urllib.parse import parse_qs

import httpx


@dataclass
class FakeOAuthServer:
    """Issues tokens, rotates refresh tokens, accepts each refresh token once."""

    client_id: str = "cid"
    client_secret: str = "cs-secret-value"
    expires_in: object = 600
    issue_refresh: bool = True
    scope: str | None = None
    next_responses: list[httpx.Response] = field(default_factory=list)
    probe_status: int | None = None
    grants: list[str] = field(default_factory=list)
    live_refresh: set[str] = field(default_factory=set)
    used_refresh: list[str] = field(default_factory=list)
    access_tokens: list[str] = field(default_factory=list)
    # Answers to lose: the grant is processed (a refresh token rotated), then the connection
    # breaks before the answer arrives, as when the answer is slower than keyturn's timeout.
    lose_answers: int = 0
    reuse: int = 0  # used refresh tokens presented again (RFC 9700: the family is revoked)
    revoked: list[str] = field(default_factory=list)  # tokens revoked through /oauth/revoke
    bodies: list[dict[str, object]] = field(default_factory=list)  # token requests, as sent
    refresh_expires_in: object = None  # sent with each refresh token when set
    # Set: access tokens are JWT-shaped (unsigned) with these claims, e.g. {"aud": "api"}.
    access_claims: dict[str, object] | None = None
    _consumed: set[str] = field(default_factory=set)
    _counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/oauth/token":
            response = self._token(json.loads(request.content))
            if self.lose_answers > 0:
                self.lose_answers -= 1
                raise httpx.ReadTimeout("answer lost", request=request)
            return response
        if request.url.path == "/oauth/revoke":  # RFC 7009: form body, 200 whatever the token
            token = parse_qs(request.content.decode()).get("token", [""])[0]
            self.revoked.append(token)
            self.live_refresh.discard(token)
            return httpx.Response(200)
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if self.probe_status is not None:
            return httpx.Response(self.probe_status)
        return httpx.Response(200 if token in self.access_tokens else 401, json=[])

    def _token(self, body: dict[str, str]) -> httpx.Response:
        self.bodies.append(dict(body))
        if self.next_responses:
            return self.next_responses.pop(0)
        self.grants.append(body["grant_type"])
        if body.get("client_secret") != self.client_secret:
            return httpx.Response(401, json={"error": "invalid_client"})
        if body["grant_type"] == "refresh_token":
            presented = body["refresh_token"]
            self.used_refresh.append(presented)
            if presented in self._consumed:
                self.reuse += 1
                self.live_refresh.clear()  # reuse revokes the family
            if presented not in self.live_refresh:
                return httpx.Response(400, json={"error": "invalid_grant"})
            self.live_refresh.discard(presented)
            self._consumed.add(presented)
        n = next(self._counter)
        access = f"at-{n}-secretvalue"
        if self.access_claims is not None:
            header: dict[str, object] = {"alg": "none"}
            access = ".".join(_b64(part) for part in (header, self.access_claims))
            access += f".at-{n}-secretvalue"
        self.access_tokens.append(access)
        response: dict[str, object] = {"access_token": access, "token_type": "Bearer"}
        if self.expires_in is not None:
            response["expires_in"] = self.expires_in
        if self.scope is not None:
            response["scope"] = self.scope
        if self.issue_refresh:
            refresh = f"rt-{n}-secretvalue"
            self.live_refresh.add(refresh)
            response["refresh_token"] = refresh
            if self.refresh_expires_in is not None:
                response["refresh_expires_in"] = self.refresh_expires_in
        return httpx.Response(200, json=response)


def _b64(part: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(part).encode()).decode().rstrip("=")
