"""Alert hooks: what keyturn tells on-call, deduplicated, rate-limited, retried, resolved.

`model` holds the `Alert` (never a secret), `hooks/` one payload and POST per receiver,
`dispatcher` the per-hook queues, `observer` the event → alert mapping, and `build` turns
`[[alerts]]` into live hooks. Payloads and the mapping: docs/alerts.md.
"""
