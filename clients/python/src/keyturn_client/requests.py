"""`requests.auth.AuthBase` for a keyturn credential.

    session.auth = KeyturnAuth(credential)

Each request carries the credential's `Authorization` header. On a 401 or 403 the credential
is re-read from Vault and, when it holds a different value, the request is sent once more
with it (as requests' own digest auth does: same connection adapter, same send options); not
for a 403 `insufficient_scope`, which a new value would get too. A body that cannot be
rewound (a one-shot generator) is not resent: the 401/403 is returned.
"""

from __future__ import annotations

import functools
from typing import Any

import requests
import requests.auth
from requests.cookies import extract_cookies_to_jar

from keyturn_client._credential import Credential
from keyturn_client._http import worth_a_new_value


class KeyturnAuth(requests.auth.AuthBase):
    def __init__(self, credential: Credential) -> None:
        self.credential = credential

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        sent = self.credential.authorization
        request.headers["Authorization"] = sent
        position: int | None = None
        tell = getattr(request.body, "tell", None)
        if callable(tell):
            try:
                position = int(tell())
            except (OSError, ValueError):
                position = None
        request.register_hook(
            "response", functools.partial(self._retry_once, sent=sent, position=position)
        )
        return request

    def _retry_once(
        self, response: requests.Response, *, sent: str, position: int | None, **send: Any
    ) -> requests.Response:
        if not worth_a_new_value(response.status_code, response.headers.get("WWW-Authenticate")):
            return response
        replacement = self.credential.on_rejected(sent)
        if replacement is None or not _rewind(response.request, position):
            return response
        _ = response.content  # read it so the connection goes back to the pool
        response.close()
        retry = response.request.copy()
        jar = retry._cookies
        if jar is not None:
            extract_cookies_to_jar(jar, response.request, response.raw)
            retry.prepare_cookies(jar)
        retry.headers["Authorization"] = replacement
        answer: requests.Response = response.connection.send(retry, **send)
        answer.history.append(response)
        answer.request = retry
        return answer

    def __repr__(self) -> str:
        return f"KeyturnAuth({self.credential!r})"


def _rewind(request: requests.PreparedRequest, position: int | None) -> bool:
    """Put a file-like body back where it was when the request was first sent."""
    body = request.body
    if body is None or isinstance(body, (bytes, str)):
        return True
    seek = getattr(body, "seek", None)
    if position is None or not callable(seek):
        return False
    try:
        seek(position)
    except (OSError, ValueError):
        return False
    return True
