"""keyturn_client in apps, against a real OpenBao, the sandbox over HTTP and `keyturn run`.

Access tokens live a few seconds, so a run of ~15 s spans several refreshes. Each app reads
its credential with its own Vault token, whose policy can read only its published path (as
deploy/vault/app.hcl grants), and calls the sandbox through httpx (sync and async) and
requests with `KeyturnAuth`. An app call fails when it raises or its final answer is not 200.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import hvac
import pytest
import requests
from keyturn_client import Credential, CredentialUnavailable
from keyturn_client.httpx import KeyturnAuth as HttpxAuth
from keyturn_client.requests import KeyturnAuth as RequestsAuth

from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import DaemonProcess, Deployment, prepare_deployment
from keyturn_devkit.harness.vault_proxy import FaultyVaultProxy

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

RUN_SECONDS = 15.0
PAUSE = 0.05  # between one app call and the next, in each loop

# A provider that kills the token a refresh replaces, at once (django-oauth-toolkit does), and
# answers a dead token 403 or, as RFC 6750 says, 401.
REVOKES_AT_REFRESH_403 = {
    "revoke_previous_access_token_on_refresh": True,
    "invalid_token_status": 403,
}
REVOKES_AT_REFRESH_401 = {
    "revoke_previous_access_token_on_refresh": True,
    "invalid_token_status": 401,
}


@dataclass
class Deployed:
    deployment: Deployment
    daemon: DaemonProcess
    app_token: str  # the app's own Vault token: read on its one path, nothing else

    @property
    def path(self) -> str:
        return self.deployment.publish_to["app"]

    @property
    def service(self) -> str:
        return self.deployment.sandbox.base_url


@pytest.fixture
def deploy(
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
) -> Iterator[Callable[..., Deployed]]:
    daemons: list[DaemonProcess] = []

    def make(lifetime: int = 5, scope: str | None = None, **sandbox_settings: Any) -> Deployed:
        sandbox = sandbox_factory({"access_token_lifetime": lifetime, **sandbox_settings})
        namespace = f"c{uuid.uuid4().hex[:8]}"
        deployment = prepare_deployment(
            openbao,
            sandbox,
            tmp_path,
            ["app"],
            namespace=namespace,
            credential={
                "refresh": {"margin": "1s", "min_interval": "500ms"},
                "backoff": {"initial": "200ms", "max": "1s"},
                **({"scope": scope} if scope else {}),
            },
        )
        root = deployment.vault_client()
        policy = f"app-{namespace}"
        root.sys.create_or_update_acl_policy(
            name=policy,
            policy=f'path "secret/data/{deployment.publish_to["app"]}" '
            '{ capabilities = ["read"] }',
        )
        token = root.auth.token.create(policies=[policy], no_default_policy=True, ttl="10m")
        daemon = DaemonProcess(deployment.config_path, tmp_path).start()
        daemons.append(daemon)
        return Deployed(deployment, daemon, token["auth"]["client_token"])

    yield make
    for daemon in daemons:
        daemon.stop()


class CountedReads:
    """A real hvac client whose KV v2 reads are counted; everything goes through to it."""

    def __init__(self, client: hvac.Client) -> None:
        self.client = client
        self.secrets = SimpleNamespace(kv=SimpleNamespace(v2=self))
        self.count = 0
        self._lock = threading.Lock()

    def read_secret_version(self, **arguments: Any) -> Any:
        with self._lock:
            self.count += 1
        return self.client.secrets.kv.v2.read_secret_version(**arguments)


def wait_published(deployed: Deployed, timeout: float = 20) -> None:
    root = deployed.deployment.vault_client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            root.secrets.kv.v2.read_secret_version(
                path=deployed.path, raise_on_deleted_version=True
            )
        except hvac.exceptions.InvalidPath:
            time.sleep(0.1)
        else:
            return
    raise TimeoutError(f"{deployed.path} not published within {timeout}s")


@dataclass
class AppCalls:
    """What the app loops saw."""

    ok: int = 0
    # answered 200 after a 401/403 and one retry with the new value, by loop
    retried: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, loop: str, status: int, history: list[int]) -> None:
        with self._lock:
            if status != 200:
                self.failed.append(f"{loop}: {status} after {history}")
            else:
                self.ok += 1
                self.retried[loop] = self.retried.get(loop, 0) + bool(history)

    def error(self, loop: str, error: Exception) -> None:
        with self._lock:
            self.failed.append(f"{loop}: {type(error).__name__}: {error}")


def httpx_loop(credential: Credential, service: str, stop: threading.Event, calls: AppCalls):
    with httpx.Client(base_url=service, auth=HttpxAuth(credential), timeout=5) as client:
        while not stop.is_set():
            try:
                answer = client.get("/v1/projects")
            except Exception as error:
                calls.error("httpx", error)
            else:
                calls.record("httpx", answer.status_code, [r.status_code for r in answer.history])
            stop.wait(PAUSE)


def requests_loop(credential: Credential, service: str, stop: threading.Event, calls: AppCalls):
    with requests.Session() as session:
        session.auth = RequestsAuth(credential)
        while not stop.is_set():
            try:
                answer = session.get(f"{service}/v1/projects", timeout=5)
            except Exception as error:
                calls.error("requests", error)
            else:
                calls.record(
                    "requests", answer.status_code, [r.status_code for r in answer.history]
                )
            stop.wait(PAUSE)


def async_loops(credential: Credential, service: str, stop: threading.Event, calls: AppCalls):
    async def one(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            try:
                answer = await client.get("/v1/projects")
            except Exception as error:
                calls.error("httpx async", error)
            else:
                history = [r.status_code for r in answer.history]
                calls.record("httpx async", answer.status_code, history)
            await asyncio.sleep(PAUSE)

    async def main() -> None:
        auth = HttpxAuth(credential)
        async with httpx.AsyncClient(base_url=service, auth=auth, timeout=5) as client:
            await asyncio.gather(*(one(client) for _ in range(4)))

    asyncio.run(main())


def run_apps(credential: Credential, service: str, seconds: float) -> AppCalls:
    """One credential shared by an httpx loop, a requests loop and four coroutines."""
    calls = AppCalls()
    stop = threading.Event()
    threads = [
        threading.Thread(target=loop, args=(credential, service, stop, calls), daemon=True)
        for loop in (httpx_loop, requests_loop, async_loops)
    ]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(15)
    return calls


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({}, id="old-token-valid-until-expiry"),
        pytest.param(REVOKES_AT_REFRESH_403, id="old-token-revoked-at-refresh-403"),
        pytest.param(REVOKES_AT_REFRESH_401, id="old-token-revoked-at-refresh-401"),
    ],
)
def test_apps_make_no_failed_call_across_refreshes(deploy, settings) -> None:
    deployed = deploy(lifetime=5, **settings)
    wait_published(deployed)
    vault = CountedReads(
        hvac.Client(url=deployed.deployment.vault.address, token=deployed.app_token)
    )
    credential = Credential(deployed.path, client=vault)
    assert credential.value  # the first read
    first_version = credential.version
    assert first_version is not None

    calls = run_apps(credential, deployed.service, RUN_SECONDS)

    assert calls.failed == []
    assert calls.ok >= 300
    assert credential.version is not None
    assert credential.version - first_version >= 3  # several refreshes went by
    assert vault.count <= calls.ok / 10  # served from memory, not read for every call
    tokens = deployed.deployment.sandbox.admin.list_tokens()
    replaced = [t for t in tokens if t["revoke_reason"] == "replaced at refresh"]
    if settings:
        # The provider killed each replaced token at once: calls made with it between the
        # refresh and the app's next read were refused (401/403), re-read and retried. Which
        # of the three loops (sharing one Credential) hit that moment is timing; each
        # integration's retry is also tested alone, in test_credential.py.
        assert len(replaced) >= 3
        assert sum(calls.retried.values()) >= 1, calls.retried
    else:
        assert replaced == []
        assert sum(calls.retried.values()) == 0  # read again in time: no call needed a retry


@pytest.mark.parametrize("outage", ["app-token-revoked", "vault-unreachable"])
def test_a_vault_outage_serves_the_value_held_until_it_expires_then_a_clear_error(
    deploy, outage, caplog
) -> None:
    caplog.set_level(logging.DEBUG)  # hvac, requests/urllib3, httpx and keyturn_client alike
    deployed = deploy(lifetime=4)
    wait_published(deployed)
    address = deployed.deployment.vault.address
    with FaultyVaultProxy(address) as proxy:
        url = proxy.url if outage == "vault-unreachable" else address
        vault = hvac.Client(url=url, token=deployed.app_token, timeout=1)
        credential = Credential(deployed.path, client=vault)
        held = credential.value
        sent_with = credential.authorization
        expires_at = credential.expires_at
        assert expires_at is not None
        if outage == "app-token-revoked":
            deployed.deployment.vault_client().auth.token.revoke(deployed.app_token)
        else:
            proxy.stop()
        answers: list[tuple[float, int]] = []
        with httpx.Client(
            base_url=deployed.service, auth=HttpxAuth(credential), timeout=5
        ) as client:
            while True:
                sent_at = time.time()  # before the header is read: a header read after expiry fails
                try:
                    answer = client.get("/v1/projects")
                except CredentialUnavailable as error:
                    failed_at = time.time()
                    unavailable = error
                    break
                answers.append((sent_at, answer.status_code))
                # The value held, all along: the header each call went out with (reading
                # credential.value here could race the expiry it is waiting for).
                assert answer.request.headers["authorization"] == sent_with
                assert time.time() < expires_at + 1, "served past expires_at"
                time.sleep(0.05)
    # Served until the value expired, every call accepted; then the clear error at once.
    assert len(answers) >= 10
    assert all(status == 200 for _, status in answers), answers
    assert answers[-1][0] < expires_at <= failed_at < expires_at + 0.5
    message = str(unavailable)
    assert unavailable.path == f"secret/{deployed.path}"
    assert f"secret/{deployed.path}" in message
    assert "expired at" in message
    expected = "Vault refused the read" if outage == "app-token-revoked" else "cannot be reached"
    assert expected in message
    assert held not in message
    assert held not in repr(unavailable.args)
    assert held not in repr(credential)
    assert caplog.records  # the libraries did log (requests, connection attempts) ...
    assert held not in caplog.text  # ... never the value
    # Meanwhile keyturn went on publishing: the value Vault holds has moved on.
    latest = deployed.deployment.vault_client().secrets.kv.v2.read_secret_version(
        path=deployed.path, raise_on_deleted_version=True
    )
    assert latest["data"]["metadata"]["version"] > (credential.version or 0)


def test_a_call_refused_for_its_scope_is_neither_retried_nor_waited_for(deploy) -> None:
    deployed = deploy(lifetime=30, scope="projects:read")
    wait_published(deployed)
    vault = CountedReads(
        hvac.Client(url=deployed.deployment.vault.address, token=deployed.app_token)
    )
    credential = Credential(deployed.path, client=vault)
    service = deployed.service
    with httpx.Client(base_url=service, auth=HttpxAuth(credential), timeout=5) as client:
        assert client.get("/v1/projects").status_code == 200
        answer = client.get("/v1/users")  # 403 insufficient_scope: a new token would get it too
        assert answer.status_code == 403
        assert "insufficient_scope" in answer.headers["WWW-Authenticate"]
        assert answer.history == []
    with requests.Session() as session:
        session.auth = RequestsAuth(credential)
        answer = session.get(f"{service}/v1/users", timeout=5)
        assert (answer.status_code, answer.history) == (403, [])

    async def through_async() -> httpx.Response:
        async with httpx.AsyncClient(base_url=service, auth=HttpxAuth(credential)) as client:
            return await client.get("/v1/users")

    answer = asyncio.run(through_async())
    assert (answer.status_code, answer.history) == (403, [])
    # The first read only: waiting for a replacement polls Vault, so no wait either.
    assert vault.count == 1
