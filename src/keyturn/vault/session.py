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
quoting (keyturn's Vault paths; no query), a plain call goes one step further down: straight to
the urllib3 connection pool that `HTTPAdapter` keeps for the node (looked up once per node,
with requests' own TLS settings applied to it once), its body read at once, the answer wrapped
in a `requests.Response`, and urllib3's errors raised as the `requests` errors
`HTTPAdapter.send` would raise (`raise_as_requests`). That skips requests' per-call URL
parsing and quoting, pool and TLS look-ups and streamed body reading: 0.62 against 0.37 to 0.43
ms of client CPU per KV write, one call at a time on loopback (docs/performance.md).
"""

from __future__ import annotations

import json as jsonlib
import re
from collections.abc import Mapping
from typing import Any, NoReturn

import requests
import urllib3
import urllib3.exceptions as u3
from requests.adapters import HTTPAdapter
from requests.hooks import default_hooks
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers

# A URL sent as it is: the node's origin, then a path with nothing to quote and no query.
_PLAIN_URL = re.compile(r"(https?://[^/?#\s@]+)(/[A-Za-z0-9._~/-]*)")


class DirectSession(requests.Session):
    """A `requests.Session` whose plain JSON calls skip the session machinery (see module)."""

    def __init__(self) -> None:
        super().__init__()
        # (origin, verify, cert) -> the urllib3 pool of the mounted HTTPAdapter for it
        self._pools: dict[tuple[Any, ...], Any] = {}

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
            response = self._send_to_pool(
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

    def _send_to_pool(
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
        """Send through the node's urllib3 pool (see module); answers as `HTTPAdapter` would."""
        merged = CaseInsensitiveDict(self.headers)
        merged.update(headers or {})
        body = None
        if json is not None:
            try:
                body = jsonlib.dumps(json, allow_nan=False).encode("utf-8")
            except ValueError as error:
                raise requests.exceptions.InvalidJSONError(error) from error
            merged.setdefault("Content-Type", "application/json")
        if isinstance(timeout, tuple):
            connect, read = timeout
        else:
            connect = read = timeout
        pool = self._pool(adapter, origin, verify, cert)
        try:
            raw = pool.urlopen(
                method=method,
                url=path,
                body=body,
                headers=dict(merged),
                redirect=False,
                assert_same_host=False,
                preload_content=True,
                decode_content=True,
                retries=adapter.max_retries,
                timeout=urllib3.Timeout(connect=connect, read=read),
            )
        except (u3.HTTPError, OSError) as error:
            raise_as_requests(error)
        response = requests.Response()
        response.status_code = raw.status
        response.headers = CaseInsensitiveDict(raw.headers)
        response.encoding = get_encoding_from_headers(response.headers)
        response.raw = raw
        response.reason = raw.reason or ""
        response.url = url
        response._content = raw.data  # what Response.content would read from `raw`
        response.connection = adapter
        return response

    def _pool(self, adapter: HTTPAdapter, origin: str, verify: Any, cert: Any) -> Any:
        """The urllib3 pool `adapter` keeps for `origin`, with requests' TLS settings applied
        as `HTTPAdapter.send` applies them; looked up again once the adapter closed it."""
        key = (origin, verify, cert if not isinstance(cert, list) else tuple(cert))
        pool = self._pools.get(key)
        if pool is None or pool.pool is None:
            probe = requests.PreparedRequest()
            probe.prepare_url(origin + "/", None)
            pool = adapter.get_connection_with_tls_context(probe, verify, proxies=None, cert=cert)
            adapter.cert_verify(pool, origin + "/", verify, cert)
            self._pools[key] = pool
        return pool


def raise_as_requests(error: BaseException) -> NoReturn:
    """Raise the `requests` error that `HTTPAdapter.send` raises for urllib3's `error`, so a
    call sent straight to the pool fails as one sent through requests (keyturn's Vault client
    tells a call that never reached Vault by these types)."""
    if isinstance(error, u3.MaxRetryError):
        reason = error.reason
        if isinstance(reason, u3.ConnectTimeoutError) and not isinstance(
            reason, u3.NewConnectionError
        ):
            raise requests.ConnectTimeout(error) from error
        if isinstance(reason, u3.ResponseError):
            raise requests.exceptions.RetryError(error) from error
        if isinstance(reason, u3.ProxyError):
            raise requests.exceptions.ProxyError(error) from error
        if isinstance(reason, u3.SSLError):
            raise requests.exceptions.SSLError(error) from error
        raise requests.ConnectionError(error) from error
    if isinstance(error, (u3.ProtocolError, OSError, u3.ClosedPoolError)):
        raise requests.ConnectionError(error) from error
    if isinstance(error, u3.ProxyError):
        raise requests.exceptions.ProxyError(error) from error
    if isinstance(error, u3.SSLError):
        raise requests.exceptions.SSLError(error) from error
    if isinstance(error, u3.ReadTimeoutError):
        raise requests.ReadTimeout(error) from error
    if isinstance(error, u3.InvalidHeader):
        raise requests.exceptions.InvalidHeader(error) from error
    raise error
