"""The Vault session reads the environment once, at start, and keeps honouring it."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyturn.vault.client import (
    VaultClient,
    VaultConnection,
    environment_proxies,
    session_verify,
)


def test_a_configured_ca_cert_wins_over_the_environment() -> None:
    environ = {"REQUESTS_CA_BUNDLE": "/etc/ssl/env-bundle.pem"}
    assert session_verify(Path("/etc/keyturn/ca.pem"), environ) == "/etc/keyturn/ca.pem"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"REQUESTS_CA_BUNDLE": "/a.pem", "CURL_CA_BUNDLE": "/b.pem"}, "/a.pem"),
        ({"CURL_CA_BUNDLE": "/b.pem"}, "/b.pem"),
        ({}, True),
    ],
)
def test_without_ca_cert_the_bundle_variables_are_used_as_requests_would(
    environ: dict[str, str], expected: bool | str
) -> None:
    assert session_verify(None, environ) == expected


def test_proxy_variables_and_no_proxy_are_read_per_vault_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "vault-b.internal")
    assert environment_proxies("https://vault-a.internal:8200").get("https") == (
        "http://proxy.internal:3128"
    )
    assert environment_proxies("https://vault-b.internal:8200") == {}


async def test_the_session_no_longer_looks_at_the_environment_on_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "vault-b.internal")
    client = VaultClient(
        VaultConnection("https://vault-a.internal:8200", nodes=("https://vault-b.internal:8200",))
    )
    try:
        assert client._session.trust_env is False
        a = client._adapter("https://vault-a.internal:8200")
        b = client._adapter("https://vault-b.internal:8200")
        assert a._kwargs["proxies"].get("https") == "http://proxy.internal:3128"
        assert not b._kwargs["proxies"]
    finally:
        await client.close()
