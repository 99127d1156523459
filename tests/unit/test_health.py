"""The metrics server over real HTTP on 127.0.0.1 (port 0), and the liveness/readiness checks.

Liveness and readiness are plain callables, so each test gives the server exactly the answer
it needs; the last test wires the real ones (heartbeat, FakeVaultStore, observer, scheduler)
together. Readiness reads the credentials' state from the scheduler, as their last runs found it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from keyturn.clock import FakeClock
from keyturn.config import MetricsSettings
from keyturn.errors import KeyturnError, VaultUnavailable
from keyturn.events import Published
from keyturn.jobs.job import Outcome
from keyturn.observability.health import Alive, HeartbeatLiveness, Ready, readiness_check, shorten
from keyturn.observability.metrics import PrometheusObserver
from keyturn.observability.server import MetricsServer
from keyturn.scheduler import CredentialScheduler
from keyturn.state import CredentialState, TokenRecord
from keyturn.testing.vault import FakeVaultStore

LOOPBACK = MetricsSettings(host="127.0.0.1", port=0)
SECRET = "s.hunter2-secretvalue"


def alive_ok() -> tuple[bool, str]:
    return True, "scheduler heartbeat 1.0 s ago"


async def ready_ok() -> tuple[bool, list[str]]:
    return True, []


Serve = Callable[..., Awaitable[tuple[MetricsServer, httpx.AsyncClient]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    started: list[tuple[MetricsServer, httpx.AsyncClient]] = []

    async def start(
        *,
        registry: CollectorRegistry | None = None,
        alive: Alive = alive_ok,
        ready: Ready = ready_ok,
        ready_timeout: float = 5.0,
    ) -> tuple[MetricsServer, httpx.AsyncClient]:
        server = MetricsServer(
            LOOPBACK,
            registry or CollectorRegistry(),
            alive=alive,
            ready=ready,
            ready_timeout=ready_timeout,
        )
        await server.start()
        client = httpx.AsyncClient(base_url=server.url, timeout=5.0)
        started.append((server, client))
        return server, client

    yield start
    for server, client in started:
        await client.aclose()
        await server.stop()


async def test_port_zero_binds_a_free_port_and_stop_releases_it(serve: Serve) -> None:
    server, client = await serve()
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert (await client.get("/healthz")).status_code == 200
    await server.stop()
    await server.stop()  # twice is harmless
    with pytest.raises(httpx.ConnectError):
        await client.get("/healthz")


async def test_starting_twice_is_refused_and_port_needs_a_start(serve: Serve) -> None:
    server, _ = await serve()
    with pytest.raises(RuntimeError, match="already started"):
        await server.start()
    idle = MetricsServer(LOOPBACK, CollectorRegistry(), alive=alive_ok, ready=ready_ok)
    with pytest.raises(RuntimeError, match="not started"):
        _ = idle.port


async def test_a_port_in_use_is_a_clear_error(serve: Serve) -> None:
    server, _ = await serve()
    taken = MetricsServer(
        MetricsSettings(host="127.0.0.1", port=server.port),
        CollectorRegistry(),
        alive=alive_ok,
        ready=ready_ok,
    )
    with pytest.raises(KeyturnError, match=rf"metrics: cannot listen on 127.0.0.1:{server.port}"):
        await taken.start()
    with pytest.raises(RuntimeError, match="not started"):
        _ = taken.port


async def test_metrics_serves_the_injected_registry(serve: Serve) -> None:
    registry = CollectorRegistry()
    Counter("keyturn_things_total", "things", registry=registry).inc(3)
    _, client = await serve(registry=registry)
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert response.headers["cache-control"] == "no-store"
    assert "keyturn_things_total 3.0" in response.text


async def test_metrics_speaks_openmetrics_when_asked(serve: Serve) -> None:
    registry = CollectorRegistry()
    Counter("keyturn_things_total", "things", registry=registry).inc()
    _, client = await serve(registry=registry)
    response = await client.get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")


async def test_healthz_follows_alive(serve: Serve) -> None:
    state = {"alive": (True, "scheduler heartbeat 2.0 s ago")}
    _, client = await serve(alive=lambda: state["alive"])
    response = await client.get("/healthz")
    assert (response.status_code, response.json()) == (
        200,
        {"alive": True, "reason": "scheduler heartbeat 2.0 s ago"},
    )
    state["alive"] = (False, "scheduler loop stalled: last heartbeat 95 s ago (limit 60 s)")
    response = await client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["reason"].startswith("scheduler loop stalled")


async def test_a_failing_liveness_check_is_503_with_its_type_only(serve: Serve) -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError(f"boom {SECRET}")

    _, client = await serve(alive=broken)
    response = await client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"alive": False, "reason": "liveness check failed (RuntimeError)"}


async def test_readyz_follows_ready(serve: Serve) -> None:
    answer: tuple[bool, list[str]] = (True, [])

    async def ready() -> tuple[bool, list[str]]:
        return answer

    _, client = await serve(ready=ready)
    response = await client.get("/readyz")
    assert (response.status_code, response.json()) == (200, {"ready": True, "problems": []})
    answer = (False, ["vault: cannot reach vault", "credential billing: nothing published yet"])
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"ready": False, "problems": answer[1]}


async def test_a_failing_or_hanging_readiness_check_is_503_without_its_text(
    serve: Serve,
) -> None:
    async def broken() -> tuple[bool, list[str]]:
        raise ValueError(f"token {SECRET} rejected")

    async def hangs() -> tuple[bool, list[str]]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    _, client = await serve(ready=broken)
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"ready": False, "problems": ["readiness check failed (ValueError)"]}
    assert SECRET not in response.text
    _, slow = await serve(ready=hangs, ready_timeout=0.05)
    response = await slow.get("/readyz")
    assert response.status_code == 503
    assert response.json()["problems"] == ["readiness check timed out after 0.05 s"]


async def test_only_the_three_endpoints_exist(serve: Serve) -> None:
    _, client = await serve()
    assert (await client.get("/")).status_code == 404
    assert (await client.get("/metrics/extra")).status_code == 404
    assert (await client.post("/metrics")).status_code == 405
    assert (await client.head("/healthz")).status_code == 200


# -- liveness and readiness ------------------------------------------------------------------


def test_liveness_from_the_heartbeat() -> None:
    clock = FakeClock()
    beat: list[float] = []
    alive = HeartbeatLiveness(lambda: beat[-1] if beat else None, clock=clock, max_age=30)
    assert alive() == (True, "starting: no heartbeat yet")
    clock.advance(10)
    beat.append(clock.monotonic())
    clock.advance(2.5)
    assert alive() == (True, "scheduler heartbeat 2.5 s ago")
    clock.advance(28)
    assert alive() == (False, "scheduler loop stalled: last heartbeat 30 s ago (limit 30 s)")


def test_a_wall_clock_step_changes_no_heartbeat_age() -> None:
    clock = FakeClock()
    observer = PrometheusObserver(CollectorRegistry(), clock)
    alive = HeartbeatLiveness(lambda: observer.last_heartbeat_monotonic, clock=clock, max_age=30)
    observer.heartbeat()
    clock.advance(2)
    clock.step_wall(-300)  # the clock is stepped back: the age stays 2 s, not -298 s
    assert alive() == (True, "scheduler heartbeat 2.0 s ago")
    clock.step_wall(+600)  # and forward: not a stalled loop either
    assert alive() == (True, "scheduler heartbeat 2.0 s ago")


def test_a_loop_that_never_beats_is_not_alive_after_the_grace() -> None:
    clock = FakeClock()
    alive = HeartbeatLiveness(lambda: None, clock=clock, max_age=30)
    clock.advance(31)
    assert alive() == (False, "no scheduler heartbeat since start 31 s ago (limit 30 s)")
    with pytest.raises(ValueError):
        HeartbeatLiveness(lambda: None, clock=clock, max_age=0)


def published(issued_at: float, expires_at: float) -> CredentialState:
    """A record whose last run published a value valid from `issued_at` to `expires_at`."""
    return CredentialState(token=TokenRecord(issued_at=issued_at, expires_at=expires_at))


@dataclass
class Job:
    """A credential job for the scheduler whose runs find the record `state` holds."""

    name: str
    kind: str = "oauth_client"
    state: CredentialState = field(default_factory=CredentialState)

    async def run(self, *, force: object = False) -> Outcome:
        return Outcome("fresh", self.state.token.expires_at or 0.0, self.state)


async def test_readiness_needs_vault_and_every_credential_published() -> None:
    clock = FakeClock()
    store = FakeVaultStore(clock=clock)
    jobs = [Job("reporting"), Job("billing")]
    scheduler = CredentialScheduler(jobs, clock=clock)
    ready = readiness_check(vault=store.health, jobs=scheduler, clock=clock)
    assert await ready() == (
        False,
        [
            "credential reporting: nothing published yet",
            "credential billing: nothing published yet",
        ],
    )
    now = clock.time()
    for job in jobs:
        job.state = published(now, now + 600)
        await scheduler.run_now(job.name)
    assert await ready() == (True, [])
    store.unavailable = True
    ok, problems = await ready()
    assert not ok
    assert len(problems) == 1 and problems[0].startswith("vault: ")


async def test_readiness_names_each_credential_without_a_valid_value() -> None:
    clock = FakeClock()
    now = clock.time()
    jobs = [
        Job("reporting", state=published(now, now + 60)),
        # rotate-after, not an expiry: past it, the key still works until it is retired
        Job("billing", "api_key", published(now, now + 30)),
        Job("fresh", state=CredentialState(token=TokenRecord(next_due=now))),
        Job("never-run"),
    ]
    scheduler = CredentialScheduler(jobs, clock=clock)
    for job in jobs[:3]:
        await scheduler.run_now(job.name)
    ready = readiness_check(vault=vault_ok, jobs=scheduler, clock=clock)
    assert await ready() == (
        False,
        ["credential fresh: nothing published yet", "credential never-run: nothing published yet"],
    )
    clock.advance(75)
    assert (await ready())[1] == [
        "credential reporting: expired at 2027-01-15T08:01:00Z",
        "credential fresh: nothing published yet",
        "credential never-run: nothing published yet",
    ]
    scheduler.replace_jobs(jobs[1:], changed=[])  # a reload removed it: no longer asked for
    assert "credential reporting" not in " ".join((await ready())[1])


async def vault_ok() -> None:
    return None


async def test_readiness_reports_a_foreign_exception_by_type_only() -> None:
    async def vault() -> None:
        raise OSError(f"connection to {SECRET} failed")

    clock = FakeClock()
    scheduler = CredentialScheduler([], clock=clock)
    ready = readiness_check(vault=vault, jobs=scheduler, clock=clock)
    assert await ready() == (False, ["vault: check failed (OSError)"])

    async def down() -> None:
        raise VaultUnavailable("vault token lookup: cannot reach vault (ConnectError)")

    ready = readiness_check(vault=down, jobs=scheduler, clock=clock)
    assert await ready() == (
        False,
        ["vault: vault token lookup: cannot reach vault (ConnectError)"],
    )


def test_many_problems_are_shortened() -> None:
    problems = [f"credential c{i}: nothing published yet" for i in range(10_000)]
    short = shorten(problems)
    assert len(short) == 20
    assert short[-1] == "… and 9981 more"
    assert shorten(problems[:20]) == problems[:20]


async def test_the_real_checks_behind_the_server(serve: Serve) -> None:
    """Observer, heartbeat liveness and readiness wired as the daemon wires them."""
    clock = FakeClock()
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry, clock)
    store = FakeVaultStore(clock=clock)
    job = Job("reporting")
    scheduler = CredentialScheduler([job], clock=clock)
    _, client = await serve(
        registry=registry,
        alive=HeartbeatLiveness(lambda: observer.last_heartbeat_monotonic, clock=clock, max_age=60),
        ready=readiness_check(vault=store.health, jobs=scheduler, clock=clock),
    )
    observer.heartbeat()
    now = clock.time()
    job.state = published(now, now + 600)
    await scheduler.run_now("reporting")
    observer(Published("reporting", "acme", "oauth_client", now, now + 600))
    assert (await client.get("/readyz")).status_code == 200
    assert 'keyturn_credential_ready{credential="reporting"' in (await client.get("/metrics")).text
    clock.advance(600)  # the token expired and the loop stopped beating
    ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["problems"] == ["credential reporting: expired at 2027-01-15T08:10:00Z"]
    assert (await client.get("/healthz")).status_code == 503
    metrics = (await client.get("/metrics")).text
    assert (
        'keyturn_credential_ready{credential="reporting",kind="oauth_client",provider="acme"} 0.0'
        in metrics
    )
