"""`credential:NAME`: an `http` rotator's calls (`auth`), a credential's probe (`probe_auth`)
or a signing key's RFC 7592 registration (`registration.auth`) authenticated with the token
keyturn keeps for another credential, read from Vault at each call (`published_token`); an
unknown name or a loop (`a -> b -> a`) is refused at load (docs/configuration.md, "A
credential that authenticates another").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keyturn.config.fields import NAME_RULE, Check, Invalid, Where, describe, secret_reference
from keyturn.errors import KeyturnError, RotationError
from keyturn.references import REFERENCE_FORMS, ReferenceResolver, SecretRef
from keyturn.secret import Secret

PREFIX = "credential:"


@dataclass(frozen=True, slots=True)
class CredentialAuth:
    """The published token of the credential `name`, read from Vault at each call."""

    name: str

    def __str__(self) -> str:
        return f"{PREFIX}{self.name}"


def published_token(
    auth: CredentialAuth,
    at: SecretRef,
    resolver: ReferenceResolver,
    *,
    field: str = "auth",
    error: type[KeyturnError] = RotationError,
) -> Callable[[], Awaitable[Secret]]:
    """Reads the token published at `at` for the credential `auth` names, afresh at each call
    (it is refreshed on its own schedule); a failure (an `error`) names `field` and `auth`,
    never a value."""

    async def read() -> Secret:
        try:
            return await resolver.resolve(at)
        except KeyturnError as failure:
            why = f"{field}: {auth}: no published token to use ({failure.message})"
            raise error(why) from failure

    return read


_EXAMPLE = 'auth = "env:SANDBOX_ADMIN_TOKEN"'
_REFERENCE = secret_reference(_EXAMPLE)
_EXPECTED = (
    f'a reference ({REFERENCE_FORMS}, e.g. {_EXAMPLE}) or "credential:<name>", the token '
    'keyturn keeps for another credential (e.g. auth = "credential:keycloak-admin")'
)


def _auth(value: object) -> SecretRef | CredentialAuth:
    if isinstance(value, str) and value.startswith(PREFIX):
        name = value[len(PREFIX) :]
        if not NAME_RULE.fullmatch(name):
            raise Invalid(f"got {describe(value)}, which names no credential; expected {_EXPECTED}")
        return CredentialAuth(name)
    try:
        ref: SecretRef = _REFERENCE.value(value)
    except Invalid as problem:
        raise Invalid(str(problem).split("; expected ")[0] + f"; expected {_EXPECTED}") from None
    return ref


AUTH = Check(_EXPECTED, _auth)

_CREDENTIAL_EXPECTED = (
    '"credential:<name>", the token keyturn keeps for another credential (e.g. '
    '"credential:keycloak-admin")'
)


def _credential_only(value: object) -> CredentialAuth:
    name = value[len(PREFIX) :] if isinstance(value, str) and value.startswith(PREFIX) else None
    if name is None or not NAME_RULE.fullmatch(name):
        shown = describe(value) if name is not None else "a value that is not one"
        raise Invalid(f"got {shown}; expected {_CREDENTIAL_EXPECTED}")
    return CredentialAuth(name)


# `probe_auth`, a registration's `auth`: only another credential's token (a static token
# belongs in the credential's own inputs).
CREDENTIAL_AUTH = Check(_CREDENTIAL_EXPECTED, _credential_only)


def unknown_credential(auth: object, declared: Sequence[str] | None) -> str | None:
    """Why `auth` names no credential (None: it is fine, or not a `credential:` one)."""
    if not isinstance(auth, CredentialAuth) or declared is None or auth.name in declared:
        return None
    known = ", ".join(f'"{n}"' for n in declared) or "none"
    return (
        f'names credential "{auth.name}", which is not a [[credentials]] entry; expected one '
        f"of: {known}"
    )


# The uses of another credential's token, as a loop's line names them: the key that sets it.
_USES: dict[str, tuple[str, ...]] = {
    "rotator": ("rotation", "rotator"),
    "probe": ("probe_auth",),
    "registration": ("registration", "auth"),
}


def auth_edges(
    credential: Any, rotators: Mapping[str, Any]
) -> Iterator[tuple[str, CredentialAuth]]:
    """(use, auth) for each call of `credential` that authenticates with another credential's
    token: its rotator's `auth`, its `probe_auth`, its registration's `auth`."""
    rotator = rotators.get(credential.rotation.rotator) if credential.rotation else None
    uses = {
        "rotator": getattr(rotator, "auth", None),
        "probe": getattr(credential, "probe_auth", None),
        "registration": getattr(getattr(credential, "registration", None), "auth", None),
    }
    for use, auth in uses.items():
        if isinstance(auth, CredentialAuth):
            yield use, auth


def auth_problems(
    credentials: Sequence[Any], rotators: Mapping[str, Any]
) -> Iterator[tuple[Where, str]]:
    """A credential's `probe_auth` or registration `auth` naming no credential (a rotator's is
    refused by the rotator), then one problem per loop of credentials authenticating with each
    other's tokens, at the first credential of the loop in the file's order."""
    index = {credential.name: i for i, credential in enumerate(credentials)}
    edges: dict[str, list[tuple[str, str]]] = {}
    for i, credential in enumerate(credentials):
        for key, message in _probe_problems(credential):
            yield ("credentials", i, key), message
        for use, auth in auth_edges(credential, rotators):
            if auth.name in index:
                edges.setdefault(credential.name, []).append((auth.name, use))
            elif use != "rotator":
                yield ("credentials", i, *_USES[use]), str(unknown_credential(auth, [*index]))
    reported: set[str] = set()
    for start in index:
        loop = _loop_from(start, edges)
        if loop is None or reported & {name for name, _use in loop}:
            continue
        reported |= {name for name, _use in loop}
        at = min(range(len(loop)), key=lambda i: index[loop[i][0]])
        ordered = [*loop[at:], *loop[:at]]
        chain = " -> ".join([*(name for name, _use in ordered), ordered[0][0]])
        steps = [
            f"{name}'s {use} uses {ordered[(i + 1) % len(ordered)][0]}'s token"
            for i, (name, use) in enumerate(ordered)
        ]
        first, use = ordered[0]
        message = (
            f"authenticates through a loop of credentials: {chain} ({'; '.join(steps)}); "
            "expected a chain that ends in a credential authenticated otherwise"
        )
        yield ("credentials", index[first], *_USES[use]), message


def _probe_problems(credential: Any) -> Iterator[tuple[str, str]]:
    """`probe_auth` and `probe_header` go together, with a probe."""
    probe_auth, header = getattr(credential, "probe_auth", None), credential.probe_header
    if probe_auth is not None and getattr(credential, "probe", None) is None:
        yield "probe_auth", "is set without probe; expected a probe for it to authenticate"
    if probe_auth is not None and header is None:
        message = (
            "missing, with probe_auth set; expected the header that carries the credential's "
            "own value, since Authorization carries the other's token, e.g. probe_header = "
            '"X-Api-Key"'
        )
        yield "probe_header", message
    if header is not None and probe_auth is None:
        message = (
            'is set without probe_auth; expected it only with probe_auth = "credential:<name>"'
        )
        yield "probe_header", message
    if header is not None and header.lower() == "authorization":
        yield "probe_header", "is Authorization, which carries probe_auth's token; expected another"


def _loop_from(
    start: str, edges: Mapping[str, Sequence[tuple[str, str]]]
) -> list[tuple[str, str]] | None:
    """A loop back to `start` ((credential, the use leading to the next) in order), by a
    depth-first walk that visits each credential once; None if there is none."""
    path: list[tuple[str, str]] = []
    names = [start]
    seen = {start}
    pending = [iter(edges.get(start, ()))]
    while pending:
        step = next(pending[-1], None)
        if step is None:
            pending.pop()
            names.pop()
            if path:
                path.pop()
            continue
        following, use = step
        if following == start:
            return [*path, (names[-1], use)]
        if following not in seen:
            seen.add(following)
            path.append((names[-1], use))
            names.append(following)
            pending.append(iter(edges.get(following, ())))
    return None
