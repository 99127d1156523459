"""`VaultStore`: `KvStore` on a real Vault or OpenBao KV v2 mount, through hvac.

It adds to `VaultClient` what KV v2 needs: a 403 caused by keyturn's own expired token is
retried once after a new login; a check-and-set conflict is reported only when a consistent
read proves it; a check-and-set write whose answer was lost is sent once more and known as
landed if it did (docs/architecture.md, "The Vault edge").
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from hvac.utils import format_url  # no stubs: hvac stays behind keyturn.vault
from requests.adapters import BaseAdapter

from keyturn.clock import Clock
from keyturn.errors import (
    VaultCasConflict,
    VaultDataError,
    VaultError,
    VaultPermissionDenied,
    VaultUnavailable,
)
from keyturn.logs import get_logger
from keyturn.secret import Secret
from keyturn.vault.auth import TokenKeeper, VaultAuth
from keyturn.vault.client import (
    OnOperation,
    Use,
    VaultClient,
    VaultConnection,
    VaultNode,
    VaultOperation,
    not_sent,
)
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

log = get_logger("keyturn.vault")

# A write rejected by a node that was behind is sent again at most this many times, after
# these pauses (seconds).
CAS_RECHECK_DELAYS = (0.05, 0.2, 0.5)

_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


class VaultStore:
    """The real `KvStore`; also the owner of keyturn's Vault token (see `keeper`)."""

    def __init__(
        self,
        connection: VaultConnection,
        auth: VaultAuth,
        *,
        clock: Clock,
        rng: random.Random | None = None,
        on_operation: OnOperation | None = None,
        transport: BaseAdapter | None = None,
    ) -> None:
        """`on_operation(operation, result, seconds)` is told about every Vault call, logins,
        renewals and look-ups included (see `keyturn.vault.client`); `transport` is mounted
        under hvac instead of requests' own (tests fake Vault there)."""
        self.connection = connection
        self._auth_method = auth.method
        self._client = VaultClient(
            connection, clock=clock, on_operation=on_operation, transport=transport
        )
        self.keeper = TokenKeeper(
            self._client, auth, clock=clock, renew_margin=connection.renew_margin, rng=rng
        )

    def __repr__(self) -> str:
        return (
            f"VaultStore(address={self.connection.address!r}, mount={self.connection.mount!r}, "
            f"auth={self._auth_method!r})"
        )

    @property
    def mount(self) -> str:
        return self.connection.mount

    @property
    def authenticated(self) -> bool:
        return self.keeper.authenticated

    def token_expires_at(self) -> float | None:
        return self.keeper.token_expires_at()

    def token_ttl(self) -> float | None:
        return self.keeper.token_ttl()

    async def maintain_token(self) -> float:
        """See `TokenKeeper.maintain_token`; the scheduler calls it again after the delay."""
        return await self.keeper.maintain_token()

    async def read(self, path: str, *, consistent: bool = False) -> KvEntry | None:
        validate_path(path)
        body = await self._call(
            _read_version(self.mount, path),
            path=f"{self.mount}/{path}",
            kind="read",
            operation="read",
            missing_ok=True,
            consistent=consistent,
        )
        data = _dict(body.get("data") if body else None)
        if data is None or data.get("data") is None:
            return None
        return _entry(path, data)

    async def write(
        self,
        path: str,
        data: Mapping[str, str | Secret],
        *,
        cas: int | None,
        custom_metadata: Mapping[str, str] | None = None,
    ) -> int:
        """KV v2 write, then (a second call) the custom metadata; see `KvStore.write`."""
        validate_path(path)
        if cas is not None and (isinstance(cas, bool) or cas < 0):
            raise ValueError("cas must be None or a non-negative int")
        payload: dict[str, Any] = {"data": reveal_data(path, data), "options": {}}
        if cas is not None:
            payload["options"]["cas"] = cas
        try:
            body = await self._write_data(path, payload, cas)
        except VaultCasConflict as conflict:
            if cas is None or self._client.standalone:
                raise  # a single server judged it against current data
            body = await self._write_after_conflict(path, payload, cas, conflict)
        except VaultUnavailable as lost:
            if cas is None or not_sent(lost.__cause__):
                raise  # unconditional writes are never sent twice; unsent ones failed over
            body = await self._write_after_lost_answer(path, payload, cas, lost)
        version = (_dict(body.get("data")) or {}).get("version") if body else None
        if isinstance(version, bool) or not isinstance(version, int):
            raise VaultDataError("vault write: response has no version", path=path)
        if custom_metadata is not None:
            metadata = {"custom_metadata": _str_map(path, custom_metadata)}
            try:
                await self._write_metadata(path, metadata)
            except VaultUnavailable as lost:
                if not_sent(lost.__cause__):
                    raise
                # The same custom metadata written twice is the same: send it once more.
                self._before_resend(path, lost, what="metadata")
                await self._write_metadata(path, metadata)
        return version

    async def _write_metadata(self, path: str, metadata: Mapping[str, Any]) -> None:
        # Not hvac's `update_metadata`: it would also send `delete_version_after`, resetting
        # what an operator set on the secret. Only the custom metadata is written.
        url = format_url("/v1/{mount}/metadata/{path}", mount=self.mount, path=path)
        body = dict(metadata)

        def use(node: VaultNode) -> object:
            return node.adapter.post(url, json=body)

        await self._call(
            use,
            path=f"{self.mount}/{path}",
            kind="write",
            operation="write metadata",
            write=True,
            consistent=True,
        )

    def _before_resend(self, path: str, lost: VaultUnavailable, *, what: str) -> None:
        """Before a write is sent again: say so, and ask anew where the active node is (the
        node that broke off may no longer be it)."""
        log.info(
            "vault.write_answer_lost", path=f"{self.mount}/{path}", write=what, error=str(lost)
        )
        self._client.forget_active()

    async def _write_data(
        self, path: str, payload: Mapping[str, Any], cas: int | None
    ) -> dict[str, Any] | None:
        mount, data = self.mount, payload["data"]

        def use(node: VaultNode) -> object:
            return node.secrets.kv.v2.create_or_update_secret(
                path, secret=data, cas=cas, mount_point=mount
            )

        return await self._call(
            use,
            path=f"{mount}/{path}",
            kind="write",
            operation=f"write (cas={cas})",
            write=True,
            consistent=True,
        )

    async def _write_after_conflict(
        self,
        path: str,
        payload: Mapping[str, Any],
        cas: int,
        conflict: VaultCasConflict,
        *,
        answer_lost: bool = False,
    ) -> dict[str, Any] | None:
        """Prove a check-and-set conflict before reporting it: read the secret from the active
        node. If an earlier send's answer was lost (`answer_lost`) and version `cas + 1` holds
        exactly what was sent, that send landed. If the secret is still at version `cas` on a
        cluster, the node that judged the write was behind, and the write is sent again (a few
        times). Otherwise the conflict stands."""
        for delay in CAS_RECHECK_DELAYS:
            self._client.forget_active()  # the node that answered may no longer be active
            try:
                current = await self.read(path, consistent=True)
            except VaultError:
                raise conflict from None  # not proven stale: the conflict stands
            if current is None:
                raise conflict
            if answer_lost and current.version == cas + 1 and current.data == payload["data"]:
                log.info("vault.write_had_landed", path=f"{self.mount}/{path}", version=cas + 1)
                return {"data": {"version": current.version}}
            if current.version != cas or self._client.standalone:
                raise conflict
            log.info("vault.cas_rejected_by_stale_node", path=f"{self.mount}/{path}", cas=cas)
            await asyncio.sleep(delay)
            try:
                return await self._write_data(path, payload, cas)
            except VaultCasConflict as again:
                conflict = again
        raise conflict

    async def _write_after_lost_answer(
        self, path: str, payload: Mapping[str, Any], cas: int, lost: VaultUnavailable
    ) -> dict[str, Any] | None:
        """Send a check-and-set write again after its answer was lost; a conflict on the
        resend may be the first send, landed (`_write_after_conflict` tells)."""
        self._before_resend(path, lost, what=f"data (cas={cas})")
        try:
            return await self._write_data(path, payload, cas)
        except VaultCasConflict as conflict:
            return await self._write_after_conflict(path, payload, cas, conflict, answer_lost=True)

    async def read_metadata(self, path: str, *, consistent: bool = False) -> KvMetadata | None:
        validate_path(path)
        mount = self.mount

        def use(node: VaultNode) -> object:
            return node.secrets.kv.v2.read_secret_metadata(path, mount_point=mount)

        body = await self._call(
            use,
            path=f"{mount}/{path}",
            kind="read_metadata",
            operation="read metadata",
            missing_ok=True,
            consistent=consistent,
        )
        data = _dict(body.get("data") if body else None)
        return _metadata(path, data) if data is not None else None

    async def delete_all(self, path: str) -> None:
        validate_path(path)
        mount = self.mount

        def use(node: VaultNode) -> object:
            return node.secrets.kv.v2.delete_metadata_and_all_versions(path, mount_point=mount)

        await self._call(
            use,
            path=f"{mount}/{path}",
            kind="delete",
            operation="delete all versions",
            write=True,
            consistent=True,
        )

    async def list_keys(self, prefix: str, *, consistent: bool = False) -> list[str]:
        validate_path(prefix)
        mount = self.mount

        def use(node: VaultNode) -> object:
            return node.secrets.kv.v2.list_secrets(prefix, mount_point=mount)

        body = await self._call(
            use,
            path=f"{mount}/{prefix}",
            kind="list",
            operation="list",
            missing_ok=True,
            consistent=consistent,
        )
        keys = (_dict(body.get("data")) or {}).get("keys") if body else None
        if keys is None:
            return []
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise VaultDataError("vault list: keys is not a list of strings", path=prefix)
        return list(keys)

    async def list_metadata(
        self, folder: str, *, after: str = "", limit: int, consistent: bool = False
    ) -> list[tuple[str, KvMetadata | None]] | None:
        validate_path(folder)
        # OpenBao's detailed-metadata (no hvac method): the folder, with its trailing slash.
        query = urlencode({"after": after, "limit": limit} if after else {"limit": limit})
        url = format_url(
            "/v1/{mount}/detailed-metadata/{folder}", mount=self.mount, folder=folder.strip("/")
        )
        url = f"{url}/?{query}"

        def use(node: VaultNode) -> object:
            return node.adapter.list(url)

        body = await self._call(
            use,
            kind="list",
            operation="list metadata",
            path=f"{self.mount}/{folder}",
            missing_ok=True,
            consistent=consistent,
        )
        data = _dict(body.get("data")) if body else None
        if data is None:
            return None
        keys, infos = data.get("keys"), _dict(data.get("key_info")) or {}
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise VaultDataError("vault list metadata: keys is not a list of strings", path=folder)
        base = folder.strip("/")
        page: list[tuple[str, KvMetadata | None]] = []
        for key in keys:
            info = _dict(infos.get(key))
            listed = None if key.endswith("/") or not info else _metadata(f"{base}/{key}", info)
            page.append((key, listed))
        return page

    async def read_fields(
        self, mount: str, path: str, fields: Sequence[str], *, consistent: bool = False
    ) -> dict[str, Secret]:
        validate_path(mount, what="mount")
        validate_path(path)
        body = await self._call(
            _read_version(mount, path),
            path=f"{mount}/{path}",
            kind="read_field",
            operation="read field",
            missing_ok=True,
            consistent=consistent,
        )
        data = _dict(body.get("data") if body else None)
        values = _dict(data.get("data")) if data else None
        return pick_fields(mount, path, values, fields)

    async def capabilities(self, paths: Sequence[str]) -> Mapping[str, frozenset[str]]:
        wanted = [validate_api_path(path) for path in paths]
        if not wanted:
            return {}

        def use(node: VaultNode) -> object:
            return node.sys.get_capabilities(paths=wanted)

        body = await self._call(
            use, kind="capabilities", operation="capabilities", path=None, write=True
        )
        data = _dict(body.get("data") if body else None) or {}
        result: dict[str, frozenset[str]] = {}
        for path in wanted:
            caps = data.get(path, [])
            if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
                raise VaultDataError("vault capabilities: malformed answer", path=path)
            result[path] = frozenset(caps)
        return result

    async def mount_config(self, mount: str) -> Mapping[str, Any]:
        """What Vault says is mounted at (or above) `mount`: `type`, `options`, `path`.

        From `sys/internal/ui/mounts/<mount>`, the call the `vault kv` CLI makes. Vault answers
        403 both when nothing is mounted there and when the token holds nothing under it
        (`keyturn.vault.mounts` tells them apart).
        """
        validate_path(mount, what="mount")
        url = format_url("/v1/sys/internal/ui/mounts/{mount}", mount=mount)

        def use(node: VaultNode) -> object:
            return node.adapter.get(url)  # no hvac method for it

        body = await self._call(
            use,
            kind="read_metadata",
            operation="read mount configuration",
            path=f"sys/internal/ui/mounts/{mount}",
        )
        return _dict(body.get("data") if body else None) or {}

    async def lookup_self(self) -> Mapping[str, Any]:
        """The `data` of keyturn's own token look-up: its display name, `meta` and entity id
        are how Vault's audit log names keyturn (keyturn.usage tells its reads apart)."""

        def use(node: VaultNode) -> object:
            return node.auth.token.lookup_self()

        body = await self._call(use, kind="lookup", operation="token lookup", path=None)
        return _dict(body.get("data") if body else None) or {}

    async def health(self) -> None:
        """Vault answers and accepts our token (token look-up); used by /readyz and `check`."""
        await self.keeper.verify()

    async def server_time(self) -> float | None:
        """Vault's own clock, or None (see `VaultClient.server_time`)."""
        return await self._client.server_time()

    async def close(self) -> None:
        await self._client.close()

    async def _call(
        self,
        use: Use,
        *,
        kind: VaultOperation,
        operation: str,
        path: str | None,
        write: bool = False,
        missing_ok: bool = False,
        consistent: bool = False,
    ) -> dict[str, Any] | None:
        """One data call (`use(node)` with hvac, see `VaultClient.call`); on a 403 caused by
        a dead token: one re-login, one retry."""
        await self.keeper.ensure_login()
        generation = self.keeper.generation

        async def call() -> dict[str, Any] | None:
            return await self._client.call(
                use,
                kind=kind,
                operation=operation,
                path=path,
                write=write,
                missing_ok=missing_ok,
                consistent=consistent,
            )

        try:
            return await call()
        except VaultPermissionDenied:
            if not await self.keeper.token_rejected(generation):
                raise
        return await call()


def _read_version(mount: str, path: str) -> Use:
    """The current version of a KV v2 secret, with hvac; a deleted version is a 404 as a
    missing secret is (hvac's `raise_on_deleted_version`)."""

    def use(node: VaultNode) -> object:
        return node.secrets.kv.v2.read_secret_version(
            path, mount_point=mount, raise_on_deleted_version=True
        )

    return use


def parse_time(text: object, *, path: str, what: str) -> float:
    """Epoch seconds of a Vault RFC 3339 timestamp (nanosecond fractions allowed)."""
    match = _TIME.match(text) if isinstance(text, str) else None
    if match is None:
        raise VaultDataError(f"vault response: {what} is not an RFC 3339 time", path=path)
    whole, fraction, zone = match.groups()
    stamp = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    return stamp.astimezone(UTC).timestamp() + float(f"0.{fraction or 0}")


def _dict(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _str_map(path: str, value: object, what: str = "custom_metadata") -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise VaultDataError(f"vault: {what} must map strings to strings", path=path)
    return dict(value)


def _int(section: Mapping[str, Any], name: str, path: str) -> int:
    value = section.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise VaultDataError(f"vault response: {name!r} is not an integer", path=path)
    return value


def _entry(path: str, data: Mapping[str, Any]) -> KvEntry:
    meta = _dict(data.get("metadata"))
    if meta is None:
        raise VaultDataError("vault read: response has no metadata", path=path)
    values = data.get("data")
    if not isinstance(values, dict):
        raise VaultDataError("vault read: data is not an object", path=path)
    for key, value in values.items():
        if not isinstance(value, str):
            raise VaultDataError(f"vault read: field {key!r} is not a string", path=path)
    return KvEntry(
        path=path,
        data=dict(values),
        version=_int(meta, "version", path),
        custom_metadata=_str_map(path, meta.get("custom_metadata")),
        created_time=parse_time(meta.get("created_time"), path=path, what="created_time"),
    )


def _metadata(path: str, data: Mapping[str, Any]) -> KvMetadata:
    raw_versions = _dict(data.get("versions")) or {}
    versions: dict[int, VersionInfo] = {}
    for number, info in raw_versions.items():
        if not number.isdigit() or not isinstance(info, dict):
            raise VaultDataError("vault metadata: malformed versions", path=path)
        deleted = info.get("deletion_time")
        versions[int(number)] = VersionInfo(
            created_time=parse_time(info.get("created_time"), path=path, what="created_time"),
            deletion_time=parse_time(deleted, path=path, what="deletion_time") if deleted else None,
            destroyed=bool(info.get("destroyed")),
        )
    return KvMetadata(
        path=path,
        current_version=_int(data, "current_version", path),
        oldest_version=_int(data, "oldest_version", path),
        custom_metadata=_str_map(path, data.get("custom_metadata")),
        versions=versions,
        created_time=parse_time(data.get("created_time"), path=path, what="created_time"),
        updated_time=parse_time(data.get("updated_time"), path=path, what="updated_time"),
    )


if TYPE_CHECKING:  # mypy proves the store satisfies the interface

    def _conforms(store: VaultStore) -> KvStore:
        return store
