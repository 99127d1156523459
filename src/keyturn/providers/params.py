"""A credential's own token-request parameters (`audience`, `resource`, `token_params`),
resolved, and what a refusal of them means.

`TokenParams.add_to` puts them in the request body the provider's `token_request` asks for:
in a form body each `resource` is its own parameter (RFC 8707 §2); in a JSON body one resource
is a string and several an array. An error answer that can be about them (`invalid_target`,
`invalid_request`, `access_denied`) is re-raised as a `ParameterRefused` that names the
configuration key to look at, so the line an operator reads says what to change.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Literal

from keyturn.errors import OAuthError
from keyturn.secret import Secret

# Error codes a server answers when it refuses a parameter (RFC 6749 §5.2, RFC 8707 §2;
# Auth0 answers access_denied for an audience it does not know).
_ABOUT_PARAMETERS = frozenset({"invalid_target", "invalid_request", "access_denied"})


class ParameterRefused(OAuthError):
    """The token endpoint refused a request that carried the credential's own parameters;
    `fields` are the configuration keys it is about (or may be)."""

    def __init__(self, error: OAuthError, fields: tuple[str, ...], *, certain: bool) -> None:
        self.fields = fields
        super().__init__(
            error.error,
            credential=error.credential,
            description=error.description,
            status=error.status,
        )
        which = ", ".join(fields)
        hint = f"the server refused {which}" if certain else f"check {which}"
        self.message = f"{self.message}; {hint} in the credential's configuration"
        self.args = (f"{error.credential}: {self.message}" if error.credential else self.message,)


@dataclass(frozen=True, slots=True)
class TokenParams:
    """One request's worth of the credential's parameters, references resolved."""

    audience: str | None = None
    resources: tuple[str, ...] = ()
    extra: tuple[tuple[str, Secret], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.audience or self.resources or self.extra)

    def add_to(self, fields: dict[str, str | list[str]], body: Literal["json", "form"]) -> None:
        if self.audience is not None:
            fields["audience"] = self.audience
        if len(self.resources) == 1 and body == "json":
            fields["resource"] = self.resources[0]
        elif self.resources:
            fields["resource"] = list(self.resources)  # httpx repeats a form parameter
        for name, value in self.extra:
            fields[name] = value.reveal()

    def secrets(self) -> tuple[Secret, ...]:
        """Values a server's error text must not echo (a reference may have been a secret)."""
        return tuple(value for _, value in self.extra)

    def keys(self) -> tuple[str, ...]:
        """The configuration keys this request carries, as an operator writes them."""
        keys = ["audience"] if self.audience is not None else []
        keys += ["resource"] if self.resources else []
        return (*keys, *(f"token_params.{name}" for name, _ in self.extra))

    def blame(self, error: OAuthError) -> OAuthError:
        """`error` naming the key it is about, if it can be about these parameters."""
        if not self or error.error not in _ABOUT_PARAMETERS:
            return error
        if error.error == "invalid_target" and self.resources:
            return ParameterRefused(error, ("resource",), certain=True)
        text = (error.description or "").lower()
        named = tuple(
            key for key in self.keys() if key.rpartition(".")[2].lower() in text
        )
        if named:
            return ParameterRefused(error, named, certain=True)
        return ParameterRefused(error, self.keys(), certain=False)


NO_PARAMS = TokenParams()

# A JWT's payload is read only up to this size: an access token is not a document.
_MAX_PAYLOAD = 16384


def token_audience(access_token: Secret) -> tuple[str, ...] | None:
    """The `aud` claim of a JWT access token (RFC 9068), read without verifying it (keyturn is
    not its audience: it only learns what the server granted); None for an opaque token, one
    without `aud`, or anything it cannot read. Nothing of the token reaches a message."""
    parts = access_token.reveal().split(".")
    if len(parts) != 3 or len(parts[1]) > _MAX_PAYLOAD:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        return None
    aud = payload.get("aud") if isinstance(payload, dict) else None
    if isinstance(aud, str):
        return (aud,)
    if isinstance(aud, list) and aud and all(isinstance(a, str) for a in aud):
        return tuple(aud)
    return None
