"""keyturn's exceptions: one root (`KeyturnError`), a tree, retryability as a class property.

Messages name the credential and the field, never a value (secrets travel as
`keyturn.secret.Secret`); foreign exceptions (httpx, hvac, OSError) are translated with
`raise ... from exc` where they enter keyturn. The tree: docs/architecture.md#errors.
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


class KeyMaterialError(KeyturnError):
    """A private key or certificate keyturn was given cannot be used (unparseable, the wrong
    type for its algorithm, too short, expired); `field` names it. Never retryable: an operator
    must replace it. The message never quotes the material."""

    def __init__(self, message: str, *, field: str, credential: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}", credential=credential)


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

    `status`: the 5xx received, else None; `retry_after`: a valid Retry-After's seconds, else
    None. `answer_lost`: the request may have been processed with no complete answer read (so a
    token request may have consumed a rotated refresh token); False when it certainly never left
    or a status came back. Which failures are which: docs/provider-responses.md.
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
