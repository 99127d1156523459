"""The provider client against a hostile HTTP server of the test's own: real sockets on
127.0.0.1, a raw asyncio server that answers as badly as it likes.

What is held: `timeout` is a total deadline for one request (a trickled body cannot hang it); a
gzip bomb is refused with bounded memory; `answer_lost` says whether a request that got no
complete answer may have been processed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from keyturn.clock import SystemClock
from keyturn.config import ProviderConfig
from keyturn.errors import MalformedResponse, ProviderUnavailable
from keyturn.providers.client import ProviderClient
from keyturn.providers.http import ProviderHttp, send_bounded
from keyturn.secret import Secret

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
SECRET = Secret("cs-hostile-secret")
TOKEN = b'{"access_token": "at", "token_type": "Bearer", "expires_in": 60}'


class HostileServer:
    """Accepts connections on 127.0.0.1 and hands each to `handler`; counts the requests read."""

    def __init__(self) -> None:
        self.handler: Handler = self.never_answer
        self.requests = 0
        self.request_read = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await reader.readexactly(length)
        self.requests += 1
        self.request_read.set()
        return body

    async def never_answer(self, reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
        await self.read_request(reader)
        await asyncio.sleep(3600)


@pytest.fixture
async def server() -> AsyncIterator[HostileServer]:
    hostile = HostileServer()
    await hostile.start()
    try:
        yield hostile
    finally:
        await hostile.stop()


@pytest.fixture
async def client(server: HostileServer) -> AsyncIterator[ProviderClient]:
    settings = ProviderConfig(name="hostile", base_url=server.url, timeout=1.0)
    provider = ProviderClient(settings, clock=SystemClock())
    try:
        yield provider
    finally:
        await provider.aclose()


async def token_request(client: ProviderClient) -> object:
    return await client.request_token(
        "reporting", grant_type="client_credentials", client_id="cid", client_secret=SECRET
    )


def head(status: str, *headers: str) -> bytes:
    return ("\r\n".join([f"HTTP/1.1 {status}", *headers]) + "\r\n\r\n").encode()


# -- the total deadline ----------------------------------------------------------------------


async def test_a_trickled_body_cannot_outlast_the_timeout(
    server: HostileServer, client: ProviderClient
) -> None:
    trickled = 0

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal trickled
        await server.read_request(reader)
        writer.write(head("200 OK", "Content-Type: application/json", "Content-Length: 100000"))
        while True:  # one byte every 0.3 s: each read is well inside httpx's 1 s read time-out
            writer.write(b" ")
            await writer.drain()
            trickled += 1
            await asyncio.sleep(0.3)

    server.handler = trickle
    started = time.monotonic()
    with pytest.raises(ProviderUnavailable) as caught:
        await token_request(client)
    elapsed = time.monotonic() - started
    assert str(caught.value) == "reporting: /oauth/token: timed out after 1s"
    assert caught.value.answer_lost is True  # the provider had the request
    assert trickled >= 2  # the body was really being trickled when the deadline struck
    assert elapsed < 10  # a safety bound only: without the deadline this takes 30,000 s


async def test_a_request_that_gets_no_answer_times_out_as_answer_lost(
    server: HostileServer, client: ProviderClient
) -> None:
    server.handler = server.never_answer
    with pytest.raises(ProviderUnavailable) as caught:
        await token_request(client)
    assert str(caught.value) == "reporting: /oauth/token: timed out after 1s"
    assert caught.value.answer_lost is True
    assert server.requests == 1


async def send_token_request(
    http: ProviderHttp, deadline: float, *, track_sending: bool = True
) -> object:
    """A token request through `send_bounded` for credential "reporting", within `deadline`."""

    def oversized(description: str) -> MalformedResponse:
        return MalformedResponse(description, field="body", credential="reporting")

    return await send_bounded(
        http,
        http.build_request("POST", "/oauth/token", content=b"{}"),
        limit=65536,
        where="/oauth/token",
        credential="reporting",
        oversized=oversized,
        deadline=deadline,
        track_sending=track_sending,
    )


async def test_a_deadline_spent_waiting_for_a_pooled_connection_is_not_answer_lost(
    server: HostileServer,
) -> None:
    """One connection, held by a request the server never answers: a second request waits
    for the pool, its deadline expires before it is sent, so it cannot have been processed."""
    server.handler = server.never_answer
    http = ProviderHttp(base_url=server.url, timeout=30.0, max_connections=1)

    async def send(deadline: float) -> object:
        return await send_token_request(http, deadline)

    try:
        holder = asyncio.create_task(send(30.0))
        await asyncio.wait_for(server.request_read.wait(), 10)
        with pytest.raises(ProviderUnavailable) as caught:
            await send(0.5)
        assert str(caught.value) == "reporting: /oauth/token: timed out after 0.5s"
        assert caught.value.answer_lost is False
        assert server.requests == 1
        holder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holder
    finally:
        await http.aclose()


async def test_untraced_a_deadline_spent_waiting_for_a_connection_may_have_been_sent(
    server: HostileServer,
) -> None:
    """Without httpcore's trace (`track_sending=False`: every request but a refresh token
    grant), a request whose deadline expires before an answer cannot tell a wait for the pool
    from a lost answer, and says the provider may have it."""
    server.handler = server.never_answer
    http = ProviderHttp(base_url=server.url, timeout=30.0, max_connections=1)
    try:
        holder = asyncio.create_task(send_token_request(http, 30.0))
        await asyncio.wait_for(server.request_read.wait(), 10)
        with pytest.raises(ProviderUnavailable) as caught:
            await send_token_request(http, 0.5, track_sending=False)
        assert str(caught.value) == "reporting: /oauth/token: timed out after 0.5s"
        assert caught.value.answer_lost is True
        assert server.requests == 1  # it never left: the conservative answer, not the truth
        holder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holder
    finally:
        await http.aclose()


async def test_max_connections_over_several_lanes_is_the_cap_on_requests_in_flight(
    server: HostileServer,
) -> None:
    """`max_connections = 11` is three lanes (4 + 4 + 3): eleven requests the server never
    answers are all sent at once, on eleven connections, and a twelfth waits for a connection
    until its deadline, unsent."""
    server.handler = server.never_answer
    http = ProviderHttp(base_url=server.url, timeout=30.0, max_connections=11)

    async def send(deadline: float) -> object:
        return await send_token_request(http, deadline)

    holders = [asyncio.create_task(send(30.0)) for _ in range(11)]
    try:
        for _ in range(200):
            if server.requests == 11:
                break
            await asyncio.sleep(0.05)
        assert server.requests == 11
        with pytest.raises(ProviderUnavailable) as caught:
            await send(0.5)
        assert caught.value.answer_lost is False
        assert server.requests == 11
    finally:
        for holder in holders:
            holder.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
        await http.aclose()


# -- a gzip bomb -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """About 50 KB of gzip that expands to 50 MB."""
    data = gzip.compress(b"\0" * 50_000_000, compresslevel=9)
    assert len(data) < 60_000
    return data


async def test_a_gzip_bomb_is_refused_with_bounded_memory(
    server: HostileServer, client: ProviderClient, bomb: bytes
) -> None:
    async def explode(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:  # keep-alive: answer every request on this connection with the bomb
            await server.read_request(reader)
            writer.write(
                head(
                    "200 OK",
                    "Content-Type: application/json",
                    "Content-Encoding: gzip",
                    f"Content-Length: {len(bomb)}",
                )
                + bomb
            )
            await writer.drain()

    server.handler = explode
    await asyncio.sleep(0)
    tracemalloc.start()
    try:
        for _ in range(20):
            with pytest.raises(MalformedResponse) as caught:
                await token_request(client)
            assert str(caught.value) == "reporting: body: response larger than 65536 bytes"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert server.requests == 20
    # httpx alone decodes each network chunk whole: tens of MB. Bounded: well under 4 MB.
    assert peak < 4_000_000, f"peak traced memory {peak} bytes"


async def test_a_gzip_token_response_is_decoded(
    server: HostileServer, client: ProviderClient
) -> None:
    body = gzip.compress(TOKEN)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(
            head("200 OK", "Content-Encoding: gzip", f"Content-Length: {len(body)}") + body
        )
        await writer.drain()

    server.handler = answer
    token = await client.request_token(
        "reporting", grant_type="client_credentials", client_id="cid", client_secret=SECRET
    )
    assert token.access_token.reveal() == "at"


# -- answer_lost on real sockets ----------------------------------------------------------------


async def test_a_server_that_closes_without_answering_is_answer_lost(
    server: HostileServer, client: ProviderClient
) -> None:
    async def hang_up(reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
        await server.read_request(reader)

    server.handler = hang_up
    with pytest.raises(ProviderUnavailable) as caught:
        await token_request(client)
    assert str(caught.value) == "reporting: /oauth/token: RemoteProtocolError"
    assert caught.value.answer_lost is True
    assert server.requests == 1


async def test_a_body_cut_short_is_answer_lost(
    server: HostileServer, client: ProviderClient
) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(head("200 OK", "Content-Length: 500") + TOKEN[:20])
        await writer.drain()

    server.handler = cut
    with pytest.raises(ProviderUnavailable) as caught:
        await token_request(client)
    assert caught.value.answer_lost is True
    assert caught.value.status is None


async def test_a_closed_port_is_not_answer_lost() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = ProviderConfig(name="gone", base_url=f"http://127.0.0.1:{port}", timeout=5.0)
    client = ProviderClient(settings, clock=SystemClock())
    try:
        with pytest.raises(ProviderUnavailable) as caught:
            await token_request(client)
    finally:
        await client.aclose()
    assert str(caught.value) == "reporting: /oauth/token: ConnectError"
    assert caught.value.answer_lost is False


async def test_a_503_with_retry_after_is_a_status_not_a_lost_answer(
    server: HostileServer, client: ProviderClient
) -> None:
    async def unavailable(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(head("503 Service Unavailable", "Retry-After: 30", "Content-Length: 0"))
        await writer.drain()

    server.handler = unavailable
    with pytest.raises(ProviderUnavailable) as caught:
        await token_request(client)
    assert str(caught.value) == "reporting: /oauth/token: HTTP 503, retry after 30s"
    assert caught.value.retry_after == 30.0
    assert caught.value.status == 503
    assert caught.value.answer_lost is False


async def test_garbage_instead_of_http_is_provider_unavailable(
    server: HostileServer, client: ProviderClient
) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"\xff\xfe\xe2\x80\xae not http at all\r\n\r\n")
        await writer.drain()

    server.handler = garbage
    with pytest.raises(ProviderUnavailable) as caught:
        await token_request(client)
    assert caught.value.answer_lost is True


@pytest.mark.parametrize("value", ["at\u202ex", "at\nx"])
async def test_a_hostile_token_is_refused_before_any_header_carries_it(
    server: HostileServer, client: ProviderClient, value: str
) -> None:
    body = json.dumps({"access_token": value, "token_type": "Bearer"}).encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(head("200 OK", f"Content-Length: {len(body)}") + body)
        await writer.drain()

    server.handler = answer
    with pytest.raises(MalformedResponse) as caught:
        await token_request(client)
    assert caught.value.field == "access_token"
    assert value not in str(caught.value)
