"""`/metrics` renders the per-credential gauges itself (prometheus_client is slow at 10,000
credentials): what Prometheus parses must be exactly what the library would have written."""

from __future__ import annotations

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
from keyturn.observability.server import MetricsServer

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


async def test_the_server_serves_the_observer_s_exposition_in_either_format() -> None:
    registry, observer = observed()
    server = MetricsServer(
        MetricsSettings(host="127.0.0.1", port=0),
        registry,
        alive=lambda: (True, "ok"),
        ready=ready,
        exposition=observer.exposition,
    )
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=5.0) as client:
            text = await client.get("/metrics")
            openmetrics = await client.get(
                "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
            )
    finally:
        await server.stop()
    library = samples(parse_text(generate_latest(registry).decode()))
    assert text.headers["content-type"].startswith("text/plain")
    assert samples(parse_text(text.text)) == library
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert samples(parse_openmetrics(openmetrics.text)) == library


async def ready() -> tuple[bool, list[str]]:
    return True, []
