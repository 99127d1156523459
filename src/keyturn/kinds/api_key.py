"""`api_key`: a key the service takes as a bearer credential, rotated by a rotator.

The job has one scheduled task, rotation, and `republish` (forced only, after someone else
changed what apps read). A new key is verified by calling `probe` with it, then published:
`api_key`, `key_id`, `created_at`, `rotate_after`, `authorization`.
"""

from __future__ import annotations

from keyturn.clock import rfc3339
from keyturn.config import CredentialConfig
from keyturn.config.credentials import ApiKeyCredential
from keyturn.errors import ConfigError
from keyturn.events import Published
from keyturn.jobs.job import CredentialJob, Inputs, JobDeps
from keyturn.jobs.rotation import KeyRotation, RepublishKey, RotationRules
from keyturn.jobs.steps import ProbeAuth, publish_with_cas, verify_with_probe
from keyturn.kinds.base import Kind, Resolve, probe_value
from keyturn.layout import custom_metadata
from keyturn.providers.client import ProviderClient
from keyturn.rotators.base import Rotator
from keyturn.secret import Secret
from keyturn.state import CredentialState

NAME = "api_key"
# Apps read the key itself; there is no key before keyturn's first (or the adopted initial_key).
ROTATION = RotationRules(publishes_rotated_value=True, starts_with_unheld_key=False)


def published_fields(
    key: Secret, key_id: str | None, created_at: float, rotate_after: float
) -> dict[str, str | Secret]:
    """The KV data an app reads for an API key."""
    return {
        "api_key": key,
        "key_id": key_id or "",
        "created_at": rfc3339(created_at),
        "rotate_after": rfc3339(rotate_after),
        "authorization": Secret(f"Bearer {key.reveal()}"),
    }


class ApiKeyTarget:
    """The `RotationTarget` of an API key: verified with the probe, published where apps read."""

    rules = ROTATION

    def __init__(
        self, credential: CredentialConfig, client: ProviderClient, inputs: Inputs, deps: JobDeps
    ) -> None:
        if credential.rotation is None or credential.probe is None:
            raise ConfigError(
                f"credentials[{credential.name!r}]: an api_key needs probe and rotation"
            )
        self.credential = credential
        self._max_age = credential.rotation.max_age
        self._probe = credential.probe
        self._client = client
        self._inputs = inputs
        self._deps = deps
        self._probe_auth = ProbeAuth.of(credential, deps)
        # (version, custom metadata) at `publish_to` as this process last wrote or read it
        # there: a publish on top of that version writes the metadata only if it differs.
        self._metadata_at: tuple[int, dict[str, str]] | None = None

    async def verify(self, key: Secret) -> None:
        await verify_with_probe(
            self._client,
            self._deps.observer,
            credential=self.credential.name,
            provider=self.credential.provider,
            probe=self._probe,
            value=key,
            what="API key",
            probe_auth=self._probe_auth,
        )

    async def publish(
        self, key: Secret, key_id: str | None, created_at: float, state: CredentialState
    ) -> int:
        entry = await self._deps.store.read(self.credential.publish_to, consistent=True)
        if entry is not None:
            self._metadata_at = (entry.version, dict(entry.custom_metadata))
        if entry is not None and key_id is not None and entry.data.get("key_id") == key_id:
            return entry.version  # keyturn's own write, before a crash
        return await self.write(key, key_id, created_at, state)

    async def write(
        self,
        key: Secret,
        key_id: str | None,
        created_at: float,
        state: CredentialState,
        *,
        report: bool = True,
    ) -> int:
        """Publish `key` on top of the version keyturn last wrote (`report=False`: a conflict
        is not reported again; the watcher already did). The custom metadata is written only
        when the path does not hold it already, as this process wrote or read it there at the
        version this publish goes on top of (as for a token: `TokenRefresh._publish`)."""
        name, provider = self.credential.name, self.credential.provider
        rotate_after = created_at + self._max_age
        metadata = custom_metadata(name, self._deps.instance_id)
        last = state.token.published_version
        known, self._metadata_at = self._metadata_at, None  # unknown if the publish fails
        version = await publish_with_cas(
            self._deps.store,
            self._deps.observer,
            path=self.credential.publish_to,
            data=published_fields(key, key_id, created_at, rotate_after),
            metadata=metadata,
            last_version=last,
            credential=name,
            provider=provider,
            report=report,
            metadata_in_place=last is not None and known == (last, metadata),
        )
        self._metadata_at = (version, metadata)
        self._deps.observer(Published(name, provider, NAME, created_at, rotate_after))
        return version

    def forget_metadata(self) -> None:
        """What is at `publish_to` is no longer known (someone else wrote there)."""
        self._metadata_at = None

    async def client_id(self) -> str | None:
        return None

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        return await self._inputs.initial_key()


def job(
    credential: CredentialConfig,
    client: ProviderClient,
    rotator: Rotator | None,
    inputs: Inputs,
    deps: JobDeps,
) -> CredentialJob:
    if rotator is None:
        raise ConfigError(f"credentials[{credential.name!r}]: an api_key needs a rotator")
    target = ApiKeyTarget(credential, client, inputs, deps)
    return CredentialJob(
        credential, [KeyRotation(target, rotator, deps), RepublishKey(target)], deps
    )


async def live_check(
    credential: CredentialConfig,
    client: ProviderClient,
    resolve: Resolve,
    state: CredentialState | None,
) -> str:
    """The probe with the key apps read (or the `initial_key` to be adopted)."""
    if state is not None and state.rotation.key is not None:
        key, which = state.rotation.key, "the current key"
    elif credential.initial_key is not None:
        key = await resolve(credential.initial_key)
        which = f"initial_key ({credential.initial_key})"
    else:
        return "no key yet: keyturn creates one on its first run; nothing to probe"
    assert credential.probe is not None  # an api_key always has one (configuration rule)
    return f"{which} {await probe_value(credential, client, key, which)}"


KIND = Kind(
    name=NAME,
    config=ApiKeyCredential,
    value_field="api_key",
    expiry_field="rotate_after",
    plan_field="rotate_after",
    secret_fields=frozenset({"api_key", "authorization"}),
    published_fields=published_fields,
    value_expires=False,
    refreshes_tokens=False,
    run_now_forces=RepublishKey.name,
    rotation=ROTATION,
    job=job,
    live_check=live_check,
    expiry_words=("rotates", "rotation due"),
)
