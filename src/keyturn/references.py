"""Secret references: where a secret lives, never the secret itself (`vault:`, `env:`, `file:`).

`parse_reference` turns text into a `SecretRef`, `ReferenceResolver` turns that into a
`Secret`; Vault goes through an injected `VaultFieldReader`, so no network I/O here. A
reference's text is not secret and errors name it, never its value. `inline` wraps a
non-secret literal (a client id) and is never parsed. docs/configuration.md#secret-references.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from keyturn.errors import SecretReferenceError
from keyturn.secret import Secret

Scheme = Literal["vault", "env", "file", "inline"]

REFERENCE_SCHEMES: tuple[str, ...] = ("vault", "env", "file")
REFERENCE_FORMS = "vault:<mount>/<path>#<field>, env:NAME or file:/absolute/path"

# One segment of a Vault path (mount or KV path); also used by the configuration's KV paths.
KV_SEGMENT = re.compile(r"[A-Za-z0-9_.@+=-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class SecretRef:
    """Where a secret lives.

    `location` is the text after the scheme: the variable name for `env`, the absolute path
    for `file`, `<mount>/<path>#<field>` for `vault`, the literal value for `inline`.
    For `vault` references `mount`, `path` and `field` hold the parts; for `file`, `path`
    holds the file path; otherwise they are empty.
    """

    scheme: Scheme
    location: str
    mount: str = ""
    path: str = ""
    field: str = ""

    @classmethod
    def env(cls, name: str) -> SecretRef:
        return cls("env", name)

    @classmethod
    def file(cls, path: str) -> SecretRef:
        return cls("file", path, path=path)

    @classmethod
    def vault(cls, mount: str, path: str, field: str) -> SecretRef:
        # Interned: 10,000 credentials repeat the same mount and field names, and each of
        # their two references (client_id, client_secret) the same path.
        mount, path, field = sys.intern(mount), sys.intern(path), sys.intern(field)
        return cls("vault", f"{mount}/{path}#{field}", mount=mount, path=path, field=field)

    @classmethod
    def inline(cls, value: str) -> SecretRef:
        """A literal, non-secret value (a client id) that resolves to itself."""
        return cls("inline", value)

    @property
    def is_inline(self) -> bool:
        return self.scheme == "inline"

    def __str__(self) -> str:
        return self.location if self.scheme == "inline" else f"{self.scheme}:{self.location}"


def looks_like_reference(text: str) -> bool:
    """Whether `text` starts with a reference scheme (`vault:`, `env:`, `file:`)."""
    scheme, sep, _ = text.partition(":")
    return bool(sep) and scheme in REFERENCE_SCHEMES


def parse_reference(text: str) -> SecretRef:
    """Parse `vault:…`, `env:…` or `file:…`.

    Raises ValueError with the reason. The reason never repeats the text: a malformed
    reference may be a secret pasted in the wrong place.
    """
    scheme, sep, rest = text.partition(":")
    if not sep or scheme not in REFERENCE_SCHEMES:
        raise ValueError(f"not a reference; expected {REFERENCE_FORMS}")
    if scheme == "env":
        if not _ENV_NAME.fullmatch(rest):
            raise ValueError(
                "env: needs a variable name (letters, digits and _, not starting with a "
                "digit), e.g. env:CLIENT_SECRET"
            )
        return SecretRef.env(rest)
    if scheme == "file":
        if not rest.startswith("/") or "\x00" in rest or rest.strip() != rest:
            raise ValueError(
                "file: needs an absolute path, e.g. "
                "file:/run/credentials/keyturn.service/client_secret"
            )
        return SecretRef.file(rest)
    return _parse_vault(rest)


def _parse_vault(rest: str) -> SecretRef:
    location, sep, field = rest.partition("#")
    if not sep or not field:
        raise ValueError(
            "vault: needs #<field> after the path, e.g. vault:secret/app/x#client_secret"
        )
    if not KV_SEGMENT.fullmatch(field):
        raise ValueError("vault: the field after # may use letters, digits and _ . @ + = -")
    mount, slash, path = location.partition("/")
    if not slash or not mount or not path:
        raise ValueError(
            "vault: needs <mount>/<path> before #, e.g. vault:secret/keyturn/inputs/app#field"
        )
    for segment in (mount, *path.split("/")):
        if segment in (".", "..") or not KV_SEGMENT.fullmatch(segment):
            raise ValueError(
                "vault: each path segment must be non-empty, not . or .., and use letters, "
                "digits and _ . @ + = -"
            )
    return SecretRef.vault(mount, path, field)


class VaultFieldReader(Protocol):
    """Reads fields of a KV v2 secret; implemented by keyturn's Vault store."""

    async def read_fields(self, mount: str, path: str, fields: Sequence[str]) -> dict[str, Secret]:
        """The fields' values, in one read; raises a `KeyturnError` naming the reference if one
        cannot be read."""
        ...


def resolve_local(ref: SecretRef, environ: Mapping[str, str]) -> Secret:
    """Resolve an `env`, `file` or `inline` reference. Raises SecretReferenceError."""
    if ref.scheme == "inline":
        return Secret(ref.location)
    if ref.scheme == "env":
        value = environ.get(ref.location)
        if value is None:
            raise SecretReferenceError(f"{ref}: environment variable {ref.location} is not set")
        if not value:
            raise SecretReferenceError(f"{ref}: environment variable {ref.location} is empty")
        return Secret(value)
    if ref.scheme == "file":
        return _read_file(ref)
    raise SecretReferenceError(f"{ref}: a vault reference needs a Vault reader to resolve")


def _read_file(ref: SecretRef) -> Secret:
    try:
        data = Path(ref.path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SecretReferenceError(f"{ref}: cannot read the file: {reason}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # `from None`: the decode error carries the file's bytes.
        raise SecretReferenceError(f"{ref}: the file is not UTF-8 text") from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise SecretReferenceError(f"{ref}: the file is empty")
    return Secret(text)


async def resolve(
    ref: SecretRef, *, environ: Mapping[str, str], vault: VaultFieldReader | None
) -> Secret:
    """Resolve any reference; `vault` references are read through `vault`."""
    return (await resolve_all((ref,), environ=environ, vault=vault))[0]


async def resolve_all(
    refs: Sequence[SecretRef], *, environ: Mapping[str, str], vault: VaultFieldReader | None
) -> list[Secret]:
    """Resolve several references, in order, reading each Vault path once (a credential's
    client_id and client_secret usually live side by side in one secret)."""
    by_path: dict[tuple[str, str], list[str]] = {}
    for ref in refs:
        if ref.scheme == "vault":
            by_path.setdefault((ref.mount, ref.path), []).append(ref.field)
    read: dict[tuple[str, str], dict[str, Secret]] = {}
    for (mount, path), wanted in by_path.items():
        if vault is None:
            first = next(ref for ref in refs if ref.scheme == "vault")
            raise SecretReferenceError(f"{first}: a vault reference needs a Vault reader")
        read[(mount, path)] = await vault.read_fields(mount, path, wanted)
    values: list[Secret] = []
    for ref in refs:
        if ref.scheme != "vault":
            values.append(resolve_local(ref, environ))
            continue
        value = read[(ref.mount, ref.path)][ref.field]
        if not value:
            raise SecretReferenceError(f"{ref}: the Vault field is empty")
        values.append(value)
    return values


class ReferenceResolver:
    """Resolves references against one environment and one (optional) Vault reader."""

    def __init__(self, environ: Mapping[str, str], vault: VaultFieldReader | None = None) -> None:
        self._environ = environ
        self._vault = vault

    async def resolve(self, ref: SecretRef) -> Secret:
        return await resolve(ref, environ=self._environ, vault=self._vault)

    async def resolve_all(self, refs: Sequence[SecretRef]) -> list[Secret]:
        return await resolve_all(refs, environ=self._environ, vault=self._vault)

    def resolve_local(self, ref: SecretRef) -> Secret:
        return resolve_local(ref, self._environ)
