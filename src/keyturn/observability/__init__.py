"""What keyturn tells the outside world about itself: Prometheus metrics (`catalog`, the contract
of docs/metrics.md as data; `metrics`), health (`health`), the HTTP server for /metrics, /healthz,
/readyz and /usage (`server`) and its TLS and basic auth (`guard`). Nothing is re-exported here:
the commands that only read the catalog (check, usage) must not import aiohttp with it.
"""
