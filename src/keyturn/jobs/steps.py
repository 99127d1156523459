"""Steps more than one task takes: publishing with check-and-set, verifying a new credential
with the probe (and telling a probe without an answer from a refusal), reading a server's
Retry-After, labelling a failed token request, and naming the input an error came from. A task
module imports these from here, never from another task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from keyturn.config import CredentialConfig
from keyturn.errors import (
    KeyturnError,
    MalformedResponse,
    OAuthError,
    ProviderUnavailable,
    RateLimited,
    SecretReferenceError,
    VaultCasConflict,
    VaultError,
    VerificationFailed,
)
from keyturn.events import NO_ANSWER, Observer, Probed, Suspicious
from keyturn.jobs.job import JobDeps
from keyturn.providers.client import ProviderClient
from keyturn.providers.tokens import error_label
from keyturn.secret import Secret
from keyturn.vault.store import KvStore


async def publish_with_cas(
    store: KvStore,
    observer: Observer,
    *,
    path: str,
    data: dict[str, str | Secret],
    metadata: dict[str, str],
    last_version: int | None,
    credential: str,
    provider: str,
    report: bool = True,
    metadata_in_place: bool = False,
) -> int:
    """Write what apps read, on top of the version keyturn last wrote, and `metadata` as the
    path's custom metadata (a second Vault call) unless `metadata_in_place`: the caller knows
    the path holds it already (it wrote or read it there at `last_version`).

    A CAS conflict means someone else wrote the path: it is reported, and keyturn publishes
    anew on top of the current version so apps get a working credential again, with its custom
    metadata unless the metadata just read shows it in place. (A crash between publishing and
    recording it looks the same, and is reported too: KV metadata cannot prove who wrote a
    version.)
    """
    try:
        return await store.write(
            path,
            data,
            cas=last_version or 0,
            custom_metadata=None if metadata_in_place else metadata,
        )
    except VaultCasConflict:
        current = await store.read_metadata(path, consistent=True)
        seen = current.current_version if current else 0
        if last_version is not None and report:
            observer(
                Suspicious(
                    credential,
                    provider,
                    "published_secret_changed",
                    "warning",
                    f"published path was at version {seen}, keyturn last wrote {last_version}",
                )
            )
        in_place = current is not None and dict(current.custom_metadata) == metadata
        return await store.write(
            path, data, cas=seen, custom_metadata=None if in_place else metadata
        )


@dataclass(frozen=True, slots=True)
class ProbeAuth:
    """`probe_auth`: the probe's Authorization is another credential's token, read afresh
    before each probe (`token`); the credential's own value goes in the header `header`."""

    token: Callable[[], Awaitable[Secret]]
    header: str
    source: str = "another credential"  # what the token is, for errors: "credential:NAME"

    @classmethod
    def of(cls, credential: CredentialConfig, deps: JobDeps) -> ProbeAuth | None:
        """The credential's, if it sets `probe_auth`; a token that cannot be read is a probe
        without an answer (the credential's own value is not judged by it)."""
        if credential.probe_auth is None or credential.probe_header is None:
            return None
        token = deps.credential_token(
            credential.probe_auth, field="probe_auth", error=ProviderUnavailable
        )
        return cls(token, credential.probe_header, str(credential.probe_auth))


async def send_probe(
    client: ProviderClient,
    credential: str,
    probe: str,
    value: Secret,
    probe_auth: ProbeAuth | None,
) -> int:
    """The probe's status: `value` as the bearer credential, or with `probe_auth`, in its
    header beside the other credential's token. A 401/403 to a token replaced meanwhile (a
    server may revoke it at its refresh) is sent again once with the new one; a 401 still is a
    probe without an answer (the other's token was refused, not `value`), a 403 a refusal."""
    if probe_auth is None:
        return await client.probe(credential, probe, Secret(f"Bearer {value.reveal()}"))
    sent: Secret | None = None
    status = 0
    for _ in range(2):
        try:
            token = await probe_auth.token()
        except ProviderUnavailable as error:
            raise ProviderUnavailable(error.message, credential=credential) from error
        if sent is not None and token.reveal() == sent.reveal():
            break
        sent = token
        authorization = Secret(f"Bearer {token.reveal()}")
        status = await client.probe(credential, probe, authorization, {probe_auth.header: value})
        if status not in (401, 403):
            break
    if status == 401:  # Authorization (the other's token) refused: nothing said of `value`
        raise ProviderUnavailable(
            f"probe {probe}: HTTP 401 to probe_auth's token ({probe_auth.source}); the "
            "credential's own value was not judged",
            credential=credential,
        )
    return status


async def verify_with_probe(
    client: ProviderClient,
    observer: Observer,
    *,
    credential: str,
    provider: str,
    probe: str,
    value: Secret,
    what: str,
    probe_auth: ProbeAuth | None = None,
) -> None:
    """Call `probe` with a credential issued just now (`value`, as a bearer credential or, with
    `probe_auth`, in its header); only a 2xx lets it be published."""
    status = await send_probe(client, credential, probe, value, probe_auth)
    observer(Probed(credential, provider, status))
    if status in (401, 403):
        observer(
            Suspicious(
                credential,
                provider,
                "fresh_credential_rejected",
                "critical",
                f"a {what} issued just now was rejected with {status} on {probe}",
            )
        )
        raise VerificationFailed(
            f"new {what} rejected by probe {probe} (HTTP {status}); nothing published",
            credential=credential,
            status=status,
        )
    if not 200 <= status < 300:
        raise VerificationFailed(
            f"probe {probe} answered HTTP {status}; nothing published",
            credential=credential,
            status=status,
        )


async def probe_answered(
    client: ProviderClient,
    observer: Observer,
    *,
    credential: str,
    provider: str,
    probe: str,
    value: Secret,
    what: str,
    probe_auth: ProbeAuth | None = None,
) -> ProviderUnavailable | RateLimited | None:
    """`verify_with_probe`, with a probe that got no usable answer (a network error, a
    time-out, a 5xx or a 429) told apart from a refusal: None once the service accepted the
    credential; the error when it did not answer (told to `observer` as a `Probed` with
    NO_ANSWER); a refusal raises VerificationFailed as before."""
    try:
        await verify_with_probe(
            client,
            observer,
            credential=credential,
            provider=provider,
            probe=probe,
            value=value,
            what=what,
            probe_auth=probe_auth,
        )
    except (ProviderUnavailable, RateLimited) as error:
        observer(Probed(credential, provider, NO_ANSWER))
        return error
    return None


def retry_after(error: KeyturnError) -> float | None:
    """A server's Retry-After carried by a 429 or a 5xx, if any."""
    if isinstance(error, (RateLimited, ProviderUnavailable)):
        return error.retry_after
    return None


def outcome_label(error: BaseException) -> str:
    """The `outcome` label for a failed token request (bounded set)."""
    if isinstance(error, OAuthError):
        return error_label(error.error)
    if isinstance(error, RateLimited):
        return "rate_limited"
    if isinstance(error, ProviderUnavailable):
        return "http_5xx" if error.status else "network"
    if isinstance(error, MalformedResponse):
        return "malformed"
    return "error"


def input_error(
    error: KeyturnError, credential: str, field: str, *, like: KeyturnError | None = None
) -> KeyturnError:
    """`error` (e.g. from resolving an input) with the credential and the field named. A Vault
    error (`error`, or `like` when given) keeps its type, so a Vault outage is still retried as
    one when Vault is back."""
    message = f"{field}: {error.message}"
    kind = like if like is not None else error
    if isinstance(kind, VaultError):
        return type(kind)(message, credential=credential)
    return SecretReferenceError(message, credential=credential)
