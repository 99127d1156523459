"""The HTTP face behind `[metrics] web_config`: TLS, client certificates and basic auth.

The server runs in-process (MetricsServer with a registry of one counter) on 127.0.0.1; a
throwaway CA and its certificates are made with `openssl` (keyturn_devkit's
make_throwaway_pki, plus a client certificate, a second server certificate and an expired
one). One real Prometheus (Debian's `prometheus`, bash scripts/system-deps.sh) scrapes three
servers: TLS with basic auth, TLS with a client certificate, and an expired certificate.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter
from structlog.testing import capture_logs

from keyturn.config import MetricsSettings
from keyturn.config.webconfig import load_web_config
from keyturn.observability.server import MetricsServer
from keyturn_devkit.dev.tls import _openssl, make_throwaway_pki

PASSWORD = "correct horse battery staple"
WRONG = "hunter2-wrong-password"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
INSTALL_HINT = "install Debian's `prometheus` package: bash scripts/system-deps.sh"


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca: Path
    server: tuple[Path, Path]  # certificate, key
    renewed: tuple[Path, Path]  # another server certificate of the same CA
    expired: tuple[Path, Path]
    client: tuple[Path, Path]
    stranger: tuple[Path, Path]  # a client certificate of another CA


def _issue(directory: Path, name: str, ca: str, *, days: int, usage: str) -> tuple[Path, Path]:
    (directory / f"{name}.ext").write_text(
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature\n"
        f"extendedKeyUsage = {usage}\n"
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid, issuer\n"
    )
    _openssl(
        ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}"],
        directory,
    )  # fmt: skip
    _openssl(
        ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}/ca.pem", "-CAkey", f"{ca}/ca.key",
         "-CAcreateserial", "-out", f"{name}.pem", "-days", str(days),
         "-extfile", f"{name}.ext"],
        directory,
    )  # fmt: skip
    return directory / f"{name}.pem", directory / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.fail("`openssl` not found on PATH; bash scripts/system-deps.sh", pytrace=False)
    directory = tmp_path_factory.mktemp("pki")
    main = make_throwaway_pki(directory / "ca")
    make_throwaway_pki(directory / "other")
    return Pki(
        directory=directory,
        ca=main.ca_cert,
        server=(main.cert, main.key),
        renewed=_issue(directory, "renewed", "ca", days=2, usage="serverAuth"),
        expired=_issue(directory, "expired", "ca", days=-1, usage="serverAuth"),
        client=_issue(directory, "client", "ca", days=2, usage="clientAuth"),
        stranger=_issue(directory, "stranger", "other", days=2, usage="clientAuth"),
    )


def _web_config(
    directory: Path,
    cert: tuple[Path, Path],
    *,
    users: bool = True,
    client_auth: str | None = None,
    ca: Path | None = None,
) -> Path:
    """A web.yml in its own directory (relative paths: to it), the key pair copied there."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(cert[0], directory / "server.pem")
    shutil.copy(cert[1], directory / "server.key")
    lines = ["tls_server_config:", "  cert_file: server.pem", "  key_file: server.key"]
    if client_auth is not None:
        assert ca is not None
        lines += [f"  client_auth_type: {client_auth}", f"  client_ca_file: {ca}"]
    if users:
        lines += ["basic_auth_users:", f"  prometheus: '{HASH}'"]
    path = directory / "web.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _usage(names: Any, summary: bool) -> dict[str, Any]:
    return {"credentials": {"reporting": {"consumers": []}}}


@asynccontextmanager
async def serving(
    web_config: Path, *, open_paths: frozenset[str] = frozenset()
) -> AsyncIterator[MetricsServer]:
    registry = CollectorRegistry()
    Counter("keyturn_tls_test", "A counter to scrape.", registry=registry).inc()

    async def ready() -> tuple[bool, list[str]]:
        return True, []

    settings = MetricsSettings(
        host="127.0.0.1", port=0, web_config=load_web_config(web_config), open_paths=open_paths
    )
    server = MetricsServer(
        settings, registry, alive=lambda: (True, "ok"), ready=ready, usage=_usage
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _trust(pki: Pki, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if client is not None:
        context.load_cert_chain(*client)
    return context


def _client(server: MetricsServer, trust: ssl.SSLContext, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, verify=trust, timeout=5.0, **kwargs)


# -- in-process -----------------------------------------------------------------------------


async def test_basic_auth_over_tls_and_a_wrong_password_is_401(pki: Pki, tmp_path: Path) -> None:
    web = _web_config(tmp_path / "web", pki.server)
    with capture_logs() as logs:
        async with serving(web) as server:
            assert server.url.startswith("https://127.0.0.1:")
            async with _client(server, _trust(pki), auth=("prometheus", PASSWORD)) as http:
                answer = await http.get("/metrics")
                assert answer.status_code == 200
                assert "keyturn_tls_test_total 1.0" in answer.text
                again = await http.get("/metrics")  # the remembered match
                assert again.status_code == 200
            for auth in (("prometheus", WRONG), ("nobody", PASSWORD), None):
                async with _client(server, _trust(pki), auth=auth) as http:
                    for path in ("/metrics", "/healthz", "/readyz", "/usage"):
                        answer = await http.get(path)
                        assert answer.status_code == 401, (auth, path)
                        assert answer.headers["WWW-Authenticate"] == "Basic"
                        assert WRONG not in answer.text
                        assert HASH not in answer.text
    text = repr(logs)
    assert "metrics.unauthorized" in text
    assert WRONG not in text
    assert PASSWORD not in text
    assert HASH not in text


async def test_open_paths_lift_basic_auth_for_the_probes_only(pki: Pki, tmp_path: Path) -> None:
    web = _web_config(tmp_path / "web", pki.server)
    async with (
        serving(web, open_paths=frozenset({"/healthz"})) as server,
        _client(server, _trust(pki)) as http,
    ):
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 401
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/usage")).status_code == 401


async def test_a_required_client_certificate_is_checked_in_the_handshake(
    pki: Pki, tmp_path: Path
) -> None:
    web = _web_config(
        tmp_path / "web",
        pki.server,
        users=False,
        client_auth="RequireAndVerifyClientCert",
        ca=pki.ca,
    )
    async with serving(web) as server:
        async with _client(server, _trust(pki, pki.client)) as http:
            assert (await http.get("/metrics")).status_code == 200
            assert (await http.get("/usage")).status_code == 200
        without = await asyncio.to_thread(_refusal, server.port, _trust(pki))
        assert "TLSV13_ALERT_CERTIFICATE_REQUIRED" in without
        stranger = await asyncio.to_thread(_refusal, server.port, _trust(pki, pki.stranger))
        assert "ALERT_UNKNOWN_CA" in stranger


def _refusal(port: int, context: ssl.SSLContext) -> str:
    """The SSL error a request on a new connection meets (TLS 1.3: the client finishes its
    side of the handshake first, the server's alert comes with the first read)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        try:
            tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = tls.recv(1024)
        except ssl.SSLError as exc:
            return str(exc)
    return f"answered {answer!r}"


async def test_usage_needs_a_verified_certificate_when_one_is_optional(
    pki: Pki, tmp_path: Path
) -> None:
    web = _web_config(
        tmp_path / "web",
        pki.server,
        users=False,
        client_auth="VerifyClientCertIfGiven",
        ca=pki.ca,
    )
    async with serving(web) as server:
        async with _client(server, _trust(pki)) as http:
            assert (await http.get("/metrics")).status_code == 200
            assert (await http.get("/healthz")).status_code == 200
            refused = await http.get("/usage")
            assert refused.status_code == 403
        async with _client(server, _trust(pki, pki.client)) as http:
            assert (await http.get("/usage")).status_code == 200


async def test_plain_http_to_the_tls_port_gets_gos_400(pki: Pki, tmp_path: Path) -> None:
    web = _web_config(tmp_path / "web", pki.server)
    async with serving(web) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.0 400 Bad Request\r\n")
        assert answer.endswith(b"\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
        # the server goes on serving TLS
        async with _client(server, _trust(pki), auth=("prometheus", PASSWORD)) as http:
            assert (await http.get("/metrics")).status_code == 200


async def _served_certificate(server: MetricsServer, pki: Pki) -> bytes:
    _, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=_trust(pki))
    certificate = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    assert isinstance(certificate, bytes)
    return certificate


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


async def test_a_renewed_certificate_is_served_without_a_restart(pki: Pki, tmp_path: Path) -> None:
    web = _web_config(tmp_path / "web", pki.server)
    cert, key = tmp_path / "web" / "server.pem", tmp_path / "web" / "server.key"
    async with serving(web) as server:
        assert await _served_certificate(server, pki) == _der(pki.server[0])
        with capture_logs() as logs:
            # half a renewal (the certificate without its key): the old pair stays
            shutil.copy(pki.renewed[0], cert)
            os.utime(cert, ns=(time.time_ns(), time.time_ns() + 10**9))
            assert await _served_certificate(server, pki) == _der(pki.server[0])
            assert await _served_certificate(server, pki) == _der(pki.server[0])
            shutil.copy(pki.renewed[1], key)
            assert await _served_certificate(server, pki) == _der(pki.renewed[0])
        events = [entry["event"] for entry in logs]
        assert events.count("metrics.tls_reload_failed") == 1, events
        assert events.count("metrics.tls_reloaded") == 1, events


# -- a real Prometheus ------------------------------------------------------------------------


def _prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail(f"`prometheus` not found on PATH; {INSTALL_HINT}", pytrace=False)
    return path


async def test_prometheus_scrapes_over_tls_with_basic_auth_and_a_client_certificate(
    pki: Pki, tmp_path: Path
) -> None:
    binary = _prometheus_binary()
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD)
    wrong_file = tmp_path / "wrong"
    wrong_file.write_text(WRONG)
    basic = _web_config(tmp_path / "basic", pki.server)
    mutual = _web_config(
        tmp_path / "mutual", pki.server, users=False, client_auth="RequireAndVerifyClientCert",
        ca=pki.ca,
    )  # fmt: skip
    expired = _web_config(tmp_path / "expired", pki.expired, users=False)
    with capture_logs() as logs:
        async with (
            serving(basic) as basic_server,
            serving(mutual) as mutual_server,
            serving(expired) as expired_server,
        ):
            tls = f"    tls_config:\n      ca_file: {pki.ca}\n"
            jobs = {
                "basic": (basic_server, tls + f"    basic_auth:\n      username: prometheus\n"
                          f"      password_file: {password_file}\n"),
                "wrong": (basic_server, tls + f"    basic_auth:\n      username: prometheus\n"
                          f"      password_file: {wrong_file}\n"),
                "mutual": (mutual_server, tls + f"      cert_file: {pki.client[0]}\n"
                           f"      key_file: {pki.client[1]}\n"),
                "no_certificate": (mutual_server, tls),
                "expired": (expired_server, tls),
            }  # fmt: skip
            config = "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
            for job, (server, settings) in jobs.items():
                config += (
                    f"  - job_name: {job}\n    scheme: https\n{settings}"
                    f"    static_configs:\n      - targets: ['127.0.0.1:{server.port}']\n"
                )
            targets = await _scrape_with_prometheus(binary, tmp_path / "prometheus", config)
    assert targets["basic"]["health"] == "up", targets["basic"]
    assert targets["mutual"]["health"] == "up", targets["mutual"]
    assert "401 Unauthorized" in targets["wrong"]["lastError"], targets["wrong"]
    assert targets["no_certificate"]["health"] == "down"
    assert "certificate required" in targets["no_certificate"]["lastError"], targets
    assert targets["expired"]["health"] == "down"
    assert "x509: certificate has expired" in targets["expired"]["lastError"], targets
    shown = repr(targets) + repr(logs) + (tmp_path / "prometheus" / "log").read_text()
    assert WRONG not in shown
    assert PASSWORD not in shown
    assert HASH not in shown


async def _scrape_with_prometheus(binary: str, workdir: Path, config: str) -> dict[str, Any]:
    """Start Prometheus on `config`; each job's target once every job has been scraped."""
    process, port = _start_prometheus(binary, workdir, config)
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            deadline = time.monotonic() + 30
            body: Any = "no answer from /api/v1/targets"
            while time.monotonic() < deadline:
                assert process.poll() is None, "prometheus exited; see its log in " + str(workdir)
                try:
                    answer = await http.get(f"http://127.0.0.1:{port}/api/v1/targets")
                except httpx.HTTPError:
                    answer = None
                if answer is None or answer.status_code != 200:
                    # Not listening yet, or listening but not ready: Prometheus answers
                    # 503 "Service Unavailable" until its storage is open.
                    await asyncio.sleep(0.1)
                    continue
                body = answer.json()
                active = body["data"]["activeTargets"]
                found = {t["labels"]["job"]: t for t in active if t["health"] != "unknown"}
                if len(found) == len(active) > 0:
                    return found
                await asyncio.sleep(0.1)
        pytest.fail(f"prometheus scraped not every target in 30 s:\n{body}")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _start_prometheus(
    binary: str, workdir: Path, config: str
) -> tuple[subprocess.Popen[bytes], int]:
    workdir.mkdir()
    (workdir / "prometheus.yml").write_text(config)
    port = _free_port()
    with (workdir / "log").open("w") as log:
        process = subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return process, port


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
