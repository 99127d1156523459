"""`FakeVaultStore`: an in-memory `KvStore` with KV v2's real semantics (versions,
check-and-set, `max_versions`, custom metadata, a glob `policy` that denies calls).

The contract suite runs against it and a real OpenBao, so it cannot drift. Test conveniences:
`fail_next`, `unavailable`, `detailed_listing`, `writes`, `external_write`,
`delete_versions`, `destroy_versions`, `reads` and `stale_by` (a lagging standby).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from keyturn.clock import Clock, SystemClock
from keyturn.errors import (
    VaultCasConflict,
    VaultPermissionDenied,
    VaultUnavailable,
)
from keyturn.secret import Secret
from keyturn.vault.store import (
    KvEntry,
    KvMetadata,
    KvStore,
    VersionInfo,
    pick_fields,
    reveal_data,
    validate_api_path,
    validate_path,
)


@dataclass(slots=True)
class _Version:
    data: dict[str, str]
    created_time: float
    deletion_time: float | None = None
    destroyed: bool = False


@dataclass(slots=True)
class _Record:
    created_time: float
    updated_time: float
    current_version: int = 0
    oldest_version: int = 0
    custom_metadata: dict[str, str] = field(default_factory=dict)
    versions: dict[int, _Version] = field(default_factory=dict)


class FakeVaultStore:
    """In-memory KV v2 on `mount` (and any other mount, for `read_fields`)."""

    def __init__(
        self,
        *,
        mount: str = "secret",
        clock: Clock | None = None,
        policy: Mapping[str, Iterable[str]] | None = None,
        max_versions: int = 10,
    ) -> None:
        self.mount = validate_path(mount, what="mount")
        self._clock = clock or SystemClock()
        self._policy = {p: frozenset(c) for p, c in policy.items()} if policy is not None else None
        self._max_versions = max_versions
        self._records: dict[tuple[str, str], _Record] = {}
        self._failures: list[BaseException] = []
        self._closed = False
        self.unavailable = False  # True: every call raises VaultUnavailable, as if Vault were down
        self.writes: list[tuple[str, int]] = []  # (path, version) of every write through the API
        # ("read" | "read_metadata" | "read_field", path, consistent) of every read.
        self.reads: list[tuple[str, str, bool]] = []
        # A lagging standby: reads without `consistent=True` on this store's mount answer as if
        # the last `stale_by` versions of each secret had not been written yet (custom metadata
        # excepted). Writes, check-and-set and consistent reads always see the current data.
        self.stale_by = 0
        self.authenticated = True
        # OpenBao lists a folder with each key's metadata (`detailed-metadata`); False answers
        # as HashiCorp Vault does (404), and callers read path by path.
        self.detailed_listing = True

    def __repr__(self) -> str:
        return f"FakeVaultStore(mount={self.mount!r}, paths={len(self._records)})"

    # -- test conveniences ------------------------------------------------------------------

    def with_policy(self, policy: Mapping[str, Iterable[str]]) -> FakeVaultStore:
        """Another client of the same fake Vault, whose token has only `policy`."""
        other = FakeVaultStore(mount=self.mount, clock=self._clock, policy=policy)
        other._records = self._records
        other._max_versions = self._max_versions
        other.detailed_listing = self.detailed_listing
        return other

    def fail_next(self, exc: BaseException) -> None:
        """The next store call raises `exc` (queue several by calling this several times)."""
        self._failures.append(exc)

    def external_write(
        self,
        path: str,
        data: Mapping[str, str],
        *,
        custom_metadata: Mapping[str, str] | None = None,
        mount: str | None = None,
    ) -> int:
        """Someone else writes (no CAS, not in `writes`); returns the new version."""
        record = self._new_version(mount or self.mount, validate_path(path), dict(data))
        if custom_metadata is not None:
            record.custom_metadata = dict(custom_metadata)
        return record.current_version

    def delete_versions(self, path: str, versions: Sequence[int] | None = None) -> None:
        """Soft-delete `versions` (default: the latest), as `kv delete` does."""
        record = self._records[(self.mount, path)]
        for number in versions or [record.current_version]:
            if number in record.versions:
                record.versions[number].deletion_time = self._clock.time()

    def destroy_versions(self, path: str, versions: Sequence[int]) -> None:
        """Destroy `versions` for good, as `kv destroy` does."""
        record = self._records[(self.mount, path)]
        for number in versions:
            if number in record.versions:
                record.versions[number].destroyed = True
                record.versions[number].data = {}

    # -- KvStore -----------------------------------------------------------------------------

    async def read(self, path: str, *, consistent: bool = False) -> KvEntry | None:
        self._enter("read", path)
        self.reads.append(("read", path, consistent))
        self._check(f"{self.mount}/data/{path}", "read", path)
        record = self._records.get((self.mount, path))
        number = self._visible(record, consistent)
        version = record.versions.get(number) if record else None
        if record is None or version is None or not _live(version):
            return None
        return KvEntry(
            path=path,
            data=dict(version.data),
            version=number,
            custom_metadata=dict(record.custom_metadata),
            created_time=version.created_time,
        )

    async def write(
        self,
        path: str,
        data: Mapping[str, str | Secret],
        *,
        cas: int | None,
        custom_metadata: Mapping[str, str] | None = None,
    ) -> int:
        self._enter("write", path)
        if cas is not None and (isinstance(cas, bool) or cas < 0):
            raise ValueError("cas must be None or a non-negative int")
        wire = reveal_data(path, data)
        record = self._records.get((self.mount, path))
        need = "update" if record is not None else "create"
        self._check(f"{self.mount}/data/{path}", need, path)
        current = record.current_version if record else 0
        if cas is not None and cas != current:
            raise VaultCasConflict(
                f"vault write (cas={cas}): check-and-set conflict", path=f"{self.mount}/{path}"
            )
        record = self._new_version(self.mount, path, wire)
        self.writes.append((path, record.current_version))
        if custom_metadata is not None:
            self._check(f"{self.mount}/metadata/{path}", "update", path)
            record.custom_metadata = dict(custom_metadata)
        return record.current_version

    async def read_metadata(self, path: str, *, consistent: bool = False) -> KvMetadata | None:
        self._enter("read metadata", path)
        self.reads.append(("read_metadata", path, consistent))
        self._check(f"{self.mount}/metadata/{path}", "read", path)
        return self._metadata(path, consistent)

    def _names(self, base: str) -> list[str]:
        """The names directly under `base` (ending in `/`), sub-folders with a trailing `/`."""
        names = set()
        for mount, path in self._records:
            if mount == self.mount and path.startswith(base):
                rest = path[len(base) :]
                names.add(rest.split("/", 1)[0] + "/" if "/" in rest else rest)
        return sorted(names)

    def _metadata(self, path: str, consistent: bool) -> KvMetadata | None:
        record = self._records.get((self.mount, path))
        if record is None:
            return None
        number = self._visible(record, consistent)
        if number <= 0 and record.current_version > 0:
            return None  # the lagging copy has not seen the secret yet
        return KvMetadata(
            path=path,
            current_version=number,
            oldest_version=record.oldest_version,
            custom_metadata=dict(record.custom_metadata),
            versions={
                n: VersionInfo(v.created_time, v.deletion_time, v.destroyed)
                for n, v in record.versions.items()
                if n <= number
            },
            created_time=record.created_time,
            updated_time=record.updated_time,
        )

    async def delete_all(self, path: str) -> None:
        self._enter("delete all versions", path)
        self._check(f"{self.mount}/metadata/{path}", "delete", path)
        self._records.pop((self.mount, path), None)

    async def list_keys(self, prefix: str, *, consistent: bool = False) -> list[str]:
        self._enter("list", prefix)
        self.reads.append(("list", prefix, consistent))
        self._check(f"{self.mount}/metadata/{prefix.strip('/')}/", "list", prefix)
        return self._names(prefix.strip("/") + "/")

    async def list_metadata(
        self, folder: str, *, after: str = "", limit: int, consistent: bool = False
    ) -> list[tuple[str, KvMetadata | None]] | None:
        self._enter("list metadata", folder)
        self.reads.append(("list_metadata", folder, consistent))
        base = folder.strip("/") + "/"
        self._check(f"{self.mount}/detailed-metadata/{base}", "list", folder)
        if not self.detailed_listing:
            return None  # HashiCorp Vault: no such endpoint, 404
        names = [name for name in self._names(base) if name > after][: max(1, limit)]
        if not names:
            return None
        return [
            (name, None if name.endswith("/") else self._metadata(base + name, consistent))
            for name in names
        ]

    async def read_fields(
        self, mount: str, path: str, fields: Sequence[str], *, consistent: bool = False
    ) -> dict[str, Secret]:
        self._enter("read field", path, mount=mount)
        self.reads.append(("read_field", path, consistent))
        self._check(f"{mount}/data/{path}", "read", path, mount=mount)
        record = self._records.get((mount, path))
        number = self._visible(record, consistent) if mount == self.mount else None
        if record is not None and number is None:
            number = record.current_version
        version = record.versions.get(number) if record and number is not None else None
        values = version.data if version is not None and _live(version) else None
        return pick_fields(mount, path, values, fields)

    async def capabilities(self, paths: Sequence[str]) -> Mapping[str, frozenset[str]]:
        self._enter("capabilities", None)
        return {validate_api_path(path): self._capabilities(path) for path in paths}

    async def health(self) -> None:
        self._enter("health", None)

    async def close(self) -> None:
        self._closed = True

    # -- token upkeep, as on VaultStore ------------------------------------------------------

    def token_expires_at(self) -> float | None:
        return None

    def token_ttl(self) -> float | None:
        return None

    async def maintain_token(self) -> float:
        return 300.0

    # -- internals ---------------------------------------------------------------------------

    def _visible(self, record: _Record | None, consistent: bool) -> int:
        """The version a read sees: the current one, or `stale_by` behind for a plain read."""
        if record is None:
            return 0
        if consistent or self.stale_by <= 0:
            return record.current_version
        return max(0, record.current_version - self.stale_by)

    def _enter(self, operation: str, path: str | None, *, mount: str | None = None) -> None:
        if self._closed:
            raise RuntimeError("the vault store is closed")
        if path is not None:
            validate_path(path)
        if mount is not None:
            validate_path(mount, what="mount")
        if self._failures:
            raise self._failures.pop(0)
        if self.unavailable:
            raise VaultUnavailable(f"vault {operation}: cannot reach vault (fake outage)")

    def _check(
        self, api_path: str, capability: str, path: str, *, mount: str | None = None
    ) -> None:
        caps = self._capabilities(api_path)
        if "root" in caps or (capability in caps and "deny" not in caps):
            return
        raise VaultPermissionDenied(
            f"vault {capability} on {api_path}: HTTP 403, permission denied",
            path=f"{mount or self.mount}/{path}",
        )

    def _capabilities(self, api_path: str) -> frozenset[str]:
        if self._policy is None:
            return frozenset({"root"})
        if api_path in self._policy:
            return self._policy[api_path]
        matches = [p for p in self._policy if _glob(p).fullmatch(api_path)]
        if not matches:
            return frozenset({"deny"})
        return self._policy[max(matches, key=len)]

    def _new_version(self, mount: str, path: str, data: dict[str, str]) -> _Record:
        now = self._clock.time()
        record = self._records.setdefault((mount, path), _Record(now, now))
        record.current_version += 1
        record.updated_time = now
        record.versions[record.current_version] = _Version(data, now)
        while len(record.versions) > self._max_versions:
            del record.versions[min(record.versions)]
            record.oldest_version = min(record.versions)
        return record


def _live(version: _Version) -> bool:
    return version.deletion_time is None and not version.destroyed


def _glob(policy_path: str) -> re.Pattern[str]:
    """Vault policy path syntax: `+` is one segment, a trailing `*` is any suffix."""
    prefix = policy_path[:-1] if policy_path.endswith("*") else policy_path
    body = "/".join("[^/]+" if part == "+" else re.escape(part) for part in prefix.split("/"))
    return re.compile(body + (".*" if policy_path.endswith("*") else ""))


if TYPE_CHECKING:  # mypy proves the fake satisfies the interface

    def _conforms(fake: FakeVaultStore) -> KvStore:
        return fake
