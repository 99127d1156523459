"""`DirectSession`: the `requests.Session` under keyturn's hvac client, without the per-call
work keyturn's Vault calls never need.

`requests.Session.request` merges cookies, auth, hooks and per-session settings into every
request, keeps a cookie jar, and runs redirect and hook machinery on every answer: about a
quarter of the client CPU of a Vault call (0.85 ms against 0.64 ms per KV write on 16 threads,
measured on loopback; docs/performance.md). Vault sets no cookies and keyturn sends no auth
but its token header, so `DirectSession` prepares the request with requests' own
`PreparedRequest` steps (method, URL, headers, JSON body) and sends it through the mounted
adapter: TLS verification, client certificates, proxies and the connection pool stay requests'
own, and so does a test's injected adapter. Anything else (form data, files, cookies, auth,
hooks, query parameters) takes the full `requests.Session.request` path, and so does a call
answered with a redirect: it is sent again that way, and requests follows the redirect.

When the mounted adapter is requests' own `HTTPAdapter`, no proxy applies and the URL needs no
quoting (keyturn's Vault paths; no query), a plain call goes one step further down: over a
connection of the standard library's `http.client`, kept open between calls (a stack of idle
connections per node, at most `max_idle`; one that the server has closed meanwhile is not
reused), with requests' own TLS settings (the CA bundle or directory named by `verify`,
requests' default bundle for `True`, the client `cert`) made into one `ssl.SSLContext` per
setting. The body is read at once, the answer wrapped in a `requests.Response`, and failures
raised as the `requests` errors `HTTPAdapter.send` would raise for them, so keyturn's Vault client
tells a call that never reached Vault (`ConnectionNotMade`) from one that may have. Per KV write,
64 in flight on 16 threads on loopback: 0.39 to 0.42 ms of client CPU, against 0.50 to 0.56 ms
through urllib3's pool (docs/performance.md).
"""

from __future__ import annotations

import http.client
import json as jsonlib
import os
import re
import select
import socket
import ssl
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.hooks import default_hooks
from requests.structures import CaseInsensitiveDict
from requests.utils import DEFAULT_CA_BUNDLE_PATH, get_encoding_from_headers

# A URL sent as it is: the node's origin, then a path with nothing to quote and no query.
_PLAIN_URL = re.compile(r"(https?://[^/?#\s@]+)(/[A-Za-z0-9._~/-]*)")

# How many idle connections to one node are kept open by default (requests' own pool size).
DEFAULT_MAX_IDLE = 10


class ConnectionNotMade(requests.ConnectionError):
    """No connection to the node could be made (refused, unreachable, no such host): the call
    surely never reached Vault. requests says the same with urllib3's `NewConnectionError`
    inside its `ConnectionError`; `keyturn.vault.client.not_sent` knows both."""


class DirectSession(requests.Session):
    """A `requests.Session` whose plain JSON calls skip the session machinery (see module).
    `max_idle`: idle connections kept open per node (keyturn: one per Vault thread)."""

    def __init__(self, max_idle: int = DEFAULT_MAX_IDLE) -> None:
        super().__init__()
        self._max_idle = max_idle
        # (origin, verify, cert) -> (host, port, TLS context or None for http)
        self._nodes: dict[tuple[Any, ...], tuple[str, int, ssl.SSLContext | None]] = {}
        self._idle: dict[tuple[Any, ...], list[http.client.HTTPConnection]] = {}
        self._idle_lock = threading.Lock()
        self._closed = False

    def request(  # type: ignore[override]  # same parameters as requests.Session.request
        self,
        method: str,
        url: str,
        params: Any = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
        cookies: Any = None,
        files: Any = None,
        auth: Any = None,
        timeout: Any = None,
        allow_redirects: bool = True,
        proxies: Mapping[str, str] | None = None,
        hooks: Any = None,
        stream: bool | None = None,
        verify: bool | str | None = None,
        cert: Any = None,
        json: Any = None,
    ) -> requests.Response:
        full = dict(
            params=params,
            data=data,
            headers=headers,
            cookies=cookies,
            files=files,
            auth=auth,
            timeout=timeout,
            allow_redirects=allow_redirects,
            proxies=proxies,
            hooks=hooks,
            stream=stream,
            verify=verify,
            cert=cert,
            json=json,
        )
        if params or data or files or cookies or auth or hooks or stream or self.trust_env:
            return super().request(method, url, **full)
        all_proxies = {**self.proxies, **(proxies or {})}
        plain = _PLAIN_URL.fullmatch(url)
        adapter = self.get_adapter(url)
        if plain and type(adapter) is HTTPAdapter and not any(all_proxies.values()):
            response = self._send_direct(
                adapter,
                method,
                url,
                plain.group(1),
                plain.group(2),
                headers=headers,
                json=json,
                timeout=timeout,
                verify=self.verify if verify is None else verify,
                cert=cert or self.cert,
            )
            if allow_redirects and response.is_redirect:
                return super().request(method, url, **full)
            return response
        prepared = requests.PreparedRequest()
        prepared.prepare_method(method)
        prepared.prepare_url(url, None)
        prepared.prepare_headers({**self.headers, **(headers or {})})
        prepared.prepare_body(None, None, json)
        prepared.hooks = default_hooks()
        adapter = self.get_adapter(prepared.url or "")
        response = adapter.send(
            prepared,
            stream=False,
            timeout=timeout,
            verify=self.verify if verify is None else verify,
            cert=cert or self.cert,
            proxies=all_proxies,
        )
        response.content  # noqa: B018  # read the body now: the connection goes back to the pool
        if allow_redirects and response.is_redirect:
            # Not carried out where it was sent: requests sends it again and follows it.
            return super().request(method, url, **full)
        return response

    def _send_direct(
        self,
        adapter: HTTPAdapter,
        method: str,
        url: str,
        origin: str,
        path: str,
        *,
        headers: Mapping[str, str] | None,
        json: Any,
        timeout: Any,
        verify: Any,
        cert: Any,
    ) -> requests.Response:
        """Send over a kept-open `http.client` connection (see module); answers as
        `HTTPAdapter` would."""
        merged = CaseInsensitiveDict(self.headers)
        merged.update(headers or {})
        merged["Accept-Encoding"] = "identity"  # the body is read as it comes: nothing to decode
        body = None
        if json is not None:
            try:
                body = jsonlib.dumps(json, allow_nan=False).encode("utf-8")
            except ValueError as error:
                raise requests.exceptions.InvalidJSONError(error) from error
            merged.setdefault("Content-Type", "application/json")
        connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        key = (origin, verify, cert if not isinstance(cert, list) else tuple(cert))
        connection = self._reuse(key) or self._connect(key, connect)
        try:
            connection.sock.settimeout(read)
            connection.request(method, path, body=body, headers=dict(merged))
            answer = connection.getresponse()
            content = answer.read()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise _as_requests_error(error) from error
        if answer.getheader("Content-Encoding", "identity").lower() != "identity":
            connection.close()
            raise requests.exceptions.ContentDecodingError(
                "Vault answered with a content encoding though none was accepted"
            )
        self._keep(key, connection, answer)
        response = requests.Response()
        response.status_code = answer.status
        response.headers = _headers(answer)
        response.encoding = get_encoding_from_headers(response.headers)
        response.reason = answer.reason or ""
        response.url = url
        response._content = content  # what Response.content would have read
        response._content_consumed = True  # nothing left to read (or close) in `raw`
        response.connection = adapter
        return response

    def _reuse(self, key: tuple[Any, ...]) -> http.client.HTTPConnection | None:
        """An idle connection to the node that the server has not closed meanwhile (a closed
        or unexpectedly readable one is dropped, as urllib3 drops it)."""
        while True:
            with self._idle_lock:
                stack = self._idle.get(key)
                if not stack:
                    return None
                connection = stack.pop()
            if connection.sock is not None and not _readable(connection.sock):
                return connection
            connection.close()

    def _keep(
        self,
        key: tuple[Any, ...],
        connection: http.client.HTTPConnection,
        answer: http.client.HTTPResponse,
    ) -> None:
        if not answer.will_close and not self._closed:
            with self._idle_lock:
                stack = self._idle.setdefault(key, [])
                if len(stack) < self._max_idle:
                    stack.append(connection)
                    return
        connection.close()

    def _connect(self, key: tuple[Any, ...], timeout: Any) -> http.client.HTTPConnection:
        """A new connection, its errors raised as requests raises them: a TCP connection that
        cannot be made is `ConnectionNotMade` (or `ConnectTimeout`); a failed TLS handshake
        is requests' `SSLError` (or `ReadTimeout`, as urllib3 reports a handshake that timed
        out)."""
        host, port, tls = self._node(key)
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except TimeoutError as error:
            raise requests.ConnectTimeout(error) from error
        except OSError as error:
            raise ConnectionNotMade(error) from error
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
        except OSError as error:
            sock.close()
            raise _as_requests_error(error) from error
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
        connection.sock = sock
        return connection

    def _node(self, key: tuple[Any, ...]) -> tuple[str, int, ssl.SSLContext | None]:
        """Where the node of `key` (origin, verify, cert) is and, for https, the TLS context of
        requests' settings (built once per key; a CA file that cannot be loaded fails the call
        as requests fails it)."""
        node = self._nodes.get(key)
        if node is None:
            origin, verify, cert = key
            parts = urlsplit(origin)
            https = parts.scheme == "https"
            tls = None
            if https:
                try:
                    tls = _tls_context(verify, cert)
                except ssl.SSLError as error:
                    raise requests.exceptions.SSLError(error) from error
            node = (parts.hostname or "", parts.port or (443 if https else 80), tls)
            self._nodes[key] = node
        return node

    def close(self) -> None:
        """Close the kept-open connections too; a call still under way closes its own."""
        self._closed = True
        with self._idle_lock:
            stacks, self._idle = list(self._idle.values()), {}
        for stack in stacks:
            for connection in stack:
                connection.close()
        super().close()


def _tls_context(verify: Any, cert: Any) -> ssl.SSLContext:
    """requests' TLS settings as one context: `verify` False (no checks), True (requests'
    default CA bundle) or a CA bundle file or directory; `cert` a file or (cert, key)."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        where = DEFAULT_CA_BUNDLE_PATH if verify is True else str(verify)
        if os.path.isdir(where):
            context = ssl.create_default_context(capath=where)
        else:
            context = ssl.create_default_context(cafile=where)
    if cert:
        certfile, keyfile = (cert, None) if isinstance(cert, str) else cert
        context.load_cert_chain(certfile, keyfile)
    return context


def _readable(sock: socket.socket) -> bool:
    """Whether an idle connection's socket has something to read: the server closed it (or
    sent what nobody asked for), so it must not carry another call."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _headers(answer: http.client.HTTPResponse) -> CaseInsensitiveDict[str]:
    """The answer's headers as requests gives them (a repeated header joined with ", ")."""
    headers: CaseInsensitiveDict[str] = CaseInsensitiveDict()
    for name, value in answer.getheaders():
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _as_requests_error(error: BaseException) -> requests.RequestException:
    """The `requests` error `HTTPAdapter.send` raises for what a sent call ran into."""
    if isinstance(error, ssl.SSLError):
        return requests.exceptions.SSLError(error)
    if isinstance(error, TimeoutError):
        return requests.ReadTimeout(error)
    return requests.ConnectionError(error)
