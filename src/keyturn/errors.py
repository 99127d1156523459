"""keyturn's exceptions: one root, a tree, retryability as a class property.

    KeyturnError
    ├── ConfigError ............ the TOML file or an override is wrong (file, key path, expected)
    ├── SecretReferenceError ... a `vault:`/`env:`/`file:` reference cannot be resolved
    ├── VaultError ............. anything from Vault, translated at the store's edge
    │   ├── VaultUnavailable ...... network error, 5xx, sealed            (retryable)
    │   ├── VaultAuthError ........ login failed, token expired/revoked   (retryable)
    │   ├── VaultPermissionDenied . the policy lacks a capability on a path
    │   ├── VaultCasConflict ...... check-and-set lost: someone else wrote (retryable)
    │   ├── VaultDataError ........ a stored value is missing or malformed
    │   └── VaultMountError ....... the KV mount is missing or not KV v2: nothing may be written
    ├── ProviderError .......... the service (token endpoint, probe, rotator APIs)
    │   ├── ProviderUnavailable ... network error, time-out, 5xx          (retryable)
    │   │                           carries `retry_after`, `answer_lost`
    │   │   └── ProbeUnanswered ... a new token's probe got no answer: kept, probed again
    │   ├── RateLimited ........... 429, carries `retry_after`            (retryable)
    │   ├── OAuthError ............ an RFC 6749 §5.2 error, carries `error` (e.g. invalid_grant)
    │   └── MalformedResponse ..... a response keyturn cannot trust (carries the field)
    ├── VerificationFailed ..... a new credential was rejected by the probe (401/403)
    └── RotationError .......... a rotator failed (exec exit code, time-out, bad output)

Messages name the credential and the field, never a value: every value that could be secret
travels as `keyturn.secret.Secret`, whose text form is a placeholder. Foreign exceptions
(httpx, hvac, OSError) are translated with `raise ... from exc` where they enter keyturn.
"""

from __future__ import annotations

from typing import ClassVar


class KeyturnError(Exception):
    """Root of keyturn's errors. `retryable` says whether backing off and trying again may help."""

    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, credential: str | None = None) -> None:
        self.credential = credential
        self.message = message
        super().__init__(f"{credential}: {message}" if credential else message)


class ConfigError(KeyturnError):
    """The configuration is invalid; `problems` holds one line per problem."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class SecretReferenceError(KeyturnError):
    """A secret reference could not be resolved (missing env var, file, Vault field)."""


class VaultError(KeyturnError):
    """Vault refused or failed an operation."""

    def __init__(self, message: str, *, path: str | None = None, credential: str | None = None):
        self.path = path
        super().__init__(f"{message} (path {path})" if path else message, credential=credential)


class VaultUnavailable(VaultError):
    retryable = True


class VaultAuthError(VaultError):
    retryable = True


class VaultPermissionDenied(VaultError):
    pass


class VaultCasConflict(VaultError):
    retryable = True


class VaultDataError(VaultError):
    pass


class VaultMountError(VaultError):
    """The mount keyturn writes to is missing, KV v1 or another engine. Not retryable: on KV v1
    every write would *succeed* as junk at `<mount>/data/...`, so keyturn refuses to start."""


class ProviderError(KeyturnError):
    """The service answered badly or not at all."""


class ProviderUnavailable(ProviderError):
    """No usable answer: a network error, a time-out or a 5xx.

    `status`: the HTTP status when one was received (5xx), else None. `retry_after`: seconds
    from a valid Retry-After on that answer, else None. `answer_lost`: True when the request
    may have reached the provider and been processed but no complete answer was read (read or
    write time-out, the total deadline expiring once the request started to leave, or for a
    request other than a refresh token grant, which is not traced, expiring at all; the server
    closing the connection); False when it certainly never left (connection refused, connect
    or pool time-out) or when a status was received. A token request whose answer was lost
    may have consumed a rotated refresh token.
    """

    retryable = True

    def __init__(
        self,
        message: str,
        *,
        credential: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
        answer_lost: bool = False,
    ) -> None:
        self.status = status
        self.retry_after = retry_after
        self.answer_lost = answer_lost
        super().__init__(message, credential=credential)


class ProbeUnanswered(ProviderUnavailable):
    """A new token's probe got no usable answer (network, time-out, 5xx, 429) after its
    retries: the token is kept, unpublished, and probed again at the next try; no new token is
    asked for while it is good."""


class RateLimited(ProviderError):
    retryable = True

    def __init__(
        self, message: str, *, credential: str | None = None, retry_after: float | None = None
    ) -> None:
        self.retry_after = retry_after
        super().__init__(message, credential=credential)


class OAuthError(ProviderError):
    """An RFC 6749 §5.2 error response; `error` is the code, e.g. `invalid_grant`."""

    def __init__(
        self,
        error: str,
        *,
        credential: str | None = None,
        description: str | None = None,
        status: int | None = None,
        endpoint: str = "token endpoint",
    ) -> None:
        self.error = error
        self.description = description
        self.status = status
        detail = f" ({description})" if description else ""
        super().__init__(f"{endpoint} returned {error}{detail}", credential=credential)


class MalformedResponse(ProviderError):
    """A response keyturn will not trust; `field` names the offending part."""

    def __init__(self, message: str, *, field: str, credential: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}", credential=credential)


class VerificationFailed(KeyturnError):
    retryable = True

    def __init__(self, message: str, *, credential: str | None = None, status: int | None = None):
        self.status = status
        super().__init__(message, credential=credential)


class RotationError(KeyturnError):
    retryable = True
