"""What `[metrics] web_config` puts in front of the HTTP face (keyturn.observability.server).

`ServerContexts`: a TLS context per connection, reloaded when the files change on disk (a
change that cannot load keeps the old one). `BasicAuth`: bcrypt on a worker thread, a match
remembered by hash. Nothing here logs or raises a password or a hash. Behaviour:
docs/configuration.md#the-web-configuration-file-web_config.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import os
import ssl
from collections.abc import Mapping
from pathlib import Path

import bcrypt

from keyturn.config.webconfig import TlsServerConfig
from keyturn.logs import get_logger

log = get_logger("keyturn.metrics")
MAX_REMEMBERED = 256


def _signature(files: tuple[Path, ...]) -> tuple[tuple[int, int, int], ...] | None:
    try:
        stats = [os.stat(path) for path in files]
    except OSError:
        return None
    return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats)


class ServerContexts:
    """The current server context; `current()` reloads it when its files changed."""

    def __init__(self, tls: TlsServerConfig) -> None:
        self._tls = tls
        self._signature = _signature(tls.files)
        self._context = tls.context()
        self._failed: object = None

    def current(self) -> ssl.SSLContext:
        signature = _signature(self._tls.files)
        if signature is None or signature == self._signature:
            return self._context
        try:
            context = self._tls.context()
        except (OSError, ssl.SSLError) as exc:
            if self._failed != signature:
                self._failed = signature
                log.warning("metrics.tls_reload_failed", error=type(exc).__name__)
            return self._context
        self._context, self._signature, self._failed = context, signature, None
        log.info("metrics.tls_reloaded", cert_file=str(self._tls.cert_file))
        return context


def credentials(header: str) -> tuple[str, str] | None:
    """(user, password) of an `Authorization: Basic` header, or None."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, colon, password = decoded.partition(":")
    return (user, password) if colon else None


class BasicAuth:
    """`await check(header)`: whether it names a user with its password."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._decoy = next(iter(self._users.values()))  # an unknown user pays a bcrypt too
        self._remembered: set[bytes] = set()

    async def check(self, header: str | None) -> bool:
        found = credentials(header) if header else None
        if found is None:
            return False
        user, password = found
        hashed = self._users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed or b""))).digest()
        if hashed is not None and key in self._remembered:
            return True
        loop = asyncio.get_running_loop()
        ok = await loop.run_in_executor(
            None, bcrypt.checkpw, password.encode(), hashed or self._decoy
        )
        if not (ok and hashed is not None):
            return False
        if len(self._remembered) >= MAX_REMEMBERED:
            self._remembered.clear()
        self._remembered.add(key)
        return True
