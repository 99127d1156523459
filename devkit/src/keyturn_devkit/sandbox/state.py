"""The sandbox's domain logic, in memory: credentials, grants, refresh rotation, revocation.

Every decision about time reads the injected `Clock`, so unit tests drive expiry, secret
overlaps and refresh-token lifetimes with `FakeClock`. Methods never await: on one event loop
each call is atomic, which is what makes "a refresh token is exchanged at most once" hold.
"""

from __future__ import annotations

import hmac
import itertools
from collections.abc import Mapping
from typing import Any, Literal

from keyturn.clock import Clock
from keyturn.secret import Secret
from keyturn_devkit.sandbox.config import Settings, apply_settings
from keyturn_devkit.sandbox.model import (
    PREFIX_ACCESS_TOKEN,
    PREFIX_API_KEY,
    PREFIX_CLIENT_SECRET,
    PREFIX_REFRESH_TOKEN,
    ApiKey,
    BearerRejected,
    ClientSecret,
    Grant,
    IssuedToken,
    NotFound,
    OAuthApp,
    OAuthFailure,
    Principal,
    TokenFamily,
    digest,
    jwt_shaped,
    new_id,
    new_secret,
)

# Expired tokens are kept this long so a late caller hears "expired", not "unknown".
RETENTION_SECONDS = 3600.0
PRUNE_EVERY_SECONDS = 60.0


def _invalid_client(description: str) -> OAuthFailure:
    return OAuthFailure("invalid_client", description, status=401)


class SandboxState:
    """All the sandbox knows. Not thread-safe by design: one event loop owns it."""

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.settings = settings
        self.clock = clock
        self._api_keys: dict[str, ApiKey] = {}
        self._api_keys_by_digest: dict[bytes, ApiKey] = {}
        self._apps: dict[str, OAuthApp] = {}
        self._access: dict[bytes, IssuedToken] = {}
        self._refresh: dict[bytes, IssuedToken] = {}
        self._last_prune = clock.time()
        # Token and family ids are not secret and only need to be unique: a counter is cheaper
        # than randomness on the token endpoint's hot path.
        self._serial = itertools.count(1)

    def update_settings(self, data: Mapping[str, Any], source: str = "settings") -> Settings:
        self.settings = apply_settings(self.settings, data, source)
        return self.settings

    # -- API keys ---------------------------------------------------------------------------

    def create_api_key(
        self, name: str, description: str = "", scope: str | None = None
    ) -> tuple[ApiKey, Secret]:
        value = new_secret(PREFIX_API_KEY)
        key = ApiKey(
            key_id=new_id("key_"),
            name=name,
            description=description,
            digest=digest(value.reveal()),
            created_at=self.clock.time(),
            scope=scope,
        )
        self._api_keys[key.key_id] = key
        self._api_keys_by_digest[key.digest] = key
        return key, value

    def api_key(self, key_id: str) -> ApiKey:
        try:
            return self._api_keys[key_id]
        except KeyError:
            raise NotFound(f"no API key {key_id}") from None

    def api_keys(self) -> list[ApiKey]:
        return list(self._api_keys.values())

    def revoke_api_key(self, key_id: str) -> ApiKey:
        key = self.api_key(key_id)
        if key.revoked_at is None:
            key.revoked_at = self.clock.time()
        return key

    # -- OAuth applications and their secrets ---------------------------------------------------

    def register_app(
        self, name: str, redirect_uri: str, scope: str | None = None
    ) -> tuple[OAuthApp, ClientSecret, Secret]:
        app = OAuthApp(
            client_id=new_id("client_"),
            name=name,
            redirect_uri=redirect_uri,
            scope=scope,
            created_at=self.clock.time(),
        )
        self._apps[app.client_id] = app
        record, value = self._add_secret(app)
        return app, record, value

    def app(self, client_id: str) -> OAuthApp:
        try:
            return self._apps[client_id]
        except KeyError:
            raise NotFound(f"no OAuth application {client_id}") from None

    def has_app(self, client_id: str) -> bool:
        return client_id in self._apps

    def apps(self) -> list[OAuthApp]:
        return list(self._apps.values())

    def _add_secret(self, app: OAuthApp) -> tuple[ClientSecret, Secret]:
        value = new_secret(PREFIX_CLIENT_SECRET)
        record = ClientSecret(new_id("sec_"), digest(value.reveal()), self.clock.time())
        app.secrets.append(record)
        return record, value

    def rotate_client_secret(
        self, client_id: str, overlap: int | None = None
    ) -> tuple[ClientSecret, Secret]:
        """A new secret; every older one stays valid for `overlap` seconds (setting by default)."""
        app = self.app(client_id)
        now = self.clock.time()
        until = now + (self.settings.client_secret_overlap if overlap is None else overlap)
        for old in app.secrets:
            if old.revoked_at is None and (old.expires_at is None or old.expires_at > until):
                old.expires_at = until
        return self._add_secret(app)

    def delete_app(self, client_id: str) -> OAuthApp:
        """Forget an application: its secrets are revoked and so is every grant it holds."""
        app = self.app(client_id)
        now = self.clock.time()
        for token in self.tokens(client_id):
            self._revoke_family(token.family, "application deleted")
        for record in app.secrets:
            if record.revoked_at is None:
                record.revoked_at = now
        del self._apps[client_id]
        return app

    def revoke_client_secret(self, client_id: str, secret_id: str) -> ClientSecret:
        for record in self.app(client_id).secrets:
            if record.secret_id == secret_id:
                if record.revoked_at is None:
                    record.revoked_at = self.clock.time()
                return record
        raise NotFound(f"no secret {secret_id} for {client_id}")

    def authenticate_client(self, client_id: str, client_secret: Secret) -> OAuthApp:
        """The app, or invalid_client (401); records the attempt in the app's usage."""
        app = self._apps.get(client_id)
        if app is None:
            raise _invalid_client("unknown client")
        now = self.clock.time()
        presented = digest(client_secret.reveal())
        for record in app.secrets:
            if hmac.compare_digest(record.digest, presented):
                status = record.status(now)
                if status in ("active", "expiring"):
                    app.usage.accepted(now)
                    app.oauth_requests += 1
                    return app
                app.usage.rejected_count += 1
                raise _invalid_client(f"client secret {record.secret_id} is {status}")
        app.usage.rejected_count += 1
        raise _invalid_client("client authentication failed")

    # -- grants ---------------------------------------------------------------------------------

    def _granted_scope(self, allowed: str, requested: str | None) -> str:
        if requested:
            missing = set(requested.split(" ")) - set(allowed.split(" "))
            if missing:
                names = " ".join(sorted(missing))
                raise OAuthFailure("invalid_scope", f"scope not allowed: {names}")
            return requested
        return allowed

    def grant_client_credentials(
        self, app: OAuthApp, scope: str | None = None, audience: tuple[str, ...] = ()
    ) -> Grant:
        allowed = app.scope if app.scope is not None else self.settings.default_scope
        granted = self._granted_scope(allowed, scope)
        family = TokenFamily(
            f"fam_{next(self._serial):08x}",
            app.client_id,
            audience=audience,
            started_at=self.clock.time(),
        )
        refresh = self.settings.issue_refresh_token_for_client_credentials
        return self._issue(family, granted, with_refresh=refresh)

    def grant_refresh_token(
        self,
        app: OAuthApp,
        refresh_token: Secret,
        scope: str | None = None,
        audience: tuple[str, ...] = (),
    ) -> Grant:
        """Exchange a refresh token once; a second exchange is theft and revokes the family."""
        now = self.clock.time()
        token = self._refresh.get(digest(refresh_token.reveal()))
        if token is None:
            raise OAuthFailure("invalid_grant", "unknown refresh token")
        if token.client_id != app.client_id:
            raise OAuthFailure("invalid_grant", "refresh token was issued to another client")
        if token.revoked_at is not None or token.family.revoked_at is not None:
            raise OAuthFailure("invalid_grant", "refresh token has been revoked")
        if token.used_at is not None:
            app.refresh_token_reuses += 1
            self._revoke_family(token.family, "refresh token reuse")
            raise OAuthFailure(
                "invalid_grant", "refresh token was already used; its token family is revoked"
            )
        if now >= token.expires_at:
            raise OAuthFailure("invalid_grant", "refresh token has expired")
        granted = self._granted_scope(token.scope, scope)
        token.used_at = now
        previous = token.family.latest_access
        replace = self.settings.revoke_previous_access_token_on_refresh
        if replace and previous is not None and previous.revoked_at is None:
            # As django-oauth-toolkit does: the access token this refresh replaces dies now,
            # even though its lifetime is not over.
            previous.revoked_at = now
            previous.reason = "replaced at refresh"
        return self._issue(token.family, granted, with_refresh=True, audience=audience)

    def _issue(
        self,
        family: TokenFamily,
        scope: str,
        *,
        with_refresh: bool,
        audience: tuple[str, ...] = (),
    ) -> Grant:
        settings = self.settings
        now = self.clock.time()
        self._maybe_prune(now)
        scope = settings.scope_override if settings.scope_override is not None else scope
        access = new_secret(PREFIX_ACCESS_TOKEN)
        if settings.jwt_access_tokens:
            aud = audience or family.audience or (family.client_id,)
            access = jwt_shaped(access, family.client_id, aud, now, settings.access_token_lifetime)
        family.latest_access = self._store(
            table=self._access,
            kind="access",
            value=access,
            family=family,
            scope=scope,
            lifetime=settings.access_token_lifetime,
        )
        refresh: Secret | None = None
        refresh_lifetime = settings.refresh_token_lifetime
        if settings.refresh_token_family_lifetime is not None:
            left = family.started_at + settings.refresh_token_family_lifetime - now
            refresh_lifetime = max(1, min(refresh_lifetime, int(left)))
        if with_refresh:
            refresh = new_secret(PREFIX_REFRESH_TOKEN)
            self._store(
                table=self._refresh,
                kind="refresh",
                value=refresh,
                family=family,
                scope=scope,
                lifetime=refresh_lifetime,
            )
        return Grant(
            access_token=access,
            token_type=settings.token_type,
            expires_in=settings.access_token_lifetime if settings.include_expires_in else None,
            scope=scope,
            refresh_token=refresh,
            family_id=family.family_id,
            refresh_expires_in=refresh_lifetime if settings.include_refresh_expires_in else None,
        )

    def _store(
        self,
        *,
        table: dict[bytes, IssuedToken],
        kind: Literal["access", "refresh"],
        value: Secret,
        family: TokenFamily,
        scope: str,
        lifetime: int,
    ) -> IssuedToken:
        now = self.clock.time()
        token = IssuedToken(
            token_id=f"tok_{next(self._serial):08x}",
            kind=kind,
            digest=digest(value.reveal()),
            client_id=family.client_id,
            family=family,
            scope=scope,
            issued_at=now,
            expires_at=now + lifetime,
        )
        table[token.digest] = token
        return token

    # -- resource requests ----------------------------------------------------------------------

    def authenticate_bearer(self, value: str) -> Principal:
        """Who `value` (an API key or access token) is, or a BearerRejected saying why not."""
        now = self.clock.time()
        presented = digest(value)
        key = self._api_keys_by_digest.get(presented)
        # Some providers answer 403 instead of RFC 6750's 401 for a dead credential.
        dead = self.settings.invalid_token_status
        if key is not None:
            if key.revoked_at is not None:
                key.usage.rejected_count += 1
                raise BearerRejected("invalid_token", "the API key has been revoked", dead)
            key.usage.accepted(now)
            return Principal("api_key", key.key_id, key.scope)
        token = self._access.get(presented)
        if token is None:
            raise BearerRejected("invalid_token", "unknown API key or access token", dead)
        app = self._apps.get(token.client_id)
        status = token.status(now)
        if status != "active":
            if app is not None:
                app.usage.rejected_count += 1
            raise BearerRejected("invalid_token", f"the access token is {status}", dead)
        if app is not None:
            app.usage.accepted(now)
            app.resource_requests += 1
        return Principal("access_token", token.client_id, token.scope)

    # -- revocation and listing -----------------------------------------------------------------

    def find_token(self, value: Secret) -> IssuedToken | None:
        presented = digest(value.reveal())
        return self._access.get(presented) or self._refresh.get(presented)

    def revoke_token(self, token: IssuedToken) -> None:
        """Revoke one token; revoking a refresh token revokes its whole grant (RFC 7009 §2.1)."""
        if token.kind == "refresh":
            self._revoke_family(token.family, "refresh token revoked")
        elif token.revoked_at is None:
            token.revoked_at = self.clock.time()

    def revoke_client_tokens(self, client_id: str) -> int:
        """Revoke every grant of a client; returns how many families were revoked."""
        self.app(client_id)
        families = {t.family.family_id: t.family for t in self.tokens(client_id)}
        live = [f for f in families.values() if f.revoked_at is None]
        for family in live:
            self._revoke_family(family, "revoked by admin")
        return len(live)

    def _revoke_family(self, family: TokenFamily, reason: str) -> None:
        if family.revoked_at is None:
            family.revoked_at = self.clock.time()
            family.revoke_reason = reason

    def tokens(self, client_id: str | None = None) -> list[IssuedToken]:
        every = [*self._access.values(), *self._refresh.values()]
        chosen = [t for t in every if client_id is None or t.client_id == client_id]
        return sorted(chosen, key=lambda t: t.issued_at)

    def _maybe_prune(self, now: float) -> None:
        """Forget tokens long expired, at most once a minute, so memory stays bounded."""
        if now - self._last_prune < PRUNE_EVERY_SECONDS:
            return
        self._last_prune = now
        horizon = now - RETENTION_SECONDS
        for table in (self._access, self._refresh):
            for stale in [d for d, t in table.items() if t.expires_at < horizon]:
                del table[stale]

    def token_count(self) -> int:
        return len(self._access) + len(self._refresh)
