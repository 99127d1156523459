"""The Vault edge of keyturn: a small typed async KV v2 store with hvac behind it.

    store.py ....... `KvStore` (the interface), `KvEntry`, `KvMetadata`, `VersionInfo`
    hvac_store.py .. `VaultStore`, the real one (Vault or OpenBao)
    client.py ...... `VaultConnection`; hvac on a bounded thread pool; error translation
    auth.py ........ `VaultAuth` (login methods) and `TokenKeeper` (keyturn's own token)
    renewal.py ..... when to renew that token: pure functions

`keyturn.testing.vault.FakeVaultStore` is the in-memory `KvStore` for unit tests.
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
