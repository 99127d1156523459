"""keyturn's own Vault identity: login methods and a `TokenKeeper` that keeps the token alive.

The keeper renews ahead of expiry (see `renewal`), logs in afresh when renewal can no longer
help (not renewable, max TTL reached, renewal refused), and keeps an `authenticated` flag that
drops on every failure path, like Vault Agent's gauge, so /readyz and the "blind spots"
detector can see a token about to be lost. A static token cannot be replaced by logging in;
for it, "log in again" re-checks the same token and can only warn.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from keyturn.clock import Clock, rfc3339
from keyturn.errors import VaultAuthError, VaultDataError, VaultError, VaultPermissionDenied
from keyturn.logs import get_logger
from keyturn.secret import Secret
from keyturn.vault.client import VaultClient, VaultNode, http_status, vault_reason
from keyturn.vault.renewal import MIN_DELAY, TokenLease, error_delay

AuthMethod = Literal["token", "token_file", "approle", "kubernetes"]
KUBERNETES_JWT = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
NO_EXPIRY_CHECK = 300.0  # a token that never expires is still looked up this often (revocation)
_REQUIRED = {
    "token": ("token",),
    "token_file": ("token_path",),
    "approle": ("role_id",),
    "kubernetes": ("role",),
}
log = get_logger("keyturn.vault")


def _lookup_self(node: VaultNode) -> object:
    """`auth/token/lookup-self`, with the token the call sends."""
    return node.auth.token.lookup_self()


def _renew_self(node: VaultNode) -> object:
    """`auth/token/renew-self` for the token's own increment."""
    return node.auth.token.renew_self()


@dataclass(frozen=True, slots=True)
class VaultAuth:
    """How keyturn logs in to Vault; secrets are `Secret`s, so the repr is safe to log."""

    method: AuthMethod
    token: Secret | None = None
    token_path: Path | None = None  # e.g. written by Vault Agent; re-read on every login
    role_id: Secret | None = None
    secret_id: Secret | None = None
    role: str | None = None  # kubernetes role
    jwt_path: Path | None = None  # kubernetes service account token (default: the projected one)
    auth_mount: str | None = None  # default: "approle" / "kubernetes"
    # Where each login input came from in the configuration, e.g. ("secret_id",
    # "env:KEYTURN_SECRET_ID"), so a refused login can say which one to check. Never a value.
    sources: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.method not in _REQUIRED:
            raise ValueError(f"vault auth method {self.method!r} is not one of {sorted(_REQUIRED)}")
        for name in _REQUIRED[self.method]:
            if not getattr(self, name):
                raise ValueError(f"vault auth method {self.method!r} needs {name!r}")

    @property
    def mount_point(self) -> str:
        return self.auth_mount or ("kubernetes" if self.method == "kubernetes" else "approle")

    @property
    def static(self) -> bool:
        """A fresh login returns the token we were given (or the file holds), not a new one."""
        return self.method in ("token", "token_file")

    def source(self, key: str) -> str:
        """`vault.auth.<key>` and where its value came from, e.g. `vault.auth.secret_id
        (env:KEYTURN_SECRET_ID)`: what a refused login asks the operator to check."""
        where = dict(self.sources).get(key)
        return f"vault.auth.{key} ({where})" if where else f"vault.auth.{key}"


class TokenKeeper:
    """Holds keyturn's Vault token: login, renewal ahead of expiry, re-login, `authenticated`."""

    def __init__(
        self,
        client: VaultClient,
        auth: VaultAuth,
        *,
        clock: Clock,
        renew_margin: float,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._auth = auth
        self._clock = clock
        self._margin = renew_margin
        self._rng = rng or random.Random()
        self._lock = asyncio.Lock()
        self._token: Secret | None = None
        self._lease: TokenLease | None = None
        self._authenticated = False
        self._generation = 0
        self._failures = 0
        self.last_error: VaultError | None = None
        self.accessor: str | None = None  # names the token in audit logs; cannot be used as one

    def __repr__(self) -> str:
        return f"TokenKeeper(method={self._auth.method!r}, authenticated={self.authenticated})"

    @property
    def authenticated(self) -> bool:
        """True while we hold a token Vault accepted and that has not expired by our clock."""
        expires_at = self.token_expires_at()
        return self._authenticated and (expires_at is None or self._clock.time() < expires_at)

    @property
    def generation(self) -> int:
        """Bumped by every login: a caller that saw a 403 can tell whether the token changed."""
        return self._generation

    def token_expires_at(self) -> float | None:
        """Epoch seconds at which the token expires; None if it never does (or no login yet)."""
        return self._lease.expires_at if self._lease else None

    def token_ttl(self) -> float | None:
        """The TTL the token was created with (what a renewal grants); None before a login."""
        return self._lease.natural_ttl if self._lease else None

    async def login(self) -> None:
        """Obtain a token by the configured method and start using it."""
        async with self._lock:
            await self._login_locked()

    async def ensure_login(self) -> None:
        """Log in unless we already did (the first data call logs in lazily)."""
        if self._lease is None:
            async with self._lock:
                if self._lease is None:
                    await self._login_locked()

    async def maintain_token(self) -> float:
        """Renew or log in again if due; return seconds until this should be called again.

        Never raises for Vault trouble: failures are logged, kept in `last_error`, drop
        `authenticated` when the token is lost, and come back as a jittered backoff.
        """
        lease = self._lease
        now = self._clock.time()
        due = lease.due_at(self._margin) if lease else None
        try:
            if lease is None or not self._authenticated:
                await self.login()
            elif due is None:
                await self.verify()
            elif now < due:
                return max(MIN_DELAY, due - now)
            elif lease.needs_login:
                await self._login_again()
            else:
                await self._renew()
        except VaultError as exc:
            return self._failed(exc)
        self._failures = 0
        self.last_error = None
        due = self._lease.due_at(self._margin) if self._lease else None
        if due is None:
            return NO_EXPIRY_CHECK
        return max(MIN_DELAY, due - self._clock.time())

    async def verify(self) -> None:
        """Look up our own token: proves Vault answers and still accepts it."""
        await self.ensure_login()
        try:
            await self._lookup_self()
        except (VaultPermissionDenied, VaultAuthError) as exc:
            self._authenticated = False
            raise VaultAuthError("vault rejected keyturn's token") from exc
        self._authenticated = True

    async def token_rejected(self, generation: int) -> bool:
        """After a 403 on a data call made with token `generation`: was the token the cause?

        True means a fresh token is now in place and the call is worth one retry; False means
        the token is fine and the 403 is a real policy denial. A failed re-login raises.
        """
        async with self._lock:
            if generation != self._generation:
                return True
            try:
                await self._lookup_self()
            except (VaultPermissionDenied, VaultAuthError):
                self._authenticated = False
            else:
                return False
            log.warning("vault_token_rejected", method=self._auth.method)
            await self._login_locked()
            return True

    async def _lookup_self(self) -> None:
        await self._client.call(
            _lookup_self, kind="lookup", operation="token lookup", path=None, write=False
        )

    async def _renew(self) -> None:
        try:
            body = await self._client.call(
                _renew_self, kind="renew", operation="token renewal", path=None, write=True
            )
        except VaultError as exc:
            if exc.retryable and not isinstance(exc, VaultAuthError):
                raise  # Vault unreachable: the token may well be fine, try again later
            log.warning("vault_token_renewal_refused", error=str(exc))
            await self._login_again()
            return
        granted, renewable = _grant(body)
        assert self._lease is not None
        self._lease = self._lease.renewed(self._clock.time(), granted, renewable)
        self._authenticated = True
        log.info("vault_token_renewed", ttl=granted, capped=self._lease.exhausted)

    async def _login_again(self) -> None:
        previous = self._token
        await self.login()
        if self._auth.static and self._token == previous and self._lease:
            expires_at = self._lease.expires_at
            log.warning(
                "vault_token_not_renewable",
                method=self._auth.method,
                expires_at=rfc3339(expires_at) if expires_at else None,
            )

    def _failed(self, exc: VaultError) -> float:
        self._failures += 1
        self.last_error = exc
        if isinstance(exc, VaultAuthError):
            self._authenticated = False
        delay = error_delay(self._failures, rng=self._rng)
        expires_at = self.token_expires_at()
        if expires_at is not None and self.authenticated:
            delay = min(delay, max(MIN_DELAY, (expires_at - self._clock.time()) / 2))
        log.warning(
            "vault_token_maintenance_failed",
            error=str(exc),
            failures=self._failures,
            authenticated=self.authenticated,
            retry_in=round(delay, 1),
        )
        return delay

    async def _login_locked(self) -> None:
        try:
            token, lease, accessor = await self._obtain()
        except VaultError:
            self._authenticated = False
            raise
        self._client.set_token(token)
        self._token, self._lease, self.accessor = token, lease, accessor
        self._generation += 1
        self._authenticated = True
        expires_at = lease.expires_at
        log.info(
            "vault_login",
            method=self._auth.method,
            accessor=accessor,
            expires_at=rfc3339(expires_at) if expires_at else None,
            renewable=lease.renewable,
        )

    async def _obtain(self) -> tuple[Secret, TokenLease, str | None]:
        auth = self._auth
        if auth.method in ("token", "token_file"):
            token = auth.token if auth.method == "token" else await self._read(auth.token_path)
            assert token is not None
            # A static token's "login" is a look-up of that token: counted as a login.
            try:
                body = await self._client.call(
                    _lookup_self,
                    kind="login",
                    operation="token lookup",
                    path=None,
                    write=False,
                    auth=True,
                    token=token,
                )
            except VaultAuthError as exc:
                raise self._refused(exc, [token]) from exc
            data = _section(body, "data")
            ttl, renewable = _number(data, "ttl"), bool(data.get("renewable"))
            natural = _number(data, "creation_ttl") if "creation_ttl" in data else ttl
            lease = TokenLease(self._clock.time(), ttl, renewable, natural or ttl)
            return token, lease, _accessor(data)
        sent: list[Secret | None]
        mount = auth.mount_point
        if auth.method == "approle":
            role_id, secret_id = auth.role_id, auth.secret_id
            assert role_id is not None
            sent = [role_id, secret_id]

            def login(node: VaultNode) -> object:
                return node.auth.approle.login(
                    role_id.reveal(),
                    secret_id.reveal() if secret_id is not None else None,
                    use_token=False,
                    mount_point=mount,
                )

        else:
            jwt = await self._read(auth.jwt_path or KUBERNETES_JWT)
            role = auth.role or ""
            sent = [jwt]

            def login(node: VaultNode) -> object:
                return node.auth.kubernetes.login(
                    role, jwt.reveal(), use_token=False, mount_point=mount
                )

        operation = f"{auth.method} login"
        try:
            body = await self._client.call(
                login, kind="login", operation=operation, path=None, write=True, auth=True
            )
        except VaultAuthError as exc:
            raise self._refused(exc, sent) from exc
        section = _section(body, "auth")
        token = section.get("client_token")
        if not isinstance(token, str) or not token:
            raise VaultDataError(f"vault {auth.method} login: no client_token in the response")
        granted, renewable = _grant(body)
        lease = TokenLease(self._clock.time(), granted, renewable, granted)
        await self._usable(Secret(token), sent)
        return Secret(token), lease, _accessor(section)

    async def _usable(self, token: Secret, sent: list[Secret | None]) -> None:
        """Look up a token Vault has just issued: a role's `token_bound_cidrs` lets the login
        through and then refuses every use of the token from elsewhere, which would otherwise
        surface later as a baffling "permission denied" on the first data call."""
        try:
            await self._client.call(
                _lookup_self,
                kind="lookup",
                operation="token lookup",
                path=None,
                write=False,
                token=token,
            )
        except (VaultPermissionDenied, VaultAuthError) as exc:
            said = _said(exc, [*sent, token])
            raise VaultAuthError(
                f"{self._where()}: Vault issued a token and then refused it ({said}); the "
                "role's token_bound_cidrs may exclude this address, or the token's policies "
                "lack read on auth/token/lookup-self"
            ) from exc

    def _where(self) -> str:
        auth = self._auth
        if auth.static:
            return f"vault {auth.method} login"
        return f"vault {auth.method} login at auth/{auth.mount_point}"

    def _refused(self, exc: VaultAuthError, sent: list[Secret | None]) -> VaultAuthError:
        """A login Vault refused, in Vault's own words, naming the configuration entries the
        refused inputs came from (never their values: anything sent is blotted out of the
        words, though Vault's login errors quote none)."""
        status = http_status(exc.__cause__)
        if status is None:
            return exc
        auth = self._auth
        said = _said(exc, sent)
        if auth.static:
            key = "token" if auth.method == "token" else "path"
            hint = f"the token comes from {auth.source(key)}"
        elif status in (403, 404, 405):
            # Vault answers a login path where nothing is mounted with 403 permission denied.
            hint = (
                f"likely no auth method is mounted at auth/{auth.mount_point} "
                "(check vault.auth.mount)"
            )
            if auth.method == "kubernetes":
                hint += f", or the service account token ({auth.source('jwt_path')}) was refused"
        elif auth.method == "approle":
            hint = (
                f"role_id from {auth.source('role_id')}, secret_id from {auth.source('secret_id')}"
            )
        else:
            hint = f"role {auth.role!r}, service account token from {auth.source('jwt_path')}"
        return VaultAuthError(f"{self._where()}: login rejected ({said}); {hint}")

    async def _read(self, path: Path | None) -> Secret:
        """A token or JWT file, read off the loop; errors name the file, never its content."""
        assert path is not None

        def read() -> str:
            return path.read_text(encoding="utf-8").strip()

        try:
            text = await asyncio.get_running_loop().run_in_executor(None, read)
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise VaultAuthError(
                f"vault {self._auth.method} login: cannot read {path}: {reason}"
            ) from exc
        if not text:
            raise VaultAuthError(f"vault {self._auth.method} login: {path} is empty")
        return Secret(text)


def _said(exc: VaultError, sent: list[Secret | None]) -> str:
    """`HTTP 400: <Vault's words>` for a refused call, with any value in `sent` blotted out."""
    cause = exc.__cause__
    reason = vault_reason(cause)
    for secret in sent:
        value = secret.reveal() if secret is not None else ""
        if len(value) >= 4:
            reason = reason.replace(value, "[redacted]")
    status = http_status(cause)
    where = f"HTTP {status}" if status else type(cause).__name__
    return f"{where}: {reason}" if reason else where


def _section(body: dict[str, Any] | None, name: str) -> dict[str, Any]:
    section = body.get(name) if body else None
    if not isinstance(section, dict):
        raise VaultDataError(f"vault token response has no {name!r} object")
    return section


def _number(section: dict[str, Any], name: str) -> float:
    value = section.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise VaultDataError(f"vault token response: {name!r} is not a non-negative number")
    return float(value)


def _accessor(section: dict[str, Any]) -> str | None:
    accessor = section.get("accessor")
    return accessor if isinstance(accessor, str) and accessor else None


def _grant(body: dict[str, Any] | None) -> tuple[float, bool]:
    """(lease_duration, renewable) from the `auth` block of a login or renewal response."""
    auth = _section(body, "auth")
    return _number(auth, "lease_duration"), bool(auth.get("renewable"))
