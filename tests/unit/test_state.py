"""The private record in Vault: its typed parts, and its one declared stored form. A record
written by an earlier keyturn (the field names and string forms docs/vault.md lists) decodes to
the same values and is written back exactly as it was."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from keyturn.errors import VaultDataError
from keyturn.secret import Secret
from keyturn.state import (
    FIELDS,
    CredentialState,
    KindRecord,
    LeaseRecord,
    RefreshTokenRecord,
    RotationJournal,
    TokenRecord,
    fingerprint,
)

REPO = Path(__file__).resolve().parents[2]
VAULT_DOCS = (REPO / "docs" / "vault.md").read_text()

FINGERPRINT = "hmac-sha256:" + "0f" * 16 + ":" + "a1" * 32

# Every field, in the format keyturn writes today (times: repr of the float epoch seconds).
RECORD = {
    "refresh_token": "rt-held-secretvalue",
    "refresh_in_flight": "5f2c9a1b7d3e4f60",
    "burned_refresh_token": "rt-burned-secretvalue",
    "refresh_token_input_fingerprint": FINGERPRINT,
    "refresh_token_refused_at": "1800000000.25",
    "issued_at": "1800000100.123456",
    "expires_at": "1800003700.0",
    "scope": "projects:read users:read",
    "published_version": "14",
    "writer": "host-a",
    "lease_owner": "host-b",
    "lease_until": "1800000130.5",
    "last_success": "1800000101.75",
    "last_error": "reporting: HTTP 503, retry after 5s",
    "consecutive_failures": "2",
    "next_due": "1800002500.0",
    "phase": "failing",
    "key": "sk-current-secretvalue",
    "key_id": "key_41",
    "key_created_at": "1799000000.0",
    "rotation_phase": "verified",
    "rotation_id": "9a8b7c6d5e4f",
    "rotation_started": "1800000050.5",
    "pending_key": "sk-pending-secretvalue",
    "pending_key_id": "key_42",
    "previous_key_id": "key_40",
    "previous_retire_at": "1800086400.0",
    "previous_version": "13",
    "waiting_consumers": '["approle/reporting", "kubernetes-prod-api/reader"]',
    "waiting_reason": "the file audit source is down",
    "rotation_failures": "1",
    "verify_failures": "3",
    "rotation_error": "billing: probe answered HTTP 500",
    "rotation_retry_at": "1800000200.0",
}


def revealed(data: dict[str, str | Secret]) -> dict[str, str]:
    return {k: v.reveal() if isinstance(v, Secret) else v for k, v in data.items()}


def test_a_record_in_todays_format_decodes_into_its_parts() -> None:
    state = CredentialState.from_data(RECORD, "reporting")
    assert state.lease == LeaseRecord(owner="host-b", until=1800000130.5)
    assert state.refresh == RefreshTokenRecord(
        token=Secret("rt-held-secretvalue"),
        in_flight="5f2c9a1b7d3e4f60",
        burned=Secret("rt-burned-secretvalue"),
        input_fingerprint=FINGERPRINT,
        refused_at=1800000000.25,
    )
    assert state.token == TokenRecord(
        issued_at=1800000100.123456,
        expires_at=1800003700.0,
        scope="projects:read users:read",
        published_version=14,
        writer="host-a",
        last_success=1800000101.75,
        last_error="reporting: HTTP 503, retry after 5s",
        consecutive_failures=2,
        next_due=1800002500.0,
        phase="failing",
    )
    assert state.rotation == RotationJournal(
        key=Secret("sk-current-secretvalue"),
        key_id="key_41",
        key_created_at=1799000000.0,
        phase="verified",
        id="9a8b7c6d5e4f",
        started=1800000050.5,
        pending_key=Secret("sk-pending-secretvalue"),
        pending_key_id="key_42",
        previous_key_id="key_40",
        previous_retire_at=1800086400.0,
        previous_version=13,
        waiting_consumers=("approle/reporting", "kubernetes-prod-api/reader"),
        waiting_reason="the file audit source is down",
        failures=1,
        verify_failures=3,
        error="billing: probe answered HTTP 500",
        retry_at=1800000200.0,
    )


def test_a_record_in_todays_format_is_written_back_exactly() -> None:
    data = CredentialState.from_data(RECORD, "reporting").to_data()
    assert revealed(data) == RECORD
    secrets = {"refresh_token", "burned_refresh_token", "key", "pending_key"}
    assert {k for k, v in data.items() if isinstance(v, Secret)} == secrets


def test_an_empty_record_is_written_as_today() -> None:
    assert CredentialState().to_data() == {
        "consecutive_failures": "0",
        "phase": "pending",
        "rotation_phase": "idle",
        "rotation_failures": "0",
        "verify_failures": "0",
    }
    assert CredentialState.from_data({}, "reporting") == CredentialState()


def test_times_round_trip_exactly() -> None:
    state = CredentialState(token=TokenRecord(next_due=1800000000.123456789, issued_at=0.1 + 0.2))
    again = CredentialState.from_data(state.to_data(), "reporting")
    assert again.token.next_due == 1800000000.123456789
    assert again.token.issued_at == 0.1 + 0.2


def test_an_empty_secret_reads_as_none() -> None:
    state = CredentialState.from_data({"refresh_token": "", "key": ""}, "reporting")
    assert state.refresh.token is None and state.rotation.key is None


def test_a_field_keyturn_does_not_know_is_ignored() -> None:
    state = CredentialState.from_data(
        {**RECORD, "written_by_a_newer_keyturn": "x", "phase": "ok"}, "reporting"
    )
    assert state.token.phase == "ok"
    assert "written_by_a_newer_keyturn" not in state.to_data()


@pytest.mark.parametrize(
    ("field", "raw", "what"),
    [
        ("lease_until", "soon", "is not a timestamp"),
        ("next_due", "inf", "is not a finite timestamp"),
        ("expires_at", "nan", "is not a finite timestamp"),
        ("published_version", "-1", "is not a whole number"),
        ("consecutive_failures", "²", "is not a whole number"),
        ("rotation_failures", "1.0", "is not a whole number"),
        ("previous_version", "v13", "is not a whole number"),
        ("waiting_consumers", "approle/secretvalue", "is not a JSON array of names"),
        ("waiting_consumers", '[1, "secretvalue"]', "is not a JSON array of names"),
        ("refresh_token_input_fingerprint", "rt-secretvalue", "is not a fingerprint"),
        ("phase", "refreshing-secretvalue", "is not a known phase (pending, ok, failing, expired)"),
        (
            "rotation_phase",
            "publishing-secretvalue",
            "is not a known phase (idle, creating, pending, verified, retiring)",
        ),
        ("writer", 7, "is not a string"),
    ],
)
def test_a_malformed_field_is_named_never_quoted(field: str, raw: object, what: str) -> None:
    with pytest.raises(VaultDataError) as caught:
        CredentialState.from_data({**RECORD, field: raw}, "reporting")
    message = str(caught.value)
    assert f"private state field {field!r} {what}" in message
    assert "reporting" in message
    assert "secretvalue" not in message
    assert caught.value.__cause__ is None  # no exception whose text quotes the value


def test_each_stored_field_is_declared_once() -> None:
    keys = [stored.key for stored in FIELDS]
    assert len(keys) == len(set(keys))
    declared = {(stored.part, stored.attribute) for stored in FIELDS}
    assert len(declared) == len(FIELDS)
    parts = {part.name for part in dataclasses.fields(CredentialState)}
    every = {
        (part, attribute.name)
        for part, record in (
            ("lease", LeaseRecord),
            ("refresh", RefreshTokenRecord),
            ("token", TokenRecord),
            ("rotation", RotationJournal),
            ("own", KindRecord),
        )
        for attribute in dataclasses.fields(record)
    }
    assert parts == {"lease", "refresh", "token", "rotation", "own"}
    assert declared == every


def test_the_stored_fields_are_the_documented_ones() -> None:
    """docs/vault.md lists the record's fields for operators; keyturn writes exactly those."""
    section = VAULT_DOCS.split("## What only keyturn reads", 1)[1].split("\n## ", 1)[0]
    documented = {
        name
        for row in section.splitlines()
        if row.startswith("| `")
        for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])
    }
    assert documented == {stored.key for stored in FIELDS}


def test_burning_keeps_the_token_to_revoke_and_never_sends_it() -> None:
    held = RefreshTokenRecord(
        token=Secret("rt-1"), in_flight="attempt", input_fingerprint=fingerprint(Secret("x"))
    )
    burned = held.burn()
    assert (burned.token, burned.in_flight, burned.burned) == (None, None, Secret("rt-1"))
    assert burned.input_fingerprint == held.input_fingerprint
    # an earlier burned token stays the one to revoke when none is held
    assert RefreshTokenRecord(burned=Secret("rt-0")).burn().burned == Secret("rt-0")


def test_a_lease_is_held_until_it_ends() -> None:
    lease = LeaseRecord(owner="host-b", until=100.0)
    assert lease.held(99.0) and not lease.held(100.0)
    assert lease.held_by_other("host-a", 99.0) and not lease.held_by_other("host-b", 99.0)
    assert not LeaseRecord().held(0.0)
