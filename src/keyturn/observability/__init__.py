"""What keyturn tells the outside world about itself: Prometheus metrics and health endpoints.

catalog.py ... the metrics contract as data (names, types, labels, help, bounded words),
               mirrored verbatim from docs/metrics.md
metrics.py ... `PrometheusObserver`: an `Observer` that keeps every metric in a registry
health.py .... liveness from the scheduler heartbeat, readiness from Vault and credentials
server.py .... `MetricsServer`: aiohttp serving /metrics, /healthz, /readyz and /usage
guard.py ..... `[metrics] web_config` at work: TLS contexts re-read on change, basic auth

Nothing is re-exported here: the commands that only read the catalog (check, usage) must not
import aiohttp or the scheduler with it.
"""
