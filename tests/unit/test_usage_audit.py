"""Parsing Vault/OpenBao audit lines: entries recorded from a real OpenBao, and bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest

from keyturn.usage.audit import (
    MAX_LINE,
    NOT_A_READ,
    NOT_AN_ENTRY,
    NOT_JSON,
    NOT_WATCHED,
    OTHER_MOUNT,
    REQUEST,
    TOO_LONG,
    TRUNCATED,
    AuditParser,
    AuditRead,
    AuditWrite,
    Identity,
    consumer_label,
)
from keyturn.usage.layout import Layout, Watched
from keyturn_devkit.dev import audit_recorded as recorded
from keyturn_devkit.dev.audit import Reader, line, read_entries, rfc3339_nano

LAYOUT = Layout(
    [Watched("app1", "acme", "apps/app1/acme")],
    inputs=[("app1", "secret", "keyturn/inputs/app1"), ("legacy", "kv1", "inputs/legacy")],
    kv_versions={"kv1": 1},
)


def raw(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode()


@pytest.fixture
def parser() -> AuditParser:
    return AuditParser(LAYOUT)


def test_a_recorded_approle_read_is_counted_from_its_response_with_the_version(
    parser: AuditParser,
) -> None:
    assert parser.parse(raw(recorded.APPROLE_READ_REQUEST)) == REQUEST
    read = parser.parse(raw(recorded.APPROLE_READ_RESPONSE))
    assert read == AuditRead(
        time=pytest.approx(1795483628.545920166),  # type: ignore[arg-type]
        target="published",
        credential="app1",
        mount="secret",
        path="apps/app1/acme",
        consumer="approle/app1",
        entity_id="1f3065db-51ab-3b1d-2597-9ba7ec575bb8",
        remote_address="127.0.0.1",
        version=2,
        ok=True,
    )
    assert parser.raw_values == 0  # the recorded log is HMAC'd


def test_a_token_without_a_role_is_named_by_its_display_name(parser: AuditParser) -> None:
    read = parser.parse(raw(recorded.TOKEN_READ_RESPONSE))
    assert isinstance(read, AuditRead)
    assert (read.consumer, read.entity_id, read.version) == ("token-ci-runner", "", 2)


def test_a_refused_read_of_keyturns_state_is_a_read_that_got_nothing(parser: AuditParser) -> None:
    read = parser.parse(raw(recorded.DENIED_STATE_READ_RESPONSE))
    assert isinstance(read, AuditRead)
    assert (read.target, read.credential, read.path, read.ok) == (
        "state",
        "app1",
        "keyturn/state/app1",
        False,
    )


def test_a_recorded_write_gives_the_version_created(parser: AuditParser) -> None:
    write = parser.parse(raw(recorded.ROOT_WRITE_RESPONSE))
    assert isinstance(write, AuditWrite)
    assert (write.action, write.version, write.ok, write.consumer) == ("write", 3, True, "token")


def test_a_metadata_read_is_not_a_read_of_the_value(parser: AuditParser) -> None:
    assert parser.parse(raw(recorded.METADATA_READ_RESPONSE)) == NOT_A_READ


def test_the_synthetic_entries_parse_like_the_recorded_ones(parser: AuditParser) -> None:
    reader = Reader(role="app1", entity_id="e-1", remote_address="10.1.2.3")
    request, response = read_entries(reader, "apps/app1/acme", at=1795483628.5, version=7)
    assert set(response) == set(recorded.APPROLE_READ_RESPONSE)
    assert parser.parse(line(request)) == REQUEST
    read = parser.parse(line(response))
    assert isinstance(read, AuditRead)
    assert (read.consumer, read.version, read.remote_address, read.time) == (
        "approle/app1",
        7,
        "10.1.2.3",
        1795483628.5,
    )


@pytest.mark.parametrize(
    ("path", "operation", "action"),
    [
        ("data/apps/app1/acme", "create", "write"),
        ("data/apps/app1/acme", "update", "write"),
        ("data/apps/app1/acme", "patch", "patch"),
        ("data/apps/app1/acme", "delete", "delete"),
        ("delete/apps/app1/acme", "update", "delete"),
        ("undelete/apps/app1/acme", "update", "undelete"),
        ("destroy/apps/app1/acme", "update", "destroy"),
        ("metadata/apps/app1/acme", "update", "metadata"),
        ("metadata/apps/app1/acme", "delete", "destroy"),
    ],
)
def test_every_kind_of_change_of_a_published_path_is_a_write(
    parser: AuditParser, path: str, operation: str, action: str
) -> None:
    entry = json.loads(raw(recorded.ROOT_WRITE_RESPONSE))
    entry["request"].update(path=f"secret/{path}", operation=operation)
    write = parser.parse(raw(entry))
    assert isinstance(write, AuditWrite)
    assert write.action == action
    assert write.version == (3 if path.startswith("data/") else None)


def test_a_refused_write_is_reported_as_not_carried_out(parser: AuditParser) -> None:
    entry = json.loads(raw(recorded.ROOT_WRITE_RESPONSE))
    entry["error"] = "1 error occurred:\n\t* permission denied\n\n"
    write = parser.parse(raw(entry))
    assert isinstance(write, AuditWrite)
    assert not write.ok


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"path": "secret/data/apps/other/acme"}, NOT_WATCHED),
        ({"path": "secret/data/keyturn/statefoo"}, NOT_WATCHED),
        ({"operation": "list", "path": "secret/metadata/apps/app1/acme"}, NOT_A_READ),
        ({"path": "secret/subkeys/apps/app1/acme"}, NOT_A_READ),
        ({"mount_type": "transit"}, OTHER_MOUNT),
        ({"namespace": {"id": "x1", "path": "team/"}}, OTHER_MOUNT),
    ],
)
def test_entries_keyturn_does_not_watch_are_skipped_by_reason(
    parser: AuditParser, change: dict[str, Any], reason: str
) -> None:
    entry = json.loads(raw(recorded.APPROLE_READ_RESPONSE))
    entry["request"].update(change)
    assert parser.parse(raw(entry)) == reason


def test_another_mount_is_skipped_before_decoding(parser: AuditParser) -> None:
    text = raw(recorded.APPROLE_READ_RESPONSE).replace(b'"secret/', b'"other/')
    assert parser.parse(text) == OTHER_MOUNT
    assert parser.parse(text[: len(text) // 2]) == OTHER_MOUNT  # never decoded: not truncated


def test_input_paths_and_keyturns_state_are_classified_with_their_credential() -> None:
    parser = AuditParser(LAYOUT)
    entry = json.loads(raw(recorded.APPROLE_READ_RESPONSE))
    entry["request"]["path"] = "secret/data/keyturn/inputs/app1"
    read = parser.parse(raw(entry))
    assert isinstance(read, AuditRead)
    assert (read.target, read.credential) == ("input", "app1")


def test_a_kv_version_1_input_mount_has_no_data_prefix() -> None:
    parser = AuditParser(LAYOUT)
    entry = json.loads(raw(recorded.APPROLE_READ_RESPONSE))
    entry["request"].update(mount_point="kv1/", path="kv1/inputs/legacy")
    entry["response"]["mount_point"] = "kv1/"
    entry["response"]["data"] = {"client_secret": "hmac-sha256:00"}
    read = parser.parse(raw(entry))
    assert isinstance(read, AuditRead)
    assert (read.target, read.credential, read.version, read.ok) == ("input", "legacy", None, True)


def test_a_namespace_is_matched_when_keyturn_works_in_one() -> None:
    parser = AuditParser(Layout([Watched("app1", "acme", "apps/app1/acme")], namespace="team"))
    entry = json.loads(raw(recorded.APPROLE_READ_RESPONSE))
    assert parser.parse(raw(entry)) == OTHER_MOUNT
    entry["request"]["namespace"] = {"id": "x1", "path": "team/"}
    assert isinstance(parser.parse(raw(entry)), AuditRead)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (b"", NOT_JSON),
        (b"hello", NOT_JSON),
        (b"\xff\xfe{}", NOT_JSON),
        (b"[1, 2]", NOT_JSON),
        (b'{"type": "response"}', NOT_AN_ENTRY),
        (b'{"time": "x", "type": "response", "request": []}', NOT_AN_ENTRY),
        (b'{"type": "other"}', NOT_AN_ENTRY),
        (b'{"type": "request"}', REQUEST),
        (b"[" * 100_000, NOT_JSON),
        (b'{"a":' * 100_000, NOT_JSON),
    ],
)
def test_garbage_is_a_reason_never_an_exception(
    parser: AuditParser, text: bytes, reason: str
) -> None:
    assert parser.parse(text) == reason


def test_a_line_cut_short_is_truncated(parser: AuditParser) -> None:
    text = raw(recorded.APPROLE_READ_RESPONSE)
    assert parser.parse(text[:1000]) == TRUNCATED


def test_a_bad_time_is_not_an_entry(parser: AuditParser) -> None:
    entry = json.loads(raw(recorded.APPROLE_READ_RESPONSE))
    entry["time"] = "yesterday"
    assert parser.parse(raw(entry)) == NOT_AN_ENTRY


def test_a_line_over_the_cap_is_too_long() -> None:
    parser = AuditParser(LAYOUT, max_line=100)
    assert parser.parse(raw(recorded.APPROLE_READ_RESPONSE)) == TOO_LONG
    assert MAX_LINE == 1 << 20


def test_the_audit_devices_prefix_is_stripped() -> None:
    parser = AuditParser(LAYOUT, prefix=b"vault-audit: ")
    read = parser.parse(b"vault-audit: " + raw(recorded.APPROLE_READ_RESPONSE))
    assert isinstance(read, AuditRead)


def test_a_log_with_raw_values_is_noticed_and_its_values_are_not_kept() -> None:
    parser = AuditParser(LAYOUT)
    entry = json.loads(raw(recorded.APPROLE_READ_RESPONSE))
    entry["response"]["data"]["data"] = {"api_key": "k-live-123", "n": 3}
    read = parser.parse(raw(entry))
    assert parser.raw_values == 1
    assert "k-live-123" not in repr(read)


def test_times_with_any_precision_parse_to_epoch_seconds(parser: AuditParser) -> None:
    for epoch in (1795483628.0, 1795483628.5, 1795483628.123456789, 1795483629.999999999):
        _, response = read_entries(Reader(role="app1"), "apps/app1/acme", at=epoch)
        read = parser.parse(line(response))
        assert isinstance(read, AuditRead)
        assert read.time == pytest.approx(epoch, abs=1e-6)
    assert rfc3339_nano(1795483628.0) == "2026-11-24T01:27:08Z"
    entry = json.loads(raw(recorded.APPROLE_READ_RESPONSE))
    entry["time"] = "2026-11-24T02:27:08.5+01:00"
    read = parser.parse(raw(entry))
    assert isinstance(read, AuditRead)
    assert read.time == 1795483628.5


@pytest.mark.parametrize(
    ("display_name", "metadata", "entity_id", "label"),
    [
        ("approle", {"role_name": "reporting"}, "e", "approle/reporting"),
        ("kubernetes-prod-api", {"role": "reader"}, "", "kubernetes-prod-api/reader"),
        ("token-ci", None, "", "token-ci"),
        ("", None, "e-9", "e-9"),
        (None, None, None, "unknown"),
        ("bad\nname\x7f", {}, "", "bad?name?"),
        ("x" * 500, {}, "", "x" * 128),
    ],
)
def test_consumer_labels(
    display_name: object, metadata: object, entity_id: object, label: str
) -> None:
    assert consumer_label(display_name, metadata, entity_id) == label


def test_keyturns_identity_from_lookup_self_matches_its_audit_entries() -> None:
    own = Identity.from_lookup(
        {"display_name": "approle", "meta": {"role_name": "app1"}, "entity_id": "e-1"}
    )
    assert own.matches("approle/app1", "")
    assert own.matches("anything", "e-1")
    assert not own.matches("approle/app2", "e-2")
    assert not Identity.from_lookup({"display_name": "token"}).matches("other", "")
