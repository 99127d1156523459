"""The Vault edge of keyturn: a small typed async KV v2 store with hvac behind it.

`store.py` (the `KvStore` interface), `hvac_store.py` (the real one), `client.py` (hvac on a
thread pool, error translation), `auth.py` (login, `TokenKeeper`), `renewal.py` (when to renew).
"""

from keyturn.vault.auth import TokenKeeper, VaultAuth
from keyturn.vault.client import VaultConnection
from keyturn.vault.hvac_store import VaultStore
from keyturn.vault.store import KvEntry, KvMetadata, KvStore, VersionInfo, validate_path

__all__ = [
    "KvEntry",
    "KvMetadata",
    "KvStore",
    "TokenKeeper",
    "VaultAuth",
    "VaultConnection",
    "VaultStore",
    "VersionInfo",
    "validate_path",
]
