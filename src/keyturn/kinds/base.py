"""`Kind`: everything keyturn's generic code asks about a credential kind, declared once by the
kind's own module (`keyturn.kinds.oauth_client.KIND`, `keyturn.kinds.api_key.KIND`) and found
through the registry (`keyturn.kinds.KINDS`, `keyturn.kinds.kind_of`).

Dependencies point one way: a kind uses the job machinery (`keyturn.jobs`), never the other
way round; what a rotation needs to know of the kind reaches it as `RotationRules` through the
kind's `RotationTarget`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, ParamSpec, Protocol

from keyturn.config import CredentialConfig
from keyturn.errors import VerificationFailed
from keyturn.jobs.job import CredentialJob, Inputs, JobDeps
from keyturn.jobs.rotation import RotationRules
from keyturn.jobs.steps import send_probe
from keyturn.providers.client import ProviderClient
from keyturn.references import SecretRef
from keyturn.rotators.base import Rotator
from keyturn.secret import Secret
from keyturn.state import CredentialState

# What apps read at `publish_to`: field → value (a `Secret` for each of `secret_fields`).
PublishedData = dict[str, str | Secret]

# The parameters of a kind's `published_fields` (its own values: a token and its times, a key
# and its id and times).
P = ParamSpec("P")

# An input's value from its reference (`keyturn check --live` passes one that stops the
# credential's check quietly when the input does not resolve: that was reported already).
Resolve = Callable[[SecretRef], Awaitable[Secret]]


class JobBuilder(Protocol):
    """A kind's job: its tasks, in the order they run (`rotator`: the one its `rotation`
    names, if it has one)."""

    def __call__(
        self,
        credential: CredentialConfig,
        client: ProviderClient,
        rotator: Rotator | None,
        inputs: Inputs,
        deps: JobDeps,
    ) -> CredentialJob: ...


class LiveCheck(Protocol):
    """`keyturn check --live` for one credential: use it as the daemon would, and nothing more
    (nothing published, no state written, no observer told); a line saying what was proven,
    or a `KeyturnError` saying what failed. `state`: its private record, if there is one."""

    async def __call__(
        self,
        credential: CredentialConfig,
        client: ProviderClient,
        resolve: Resolve,
        state: CredentialState | None,
    ) -> str: ...


async def probe_value(
    credential: CredentialConfig, client: ProviderClient, value: Secret, what: str
) -> str:
    """Call the credential's `probe` with `value` as its bearer credential, once, with no event
    (`keyturn check --live`); VerificationFailed unless a 2xx answers. What was proven, for the
    check's line: a probe with `probe_auth` is not sent (the check does not read the other
    credential's published token), and the line says so."""
    assert credential.probe is not None
    if credential.probe_auth is not None:
        return (
            f"not probed: probe_auth = {credential.probe_auth} is used by the daemon only "
            "(check --live reads no published token)"
        )
    status = await send_probe(client, credential.name, credential.probe, value, None)
    if not 200 <= status < 300:
        verdict = "rejected" if status in (401, 403) else "not accepted"
        raise VerificationFailed(
            f"{what} {verdict} by probe {credential.probe} (HTTP {status})",
            credential=credential.name,
            status=status,
        )
    return f"accepted by probe {credential.probe}"


def no_details(state: CredentialState, credential: str) -> Mapping[str, str]:
    """A kind with nothing to add to `keyturn status`'s row."""
    return {}


@dataclass(frozen=True, slots=True)
class Kind(Generic[P]):
    """One credential kind, as the code outside `keyturn.kinds` asks about it. `P`: the
    parameters of its `published_fields` (each kind's own; `AnyKind` where kinds are mixed)."""

    # The `kind` key's value in the configuration, in events and metric labels.
    name: str
    # Its configuration model (`keyturn.config.credentials`, one of its `KINDS`): the keys
    # only it takes and its rules. Its `kind` tag is `name` (the registry checks).
    config: type[CredentialConfig]

    # -- what apps read at `publish_to` (keyturn.layout) ------------------------------------
    # The field holding the value apps use ("access_token", "api_key").
    value_field: str
    # The field saying until when that value is good, as RFC 3339 ("expires_at" for a token;
    # "rotate_after" for a key, which outlives it until keyturn retires it).
    expiry_field: str
    # The field saying when keyturn plans to replace the value, so readers plan re-reads.
    plan_field: str
    # The fields that carry a secret (never logged, written only to a sink's secret files).
    secret_fields: frozenset[str]
    # The published data, from the kind's own values (the custom metadata beside it is
    # generic: `keyturn.layout`).
    published_fields: Callable[P, PublishedData]
    # Whether the published value stops working at its expiry (an access token). If not (an
    # API key), it works until keyturn retires it, even past its rotation date: readiness
    # asks only that one was published, `status` says "rotation due" rather than "expired",
    # and how long a token lasts (takeover, `keyturn check`) does not apply to it.
    value_expires: bool

    # -- its tasks ---------------------------------------------------------------------------
    # Whether its job keeps an OAuth token fresh from the provider's token endpoint, with a
    # refresh token: `keyturn refresh` and `keyturn import-refresh-token` apply, and
    # `keyturn check` holds its provider to the token endpoint's rules.
    refreshes_tokens: bool
    # The task a run-now (the watcher found what apps read changed by someone else) forces:
    # a new token ("refresh"), or the current key put back ("republish").
    run_now_forces: str
    # What its rotation's journal needs to know of its key (`keyturn.jobs.rotation`).
    rotation: RotationRules
    # Its job (`JobBuilder`).
    job: JobBuilder
    # What `keyturn check --live` does with it (`LiveCheck`).
    live_check: LiveCheck

    # -- how `keyturn status` words it -------------------------------------------------------
    # The EXPIRY column before and after `expiry_field`'s time: "expires"/"expired",
    # "rotates"/"rotation due".
    expiry_words: tuple[str, str]
    # What `status` adds to a credential's row from its record (a signing key: the key ids the
    # server holds), as label → words: the ROTATION column and `--json`'s `details`.
    status_details: Callable[[CredentialState, str], Mapping[str, str]] = no_details

    @property
    def shows_key_id(self) -> bool:
        """Whether `status` shows the rotation's key id: the id of the key apps read, so only
        for a kind that publishes its rotated key (a client secret's id is its own business)."""
        return self.rotation.publishes_rotated_value

    def value_ready(self, issued_at: float | None, expires_at: float | None, now: float) -> bool:
        """Can apps use the published value now? One that expires (an access token) is valid
        until it does; one that does not (an API key: `expires_at` is its rotate-after time)
        works once published, until keyturn retires it (an overdue rotation is its own
        alert)."""
        if not self.value_expires:
            return issued_at is not None
        return expires_at is not None and expires_at > now

    def expiry_word(self, expires_at: float, now: float) -> str:
        """`status`'s verb for `expires_at`: before it, or once it has passed."""
        before, after = self.expiry_words
        return before if expires_at > now else after


# A kind whatever its `published_fields` takes: what the registry holds.
AnyKind = Kind[...]
