"""Harnesses for the integration tests: processes, servers and threads around a real daemon,
a real OpenBao and the sandbox (the in-memory fakes are in `keyturn.testing`)."""
