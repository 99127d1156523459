"""`/metrics` renders the per-credential gauges itself (prometheus_client is slow at 10,000
credentials): what Prometheus parses must be exactly what the library would have written."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from keyturn.clock import FakeClock
from keyturn.config import MetricsSettings
from keyturn.events import (
    Failed,
    Probed,
    Published,
    Restored,
    RotationPlanned,
    RotationStep,
    Scheduled,
    Suspicious,
    TokenRequest,
)
from keyturn.observability.metrics import PrometheusObserver
from keyturn.observability.server import CHUNK, MetricsServer

NOW = 1_800_000_000.0


def observed() -> tuple[CollectorRegistry, PrometheusObserver]:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry, FakeClock(NOW))
    # Odd label values on purpose: a quote, a backslash and a newline must be escaped.
    for name, provider in (("alpha", "acme"), ("beta", 'we"ird\\pro\nvider'), ("gamma", "acme")):
        observer(TokenRequest(name, provider, "client_credentials", "success", 0.02))
        observer(Published(name, provider, "oauth_client", NOW - 100, NOW + 3500))
        observer(Scheduled(name, provider, "oauth_client", NOW + 2000))
    observer(Failed("gamma", "acme", "oauth_client", RuntimeError("boom"), 3))
    observer(Restored("delta", "acme", "api_key", NOW - 50, NOW + 86_000, NOW - 50, 0))
    observer(RotationPlanned("delta", "acme", "api_key", NOW + 86_000))
    observer(Probed("alpha", "acme", 200))
    observer(RotationStep("delta", "acme", "api_key", "created"))
    observer(Suspicious(None, None, "vault_token_expiring", "critical", "soon"))
    observer(Suspicious("beta", 'we"ird\\pro\nvider', "refresh_token_rejected", "critical", "x"))
    observer.sink_write("alpha", "written")
    observer.vault_token(NOW + 600, authenticated=True)
    observer.heartbeat()
    return registry, observer


def samples(families: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in families:  # type: ignore[attr-defined]
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def help_and_types(families: object) -> dict[str, tuple[str, str]]:
    return {f.name: (f.documentation, f.type) for f in families}  # type: ignore[attr-defined]


def test_the_text_format_says_what_prometheus_client_would_say() -> None:
    registry, observer = observed()
    library = generate_latest(registry).decode()
    ours = observer.exposition().decode()
    assert samples(parse_text(ours)) == samples(parse_text(library))
    assert help_and_types(parse_text(ours)) == help_and_types(parse_text(library))
    assert 'provider="we\\"ird\\\\pro\\nvider"' in ours
    # Rendered once: each family's header appears a single time.
    assert ours.count("# TYPE keyturn_credential_ready gauge") == 1
    assert ours.count("# TYPE keyturn_token_requests_total counter") == 1


def test_openmetrics_ends_with_eof_and_parses_to_the_same_samples() -> None:
    registry, observer = observed()
    ours = observer.exposition(openmetrics=True).decode()
    assert ours.endswith("# EOF\n")
    assert ours.count("# EOF") == 1
    library = generate_latest(registry).decode()
    assert samples(parse_openmetrics(ours)) == samples(parse_text(library))


def test_a_forgotten_credential_leaves_no_series() -> None:
    _registry, observer = observed()
    assert 'keyturn_token_requests_total{credential="beta"' in observer.exposition().decode()
    observer.forget("beta")
    assert 'credential="beta"' not in observer.exposition().decode()
    assert 'credential="alpha"' in observer.exposition().decode()


@contextlib.asynccontextmanager
async def serving(
    registry: CollectorRegistry, observer: PrometheusObserver
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a MetricsServer that serves the observer's exposition."""
    server = MetricsServer(
        MetricsSettings(host="127.0.0.1", port=0),
        registry,
        alive=lambda: (True, "ok"),
        ready=ready,
        exposition=observer.exposition_parts,
    )
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=5.0) as client:
            yield client
    finally:
        await server.stop()


async def test_the_server_serves_the_observer_s_exposition_in_either_format() -> None:
    registry, observer = observed()
    async with serving(registry, observer) as client:
        text = await client.get("/metrics")
        openmetrics = await client.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
    library = samples(parse_text(generate_latest(registry).decode()))
    assert text.headers["content-type"].startswith("text/plain")
    assert samples(parse_text(text.text)) == library
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert samples(parse_openmetrics(openmetrics.text)) == library


async def test_a_body_of_many_chunks_is_sent_whole_and_in_order() -> None:
    registry, observer = observed()
    for i in range(2_000):  # about 1.6 MB of lines: several chunks
        name = f"c{i:04}"
        observer(TokenRequest(name, "acme", "client_credentials", "success", 0.02))
        observer(Published(name, "acme", "oauth_client", NOW - 100, NOW + 3500))
    async with serving(registry, observer) as client:
        answer = await client.get("/metrics")
    whole = observer.exposition()
    assert len(whole) > 4 * CHUNK
    assert int(answer.headers["content-length"]) == len(whole)
    assert answer.content == whole


async def ready() -> tuple[bool, list[str]]:
    return True, []


# -- the lines are made as events come: a scrape must still show the latest of everything -------

EXPIRY = "keyturn_credential_expiry_timestamp_seconds"


def credential_order(text: str, family: str) -> list[str]:
    return [
        line.split('credential="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith(family + "{")
    ]


def test_a_value_changed_after_a_scrape_shows_in_the_next_one() -> None:
    registry, observer = observed()
    before = observer.exposition().decode()
    observer(Published("alpha", "acme", "oauth_client", NOW + 1, NOW + 7200))
    observer(Failed("alpha", "acme", "oauth_client", RuntimeError("boom"), 2))
    observer(TokenRequest("alpha", "acme", "client_credentials", "success", 0.02))
    observer(Scheduled("gamma", "elsewhere", "oauth_client", NOW + 60))  # a new provider label
    observer(Published("epsilon", "acme", "oauth_client", NOW, NOW + 60))  # a new credential
    observer.sink_write("alpha", "written")
    text = observer.exposition().decode()
    assert text != before
    ours = samples(parse_text(text))
    assert ours == samples(parse_text(generate_latest(registry).decode()))
    alpha = (("credential", "alpha"), ("kind", "oauth_client"), ("provider", "acme"))
    assert ours[(EXPIRY, alpha)] == NOW + 7200
    assert ours[("keyturn_credential_consecutive_failures", alpha)] == 2
    requests = (
        ("credential", "alpha"),
        ("grant_type", "client_credentials"),
        ("outcome", "success"),
        ("provider", "acme"),
    )
    assert ours[("keyturn_token_requests_total", requests)] == 2
    assert (
        ours[("keyturn_sink_writes_total", (("credential", "alpha"), ("result", "written")))] == 2
    )
    assert f'{EXPIRY}{{credential="gamma",provider="elsewhere",kind="oauth_client"}}' in text
    assert f'{EXPIRY}{{credential="gamma",provider="acme"' not in text
    assert credential_order(text, EXPIRY) == ["alpha", "beta", "delta", "epsilon", "gamma"]


def test_ready_follows_the_clock_with_no_event_between_scrapes() -> None:
    clock = FakeClock(NOW)
    observer = PrometheusObserver(CollectorRegistry(), clock)
    observer(Published("alpha", "acme", "oauth_client", NOW, NOW + 60))
    line = 'keyturn_credential_ready{credential="alpha",provider="acme",kind="oauth_client"}'
    assert f"{line} 1.0\n" in observer.exposition().decode()
    clock.advance(61)
    assert f"{line} 0.0\n" in observer.exposition().decode()


def test_a_forgotten_credential_that_comes_back_starts_afresh() -> None:
    registry, observer = observed()
    observer.exposition()
    observer.forget("beta")
    observer(Scheduled("beta", "acme", "oauth_client", NOW + 30))
    text = observer.exposition().decode()
    assert samples(parse_text(text)) == samples(parse_text(generate_latest(registry).decode()))
    beta = [line for line in text.splitlines() if 'credential="beta"' in line]
    assert beta == [
        'keyturn_credential_next_scheduled_timestamp_seconds{credential="beta",provider="acme",'
        f'kind="oauth_client"}} {NOW + 30!r}',
        'keyturn_credential_ready{credential="beta",provider="acme",kind="oauth_client"} 0.0',
        'keyturn_credential_consecutive_failures{credential="beta",provider="acme",'
        'kind="oauth_client"} 0.0',
    ]
    assert credential_order(text, "keyturn_credential_ready") == ["alpha", "beta", "delta", "gamma"]


def test_scrapes_from_another_thread_while_events_arrive() -> None:
    """The server renders off the event loop: no 'dictionary changed size' mid-scrape, and
    what it renders parses."""
    _registry, observer = observed()
    errors: list[BaseException] = []
    scraped: list[bytes] = []
    done = threading.Event()

    def scrape() -> None:
        try:
            while not done.is_set():
                scraped.append(observer.exposition(openmetrics=True))
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=scrape)
    thread.start()
    try:
        for i in range(3000):
            name = f"c{i % 300}"
            observer(Published(name, "acme", "oauth_client", NOW, NOW + 60))
            observer(TokenRequest(name, "acme", "client_credentials", "success", 0.1))
            if i % 7 == 0:
                observer.forget(name)
    finally:
        done.set()
        thread.join()
    assert errors == []
    for text in scraped[-3:]:
        list(parse_openmetrics(text.decode()))
