"""Secret references: parsing, text form, and resolution (env, file, a fake Vault reader)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from keyturn.errors import SecretReferenceError, VaultPermissionDenied
from keyturn.references import (
    ReferenceResolver,
    SecretRef,
    looks_like_reference,
    parse_reference,
    resolve,
    resolve_local,
)
from keyturn.secret import Secret


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("env:VAULT_TOKEN", SecretRef("env", "VAULT_TOKEN")),
        ("env:_x1", SecretRef("env", "_x1")),
        (
            "file:/run/credentials/keyturn.service/cs",
            SecretRef.file("/run/credentials/keyturn.service/cs"),
        ),
        (
            "vault:secret/keyturn/inputs/reporting#client_secret",
            SecretRef(
                "vault",
                "secret/keyturn/inputs/reporting#client_secret",
                "secret",
                "keyturn/inputs/reporting",
                "client_secret",
            ),
        ),
        ("vault:kv/a#f", SecretRef.vault("kv", "a", "f")),
    ],
)
def test_parse_valid_references(text: str, expected: SecretRef) -> None:
    ref = parse_reference(text)
    assert ref == expected
    assert str(ref) == text
    assert looks_like_reference(text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("hunter2", "not a reference; expected vault:<mount>/<path>#<field>"),
        ("https://x", "not a reference"),
        ("Env:X", "not a reference"),
        ("env:", "env: needs a variable name"),
        ("env:1ABC", "env: needs a variable name"),
        ("env:A-B", "env: needs a variable name"),
        ("file:", "file: needs an absolute path"),
        ("file:relative/x", "file: needs an absolute path"),
        ("file:/x ", "file: needs an absolute path"),
        ("vault:secret/x", "vault: needs #<field> after the path"),
        ("vault:secret/x#", "vault: needs #<field> after the path"),
        ("vault:secret#f", "vault: needs <mount>/<path> before #"),
        ("vault:/secret/x#f", "vault: needs <mount>/<path> before #"),
        ("vault:secret/#f", "vault: needs <mount>/<path> before #"),
        ("vault:secret/a//b#f", "each path segment must be non-empty"),
        ("vault:secret/../b#f", "not . or .."),
        ("vault:secret/a b#f", "each path segment"),
        ("vault:secret/a#f#g", "the field after # may use"),
    ],
)
def test_parse_invalid_references(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=r".") as caught:
        parse_reference(text)
    message = str(caught.value)
    assert reason in message
    # A malformed reference may be a pasted secret: the reason never repeats the text.
    assert text not in message or text in ("env:", "file:")


def test_inline_values_resolve_to_themselves_and_are_not_references() -> None:
    ref = SecretRef.inline("reporting-app")
    assert ref.is_inline
    assert str(ref) == "reporting-app"
    assert resolve_local(ref, {}).reveal() == "reporting-app"
    assert not looks_like_reference("reporting-app")


def test_env_reference() -> None:
    secret = resolve_local(SecretRef.env("CS"), {"CS": "s3cret"})
    assert isinstance(secret, Secret)
    assert secret.reveal() == "s3cret"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, "env:CS: environment variable CS is not set"),
        ({"CS": ""}, "env:CS: environment variable CS is empty"),
    ],
)
def test_env_reference_errors(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SecretReferenceError) as caught:
        resolve_local(SecretRef.env("CS"), environ)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"s3cret\n", "s3cret"),
        (b"s3cret", "s3cret"),
        (b"s3cret\r\n", "s3cret"),
        (b"s3cret\n\n", "s3cret\n"),  # only one newline is stripped
        (b"  s3cret  \n", "  s3cret  "),
    ],
)
def test_file_reference_strips_one_trailing_newline(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "cs"
    path.write_bytes(content)
    assert resolve_local(parse_reference(f"file:{path}"), {}).reveal() == expected


def test_file_reference_errors_name_the_reference_not_the_value(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(SecretReferenceError) as caught:
        resolve_local(SecretRef.file(str(missing)), {})
    assert str(caught.value) == f"file:{missing}: cannot read the file: No such file or directory"

    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(SecretReferenceError, match="the file is empty"):
        resolve_local(SecretRef.file(str(empty)), {})

    binary = tmp_path / "binary"
    binary.write_bytes(b"s3cret\xff\xfe")
    with pytest.raises(SecretReferenceError) as caught:
        resolve_local(SecretRef.file(str(binary)), {})
    assert str(caught.value) == f"file:{binary}: the file is not UTF-8 text"
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__

    with pytest.raises(SecretReferenceError, match="cannot read the file"):
        resolve_local(SecretRef.file(str(tmp_path)), {})  # a directory


def test_vault_reference_needs_a_reader() -> None:
    with pytest.raises(SecretReferenceError, match="needs a Vault reader"):
        resolve_local(parse_reference("vault:secret/a#f"), {})


class FakeVault:
    """A `VaultFieldReader` over a dict: {(mount, path): {field: value}}."""

    def __init__(self, data: dict[tuple[str, str], dict[str, str]]) -> None:
        self.data = data
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []

    async def read_fields(self, mount: str, path: str, fields: Sequence[str]) -> dict[str, Secret]:
        self.calls.append((mount, path, tuple(fields)))
        try:
            return {field: Secret(self.data[(mount, path)][field]) for field in fields}
        except KeyError:
            raise VaultPermissionDenied("cannot read", path=f"{mount}/{path}") from None


async def test_resolve_reads_vault_references_through_the_reader() -> None:
    vault = FakeVault({("secret", "keyturn/inputs/r"): {"client_secret": "cs", "empty": ""}})
    ref = parse_reference("vault:secret/keyturn/inputs/r#client_secret")
    secret = await resolve(ref, environ={}, vault=vault)
    assert secret.reveal() == "cs"
    assert vault.calls == [("secret", "keyturn/inputs/r", ("client_secret",))]

    with pytest.raises(SecretReferenceError, match="the Vault field is empty"):
        await resolve(
            parse_reference("vault:secret/keyturn/inputs/r#empty"), environ={}, vault=vault
        )
    with pytest.raises(VaultPermissionDenied):  # the reader's own errors pass through
        await resolve(parse_reference("vault:secret/other#f"), environ={}, vault=vault)
    with pytest.raises(SecretReferenceError, match="needs a Vault reader"):
        await resolve(ref, environ={}, vault=None)


async def test_resolver_bundles_environment_and_reader(tmp_path: Path) -> None:
    (tmp_path / "sid").write_text("sid-value\n")
    vault = FakeVault({("kv", "app"): {"id": "vault-value"}})
    resolver = ReferenceResolver({"TOKEN": "env-value"}, vault)
    refs = ["env:TOKEN", f"file:{tmp_path / 'sid'}", "vault:kv/app#id"]
    values = [(await resolver.resolve(parse_reference(r))).reveal() for r in refs]
    assert values == ["env-value", "sid-value", "vault-value"]
    assert resolver.resolve_local(SecretRef.env("TOKEN")).reveal() == "env-value"
    assert (await resolver.resolve(SecretRef.inline("cid"))).reveal() == "cid"


async def test_references_to_one_vault_secret_are_read_once_and_kept_in_order() -> None:
    vault = FakeVault(
        {
            ("kv", "oauth/billing"): {"client_id": "cid", "client_secret": "cs"},
            ("kv", "o"): {"x": "1"},
        }
    )
    resolver = ReferenceResolver({"ID": "env-id"})
    refs = [
        parse_reference("vault:kv/oauth/billing#client_secret"),
        parse_reference("env:ID"),
        parse_reference("vault:kv/o#x"),
        parse_reference("vault:kv/oauth/billing#client_id"),
    ]
    values = await ReferenceResolver({"ID": "env-id"}, vault).resolve_all(refs)
    assert [v.reveal() for v in values] == ["cs", "env-id", "1", "cid"]
    assert vault.calls == [
        ("kv", "oauth/billing", ("client_secret", "client_id")),
        ("kv", "o", ("x",)),
    ]
    with pytest.raises(SecretReferenceError, match="needs a Vault reader"):
        await resolver.resolve_all(refs)


def test_references_are_frozen_and_hashable() -> None:
    ref = parse_reference("env:X")
    assert {ref: 1}[SecretRef.env("X")] == 1
    with pytest.raises(AttributeError):
        ref.location = "Y"  # type: ignore[misc]
