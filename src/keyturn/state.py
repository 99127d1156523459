"""keyturn's private record of one credential, at `<state_prefix>/<name>` in Vault.

In Vault, one KV entry of string fields named as docs/vault.md lists them; in Python a
`CredentialState` of five typed parts (`lease`, `refresh`, `token`, `rotation`, and `own`: what
a kind keeps of its own, one secret JSON object only the kind's module reads, `KindRecord`),
changed with `dataclasses.replace` so mypy sees every name. `FIELDS` declares each stored field
once (KV name, part, attribute, codec) and alone drives `to_data` and `from_data`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, TypeAlias, TypeVar, get_args

from keyturn.errors import VaultDataError
from keyturn.secret import Secret

# What the last run left, for `keyturn status`: `pending` (never refreshed or published),
# `ok`, `failing` (the last run failed; what apps read may still be valid) or `expired`.
Phase: TypeAlias = Literal["pending", "ok", "failing", "expired"]
# Where a rotation stands (see `keyturn.jobs.rotation`).
RotationPhase: TypeAlias = Literal["idle", "creating", "pending", "verified", "retiring"]

PHASES: tuple[Phase, ...] = get_args(Phase)
ROTATION_PHASES: tuple[RotationPhase, ...] = get_args(RotationPhase)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """Which instance is working on the credential, and until when (epoch seconds).

    `ends_with`: a run that stored its outcome before publishing (see
    `keyturn.jobs.job.Journal.save_ending_with`) writes no release; its lease ends when this KV
    version lands at the published path, or at `until`, whichever comes first
    (`keyturn.jobs.job.lease_in_force`)."""

    owner: str | None = None
    until: float | None = None
    ends_with: int | None = None

    def held(self, now: float) -> bool:
        """Someone holds the lease now."""
        return self.owner is not None and self.until is not None and self.until > now

    def held_by_other(self, instance: str, now: float) -> bool:
        return self.held(now) and self.owner != instance


@dataclass(frozen=True, slots=True)
class RefreshTokenRecord:
    """The refresh token keyturn holds, and what makes sure it is presented at most once."""

    token: Secret | None = None
    # Set (to a random attempt id) before the refresh token is presented, cleared once the
    # answer is stored: a record found with it set means the answer was lost (crash, time-out),
    # the provider may have rotated the token, and it must never be presented again.
    in_flight: str | None = None
    # A refresh token burned that way, kept only to be revoked (RFC 7009) once the replacement
    # is published: revoking a grant also kills the access token apps read until then.
    burned: Secret | None = None
    # A fingerprint (salted HMAC-SHA256, never the value) of the credential's `refresh_token`
    # input as it was when keyturn last seeded from it: the input is read again only after the
    # provider refused the refresh token keyturn held, and used only if it has changed since.
    input_fingerprint: str | None = None
    # When the provider last refused (invalid_grant) the refresh token keyturn held; cleared
    # once keyturn holds a refresh token again.
    refused_at: float | None = None
    # When the held refresh token expires, from the provider's `refresh_expires_in`, and when
    # its family began (the grant or hand-over that brought its first token): with the
    # provider's `refresh_token_max_lifetime`, when a person must consent again.
    expires_at: float | None = None
    family_started: float | None = None

    def burn(self) -> RefreshTokenRecord:
        """The held token given up as possibly used: never presented again, kept to revoke."""
        return replace(
            self.dropped(), token=None, in_flight=None, burned=self.token or self.burned
        )

    def dropped(self) -> RefreshTokenRecord:
        """No refresh token held any more: nothing is known of a family."""
        return replace(self, token=None, expires_at=None, family_started=None)

    def family_ends_at(self, max_lifetime: float | None) -> float | None:
        """When the held refresh token can no longer be used, at the latest: its expiry, or
        its family's start plus the provider's absolute lifetime (None: not known)."""
        if self.token is None:
            return None
        absolute = None
        if max_lifetime is not None and self.family_started is not None:
            absolute = self.family_started + max_lifetime
        ends = [t for t in (self.expires_at, absolute) if t is not None]
        return min(ends, default=None)


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What apps read and how the last run went. Times are epoch seconds."""

    issued_at: float | None = None
    expires_at: float | None = None
    scope: str | None = None
    published_version: int | None = None  # the KV version keyturn last wrote at publish_to
    writer: str | None = None  # the instance that last published
    last_success: float | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    next_due: float | None = None
    phase: Phase = "pending"
    # Set when the published token went out unverified (its probe got no answer and the token
    # apps read before would have expired before another try): when to probe it again.
    verify_at: float | None = None
    # The `aud` claim of the published token where it is a readable JWT (space-separated):
    # grant drift compares the next token's with it.
    audience: str | None = None


@dataclass(frozen=True, slots=True)
class RotationJournal:
    """The rotation journal: the current key (api_key: the key apps read; oauth_client: the
    client secret, once keyturn has rotated it), a new one on its way, the previous one in its
    grace period, and the retries."""

    key: Secret | None = None
    key_id: str | None = None
    key_created_at: float | None = None
    phase: RotationPhase = "idle"
    id: str | None = None
    started: float | None = None
    pending_key: Secret | None = None
    pending_key_id: str | None = None
    previous_key_id: str | None = None
    previous_retire_at: float | None = None
    # The KV version that published the previous key: the consumers still reading it (or an
    # older one) are the ones `rotation.wait_for_consumers` waits for.
    previous_version: int | None = None
    # While the previous key outlives its grace because consumers still read it: their names
    # (`keyturn status` shows them), and why keyturn cannot rule out others, if it cannot.
    waiting_consumers: tuple[str, ...] | None = None
    waiting_reason: str | None = None
    failures: int = 0
    verify_failures: int = 0
    error: str | None = None
    retry_at: float | None = None


@dataclass(frozen=True, slots=True)
class KindRecord:
    """What a credential kind keeps of its own beside the journal, e.g. a signing key's
    registration access token: one JSON object, held as a secret, that generic code stores and
    never reads (the kind's module gives it a type)."""

    data: Secret | None = None


@dataclass(frozen=True, slots=True)
class CredentialState:
    """keyturn's private record for one credential."""

    lease: LeaseRecord = field(default_factory=LeaseRecord)
    refresh: RefreshTokenRecord = field(default_factory=RefreshTokenRecord)
    token: TokenRecord = field(default_factory=TokenRecord)
    rotation: RotationJournal = field(default_factory=RotationJournal)
    own: KindRecord = field(default_factory=KindRecord)

    def to_data(self) -> dict[str, str | Secret]:
        """KV data: every value a string (times as exact epoch seconds), absent values left
        out."""
        data: dict[str, str | Secret] = {}
        for stored in FIELDS:
            value = getattr(getattr(self, stored.part), stored.attribute)
            if value is not None:
                data[stored.key] = stored.codec.encode(value)
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, object], credential: str) -> CredentialState:
        """Parse a stored record; a malformed field is a VaultDataError naming it (never its
        value). Fields keyturn does not know (a newer keyturn wrote them) are ignored."""
        values: dict[Part, dict[str, Any]] = {part: {} for part in get_args(Part)}
        for stored in FIELDS:
            if stored.key not in data:
                continue
            raw = data[stored.key]
            if not isinstance(raw, str):
                raise _bad(credential, stored.key, "is not a string")
            try:
                values[stored.part][stored.attribute] = stored.codec.decode(raw)
            except ValueError as exc:
                raise _bad(credential, stored.key, str(exc)) from None  # no value in a trace
        return cls(
            lease=LeaseRecord(**values["lease"]),
            refresh=RefreshTokenRecord(**values["refresh"]),
            token=TokenRecord(**values["token"]),
            rotation=RotationJournal(**values["rotation"]),
            own=KindRecord(**values["own"]),
        )


# -- the stored form --------------------------------------------------------------------------

T = TypeVar("T")
P = TypeVar("P", bound=str)


@dataclass(frozen=True, slots=True)
class Codec(Generic[T]):
    """How one kind of value is written as a KV string and read back. `decode` raises a
    ValueError saying what is wrong, never quoting the value."""

    encode: Callable[[T], str | Secret]
    decode: Callable[[str], T | None]


def _decode_time(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("is not a timestamp") from None
    if not math.isfinite(value):
        raise ValueError("is not a finite timestamp")
    return value


def _decode_count(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError("is not a whole number")
    return int(raw)


# A fingerprint: "hmac-sha256:<16-byte salt, hex>:<HMAC-SHA256 of the value under the salt, hex>".
_FINGERPRINT = re.compile(r"hmac-sha256:[0-9a-f]{32}:[0-9a-f]{64}")


def _decode_fingerprint(raw: str) -> str:
    if not _FINGERPRINT.fullmatch(raw):
        raise ValueError("is not a fingerprint (hmac-sha256:<salt>:<digest>)")
    return raw


def _phase(values: tuple[P, ...]) -> Codec[P]:
    def decode(raw: str) -> P:
        for value in values:
            if raw == value:
                return value
        raise ValueError(f"is not a known phase ({', '.join(values)})")

    return Codec(encode=str, decode=decode)


def _decode_secret(raw: str) -> Secret | None:
    return Secret(raw) if raw else None


def _text(raw: str) -> str:
    return raw


def _encode_names(names: tuple[str, ...]) -> str:
    return json.dumps(list(names), ensure_ascii=False)


def _decode_names(raw: str) -> tuple[str, ...]:
    try:
        names = json.loads(raw)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError("is not a JSON array of names")
    return tuple(names)


# Times are epoch seconds written with repr (exact, so a resumed job plans exactly what was
# planned). An empty secret reads as none.
TIME: Codec[float] = Codec(encode=lambda value: repr(float(value)), decode=_decode_time)
COUNT: Codec[int] = Codec(encode=str, decode=_decode_count)
SECRET: Codec[Secret] = Codec(encode=lambda value: value, decode=_decode_secret)
TEXT: Codec[str] = Codec(encode=_text, decode=_text)
FINGERPRINT: Codec[str] = Codec(encode=_text, decode=_decode_fingerprint)
NAMES: Codec[tuple[str, ...]] = Codec(encode=_encode_names, decode=_decode_names)
PHASE: Codec[Phase] = _phase(PHASES)
ROTATION_PHASE: Codec[RotationPhase] = _phase(ROTATION_PHASES)

Part: TypeAlias = Literal["lease", "refresh", "token", "rotation", "own"]


@dataclass(frozen=True, slots=True)
class StoredField:
    """One field of the record in Vault: its KV name, where it lives in `CredentialState`
    (`part`, `attribute`), and how it is written."""

    key: str
    part: Part
    attribute: str
    codec: Codec[Any]


# Every stored field, once. The KV names are the record's documented format (docs/vault.md):
# never rename one, or an existing deployment loses what it stored there.
FIELDS: tuple[StoredField, ...] = (
    StoredField("lease_owner", "lease", "owner", TEXT),
    StoredField("lease_until", "lease", "until", TIME),
    StoredField("lease_ends_with", "lease", "ends_with", COUNT),
    StoredField("refresh_token", "refresh", "token", SECRET),
    StoredField("refresh_in_flight", "refresh", "in_flight", TEXT),
    StoredField("burned_refresh_token", "refresh", "burned", SECRET),
    StoredField("refresh_token_input_fingerprint", "refresh", "input_fingerprint", FINGERPRINT),
    StoredField("refresh_token_refused_at", "refresh", "refused_at", TIME),
    StoredField("refresh_token_expires_at", "refresh", "expires_at", TIME),
    StoredField("refresh_family_started", "refresh", "family_started", TIME),
    StoredField("issued_at", "token", "issued_at", TIME),
    StoredField("expires_at", "token", "expires_at", TIME),
    StoredField("scope", "token", "scope", TEXT),
    StoredField("published_version", "token", "published_version", COUNT),
    StoredField("writer", "token", "writer", TEXT),
    StoredField("last_success", "token", "last_success", TIME),
    StoredField("last_error", "token", "last_error", TEXT),
    StoredField("consecutive_failures", "token", "consecutive_failures", COUNT),
    StoredField("next_due", "token", "next_due", TIME),
    StoredField("phase", "token", "phase", PHASE),
    StoredField("verify_at", "token", "verify_at", TIME),
    StoredField("granted_audience", "token", "audience", TEXT),
    StoredField("key", "rotation", "key", SECRET),
    StoredField("key_id", "rotation", "key_id", TEXT),
    StoredField("key_created_at", "rotation", "key_created_at", TIME),
    StoredField("rotation_phase", "rotation", "phase", ROTATION_PHASE),
    StoredField("rotation_id", "rotation", "id", TEXT),
    StoredField("rotation_started", "rotation", "started", TIME),
    StoredField("pending_key", "rotation", "pending_key", SECRET),
    StoredField("pending_key_id", "rotation", "pending_key_id", TEXT),
    StoredField("previous_key_id", "rotation", "previous_key_id", TEXT),
    StoredField("previous_retire_at", "rotation", "previous_retire_at", TIME),
    StoredField("previous_version", "rotation", "previous_version", COUNT),
    StoredField("waiting_consumers", "rotation", "waiting_consumers", NAMES),
    StoredField("waiting_reason", "rotation", "waiting_reason", TEXT),
    StoredField("rotation_failures", "rotation", "failures", COUNT),
    StoredField("verify_failures", "rotation", "verify_failures", COUNT),
    StoredField("rotation_error", "rotation", "error", TEXT),
    StoredField("rotation_retry_at", "rotation", "retry_at", TIME),
    StoredField("kind_record", "own", "data", SECRET),
)


def _bad(credential: str, key: str, what: str) -> VaultDataError:
    return VaultDataError(f"private state field {key!r} {what}", credential=credential)


# -- fingerprints of the refresh_token input ------------------------------------------------


def fingerprint(value: Secret, salt: bytes | None = None) -> str:
    """A salted HMAC-SHA256 of `value`: tells whether a value changed without keeping it (a
    fresh random salt each time unless given, so equal values do not look equal across
    records)."""
    salt = secrets.token_bytes(16) if salt is None else salt
    digest = hmac.new(salt, value.reveal().encode(), hashlib.sha256).hexdigest()
    return f"hmac-sha256:{salt.hex()}:{digest}"


def fingerprint_matches(stored: str, value: Secret) -> bool:
    """Whether `value` is the value `stored` (a `fingerprint`) was made from."""
    if not _FINGERPRINT.fullmatch(stored):
        return False
    salt = bytes.fromhex(stored.split(":")[1])
    return hmac.compare_digest(fingerprint(value, salt), stored)
