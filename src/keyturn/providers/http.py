"""HTTP to a provider, shared by the token client and the http rotator.

Per-provider `httpx` pools (`ProviderHttp`), every response read under a total deadline and a
bound on the *decoded* body (keyturn decodes gzip/deflate itself, a piece at a time, so a
compression bomb never grows memory), and transient failures (network, time-out, 429, 5xx)
translated here. The rules: docs/provider-responses.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import math
import re
import ssl
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from keyturn.errors import KeyturnError, ProviderUnavailable, RateLimited

ACCEPT_ENCODING = "gzip, deflate"

# Failures that happen before a byte of the request can have left: the provider cannot have
# processed it.
_NOT_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.ProxyError,
    httpx.LocalProtocolError,
)
# Failures after the request started to leave and before a complete answer was read.
_ANSWER_LOST = (
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)
_CODING_NAME = re.compile(r"[A-Za-z0-9._+-]{1,32}")


# Connections per pool. httpcore walks every connection of a pool, and every queued request
# against every connection, on each request and each release, polling each idle socket
# (encode/httpcore#1035, open in 1.0.9): one pool of 100 connections with 64 requests in
# flight costs ~4 ms of CPU per request on loopback, pools of 8 0.85-1.4 ms, pools of 4
# 0.65-1.1 ms (pools of 2 no less; docs/performance.md).
LANE_CONNECTIONS = 4


@functools.cache
def system_tls() -> ssl.SSLContext:
    """The TLS context trusting what httpx trusts (certifi, or SSL_CERT_FILE), made once per
    process and shared by every client: each one holds the CA bundle (about 1 MiB) and takes
    about 20 ms of CPU to load it."""
    return httpx.create_ssl_context()


# The paths a provider's requests go to come from the configuration: a handful each.
_URLS_KEPT = 64


class ProviderHttp:
    """`max_connections` to one provider, as lanes of at most `LANE_CONNECTIONS` pooled
    connections each (one `httpx.AsyncClient` per lane, same settings); each exchange takes the
    lane with the fewest exchanges in flight, so a quiet provider keeps reusing the first
    lane's connections and a busy one spreads over all. With a `transport` (tests) there is one
    lane on it."""

    def __init__(
        self,
        *,
        base_url: str,
        timeout: float,
        max_connections: int,
        transport: httpx.AsyncBaseTransport | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        count = 1 if transport is not None else -(-max_connections // LANE_CONNECTIONS)
        sizes = [max_connections // count + (i < max_connections % count) for i in range(count)]
        # `tls`: one that also presents a client certificate (mutual TLS).
        tls = tls or system_tls()
        self._lanes = [_pooled_client(base_url, timeout, size, transport, tls) for size in sizes]
        self._in_flight = [0] * count
        self.timeout = self._lanes[0].timeout
        self._urls: dict[str, httpx.URL] = {}

    def build_request(self, method: str, url: str, **kwargs: Any) -> httpx.Request:
        # Each path's absolute URL is made once: httpx parses a relative URL and merges it with
        # `base_url` on every request (3 % of a cold start's CPU); an httpx.URL goes as it is.
        absolute = self._urls.get(url)
        if absolute is None:
            absolute = self._lanes[0].build_request("GET", url).url
            if len(self._urls) < _URLS_KEPT:
                self._urls[url] = absolute
        return self._lanes[0].build_request(method, absolute, **kwargs)

    @contextlib.contextmanager
    def lane(self) -> Iterator[httpx.AsyncClient]:
        """The least busy lane, counted busy until the block ends (the body read included)."""
        index = min(range(len(self._lanes)), key=self._in_flight.__getitem__)
        self._in_flight[index] += 1
        try:
            yield self._lanes[index]
        finally:
            self._in_flight[index] -= 1

    async def aclose(self) -> None:
        for lane in self._lanes:
            await lane.aclose()


def _pooled_client(
    base_url: str,
    timeout: float,
    max_connections: int,
    transport: httpx.AsyncBaseTransport | None,
    tls: ssl.SSLContext,
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=timeout,
        verify=tls,
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        ),
        transport=transport,
        follow_redirects=False,
        headers={
            "User-Agent": "keyturn",
            "Accept": "application/json",
            "Accept-Encoding": ACCEPT_ENCODING,
        },
    )


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date), None if absent/invalid.

    A negative number, a fraction, a non-ASCII digit or a date that cannot be read is invalid;
    a date in the past is 0.
    """
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        seconds = when.timestamp() - now
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def format_seconds(seconds: float) -> str:
    """`30`, `1.5`, `86400`: no `.0`, no exponent."""
    text = f"{round(seconds, 1):.1f}"
    return text[:-2] if text.endswith(".0") else text


def _retry_after_text(header: str | None, retry_after: float | None) -> str:
    if retry_after is not None:
        return f"retry after {format_seconds(retry_after)}s"
    return "no valid Retry-After" if header else "no Retry-After"


@dataclass(slots=True)
class _Progress:
    """How far one request got, from httpcore's `trace` extension and from send(). Without
    the trace (`send_bounded(track_sending=False)`), a request handed to httpx counts as
    possibly sent."""

    sending: bool = False  # the request line/headers started to leave
    answered: bool = False  # a status line and headers were read

    @property
    def answer_lost(self) -> bool:
        return self.sending or self.answered

    def follow(self, request: httpx.Request) -> None:
        previous = request.extensions.get("trace")

        async def trace(name: str, info: dict[str, Any]) -> None:
            if name.endswith(".send_request_headers.started"):
                self.sending = True
            if previous is not None:
                await previous(name, info)

        request.extensions["trace"] = trace


async def send_bounded(
    http: ProviderHttp,
    request: httpx.Request,
    *,
    limit: int,
    where: str,
    credential: str,
    oversized: Callable[[str], KeyturnError],
    deadline: float | None = None,
    track_sending: bool = True,
) -> tuple[int, httpx.Headers, bytes]:
    """Send `request` and read at most `limit` decoded bytes of the answer, all within `deadline`.

    `deadline` (default: the read time-out) bounds the whole exchange, as httpx's per-operation
    time-outs do not. Failures to get an answer are ProviderUnavailable naming `where`; a refused
    body raises `oversized(description)`. `track_sending=False` skips httpcore's trace (CPU), so a
    lapsed deadline then always counts as `answer_lost`.
    """
    total = deadline if deadline is not None else http.timeout.read
    progress = _Progress(sending=not track_sending)  # untracked: maybe sent, once handed over
    if track_sending:
        progress.follow(request)
    try:
        async with asyncio.timeout(total):
            with http.lane() as lane:
                response = await lane.send(request, stream=True)
                progress.answered = True
                try:
                    body = await _read_body(response, limit, oversized)
                finally:
                    await response.aclose()
    except TimeoutError as exc:
        # asyncio.timeout: the total deadline expired.
        raise ProviderUnavailable(
            f"{where}: timed out after {format_seconds(total or 0)}s",
            credential=credential,
            answer_lost=progress.answer_lost,
        ) from exc
    except httpx.HTTPError as exc:
        lost = not isinstance(exc, _NOT_SENT) and (
            isinstance(exc, _ANSWER_LOST) or progress.answer_lost
        )
        if isinstance(exc, httpx.TimeoutException):
            seconds = http.timeout.read
            message = (
                f"{where}: timed out after {format_seconds(seconds)}s"
                if seconds
                else f"{where}: timed out"
            )
        else:
            message = f"{where}: {type(exc).__name__}"
        raise ProviderUnavailable(message, credential=credential, answer_lost=lost) from exc
    return response.status_code, response.headers, body


def _decoder(
    response: httpx.Response, oversized: Callable[[str], KeyturnError]
) -> _BoundedDecoder | None:
    """The decoder for the response's Content-Encoding; None for identity."""
    header = response.headers.get("Content-Encoding", "")
    codings = [c.strip().lower() for c in header.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip"):
        return _BoundedDecoder("gzip", oversized)
    if len(codings) == 1 and codings[0] == "deflate":
        return _BoundedDecoder("deflate", oversized)
    shown = ", ".join(c if _CODING_NAME.fullmatch(c) else "?" for c in codings[:4])
    raise oversized(f"unsupported content encoding {shown!r} (keyturn accepts gzip and deflate)")


async def _read_body(
    response: httpx.Response, limit: int, oversized: Callable[[str], KeyturnError]
) -> bytes:
    if response.is_stream_consumed:
        # A transport that built its response from bytes (a test's httpx.MockTransport) has
        # had httpx read and decode it already; httpx's network transport never does.
        if len(response.content) > limit:
            raise oversized(f"response larger than {limit} bytes")
        return response.content
    decoder = _decoder(response, oversized)
    chunks: list[bytes] = []
    raw_size = 0
    size = 0
    async for chunk in response.aiter_raw():
        raw_size += len(chunk)
        if raw_size > limit:
            raise oversized(f"response larger than {limit} bytes")
        pieces = [chunk] if decoder is None else decoder.feed(chunk, limit - size + 1)
        for piece in pieces:
            size += len(piece)
            if size > limit:
                raise oversized(f"response larger than {limit} bytes")
            chunks.append(piece)
    if decoder is not None:
        decoder.finish()
    return b"".join(chunks)


class _BoundedDecoder:
    """gzip (RFC 1952, several members allowed) or deflate (zlib-wrapped as RFC 9110 says, or
    raw as some servers send it) decoded a bounded piece at a time: `feed` never returns more
    than `room` bytes, so a bomb is refused after `limit + 1` decoded bytes whatever its ratio.
    """

    def __init__(self, coding: str, oversized: Callable[[str], KeyturnError]) -> None:
        self.coding = coding
        self._oversized = oversized
        self._head = b""  # deflate: the first bytes, until the zlib header can be checked
        self._fed = False
        self._inflate: Any = zlib.decompressobj(zlib.MAX_WBITS | 16) if coding == "gzip" else None

    def feed(self, data: bytes, room: int) -> list[bytes]:
        """Decode `data`, returning at most `room` (> 0) bytes; returning exactly `room`
        bytes may leave input undecoded, which is fine: the caller refuses the body then."""
        self._fed = self._fed or bool(data)
        if self._inflate is None:
            self._head += data
            if len(self._head) < 2:
                return []
            data, self._head = self._head, b""
            self._inflate = zlib.decompressobj(
                zlib.MAX_WBITS if _zlib_header(data) else -zlib.MAX_WBITS
            )
        out: list[bytes] = []
        while data:
            if self._inflate.eof:
                if self.coding != "gzip":
                    raise self._oversized(f"data after the end of the {self.coding} stream")
                self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 16)  # the next member
            try:
                piece = self._inflate.decompress(data, room)  # room > 0: 0 means unbounded
            except zlib.error:
                raise self._oversized(f"{self.coding} data is corrupt") from None
            out.append(piece)
            room -= len(piece)
            if room <= 0:
                break
            # Output stopped short of `room`: all input was taken, except what follows the end
            # of a member.
            data = self._inflate.unused_data if self._inflate.eof else b""
        return out

    def finish(self) -> None:
        """An empty body is fine (a 503 may say gzip and send nothing); a cut one is not."""
        if self._fed and (self._inflate is None or not self._inflate.eof):
            raise self._oversized(f"{self.coding} data is truncated")


def _zlib_header(data: bytes) -> bool:
    """RFC 1950 §2.2: CM = 8 (deflate) and the check bits."""
    return data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


def raise_if_transient(
    status: int, headers: httpx.Headers, *, now: float, where: str, credential: str
) -> None:
    """429 → RateLimited, 5xx → ProviderUnavailable, both with Retry-After; else nothing."""
    if status != 429 and status < 500:
        return
    header = headers.get("Retry-After")
    retry_after = parse_retry_after(header, now)
    detail = _retry_after_text(header, retry_after)
    if status == 429:
        raise RateLimited(
            f"{where}: rate limited (429), {detail}",
            credential=credential,
            retry_after=retry_after,
        )
    message = f"{where}: HTTP {status}" if header is None else f"{where}: HTTP {status}, {detail}"
    raise ProviderUnavailable(
        message, credential=credential, status=status, retry_after=retry_after
    )
