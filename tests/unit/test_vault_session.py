"""The `requests.Session` under hvac: it reads the environment once, at start, and keeps
honouring it; a call reaches requests' transport with what it must carry; requests' own
`HTTPAdapter` (its pool, TLS, errors) is what production runs, over a socket of the test's."""

from __future__ import annotations

import json as jsonlib
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
import requests
from requests.adapters import BaseAdapter

from keyturn.errors import VaultUnavailable
from keyturn.secret import Secret
from keyturn.testing.transport import vault_answer
from keyturn.vault.client import (
    VaultClient,
    VaultConnection,
    api_url,
    environment_proxies,
    not_sent,
    session_verify,
)
from keyturn_devkit.dev.tls import make_throwaway_pki


def test_a_configured_ca_cert_wins_over_the_environment() -> None:
    environ = {"REQUESTS_CA_BUNDLE": "/etc/ssl/env-bundle.pem"}
    assert session_verify(Path("/etc/keyturn/ca.pem"), environ) == "/etc/keyturn/ca.pem"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"REQUESTS_CA_BUNDLE": "/a.pem", "CURL_CA_BUNDLE": "/b.pem"}, "/a.pem"),
        ({"CURL_CA_BUNDLE": "/b.pem"}, "/b.pem"),
        ({}, True),
    ],
)
def test_without_ca_cert_the_bundle_variables_are_used_as_requests_would(
    environ: dict[str, str], expected: bool | str
) -> None:
    assert session_verify(None, environ) == expected


def test_proxy_variables_and_no_proxy_are_read_per_vault_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "vault-b.internal")
    assert environment_proxies("https://vault-a.internal:8200").get("https") == (
        "http://proxy.internal:3128"
    )
    assert environment_proxies("https://vault-b.internal:8200") == {}


async def _write_apps_x(client: VaultClient, body: dict[str, Any]) -> Any:
    """A KV v2 write of `secret/apps/x` as the store makes it: the answer's body."""
    return await client.request(
        "POST",
        api_url("secret", "data", "apps/x"),
        kind="write",
        operation="write",
        path="secret/apps/x",
        json=body,
    )


async def test_the_session_no_longer_looks_at_the_environment_on_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "vault-b.internal")
    client = VaultClient(
        VaultConnection("https://vault-a.internal:8200", nodes=("https://vault-b.internal:8200",))
    )
    try:
        assert client._session.trust_env is False
        a = client._adapter("https://vault-a.internal:8200")
        b = client._adapter("https://vault-b.internal:8200")
        assert a._kwargs["proxies"].get("https") == "http://proxy.internal:3128"
        assert not b._kwargs["proxies"]
    finally:
        await client.close()


class Recorder(BaseAdapter):
    """A `requests` transport that keeps what it was asked to send and answers from `answers`
    in turn (status, headers, body)."""

    def __init__(self, *answers: tuple[int, dict[str, str], bytes]) -> None:
        super().__init__()
        self.answers = list(answers)
        self.sent: list[tuple[requests.PreparedRequest, dict[str, Any]]] = []

    def send(self, request: requests.PreparedRequest, *args: object, **kwargs: Any) -> Any:
        self.sent.append((request, kwargs))
        status, headers, body = self.answers.pop(0)
        return vault_answer(request, status, raw=body, headers=headers)

    def close(self) -> None:
        pass


async def test_a_vault_call_reaches_the_transport_with_the_token_body_and_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hvac's call reaches requests' transport with the token and the JSON body, the
    session's default headers, the configured CA bundle, the node's proxy and the timeout."""
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    recorder = Recorder((200, {"Content-Type": "application/json"}, b'{"data": {"version": 4}}'))
    client = VaultClient(
        VaultConnection("https://vault-a.internal:8200", ca_cert=Path("/etc/keyturn/ca.pem")),
        transport=recorder,
    )
    client.set_token(Secret("s.test-token"))
    try:
        body = await _write_apps_x(client, {"data": {"access_token": "a b"}, "options": {"cas": 3}})
    finally:
        await client.close()
    assert body == {"data": {"version": 4}}
    [(request, settings)] = recorder.sent
    assert request.method == "POST"
    assert request.url == "https://vault-a.internal:8200/v1/secret/data/apps/x"
    assert request.headers["X-Vault-Token"] == "s.test-token"
    assert request.headers["Content-Type"] == "application/json"
    assert str(request.headers["User-Agent"]).startswith("python-requests/")
    assert isinstance(request.body, bytes)
    assert jsonlib.loads(request.body) == {
        "data": {"access_token": "a b"},
        "options": {"cas": 3},
    }
    assert settings["verify"] == "/etc/keyturn/ca.pem"
    assert settings["proxies"].get("https") == "http://proxy.internal:3128"
    assert settings["timeout"] == 10.0
    assert settings["stream"] is False


async def test_a_redirect_is_followed_as_requests_follows_it() -> None:
    """A 307 (a standby that redirects instead of forwarding): requests follows the Location
    with method and body kept, and the final answer is what the caller gets."""
    moved = (307, {"Location": "https://vault-b.internal:8200/v1/secret/data/apps/x"}, b"")
    recorder = Recorder(
        moved,
        (200, {"Content-Type": "application/json"}, b'{"data": {"version": 5}}'),
    )
    client = VaultClient(VaultConnection("https://vault-a.internal:8200"), transport=recorder)
    client.set_token(Secret("s.test-token"))
    try:
        body = await _write_apps_x(client, {"data": {"k": "v"}})
    finally:
        await client.close()
    assert body == {"data": {"version": 5}}
    assert [r.url for r, _ in recorder.sent] == [
        "https://vault-a.internal:8200/v1/secret/data/apps/x",
        "https://vault-b.internal:8200/v1/secret/data/apps/x",
    ]
    assert all(r.method == "POST" for r, _ in recorder.sent)
    last = recorder.sent[-1][0].body
    assert isinstance(last, bytes)
    assert jsonlib.loads(last) == {"data": {"k": "v"}}


class OneShotServer:
    """A socket on 127.0.0.1 that accepts connections on a thread and does `behaviour` with
    each: answer, say nothing, hang up after reading the request, or answer with bytes that
    are not TLS."""

    def __init__(self, behaviour: str, tls: ssl.SSLContext | None = None) -> None:
        self.behaviour = behaviour
        self.tls = tls
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.answered = threading.Semaphore(0)  # released per connection closed after answering
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.open.append(connection)
            if self.tls is not None:
                try:
                    connection = self.tls.wrap_socket(connection, server_side=True)
                    self.open[-1] = connection
                except OSError:
                    continue  # the client refused the certificate
            if self.behaviour == "not_tls":
                connection.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                continue
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = connection.recv(65536)
                if not chunk:
                    break
                request += chunk
            if self.behaviour == "hang_up":
                connection.close()
            elif self.behaviour in ("answer", "answer_then_close"):
                body = b'{"data": {"version": 7}}'
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + b"X-Vault-Index: abc\r\nContent-Length: %d\r\n\r\n" % len(body)
                    + body
                )
                if self.behaviour == "answer_then_close":
                    connection.close()  # an idle keep-alive connection the server let go
                    self.answered.release()
            # "silent": read the request, never answer

    def close(self) -> None:
        self.listener.close()
        for connection in self.open:
            connection.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _write(address: str, *, ca_cert: Path | None = None) -> list[Any]:
    """A KV write through a `VaultClient` on requests' own transport: the answer's body, or
    the error it raised."""
    client = VaultClient(VaultConnection(address, ca_cert=ca_cert, timeout=0.5))
    outcomes: list[Any] = []
    try:
        try:
            outcomes.append(await _write_apps_x(client, {"data": {"k": "v"}}))
        except VaultUnavailable as error:
            outcomes.append(error)
    finally:
        await client.close()
    return outcomes


@pytest.mark.parametrize("situation", ["refused", "silent", "hang_up", "not_tls"])
async def test_a_call_that_never_reached_vault_is_told_apart(situation: str) -> None:
    """Through requests' own transport, a call that could not connect is "not sent" (it may
    go to another node, even a write); one that may have reached Vault (no answer, a hang-up
    after the request, a failed TLS handshake) is not."""
    server = None if situation == "refused" else OneShotServer(situation)
    port = _free_port() if server is None else server.port
    scheme = "https" if situation == "not_tls" else "http"
    try:
        [outcome] = await _write(f"{scheme}://127.0.0.1:{port}")
    finally:
        if server is not None:
            server.close()
    assert isinstance(outcome, VaultUnavailable)
    assert isinstance(outcome.__cause__, requests.RequestException)
    assert not_sent(outcome.__cause__) == (situation == "refused")


async def test_an_idle_connection_the_server_closed_is_not_used_again() -> None:
    """Vault (or a load balancer) may close a kept-open connection between two calls: the next
    call opens a new one instead of failing on the dead one."""
    server = OneShotServer("answer_then_close")
    client = VaultClient(VaultConnection(f"http://127.0.0.1:{server.port}", timeout=2))
    answers = []
    try:
        for _ in range(2):
            answers.append(await _write_apps_x(client, {"data": {"k": "v"}}))
            assert server.answered.acquire(timeout=5)  # the server has closed that connection
    finally:
        await client.close()
        server.close()
    assert answers == [{"data": {"version": 7}}] * 2
    assert len(server.open) == 2  # the second call came over a new connection


@pytest.mark.parametrize("trusted", [True, False])
async def test_vaults_certificate_is_checked_against_ca_cert(trusted: bool, tmp_path: Path) -> None:
    """Over HTTPS the configured `ca_cert` is what Vault's certificate is checked against;
    without it, requests' own bundle, which does not know a private CA: an `SSLError`, never
    "not sent"."""
    pki = make_throwaway_pki(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert, pki.key)
    server = OneShotServer("answer", tls=context)
    try:
        [outcome] = await _write(
            f"https://127.0.0.1:{server.port}", ca_cert=pki.ca_cert if trusted else None
        )
    finally:
        server.close()
    if trusted:
        assert outcome == {"data": {"version": 7}}
    else:
        assert isinstance(outcome, VaultUnavailable)
        assert isinstance(outcome.__cause__, requests.exceptions.SSLError)
        assert not not_sent(outcome.__cause__)
