"""The Vault session reads the environment once, at start, and keeps honouring it; its direct
path sends what `requests.Session` would."""

from __future__ import annotations

import json as jsonlib
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
import requests
from requests.adapters import BaseAdapter, HTTPAdapter

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
from keyturn.vault.session import DirectSession
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
    """The direct path (no session merging) still sends the token and the JSON body, the
    session's default headers, the configured CA bundle, the node's proxy and the timeout."""
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    recorder = Recorder((200, {"Content-Type": "application/json"}, b'{"data": {"version": 4}}'))
    client = VaultClient(
        VaultConnection("https://vault-a.internal:8200", ca_cert=Path("/etc/keyturn/ca.pem")),
        adapter=recorder,
    )
    client.set_token(Secret("s.test-token"))
    try:
        body = await client.request(
            "POST",
            api_url("secret", "data", "apps/x"),
            kind="write",
            operation="write",
            path="secret/apps/x",
            json={"data": {"access_token": "a b"}, "options": {"cas": 3}},
        )
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


def test_a_redirect_is_followed_as_requests_follows_it() -> None:
    """A 307 (a standby that redirects instead of forwarding) leaves the direct path: the call
    is made again through `requests.Session.request`, which follows the Location with method
    and body kept, and the final answer is what the caller gets."""
    moved = (307, {"Location": "https://vault-b.internal:8200/v1/secret/data/apps/x"}, b"")
    recorder = Recorder(
        moved,
        moved,
        (200, {"Content-Type": "application/json"}, b'{"data": {"version": 5}}'),
    )
    session = DirectSession()
    session.trust_env = False
    session.mount("https://", recorder)
    response = session.request(
        "POST", "https://vault-a.internal:8200/v1/secret/data/apps/x", json={"data": {"k": "v"}}
    )
    assert response.json() == {"data": {"version": 5}}
    assert [r.url for r, _ in recorder.sent] == [
        "https://vault-a.internal:8200/v1/secret/data/apps/x",  # direct
        "https://vault-a.internal:8200/v1/secret/data/apps/x",  # through requests
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


def requests_type(error: BaseException) -> type:
    """The requests exception class `error` is (keyturn's `ConnectionNotMade` is requests'
    `ConnectionError`, told apart)."""
    return next(c for c in type(error).__mro__ if c.__module__.startswith("requests."))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("situation", ["refused", "silent", "hang_up", "not_tls"])
def test_a_call_sent_the_direct_way_fails_as_one_sent_through_requests(
    situation: str,
) -> None:
    """The direct path's errors are requests' own types, and a call that never reached Vault
    is told apart from one that may have, exactly as through `requests.Session`."""
    server = None if situation == "refused" else OneShotServer(situation)
    port = _free_port() if server is None else server.port
    scheme = "https" if situation == "not_tls" else "http"
    url = f"{scheme}://127.0.0.1:{port}/v1/secret/data/apps/x"
    errors: list[BaseException] = []
    direct = DirectSession()
    direct.trust_env = False
    direct.mount("http://", HTTPAdapter(max_retries=0))
    direct.mount("https://", HTTPAdapter(max_retries=0))
    plain = requests.Session()
    plain.trust_env = False
    try:
        for session in (direct, plain):
            with pytest.raises(requests.RequestException) as caught:
                session.request("POST", url, json={"data": {"k": "v"}}, timeout=0.5)
            errors.append(caught.value)
    finally:
        if server is not None:
            server.close()
    assert direct._nodes  # the call went the direct way
    assert requests_type(errors[0]) is requests_type(errors[1])
    assert not_sent(errors[0]) == not_sent(errors[1]) == (situation == "refused")


def test_an_answer_the_direct_way_reads_as_requests_would_give_it() -> None:
    server = OneShotServer("answer")
    session = DirectSession()
    session.trust_env = False
    session.mount("http://", HTTPAdapter(max_retries=0))
    try:
        url = f"http://127.0.0.1:{server.port}/v1/secret/data/apps/x"
        direct = session.request("POST", url, json={"data": {"k": "v"}}, timeout=2)
        through = requests.post(url, json={"data": {"k": "v"}}, timeout=2)
        kept = sum(len(stack) for stack in session._idle.values())
    finally:
        session.close()
        server.close()
    assert kept == 1  # the connection is kept open for the next call
    assert not session._idle  # and closed with the session
    assert direct.status_code == through.status_code == 200
    assert direct.ok and direct.reason == through.reason
    assert direct.json() == through.json() == {"data": {"version": 7}}
    assert direct.headers["x-vault-index"] == through.headers["X-Vault-Index"] == "abc"
    assert direct.encoding == through.encoding
    assert direct.url == through.url


def test_an_idle_connection_the_server_closed_is_not_used_again() -> None:
    """Vault (or a load balancer) may close a kept-open connection between two calls: the next
    call sees it closed and opens a new one instead of failing on the dead one."""
    server = OneShotServer("answer_then_close")
    session = DirectSession()
    session.trust_env = False
    session.mount("http://", HTTPAdapter(max_retries=0))
    url = f"http://127.0.0.1:{server.port}/v1/secret/data/apps/x"
    try:
        first = session.request("POST", url, json={"data": {"k": "v"}}, timeout=2)
        assert server.answered.acquire(timeout=5)  # the server has closed that connection
        second = session.request("POST", url, json={"data": {"k": "v"}}, timeout=2)
    finally:
        session.close()
        server.close()
    assert first.json() == second.json() == {"data": {"version": 7}}
    assert len(server.open) == 2  # the second call came over a new connection


@pytest.mark.parametrize("trusted", [True, False])
def test_the_direct_way_checks_vaults_certificate_as_requests_does(
    trusted: bool, tmp_path: Path
) -> None:
    """Over HTTPS the direct way trusts what `verify` names, as requests does: the CA file
    given (the answer reads the same), or requests' own bundle, which does not know a private
    CA (the same `SSLError`, and never "not sent")."""
    pki = make_throwaway_pki(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert, pki.key)
    server = OneShotServer("answer", tls=context)
    url = f"https://127.0.0.1:{server.port}/v1/secret/data/apps/x"
    verify: str | bool = str(pki.ca_cert) if trusted else True
    direct = DirectSession()
    direct.trust_env = False
    direct.mount("https://", HTTPAdapter(max_retries=0))
    plain = requests.Session()
    plain.trust_env = False
    outcomes: list[requests.Response | BaseException] = []
    try:
        for session in (direct, plain):
            try:
                outcomes.append(
                    session.request("POST", url, json={"k": "v"}, timeout=2, verify=verify)
                )
            except requests.RequestException as error:
                outcomes.append(error)
    finally:
        direct.close()
        plain.close()
        server.close()
    assert direct._nodes  # the call went the direct way
    if trusted:
        answers = [o for o in outcomes if isinstance(o, requests.Response)]
        assert [a.json() for a in answers] == [{"data": {"version": 7}}] * 2
    else:
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(errors) == 2
        assert requests_type(errors[0]) is requests_type(errors[1]) is requests.exceptions.SSLError
        assert not not_sent(errors[0]) and not not_sent(errors[1])
