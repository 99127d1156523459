"""The reference service ("sandbox"): a faithful, runnable implementation of the spec's API.

`keyturn sandbox` serves `POST /oauth/token`, `GET /v1/users`, `GET /v1/projects` and an admin
API (what the spec's dashboard does, plus settings, fault injection and usage records) on
loopback. State lives in memory. Module map:

    config.py ..... settings: defaults, TOML file, validation (shared with PUT /admin/settings)
    model.py ...... records (API keys, OAuth apps, client secrets, tokens) and their errors
    state.py ...... the domain logic: issue, rotate, refresh, revoke, authenticate, usage
    faults.py ..... rate limits and fault injection (error rate, latency, outage)
    wire.py ....... HTTP details: bounded bodies, JSON/form parameters, auth headers
    context.py .... what the handlers share (one `Sandbox` object on the aiohttp app)
    oauth.py ...... /oauth/token and /oauth/revoke
    resources.py .. /v1/users and /v1/projects
    admin.py ...... /admin/...
    app.py ........ the aiohttp Application and its middleware (faults, limits, access log)
    server.py ..... listening, bootstrap credentials, shutdown
    command.py .... the `keyturn sandbox` command line
"""
