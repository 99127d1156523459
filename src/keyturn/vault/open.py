"""From the `[vault]` configuration to a logged-in `VaultStore` on a KV v2 mount."""

from __future__ import annotations

import os
from collections.abc import Mapping

from keyturn.clock import Clock
from keyturn.config import AppRoleAuth, Config, KubernetesAuth, TokenAuth, TokenFileAuth
from keyturn.errors import SecretReferenceError
from keyturn.references import SecretRef, resolve_local
from keyturn.secret import Secret
from keyturn.vault.auth import VaultAuth
from keyturn.vault.client import OnOperation, VaultConnection
from keyturn.vault.hvac_store import VaultStore
from keyturn.vault.mounts import require_kv_v2


def _local(ref: SecretRef, environ: Mapping[str, str], what: str) -> Secret:
    """Vault's own login secrets cannot come from Vault: only env: and file: references."""
    if ref.scheme == "vault":
        raise SecretReferenceError(
            f"vault.auth.{what}: {ref} needs Vault to log in to Vault; use env: or file:"
        )
    return resolve_local(ref, environ)


def _named(ref: SecretRef) -> str:
    """How a refused login names where an input came from: the reference, never a value."""
    return "an inline value" if ref.is_inline else str(ref)


def vault_auth(config: Config, environ: Mapping[str, str]) -> VaultAuth:
    auth = config.vault.auth
    if isinstance(auth, TokenAuth):
        return VaultAuth(
            method="token",
            token=_local(auth.token, environ, "token"),
            sources=(("token", _named(auth.token)),),
        )
    if isinstance(auth, TokenFileAuth):
        return VaultAuth(
            method="token_file", token_path=auth.path, sources=(("path", str(auth.path)),)
        )
    if isinstance(auth, AppRoleAuth):
        return VaultAuth(
            method="approle",
            role_id=_local(auth.role_id, environ, "role_id"),
            secret_id=_local(auth.secret_id, environ, "secret_id"),
            auth_mount=auth.mount,
            sources=(("role_id", _named(auth.role_id)), ("secret_id", _named(auth.secret_id))),
        )
    if isinstance(auth, KubernetesAuth):
        return VaultAuth(
            method="kubernetes",
            role=auth.role,
            jwt_path=auth.jwt_path,
            auth_mount=auth.mount,
            sources=(("jwt_path", str(auth.jwt_path)),),
        )
    raise TypeError(f"unknown Vault auth {type(auth).__name__}")  # pragma: no cover


async def open_vault_store(
    config: Config,
    *,
    clock: Clock,
    environ: Mapping[str, str] | None = None,
    on_operation: OnOperation | None = None,
    check_mount: bool = True,
) -> VaultStore:
    """A store logged in to Vault; raises a VaultError (or SecretReferenceError) if it cannot.

    `check_mount`: raise `VaultMountError` when `vault.mount` is missing, KV v1 or another
    engine, before the caller (the daemon, refresh, rotate, ...) can write anything there.
    `keyturn check` turns it off and reports every mount itself.
    """
    vault = config.vault
    connection = VaultConnection(
        address=vault.address,
        nodes=vault.nodes,
        mount=vault.mount,
        namespace=vault.namespace,
        ca_cert=vault.ca_cert,
        timeout=vault.timeout,
        max_workers=config.keyturn.vault_concurrency,
        renew_margin=vault.renew_margin,
    )
    store = VaultStore(
        connection,
        vault_auth(config, os.environ if environ is None else environ),
        clock=clock,
        on_operation=on_operation,
    )
    try:
        await store.keeper.login()
        if check_mount:
            await require_kv_v2(store, config)
    except BaseException:
        await store.close()
        raise
    return store
