"""The Alert value object: names, runbook links, fingerprints, and the checks that keep a
secret out of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyturn.alerts.model import (
    DEFAULT_RUNBOOK_BASE,
    MAX_FIELD,
    Alert,
    alert_name,
    clip,
    fingerprint,
    is_web_link,
    runbook_url,
    scrub_text,
)
from keyturn.secret import PLACEHOLDER, Secret

T0 = 1_800_000_000.0


def make(**changes: object) -> Alert:
    fields: dict[str, object] = {
        "name": "KeyturnClientRejected",
        "detector": "client_rejected",
        "severity": "critical",
        "summary": "reporting: invalid_client",
        "credential": "reporting",
        "provider": "acme",
        "runbook_url": runbook_url(DEFAULT_RUNBOOK_BASE, "KeyturnClientRejected"),
        "starts_at": T0,
    }
    fields.update(changes)
    return Alert(**fields)  # type: ignore[arg-type]


def test_names_and_runbook_anchors_follow_the_detector() -> None:
    assert alert_name("refresh_token_rejected") == "KeyturnRefreshTokenRejected"
    assert alert_name("credential_failing") == "KeyturnCredentialFailing"
    assert runbook_url("https://x.example/runbook.md", "KeyturnGrantDrift") == (
        "https://x.example/runbook.md#keyturngrantdrift"
    )
    alert = Alert.make("grant_drift", "warning", "scope", credential="a", starts_at=T0)
    assert alert.name == "KeyturnGrantDrift"
    assert alert.runbook_url == DEFAULT_RUNBOOK_BASE + "#keyturngrantdrift"


def test_the_default_runbook_is_the_file_in_keyturns_source_not_a_made_up_url() -> None:
    root = Path(__file__).resolve().parents[2]
    assert DEFAULT_RUNBOOK_BASE == "docs/runbook.md"
    assert (root / DEFAULT_RUNBOOK_BASE).is_file()
    assert not is_web_link(runbook_url(DEFAULT_RUNBOOK_BASE, "KeyturnGrantDrift"))
    assert is_web_link("https://wiki.example.com/keyturn/runbook#keyturngrantdrift")
    assert is_web_link("http://127.0.0.1:8080/runbook.md")
    assert not is_web_link("https:runbook.md")
    assert not is_web_link("file:///srv/runbook.md")


def test_the_fingerprint_is_stable_and_names_the_condition_not_the_text() -> None:
    a = make()
    b = make(summary="other words", severity="warning", starts_at=T0 + 50)
    assert a.fingerprint == b.fingerprint == fingerprint("client_rejected", "reporting", "acme")
    assert a.fingerprint == "761e6f029f74f5ce"  # the same in every process and version
    assert make(credential="billing").fingerprint != a.fingerprint
    assert make(provider="other").fingerprint != a.fingerprint
    assert make(detector="grant_drift").fingerprint != a.fingerprint
    assert make(hook="pager").fingerprint != a.fingerprint
    # No accidental collisions from joining: ("a_b", "c") is not ("a", "b_c").
    assert fingerprint("x", "a", "bc") != fingerprint("x", "ab", "c")


def test_resolve_keeps_the_identity_and_sets_the_end() -> None:
    alert = make()
    resolved = alert.resolve(T0 + 60)
    assert (resolved.status, resolved.ends_at) == ("resolved", T0 + 60)
    assert resolved.fingerprint == alert.fingerprint
    assert not resolved.firing
    assert alert.resolve(T0 - 5).ends_at == T0  # never before it started


def test_to_dict_has_every_field_in_rfc3339() -> None:
    data = make().resolve(T0 + 1).to_dict()
    assert data == {
        "name": "KeyturnClientRejected",
        "fingerprint": make().fingerprint,
        "status": "resolved",
        "severity": "critical",
        "detector": "client_rejected",
        "credential": "reporting",
        "provider": "acme",
        "hook": None,
        "summary": "reporting: invalid_client",
        "runbook_url": DEFAULT_RUNBOOK_BASE + "#keyturnclientrejected",
        "starts_at": "2027-01-15T08:00:00Z",
        "ends_at": "2027-01-15T08:00:01Z",
    }


@pytest.mark.parametrize("field", ["summary", "credential", "provider", "detector", "name"])
def test_a_secret_is_refused_not_rendered(field: str) -> None:
    with pytest.raises(TypeError, match=field):
        make(**{field: Secret("s3cr3t-value")})


def test_overlong_fields_are_refused() -> None:
    with pytest.raises(ValueError, match="summary"):
        make(summary="x" * (MAX_FIELD + 1))
    assert len(clip("x" * 5000)) == MAX_FIELD
    made = Alert.make("grant_drift", "warning", "y" * 5000, starts_at=T0)
    assert len(made.summary) == MAX_FIELD


@pytest.mark.parametrize(
    ("severity", "status"), [("fatal", "firing"), ("warning", "open")], ids=["severity", "status"]
)
def test_unknown_words_are_refused(severity: str, status: str) -> None:
    with pytest.raises(ValueError):
        make(severity=severity, status=status)


@pytest.mark.parametrize(
    ("text", "leaked"),
    [
        ("refresh failed: token=abc123def", "abc123def"),
        ('body {"client_secret": "hunter2hunter2"}', "hunter2hunter2"),
        ("api_key: k-9f8e7d", "k-9f8e7d"),
        ("header Authorization: Bearer eyJhbGciOi.abc.def", "eyJhbGciOi.abc.def"),
        ("sent Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
        ("PASSWORD=pw-1234", "pw-1234"),
        ("routing_key=R0UT1NG", "R0UT1NG"),
        # the forms of the issue, with values that are plain words
        ("Bearer xyz", "xyz"),
        ("Basic xyz", "xyz"),
        ("token=xyz", "xyz"),
        ('{"client_secret": "xyz"}', "xyz"),
        ("{'client_secret':'xyz'}", "xyz"),
        ("GET /v1/users?api_key=xyz&page=2", "xyz"),
        ("grant_type=refresh_token&refresh_token=xyz", "xyz"),
        ("token:xyz", "xyz"),
        ('"access_token": "two words"', "two words"),
        # name: value, where the value is not a word
        ("client_secret: cs-7f3a9b2c4d5e; Authorization: Bearer at-1", "cs-7f3a9b2c4d5e"),
        ("the server said client_secret: s3cr3t-v4lue-0123 was reused", "s3cr3t-v4lue-0123"),
        ("x-vault-token: hvs.CAESIJ0123", "hvs.CAESIJ0123"),
        ("Authorization: Token 0123abcd", "0123abcd"),
    ],
)
def test_scrub_text_blanks_values_after_secret_names(text: str, leaked: str) -> None:
    scrubbed = scrub_text(text)
    assert leaked not in scrubbed
    assert PLACEHOLDER in scrubbed
    assert leaked not in Alert.make("grant_drift", "warning", text, starts_at=T0).summary


def test_scrub_text_leaves_ordinary_messages_alone() -> None:
    text = (
        "reporting: 3 consecutive failed runs; last: OAuthError: token endpoint answered "
        "invalid_client (HTTP 401); published path was at version 7"
    )
    assert scrub_text(text) == text


@pytest.mark.parametrize(
    "text",
    [
        # keyturn's own `<where>: <reason>` and `<field>: <reason>` messages
        "ProviderUnavailable: app1: /oauth/token: RemoteProtocolError",
        "ProviderUnavailable: app1: /oauth/token: HTTP 503",
        "ProviderUnavailable: app1: /oauth/token: timed out after 5s",
        "RateLimited: app1: /oauth/token: rate limited (429), retry after 30s",
        "MalformedResponse: app1: access_token: missing or not a non-empty string",
        "MalformedResponse: app1: refresh_token: not a non-empty string",
        "OAuthError: app1: token endpoint returned invalid_client (Client authentication failed)",
        "VerificationFailed: app1: new access token rejected by probe /v1/token (HTTP 401)",
        "SecretReferenceError: env:APP_TOKEN: environment variable APP_TOKEN is not set",
        "SecretReferenceError: vault:secret/in/app#client_secret: the Vault field is empty",
        "RotationError: app1: rotator keys: create (POST /api_key): value /key: not a string",
        # credentials named like a secret: their name starts keyturn's summary
        "token: 3 consecutive failed runs; last: ProviderUnavailable: token: /oauth/token: "
        "HTTP 503",
        "api_key: 5 consecutive failed runs; last: OSError",
        "key: a key issued just now was rejected with 401 on /v1/users",
    ],
)
def test_scrub_text_keeps_the_words_of_keyturns_messages(text: str) -> None:
    assert scrub_text(text) == text
    summary = Alert.make("credential_failing", "warning", text, starts_at=T0).summary
    assert summary == text


@pytest.mark.parametrize(
    "text",
    [
        "refresh_token=rt-1 reused; client_secret: cs-2; Authorization: Bearer at-3",
        '{"api_key": "k", "token": "t"}',
        "api_key: k-9f8e7d",
        "/oauth/token: HTTP 503",
    ],
)
def test_scrubbing_twice_changes_nothing(text: str) -> None:
    """The dispatcher scrubs a summary again before delivery."""
    once = scrub_text(text)
    assert scrub_text(once) == once
