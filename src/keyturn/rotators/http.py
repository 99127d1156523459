"""The `http` rotator: a provider's key-management API, described in the configuration.

Placeholders are URL-quoted in a path and JSON-escaped in a body; answers are parsed strictly
under a size bound. Transient failures are `ProviderUnavailable`/`RateLimited`, anything else
(the rotator's own credential refused too) a `RotationError` naming rotator, credential, call
and JSON pointer, never a key, the auth value or a body. See docs/rotation.md#rotators.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import NoReturn

import httpx

from keyturn.clock import Clock, SystemClock
from keyturn.config.schema import HttpCall, HttpRotatorConfig, ProviderConfig
from keyturn.config.templates import (
    PLACEHOLDER,
    pointer_tokens,
    render_body,
    render_path,
    resolve_pointer,
)
from keyturn.errors import RotationError
from keyturn.providers.http import ProviderHttp, raise_if_transient, send_bounded
from keyturn.rotators.base import NewKey, RotationRequest, json_kind
from keyturn.secret import Secret

# A revoke of a key the provider no longer knows has nothing left to do.
GONE = (404, 410)
# An `error` code is shown only if it reads like one (`invalid_request`, `quota_exceeded`):
# lowercase words, no digits, so that a provider echoing a token never gets it into a message.
_ERROR_CODE = re.compile(r"[a-z]{2,20}(?:_[a-z]{2,20}){0,4}")


# Where an `auth = "credential:NAME"` token comes from: read at each call.
TokenSource = Callable[[], Awaitable[Secret]]


class HttpRotator:
    """Creates, revokes and finds keys through one provider's API. `aclose()` when done.
    `auth`: a value resolved once, or a `TokenSource` read before each call."""

    def __init__(
        self,
        config: HttpRotatorConfig,
        provider: ProviderConfig,
        auth: Secret | TokenSource | None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.name = config.name
        self.config = config
        self._auth = auth
        self._sent_auth: Secret | None = None
        self._clock = clock or SystemClock()
        self._limit = provider.max_response_bytes
        self._timeout = provider.timeout
        self._http = ProviderHttp(
            base_url=provider.base_url,
            timeout=provider.timeout,
            max_connections=provider.max_connections,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"HttpRotator({self.name!r})"

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- the Rotator interface ------------------------------------------------------------

    async def create(self, request: RotationRequest) -> NewKey:
        call = self.config.create
        if call.value is None:  # the loader requires it; a hand-made config might not
            raise self._error("create has no value pointer", request)
        status, body = await self._call("create", call, request, None)
        if status not in call.ok_status:
            self._refuse("create", status, body, request)
        document = self._json("create", body, request)
        value = self._pick(document, call.value, "create", request)
        if not isinstance(value, str) or not value:
            raise self._error(
                f"create response: {call.value} is {json_kind(value)}; expected the new key as a "
                "non-empty string",
                request,
            )
        key_id = None
        if call.id is not None:
            key_id = _identifier(self._pick(document, call.id, "create", request))
            if key_id is None:
                raise self._error(
                    f"create response: {call.id} is not a string or integer id", request
                )
        return NewKey(Secret(value), key_id)

    async def revoke(self, request: RotationRequest, key_id: str) -> None:
        call = self.config.revoke
        status, body = await self._call("revoke", call, request, key_id)
        if status not in call.ok_status and status not in GONE:
            self._refuse("revoke", status, body, request)

    async def find(self, request: RotationRequest) -> list[str] | None:
        find = self.config.find
        if find is None:
            return None
        call = HttpCall(path=find.path, method=find.method, ok_status=())
        status, body = await self._call("find", call, request, None)
        if not 200 <= status < 300:
            self._refuse("find", status, body, request)
        items = self._pick(self._json("find", body, request), find.items, "find", request)
        if not isinstance(items, list):
            raise self._error(f"find response: {find.items or '(root)'} is not an array", request)
        name_at, id_at = pointer_tokens(find.name), pointer_tokens(find.id)
        found: list[str] = []
        for index, item in enumerate(items):
            try:
                name = resolve_pointer(item, name_at)
            except KeyError:
                continue  # an item without a name is not one of ours
            if name != request.key_name:
                continue
            try:
                key_id = _identifier(resolve_pointer(item, id_at))
            except KeyError:
                key_id = None
            if key_id is None:
                raise self._error(
                    f"find response: item {index} has no string or integer id at {find.id}",
                    request,
                )
            found.append(key_id)
        return found

    # -- the wire -------------------------------------------------------------------------

    async def _call(
        self, what: str, call: HttpCall, request: RotationRequest, key_id: str | None
    ) -> tuple[int, bytes]:
        values = self._values(request, key_id, call)
        headers = {"Cache-Control": "no-store"}
        auth = await self._current_auth(request)
        if auth is not None:
            headers["Authorization"] = f"{self.config.auth_scheme} {auth.reveal()}"
        content = None
        if call.body is not None:
            content = render_body(call.body, values).encode()
            headers["Content-Type"] = "application/json"
        built = self._http.build_request(
            call.method, render_path(call.path, values), content=content, headers=headers
        )
        where = f"rotator {self.name}: {what} ({call.method} {call.path})"
        status, answer_headers, body = await send_bounded(
            self._http,
            built,
            limit=self._limit,
            where=where,
            credential=request.credential,
            oversized=lambda description: self._error(f"{where}: {description}", request),
        )
        raise_if_transient(
            status,
            answer_headers,
            now=self._clock.time(),
            where=where,
            credential=request.credential,
        )
        return status, body

    async def _current_auth(self, request: RotationRequest) -> Secret | None:
        """The value to send now; a `TokenSource` is read afresh (and kept, so that an error
        body echoing it is not shown)."""
        if self._auth is None or isinstance(self._auth, Secret):
            return self._auth
        try:
            self._sent_auth = await self._auth()
        except RotationError as error:
            raise self._error(f"rotators[{self.name!r}].{error.message}", request) from error
        return self._sent_auth

    def _values(
        self, request: RotationRequest, key_id: str | None, call: HttpCall
    ) -> dict[str, str]:
        values = {
            "credential": request.credential,
            "rotation_id": request.rotation_id,
            "key_name": request.key_name,
        }
        if request.client_id is not None:
            values["client_id"] = request.client_id
        if key_id is not None:
            values["key_id"] = key_id
        for template in (call.path, call.body or ""):
            for name in PLACEHOLDER.findall(template):
                if name not in values:
                    raise self._error(f"placeholder {{{name}}} has no value here", request)
        return values

    # -- parsing and errors ---------------------------------------------------------------

    def _json(self, what: str, body: bytes, request: RotationRequest) -> object:
        try:
            return json.loads(body)
        except ValueError:
            # `from None`: the decode error quotes the body, which may hold the key.
            raise self._error(f"{what} response is not JSON", request) from None

    def _pick(self, document: object, pointer: str, what: str, request: RotationRequest) -> object:
        try:
            return resolve_pointer(document, pointer_tokens(pointer))
        except KeyError:
            raise self._error(f"{what} response has nothing at {pointer}", request) from None

    def _refuse(self, what: str, status: int, body: bytes, request: RotationRequest) -> NoReturn:
        if status in (401, 403):
            raise self._error(
                f"{what}: the provider refused the rotator's auth (HTTP {status}); check "
                f"rotators[{self.name!r}].auth",
                request,
            )
        code = _error_code(body)
        sent = self._auth if isinstance(self._auth, Secret) else self._sent_auth
        if code and sent is not None and code in sent.reveal():
            code = None
        detail = f" ({code})" if code else ""
        raise self._error(f"{what}: unexpected HTTP {status}{detail}", request)

    def _error(self, message: str, request: RotationRequest) -> RotationError:
        return RotationError(f"rotator {self.name}: {message}", credential=request.credential)


def _identifier(value: object) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _error_code(body: bytes) -> str | None:
    """An OAuth-style `error` code from a JSON error body, if it looks like a code."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    code = document.get("error") if isinstance(document, dict) else None
    return code if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else None
