"""`[[credentials]]`: one model per credential kind, chosen by `kind` (a discriminated union),
and the tables inside a credential (`refresh`, `backoff`, `rotation`, `sinks`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from pydantic import Field, ValidationInfo, model_validator
from pydantic_core import core_schema

from keyturn.config.credential_auth import CREDENTIAL_AUTH, CredentialAuth
from keyturn.config.fields import (
    BOOLEAN,
    DAY,
    ENTRY_NAME,
    HOUR,
    HTTP_PATH,
    MAX_TIMEOUT,
    MODE,
    NAME,
    NAME_EXPECTED,
    OUTSIDE_STATE_PREFIX,
    REFERENCE_OR_INLINE,
    SINK_PATH,
    URL,
    Check,
    LoadContext,
    NotAKey,
    Table,
    Unique,
    Via,
    Where,
    array_of,
    command,
    context_of,
    described,
    duration,
    integer,
    json_or_split,
    kv_path,
    number,
    refers_to,
    report,
    secret_reference,
    table,
    text,
)
from keyturn.config.token_params import AUDIENCE, RESOURCE, TOKEN_PARAMS
from keyturn.policy import BackoffPolicy, RefreshPolicy
from keyturn.references import SecretRef

CredentialKind = Literal["oauth_client", "api_key", "signing_key"]
# How an oauth_client proves itself at the token endpoint: its client secret (as the
# provider's `client_auth` says, body or basic), a signed assertion (RFC 7523 §2.2) or a
# client certificate (RFC 8705).
CredentialClientAuth = Literal[
    "client_secret", "private_key_jwt", "tls_client_auth", "self_signed_tls_client_auth"
]
KEYLESS = ("private_key_jwt", "tls_client_auth", "self_signed_tls_client_auth")
# How an oauth_client gets a token when it has no refresh token: client credentials, or the
# JWT bearer grant (RFC 7523 §2.1) with an assertion it signs.
CredentialGrant = Literal["client_credentials", "jwt_bearer"]
AssertionAlg = Literal["RS256", "PS256", "ES256", "EdDSA"]
# A credential's keys that hold references to its private inputs (checked by `keyturn check`,
# watched in Vault's audit log).
INPUT_REFERENCES = (
    "client_id",
    "client_secret",
    "initial_key",
    "refresh_token",
    "client_key",
    "client_certificate",
    "service_account",
)

# How long after a new key is published its predecessor lives at most while keyturn waits for
# consumers to move, unless `max_grace` says otherwise.
DEFAULT_MAX_GRACE = DAY
TIMEOUT = duration(positive=True, maximum=MAX_TIMEOUT)
MARGIN = duration()
LIFETIME = duration(positive=True)
KV_PATH = kv_path(
    'a path relative to the mount, e.g. "apps/reporting/acme": segments of letters, digits '
    'and _ . @ + = - joined by single "/", no "." or ".."'
)
PROVIDER = refers_to("providers", "provider")
WAIT = duration(positive=True, maximum=DAY)
OTHER_KINDS = NotAKey(named=True)  # a kind's own key, in the base that every kind reads
HOOK_COMMAND = command('["/usr/bin/systemctl", "try-restart", "reporting"]', from_env=False)
MAX_CONSUMER_NAME = 128  # a consumer's name is at most this long (keyturn.usage.audit)
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")
_CONSUMERS_EXPECTED = (
    "a non-empty array of consumer names, fnmatch patterns or entity ids, e.g. "
    '["approle/reporting", "kubernetes-prod-*"] (each at most 128 characters; in the '
    'environment a JSON array or "a,b")'
)


def _consumer(item: object) -> str | None:
    if not isinstance(item, str) or not item.strip() or len(item) > MAX_CONSUMER_NAME:
        return None
    return None if _CONTROL_CHARACTER.search(item) else item


CONSUMERS = array_of(_CONSUMERS_EXPECTED, _consumer, json_or_split)
SCOPE = text('space-separated scopes, e.g. "read write"')


def input_reference(key: str, field: str = "") -> Check:
    """A reference to one of a credential's inputs; the example has it in Vault."""
    return secret_reference(f'{key} = "vault:secret/keyturn/inputs/<name>#{field or key}"')


@table(kw_only=True)
class RotationPolicy(Table):
    """`rotation`: a key (or client secret) replaced every `max_age` by the rotator
    `rotator`, the old one revoked `grace` later (docs/configuration.md)."""

    # A key may live up to ten years; the old one stays valid for at most a year after.
    max_age: Annotated[float, duration(minimum=1.0, maximum=3650 * DAY)]
    grace: Annotated[float, MARGIN] = 3600.0
    # Required by the kinds whose keys a rotator creates (`needs_rotator`); a signing key is
    # made by keyturn itself and registered as its `registration` says.
    rotator: Annotated[str | None, NAME, refers_to("rotators", "rotator")] = None
    verify_attempts: Annotated[int, integer(1, 100)] = 5
    wait_for_consumers: Annotated[bool, BOOLEAN] = False
    consumer_window: Annotated[float, duration(positive=True)] = DAY
    max_grace: Annotated[float | None, MARGIN] = None

    def needs_rotator(self) -> Iterator[tuple[Where, str]]:
        """The problem of a kind whose keys a rotator creates, when none is named."""
        if self.rotator is None:
            yield ("rotation", "rotator"), f"missing; expected {NAME_EXPECTED}"

    def longest_grace(self) -> float:
        """How long after the new key is published the old one is revoked at the latest when
        waiting for consumers: `max_grace`, or by default a day (never less than `grace`)."""
        return self.max_grace if self.max_grace is not None else max(self.grace, DEFAULT_MAX_GRACE)

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        if self.grace >= self.max_age:
            message = (
                f"is not shorter than max_age ({self.max_age:g}s); expected a grace shorter "
                "than max_age, so that at most two keys are live at once"
            )
            yield "grace", message
        if self.max_grace is not None and self.max_grace < self.grace:
            message = (
                f"is shorter than grace ({self.grace:g}s); expected max_grace >= grace (the "
                "old key is never revoked before grace has passed)"
            )
            yield "max_grace", message
        longest = self.longest_grace()
        if self.wait_for_consumers and longest >= self.max_age > self.grace:
            if self.max_grace is None:
                message = (
                    f"waits up to max_grace's default ({longest:g}s), which is not shorter than "
                    f"max_age ({self.max_age:g}s); expected a max_grace shorter than max_age"
                )
                yield "wait_for_consumers", message
            else:
                message = (
                    f"is not shorter than max_age ({self.max_age:g}s); expected a max_grace "
                    "shorter than max_age, so that at most two keys are live at once"
                )
                yield "max_grace", message


def _present(table: Any) -> dict[str, Any]:
    """The keys a table sets; one it leaves out takes the built object's default."""
    values = {f.name: getattr(table, f.name) for f in dataclasses.fields(table)}
    return {name: value for name, value in values.items() if value is not None}


@table()
class RefreshTable(Table):
    """`refresh`: a keyturn.policy.RefreshPolicy."""

    at: Annotated[float | None, number("a fraction between 0 and 1 (exclusive)", gt=0, lt=1)] = None
    jitter: Annotated[float | None, number("a fraction >= 0 and < 0.5", ge=0, lt=0.5)] = None
    margin: Annotated[float | None, MARGIN] = None
    min_interval: Annotated[float | None, LIFETIME] = None

    def build(self) -> RefreshPolicy:
        return RefreshPolicy(**_present(self))

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        policy = self.build()
        low, high = policy.at - policy.jitter, policy.at + policy.jitter
        if low <= 0 or high >= 1:
            message = (
                f"at ± jitter spans {low:.2f} to {high:.2f} of the lifetime; "
                "expected both ends strictly between 0 and 1"
            )
            yield "jitter", message


@table()
class BackoffTable(Table):
    """`backoff`: a keyturn.policy.BackoffPolicy (`max` is its `maximum`)."""

    initial: Annotated[float | None, WAIT] = None
    maximum: Annotated[float | None, WAIT, Field(alias="max")] = None
    multiplier: Annotated[float | None, number("a number between 1 and 10", ge=1, le=10)] = None
    after_expiry: Annotated[float | None, duration(minimum=1.0, maximum=HOUR)] = None

    def build(self) -> BackoffPolicy:
        return BackoffPolicy(**_present(self))

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        policy = self.build()
        if policy.maximum < policy.initial:
            yield "max", f"is shorter than initial; expected max >= initial ({policy.initial:g}s)"


@table()
class HookConfig(Table):
    """A sink's `on_publish`: a command (argv, no shell; not run at load) run after each write
    of the sink's file, told what was written as JSON on its stdin."""

    NAMED_IN_PROBLEMS = True
    command: Annotated[tuple[str, ...], HOOK_COMMAND]
    timeout: Annotated[float, TIMEOUT] = 10.0


@table()
class SinkConfig(Table):
    """One of a credential's `sinks`: a file on keyturn's host kept equal to what is published
    (keyturn.sinks); no name, so named by position and not overridden."""

    path: Annotated[Path, SINK_PATH, Unique("each sink to write its own file")]
    format: Literal["raw", "json", "env"]
    mode: Annotated[int, MODE] = 0o600
    env_prefix: Annotated[
        str,
        text(
            'a prefix of letters, digits and "_", not starting with a digit (at most 64 '
            'characters), e.g. "REPORTING_"',
            r"^[A-Za-z_][A-Za-z0-9_]{0,63}$",
        ),
    ] = "KEYTURN_"
    on_publish: Annotated[
        HookConfig | None,
        described(
            'a table, e.g. on_publish = { command = ["/usr/bin/systemctl", "try-restart", '
            '"app"], timeout = "10s" }'
        ),
    ] = None

    @model_validator(mode="wrap")
    @classmethod
    def _env_prefix_only_for_env(
        cls, data: Any, handler: core_schema.ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        sink = handler(data)
        given = context_of(info) and isinstance(data, dict) and "env_prefix" in data
        if given and sink.format != "env":
            message = f'is set for format "{sink.format}", which has no variables; expected '
            raise report([("env_prefix", message + 'env_prefix only with format = "env"')])
        return sink


@table(kw_only=True)
class CredentialConfig(Table):
    """One credential keyturn keeps fresh, as the code reads it: every kind's attributes, a
    kind's own keys None (or their default) for the others; the file's entries are one of
    `KINDS`."""

    name: Annotated[str, ENTRY_NAME]
    provider: Annotated[str, NAME, PROVIDER]
    kind: CredentialKind = "oauth_client"
    # A kind's own keys are OTHER_KINDS' here: refused by name by a kind that does not
    # declare them again, in its `REFUSED` words.
    client_id: Annotated[SecretRef | None, OTHER_KINDS] = None
    client_secret: Annotated[SecretRef | None, OTHER_KINDS] = None
    scope: Annotated[str | None, OTHER_KINDS] = None
    refresh_token: Annotated[SecretRef | None, OTHER_KINDS] = None
    refresh: Annotated[RefreshPolicy, OTHER_KINDS] = dataclasses.field(
        default_factory=RefreshPolicy
    )
    # What the token request carries besides the grant (keyturn.config.token_params).
    audience: Annotated[str | None, OTHER_KINDS] = None
    resource: Annotated[tuple[str, ...], OTHER_KINDS] = ()
    token_params: Annotated[tuple[tuple[str, SecretRef], ...], OTHER_KINDS] = ()
    publish_to: Annotated[
        str, KV_PATH, OUTSIDE_STATE_PREFIX, Unique("each credential to publish to its own path")
    ]
    probe: Annotated[str | None, HTTP_PATH] = None
    # The probe sent with another credential's token as its Authorization (an endpoint that
    # needs an admin token), the credential's own value then in the header `probe_header`.
    probe_auth: Annotated[CredentialAuth | None, CREDENTIAL_AUTH] = None
    probe_header: Annotated[
        str | None,
        text(
            'an HTTP header name for the credential\'s own value, e.g. "X-Api-Key"',
            r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$",
        ),
    ] = None
    backoff: Annotated[
        BackoffPolicy, Via(BackoffTable), described("a table ([credentials.backoff])")
    ] = dataclasses.field(default_factory=BackoffPolicy)
    rotation: Annotated[
        RotationPolicy | None,
        described('a table, e.g. rotation = { max_age = "30d", rotator = "acme-keys" }'),
    ] = None
    initial_key: Annotated[SecretRef | None, OTHER_KINDS] = None
    initial_key_id: Annotated[str | None, OTHER_KINDS] = None
    sinks: Annotated[
        tuple[SinkConfig, ...],
        described(
            "an array of tables, e.g. [[credentials.sinks]] or sinks = [{ path = "
            '"/run/keyturn/app.env", format = "env" }]'
        ),
    ] = ()
    consumers: Annotated[tuple[str, ...] | None, CONSUMERS] = None
    client_auth: Annotated[CredentialClientAuth, OTHER_KINDS] = "client_secret"
    client_key: Annotated[SecretRef | None, OTHER_KINDS] = None
    client_key_alg: Annotated[AssertionAlg | None, OTHER_KINDS] = None
    client_key_id: Annotated[str | None, OTHER_KINDS] = None
    client_certificate: Annotated[SecretRef | None, OTHER_KINDS] = None
    grant: Annotated[CredentialGrant, OTHER_KINDS] = "client_credentials"
    service_account: Annotated[SecretRef | None, OTHER_KINDS] = None
    assertion_subject: Annotated[str | None, OTHER_KINDS] = None
    assertion_audience: Annotated[str | None, OTHER_KINDS] = None
    REFUSED: ClassVar[str] = ""  # what the kind says of another's key; "{owner}": its kind

    @classmethod
    def refusal(cls, key: str) -> str:
        """What this kind says of `key`, a key of another kind (`OTHER_KINDS`)."""
        owner = next(kind for kind in KINDS if key in vars(kind)["__annotations__"])
        return cls.REFUSED.format(owner=owner.__dataclass_fields__["kind"].default)

    @property
    def keyless(self) -> bool:
        """Whether the client proves itself without a client secret."""
        return self.client_auth in KEYLESS or (
            self.grant == "jwt_bearer" and self.client_secret is None
        )

    def references(self) -> Iterator[tuple[str, SecretRef]]:
        """Its inputs' secret references, each with the key that holds it (`keyturn check`
        resolves them and checks Vault's capabilities on them)."""
        for key in INPUT_REFERENCES:
            ref = getattr(self, key)
            if ref is not None:
                yield key, ref

    def also_published(self) -> tuple[str, ...]:
        """KV paths it writes besides `publish_to` (a signing key's JWKS document)."""
        return ()

    def _rotator_in(self, context: LoadContext) -> tuple[str, str | None, bool] | None:
        """The rotator `rotation` names, as the file declares it: its name, its type and
        whether its templates use {client_id} (None without a rotation, or a guess)."""
        if self.rotation is None or self.rotation.rotator is None or context.rotators is None:
            return None
        name = self.rotation.rotator
        return name, *context.rotators.get(name, (None, False))


# Each kind below is self-contained (its keys, its rules), so that it can move next to its
# kind's module; KINDS at the end lists them.


@table(kw_only=True)
class OAuthClientCredential(CredentialConfig):
    """`kind = "oauth_client"`: an OAuth 2.0 client; keyturn gets access tokens with its
    client credentials (and, with `rotation`, rotates its client secret)."""

    REFUSED = (
        'not allowed for kind "oauth_client" (its secret is client_secret); expected it only '
        'with kind = "{owner}"'
    )
    kind: Literal["oauth_client"] = "oauth_client"
    client_id: Annotated[SecretRef, REFERENCE_OR_INLINE]
    client_secret: Annotated[SecretRef | None, input_reference("client_secret")] = None
    scope: Annotated[str | None, SCOPE] = None
    client_auth: CredentialClientAuth = "client_secret"
    client_key: Annotated[SecretRef | None, input_reference("client_key", "private_key")] = None
    client_key_alg: AssertionAlg | None = None
    client_key_id: Annotated[str | None, text('the key\'s id at the provider (JWS "kid")')] = None
    client_certificate: Annotated[
        SecretRef | None,
        secret_reference('client_certificate = "file:/etc/keyturn/<name>.crt"'),
    ] = None
    grant: CredentialGrant = "client_credentials"
    service_account: Annotated[
        SecretRef | None,
        secret_reference('service_account = "file:/etc/keyturn/<name>-sa.json"'),
    ] = None
    assertion_subject: Annotated[
        str | None, text('the assertion\'s "sub", e.g. "alice@example.com"')
    ] = None
    assertion_audience: Annotated[
        str | None, text('the assertion\'s "aud", e.g. "https://oauth2.googleapis.com/token"')
    ] = None
    refresh_token: Annotated[SecretRef | None, input_reference("refresh_token")] = None
    refresh: Annotated[
        RefreshPolicy, Via(RefreshTable), described("a table ([credentials.refresh])")
    ] = dataclasses.field(default_factory=RefreshPolicy)
    audience: Annotated[str | None, AUDIENCE] = None
    resource: Annotated[tuple[str, ...], RESOURCE] = ()
    token_params: Annotated[tuple[tuple[str, SecretRef], ...], TOKEN_PARAMS] = ()

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        yield from self._client_auth_problems()
        if self.rotation is not None:
            yield from self.rotation.needs_rotator()
        if self.rotation is not None and self.rotation.wait_for_consumers:
            message = (
                "is true for an oauth_client, whose client secret is never published, so no "
                "consumer reads it; expected wait_for_consumers only for an api_key"
            )
            yield ("rotation", "wait_for_consumers"), message
        rotator = self._rotator_in(context)
        if rotator is not None and rotator[1] == "manual":
            message = (
                f'"{rotator[0]}" is a manual rotator, which cannot rotate an oauth_client\'s '
                'secret; expected an "http" or "exec" rotator'
            )
            yield ("rotation", "rotator"), message

    def _client_auth_problems(self) -> Iterator[tuple[Where, str]]:
        """Which keys each way of authenticating needs, and which it refuses."""
        method = self.client_auth
        bearer = self.grant == "jwt_bearer"
        if method == "client_secret" and self.client_secret is None and not bearer:
            yield "client_secret", "is missing; expected a reference (or another client_auth)"
        if method in KEYLESS and self.client_secret is not None:
            message = f'is set with client_auth = "{method}", which sends no client secret; '
            yield "client_secret", message + "expected no client_secret"
        if method in KEYLESS and self.client_key is None:
            yield "client_key", f'is missing; client_auth = "{method}" needs the private key'
        if method in KEYLESS[1:] and self.client_certificate is None:
            message = f'is missing; client_auth = "{method}" needs the client certificate'
            yield "client_certificate", message
        if bearer and (self.client_key is None) == (self.service_account is None):
            message = "expected exactly one of client_key and service_account to sign the assertion"
            yield "grant", f'is "jwt_bearer": {message}'
        if not bearer:
            for name in ("service_account", "assertion_subject", "assertion_audience"):
                if getattr(self, name) is not None:
                    yield name, 'is set without grant = "jwt_bearer"; expected it only with it'
        if self.rotation is not None and self.keyless:
            message = (
                "rotates a client secret, which this credential does not use; expected no "
                "rotation with a key or certificate (rotate those at their source)"
            )
            yield "rotation", message


@table(kw_only=True)
class ApiKeyCredential(CredentialConfig):
    """`kind = "api_key"`: an API key that keyturn rotates on a schedule with a rotator,
    verified with `probe`; `initial_key` (with `initial_key_id`) adopts an existing key."""

    REFUSED = (
        'not allowed for kind "api_key", which has no OAuth client and no token to refresh; '
        'expected it only with kind = "{owner}"'
    )
    kind: Literal["api_key"] = "api_key"
    probe: Annotated[str, HTTP_PATH]
    rotation: Annotated[
        RotationPolicy,
        described('a table, e.g. rotation = { max_age = "30d", rotator = "acme-keys" }'),
    ]
    initial_key: Annotated[SecretRef | None, input_reference("initial_key", "api_key")] = None
    initial_key_id: Annotated[
        str | None, text('the provider\'s id of initial_key, e.g. "key_0123"')
    ] = None

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        yield from self.rotation.needs_rotator()
        if self.initial_key_id is not None and self.initial_key is None:
            message = (
                "is set without initial_key; expected initial_key (a reference to the key "
                "whose id this is) as well"
            )
            yield "initial_key_id", message
        rotator = self._rotator_in(context)
        if rotator is not None and rotator[2]:
            message = (
                f'"{rotator[0]}" uses {{client_id}}, which an api_key credential does not have; '
                "expected a rotator whose templates do not use {client_id}"
            )
            yield ("rotation", "rotator"), message


RSA_ALGORITHMS = ("RS256", "PS256")
DEFAULT_RSA_BITS = 3072


@table(kw_only=True)
class Rfc7592Registration(Table):
    """`registration = { method = "rfc7592", … }`: the public keys `PUT` in the client's
    metadata at `client_uri` (RFC 7592), with the registration access token."""

    method: Literal["rfc7592"] = "rfc7592"
    client_uri: Annotated[str, URL]
    access_token: Annotated[
        SecretRef | None, input_reference("access_token", "registration_access_token")
    ] = None
    # Instead of a registration access token: another credential's token (e.g. an admin's).
    auth: Annotated[CredentialAuth | None, CREDENTIAL_AUTH] = None

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        if self.auth is not None and self.access_token is not None:
            message = (
                "is set with auth, which replaces the registration access token; expected "
                "one of them"
            )
            yield "access_token", message


@table(kw_only=True)
class JwksRegistration(Table):
    """`registration = { method = "jwks", … }`: the client's JWKS document, published where
    the server fetches it as the client's `jwks_uri`."""

    method: Literal["jwks"] = "jwks"
    publish_to: Annotated[
        str | None,
        KV_PATH,
        OUTSIDE_STATE_PREFIX,
        Unique("each credential to publish to its own path"),
    ] = None
    file: Annotated[Path | None, SINK_PATH, Unique("each sink to write its own file")] = None
    # How long the server may keep a document it fetched: a new key is in the document this
    # long before it signs (panva/oidc-provider keeps one at least 60 s).
    server_cache: Annotated[float, duration(maximum=DAY)] = 60.0

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        if self.publish_to is None and self.file is None:
            message = (
                "missing, and so is file; expected where the JWKS document goes: publish_to "
                "(a Vault path), file (a path on keyturn's host), or both"
            )
            yield "publish_to", message


@table(kw_only=True)
class RotatorRegistration(Table):
    """`registration = { method = "rotator" }`: the `exec` rotator `rotation.rotator` names
    registers the public keys at the provider's own API."""

    method: Literal["rotator"] = "rotator"


Registration = Annotated[
    Rfc7592Registration | JwksRegistration | RotatorRegistration,
    Field(discriminator="method"),
    described(
        'a table, e.g. registration = { method = "rfc7592", client_uri = '
        '"https://idp.example/reg/billing" } or { method = "jwks", publish_to = '
        '"apps/billing/jwks" }'
    ),
]


@table(kw_only=True)
class SigningKeyCredential(CredentialConfig):
    """`kind = "signing_key"`: a key pair keyturn makes, rotates and registers with the server
    as `registration` says, proven by a token request signed with it before apps use it."""

    REFUSED = (
        'not allowed for kind "signing_key", whose key keyturn makes itself and which '
        "authenticates with no client secret and holds no token"
    )
    kind: Literal["signing_key"] = "signing_key"
    client_id: Annotated[SecretRef, REFERENCE_OR_INLINE]
    scope: Annotated[str | None, SCOPE] = None
    rotation: Annotated[
        RotationPolicy,
        described('a table, e.g. rotation = { max_age = "90d", grace = "1d" }'),
    ]
    algorithm: AssertionAlg = "ES256"
    key_size: Annotated[int | None, integer(2048, 8192, " (bits of an RSA key)")] = None
    registration: Registration

    def references(self) -> Iterator[tuple[str, SecretRef]]:
        yield from CredentialConfig.references(self)  # (slotted dataclasses: no bare super())
        registration = self.registration
        if isinstance(registration, Rfc7592Registration) and registration.access_token:
            yield "registration.access_token", registration.access_token

    def also_published(self) -> tuple[str, ...]:
        registration = self.registration
        if isinstance(registration, JwksRegistration) and registration.publish_to is not None:
            return (registration.publish_to,)
        return ()

    def problems(self, context: LoadContext) -> Iterator[tuple[Where, str]]:
        through_rotator = isinstance(self.registration, RotatorRegistration)
        rotator = self._rotator_in(context)
        if self.rotation.rotator is not None and not through_rotator:
            message = (
                f'is "{self.rotation.rotator}" for a signing_key registered by '
                f'"{self.registration.method}", whose key keyturn makes itself; expected no '
                'rotator, or registration = { method = "rotator" }'
            )
            yield ("rotation", "rotator"), message
        elif through_rotator and self.rotation.rotator is None:
            message = (
                'missing; registration = { method = "rotator" } needs the name of an "exec" '
                "rotator that registers the public keys"
            )
            yield ("rotation", "rotator"), message
        elif through_rotator and rotator is not None and rotator[1] not in (None, "exec"):
            message = (
                f'"{rotator[0]}" is a {rotator[1]} rotator; expected an exec rotator (its '
                "register action gets the public JWK on stdin)"
            )
            yield ("rotation", "rotator"), message
        if self.key_size is not None and self.algorithm not in RSA_ALGORITHMS:
            message = (
                f'is set for algorithm "{self.algorithm}", whose key size is fixed; expected '
                'key_size only with "RS256" or "PS256"'
            )
            yield "key_size", message


# Every kind, one class each; `CredentialKind` lists their tags (a test checks the two agree).
# Each is named by its kind's `Kind.config` (`keyturn.kinds`), and the registry refuses to load
# unless its `REGISTERED` names these, in this order (this module imports no kind: the
# configuration is read before any job machinery is loaded).
KINDS = (OAuthClientCredential, ApiKeyCredential, SigningKeyCredential)
if TYPE_CHECKING:
    AnyCredential = CredentialConfig
else:
    AnyCredential = Annotated[Union[KINDS], Field(discriminator="kind")]  # noqa: UP007
