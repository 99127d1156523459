"""The rotator interface: how keyturn gets a new key or client secret, and retires an old one.

A rotator only *creates* and *revokes*; verification, publishing and the journal are keyturn's
own (`keyturn.jobs.rotation`). Implementations: `http` (a provider's key-management API described in
config), `exec` (an operator's command, parameters as JSON on stdin), `manual` (a person makes
the key in the dashboard and hands it over with `keyturn import-key`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from keyturn.errors import RotationError
from keyturn.secret import Secret


@dataclass(frozen=True, slots=True)
class RotationRequest:
    """What a rotator is told about the rotation at hand (no secret in here)."""

    credential: str  # the credential's name in keyturn's configuration
    kind: str  # the credential's kind, a name in keyturn.kinds.KINDS ("api_key", "oauth_client")
    rotation_id: str  # unique per rotation; stable across a crash and resume
    key_name: str  # a name for the new key, derived from credential and rotation_id
    client_id: str | None = None  # for oauth_client: whose secret is rotated
    # For signing_key: the public JWK to register at the provider (a public key, not secret).
    public_key: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class NewKey:
    """A freshly created key (or client secret) and the provider's id for it, if any."""

    value: Secret
    key_id: str | None


def json_kind(value: object) -> str:
    """What kind of JSON value a rotator got, without the value (it may be a key): "null",
    "a boolean", "a number", "an empty string", "a string", "an array" or "an object"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string" if value else "an empty string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class AwaitingManualKey(RotationError):
    """Raised by the manual rotator: a person has to create the key and import it."""

    retryable = True


class Rotator(Protocol):
    name: str

    async def create(self, request: RotationRequest) -> NewKey:
        """Create a new key at the provider. Raises RotationError (or a ProviderError)."""

    async def revoke(self, request: RotationRequest, key_id: str) -> None:
        """Revoke the key `key_id`. A key that no longer exists counts as revoked."""

    async def find(self, request: RotationRequest) -> list[str] | None:
        """Ids of keys named `request.key_name` (keys a crash left behind after `create`), or
        None when this rotator cannot list keys."""

    async def aclose(self) -> None:
        """Release connections."""


@runtime_checkable
class KeyRegistry(Protocol):
    """A rotator that registers a public key keyturn made (a signing key's, at a provider's own
    API) instead of creating a key: the `exec` rotator's `register` action."""

    name: str

    async def register(self, request: RotationRequest) -> str:
        """Register `request.public_key` under the name `request.key_name`; the provider's id
        for it. Raises RotationError (or a ProviderError)."""

    async def revoke(self, request: RotationRequest, key_id: str) -> None:
        """Remove the key `key_id`. A key that no longer exists counts as removed."""

    async def find(self, request: RotationRequest) -> list[str] | None:
        """Ids of keys named `request.key_name`, or None when the provider cannot list them."""
