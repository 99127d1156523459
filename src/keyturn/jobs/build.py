"""What the jobs of one configuration share and hold: a credential's inputs, resolved when a
task asks (`CredentialInputs`), and the `JobSet` of one configuration (how long a lease lasts,
`lease_seconds`, is `keyturn.jobs.job`'s, re-exported here).

Jobs are built by their credential's kind: `keyturn.kinds.build_jobs` (nothing in
`keyturn.jobs` imports a kind).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from keyturn.clock import Clock, SystemClock
from keyturn.config import Config, CredentialConfig
from keyturn.errors import SecretReferenceError
from keyturn.jobs.job import LEASE_SLACK, CredentialJob, lease_seconds
from keyturn.providers.client import ClientSecret, ProviderClient
from keyturn.providers.client_auth import resolve_keyless
from keyturn.references import ReferenceResolver
from keyturn.rotators.base import Rotator
from keyturn.secret import Secret

__all__ = ["LEASE_SLACK", "CredentialInputs", "JobSet", "lease_seconds"]


class CredentialInputs:
    """One credential's inputs, resolved from their references when a task asks.

    client_id and client_secret are read once (one Vault read when they share a secret) and
    kept in memory (10,000 credentials must not cost 20,000 Vault reads per refresh cycle);
    `fresh=True` re-reads them, which the refresh does on invalid_client in case the secret was
    changed at its source. The starting refresh token and the initial key are read each time
    they are asked for (rarely).

    `rotated_key`: the client key is one another credential of this configuration rotates (a
    `signing_key`'s published `private_key`), read at each request: a server that fetches the
    client's `jwks_uri` goes on accepting the old key after it left the document
    (panva/oidc-provider does until an assertion fails against its copy), so no refusal would
    say that it changed.
    """

    def __init__(
        self,
        credential: CredentialConfig,
        resolver: ReferenceResolver,
        clock: Clock | None = None,
        *,
        rotated_key: bool = False,
    ) -> None:
        self._credential = credential
        self._resolver = resolver
        self._clock = clock or SystemClock()
        self._client: tuple[str, ClientSecret] | None = None
        self._rotated_key = rotated_key and credential.keyless

    async def client(self, *, fresh: bool = False) -> tuple[str, ClientSecret]:
        if fresh or self._client is None or self._rotated_key:
            credential = self._credential
            if credential.client_id is not None and credential.keyless:
                self._client = await resolve_keyless(
                    credential, self._resolver.resolve_all, self._clock.time()
                )
                return self._client
            if credential.client_id is None or credential.client_secret is None:
                raise SecretReferenceError(
                    f"{credential.name}: an {credential.kind} has no client inputs"
                )
            # One Vault read when both live in one secret, as they usually do.
            client_id, client_secret = await self._resolver.resolve_all(
                (credential.client_id, credential.client_secret)
            )
            self._client = (client_id.reveal(), client_secret)
        return self._client

    async def refresh_token(self) -> Secret | None:
        ref = self._credential.refresh_token
        return None if ref is None else await self._resolver.resolve(ref)

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        credential = self._credential
        if credential.initial_key is None:
            return None
        return await self._resolver.resolve(credential.initial_key), credential.initial_key_id


@dataclass(frozen=True, slots=True)
class JobSet:
    """Everything built from one configuration: provider clients, rotators, jobs.

    A configuration reload builds a new JobSet and closes the old one once its runs are over.
    """

    config: Config
    clients: dict[str, ProviderClient] = field(default_factory=dict)
    rotators: dict[str, Rotator] = field(default_factory=dict)
    jobs: dict[str, CredentialJob] = field(default_factory=dict)

    async def aclose(self) -> None:
        for rotator in self.rotators.values():
            await rotator.aclose()
        for client in self.clients.values():
            await client.aclose()
