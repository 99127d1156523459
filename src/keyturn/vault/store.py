"""The Vault interface the rest of keyturn codes against: `KvStore` and its value types.

Satisfied by `VaultStore` (hvac) and `keyturn.testing.vault.FakeVaultStore` (memory); one
contract suite runs over both. Values come back as plain `str` (callers wrap secret fields in
`Secret`); `consistent=True` reads reflect every acknowledged write, even on a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from keyturn.errors import SecretReferenceError, VaultDataError
from keyturn.secret import Secret


@dataclass(frozen=True, slots=True)
class KvEntry:
    """The latest live version of a KV v2 secret."""

    path: str  # relative to the mount
    data: Mapping[str, str]
    version: int
    custom_metadata: Mapping[str, str]
    created_time: float  # epoch seconds of this version


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """One version in a secret's history; deleted versions can be undeleted, destroyed cannot."""

    created_time: float
    deletion_time: float | None
    destroyed: bool


@dataclass(frozen=True, slots=True)
class KvMetadata:
    """A secret's metadata: what detectors compare against what keyturn last wrote."""

    path: str
    current_version: int
    oldest_version: int  # 0 until old versions have been pruned (KV v2 keeps max_versions)
    custom_metadata: Mapping[str, str]
    versions: Mapping[int, VersionInfo]
    created_time: float
    updated_time: float


@runtime_checkable
class KvStore(Protocol):
    """Async access to one KV v2 mount (plus `read_fields` on any mount, for references)."""

    async def read(self, path: str, *, consistent: bool = False) -> KvEntry | None:
        """The latest version; None if never written or the latest version is deleted/destroyed.

        `consistent=True`: read from where the latest acknowledged write is visible (a
        cluster's active node), for an answer keyturn will act on."""
        ...

    async def write(
        self,
        path: str,
        data: Mapping[str, str | Secret],
        *,
        cas: int | None,
        custom_metadata: Mapping[str, str] | None = None,
    ) -> int:
        """Write a new version and return its number. `cas=0`: the path must not exist;
        `cas=N`: the current version must be N (a proven loss raises `VaultCasConflict`);
        `None`: unconditional. `custom_metadata` replaces the path's custom metadata in a
        second call, so a failure there leaves the new version without it."""
        ...

    async def read_metadata(self, path: str, *, consistent: bool = False) -> KvMetadata | None:
        """The metadata and version history; None if the path has no metadata at all.
        `consistent` as for `read`."""
        ...

    async def delete_all(self, path: str) -> None:
        """Delete the metadata and every version (locks, state cleanup); no error if absent."""
        ...

    async def list_keys(self, prefix: str, *, consistent: bool = False) -> list[str]:
        """The names directly under `prefix` (KV v2 LIST; a sub-folder ends with `/`), [] if
        nothing is there. One call for a whole prefix: the daemon's start learns which state
        records exist without a read per credential."""
        ...

    async def list_metadata(
        self, folder: str, *, after: str = "", limit: int, consistent: bool = False
    ) -> list[tuple[str, KvMetadata | None]] | None:
        """The names directly under `folder` with each one's metadata (None for a sub-folder),
        in name order: at most `limit`, starting after the name `after`. One call for a page of
        a whole folder: the watcher's sweep reads many published paths without a read each.

        OpenBao's `detailed-metadata` LIST. None when the answer is 404: nothing is there, or
        the server has no such endpoint (HashiCorp Vault); callers then read path by path.
        `consistent` as for `read`."""
        ...

    async def read_fields(
        self, mount: str, path: str, fields: Sequence[str], *, consistent: bool = False
    ) -> dict[str, Secret]:
        """String fields of the secret at `<mount>/<path>` on any KV v2 mount, in one read
        (`consistent` as for `read`, e.g. when re-reading an input that was just refused).

        A missing secret or field raises `SecretReferenceError`; a non-string value
        `VaultDataError`. Both name mount, path and field (`vault:<mount>/<path>#<field>`),
        never the value.
        """
        ...

    async def capabilities(self, paths: Sequence[str]) -> Mapping[str, frozenset[str]]:
        """Our token's capabilities on full API paths (e.g. `secret/data/apps/x`)."""
        ...

    async def health(self) -> None:
        """Return if Vault answers and our token is valid; else VaultUnavailable/VaultAuthError."""
        ...

    async def close(self) -> None:
        """Release threads and connections; the store is unusable afterwards."""
        ...


def validate_api_path(path: str) -> str:
    """A full API path for `capabilities`: a path, or a folder as a LIST names it (a trailing
    `/`: Vault checks a LIST against the folder's path with its slash)."""
    validate_path(path.removesuffix("/") if path.endswith("/") else path)
    return path


def validate_path(path: str, *, what: str = "path") -> str:
    """Return `path` if it is a clean relative Vault path, else raise ValueError.

    Rejects leading or trailing slashes, empty, `.` and `..` segments and control characters,
    so a path from configuration can never escape its mount or its prefix.
    """
    if not isinstance(path, str) or not path:
        raise ValueError(f"vault {what} must be a non-empty string")
    if path.startswith("/") or path.endswith("/"):
        raise ValueError(f"vault {what} {path!r} must not start or end with '/'")
    if any(ord(char) < 0x20 or char == "\x7f" for char in path):
        raise ValueError(f"vault {what} {path!r} contains a control character")
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"vault {what} {path!r} contains an empty, '.' or '..' segment")
    return path


def pick_fields(
    mount: str, path: str, values: Mapping[str, Any] | None, fields: Sequence[str]
) -> dict[str, Secret]:
    """`fields` of a secret's data as read (None: no secret there), or the error that names the
    first reference that cannot be resolved."""
    picked: dict[str, Secret] = {}
    for field in fields:
        reference = f"vault:{mount}/{path}#{field}"
        if values is None:
            raise SecretReferenceError(f"{reference}: no secret at {mount}/{path}")
        if field not in values:
            raise SecretReferenceError(f"{reference}: the secret has no field {field!r}")
        value = values[field]
        if not isinstance(value, str):
            raise VaultDataError(f"{reference}: field {field!r} is not a string", path=path)
        picked[field] = Secret(value)
    return picked


def reveal_data(path: str, data: Mapping[str, str | Secret]) -> dict[str, str]:
    """The wire form of `write` data: `Secret`s revealed, anything but str rejected."""
    wire: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"vault write to {path}: field names must be non-empty strings")
        if isinstance(value, Secret):
            wire[key] = value.reveal()
        elif isinstance(value, str):
            wire[key] = value
        else:
            raise TypeError(
                f"vault write to {path}: field {key!r} must be str or Secret, "
                f"not {type(value).__name__}"
            )
    return wire
