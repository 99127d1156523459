"""HTTP to a provider, shared by the token client and the http rotator.

One pooled `httpx.AsyncClient` per provider; every response read with a size bound; the
transient failures (network, time-out, 429, 5xx) translated here into keyturn's errors, so the
callers only decide what the other statuses mean.
"""

from __future__ import annotations

import email.utils
from collections.abc import Callable

import httpx

from keyturn.errors import KeyturnError, ProviderUnavailable, RateLimited


def pooled_client(
    *,
    base_url: str,
    timeout: float,
    max_connections: int,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=timeout,
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        ),
        transport=transport,
        follow_redirects=False,
        headers={"User-Agent": "keyturn", "Accept": "application/json"},
    )


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date), None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


async def send_bounded(
    http: httpx.AsyncClient,
    request: httpx.Request,
    *,
    limit: int,
    where: str,
    credential: str,
    oversized: Callable[[str], KeyturnError],
) -> tuple[int, httpx.Headers, bytes]:
    """Send `request` and read at most `limit` bytes of the answer.

    A network error or time-out is ProviderUnavailable, its message starting with `where` (it
    names the call, never a value); a longer body raises `oversized(description)`.
    """
    try:
        response = await http.send(request, stream=True)
        try:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise oversized(f"response larger than {limit} bytes")
                chunks.append(chunk)
        finally:
            await response.aclose()
    except httpx.TimeoutException as exc:
        timeout = http.timeout.read
        raise ProviderUnavailable(
            f"{where}: timed out after {timeout:g}s" if timeout else f"{where}: timed out",
            credential=credential,
        ) from exc
    except httpx.HTTPError as exc:
        raise ProviderUnavailable(f"{where}: {type(exc).__name__}", credential=credential) from exc
    return response.status_code, response.headers, b"".join(chunks)


def raise_if_transient(
    status: int, headers: httpx.Headers, *, now: float, where: str, credential: str
) -> None:
    """429 → RateLimited (with Retry-After), 5xx → ProviderUnavailable; else nothing."""
    if status == 429:
        retry_after = parse_retry_after(headers.get("Retry-After"), now)
        raise RateLimited(
            f"{where}: rate limited (429), retry after {retry_after}s",
            credential=credential,
            retry_after=retry_after,
        )
    if status >= 500:
        raise ProviderUnavailable(f"{where}: HTTP {status}", credential=credential, status=status)
