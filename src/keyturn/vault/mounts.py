"""Is a mount keyturn uses really a KV v2 secrets engine?

On a KV v1 mount keyturn's writes would *succeed*, as secrets named `data/...` that nothing
reads back, so `check` and the daemon's start ask what is mounted before writing; a 403 is
told apart (nothing mounted, or a policy granting nothing) by the token's capabilities.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from keyturn.config import Config
from keyturn.errors import KeyturnError, VaultError, VaultMountError, VaultPermissionDenied
from keyturn.layout import state_path
from keyturn.logs import get_logger

MountKind = Literal["kv-v2", "kv-v1", "other", "missing", "hidden"]
log = get_logger("keyturn.vault")


class MountReader(Protocol):
    """What the inspection needs from a store (`VaultStore` has both)."""

    async def mount_config(self, mount: str) -> Mapping[str, Any]: ...

    async def capabilities(self, paths: Sequence[str]) -> Mapping[str, frozenset[str]]: ...


@dataclass(frozen=True, slots=True)
class MountInfo:
    """What is at `mount`: `engine` is Vault's type word (`kv`, `transit`, ...) when known;
    `nearest` the mount that does answer for the path when it is not a mount itself."""

    mount: str
    kind: MountKind
    engine: str = ""
    nearest: str = ""

    def problem(self, used_by: str) -> str | None:
        """One line saying why keyturn cannot use the mount and what fixes it (None when it
        can); `used_by` names the configuration entry that points there, e.g. `vault.mount`."""
        mount = self.mount
        enable = f"bao secrets enable -path={mount} kv-v2"
        enable += f" (or: vault secrets enable -path={mount} kv-v2)"
        if self.kind == "kv-v2":
            return None
        if self.kind == "missing":
            inside = f" (it is a path inside {self.nearest}/)" if self.nearest else ""
            return (
                f"{mount}/ ({used_by}): no secrets engine is mounted there{inside}; keyturn "
                f"needs KV v2: {enable}"
            )
        if self.kind == "kv-v1":
            return (
                f"{mount}/ ({used_by}) is a KV version 1 mount; keyturn needs KV v2: "
                f"bao kv enable-versioning {mount}/ (or: vault kv enable-versioning {mount}/) "
                "upgrades it in place"
            )
        if self.kind == "other":
            return (
                f"{mount}/ ({used_by}) is a {self.engine or 'non-KV'} secrets engine, not KV v2; "
                f"point {used_by} at a KV v2 mount"
            )
        return (
            f"{mount}/ ({used_by}): Vault refused to describe the mount "
            f"(sys/internal/ui/mounts/{mount}: permission denied) because the token holds no "
            f"capability under {mount}/, so whether it is KV v2 cannot be checked"
        )


def describe(mount: str, data: Mapping[str, Any]) -> MountInfo:
    """Classify Vault's answer for `sys/internal/ui/mounts/<mount>`."""
    answered = str(data.get("path") or "").strip("/")
    if answered and answered != mount:
        return MountInfo(mount, "missing", nearest=answered)
    engine = str(data.get("type") or "")
    if engine not in ("kv", "generic"):  # "generic": KV v1's old name
        return MountInfo(mount, "other", engine=engine)
    options = data.get("options")
    version = options.get("version") if isinstance(options, Mapping) else None
    return MountInfo(mount, "kv-v2" if str(version) == "2" else "kv-v1", engine=engine)


async def inspect_mount(store: MountReader, mount: str, *, under: Sequence[str]) -> MountInfo:
    """What is mounted at `mount`. `under`: full API paths below it that keyturn needs (their
    capabilities settle a 403, see the module docstring). Other Vault errors are raised."""
    try:
        data = await store.mount_config(mount)
    except VaultPermissionDenied:
        return MountInfo(mount, "missing" if await _holds_any(store, under) else "hidden")
    return describe(mount, data)


async def _holds_any(store: MountReader, paths: Sequence[str]) -> bool:
    if not paths:
        return False
    try:
        granted = await store.capabilities(list(paths))
    except KeyturnError:
        return False
    return any(caps - {"deny"} for caps in granted.values())


async def require_kv_v2(store: MountReader, config: Config) -> None:
    """Raise `VaultMountError` when `vault.mount` is missing, KV v1 or another engine (called
    on opening the store, before anything is written). A mount the token cannot see (with no
    grant there it cannot write there either) or a Vault error only logs a warning."""
    mount = config.vault.mount
    name = config.credentials[0].name if config.credentials else "-"
    under = [f"{mount}/data/{state_path(config.keyturn.state_prefix, name)}"]
    try:
        info = await inspect_mount(store, mount, under=under)
    except VaultError as error:
        log.warning("vault.mount_unchecked", mount=mount, error=str(error))
        return
    problem = info.problem("vault.mount")
    if info.kind == "hidden":
        log.warning("vault.mount_unchecked", mount=mount, error=problem)
    elif problem is not None:
        raise VaultMountError(f"{problem}; nothing was written")
