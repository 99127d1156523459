"""`auth = "credential:NAME"`: an `http` rotator's calls authenticated with the token keyturn
keeps for another credential; an unknown name or a loop (`a -> b -> a`) is refused at load
(docs/configuration.md, "A credential that authenticates another").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keyturn.config.fields import NAME_RULE, Check, Invalid, Where, describe, secret_reference
from keyturn.references import REFERENCE_FORMS, SecretRef

PREFIX = "credential:"


@dataclass(frozen=True, slots=True)
class CredentialAuth:
    """The published token of the credential `name`, read from Vault at each call."""

    name: str

    def __str__(self) -> str:
        return f"{PREFIX}{self.name}"


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


def unknown_credential(auth: object, declared: Sequence[str] | None) -> str | None:
    """Why `auth` names no credential (None: it is fine, or not a `credential:` one)."""
    if not isinstance(auth, CredentialAuth) or declared is None or auth.name in declared:
        return None
    known = ", ".join(f'"{n}"' for n in declared) or "none"
    return (
        f'names credential "{auth.name}", which is not a [[credentials]] entry; expected one '
        f"of: {known}"
    )


def auth_loops(
    credentials: Sequence[Any], rotators: Mapping[str, Any]
) -> Iterator[tuple[Where, str]]:
    """One problem per loop of credentials whose rotations authenticate with each other's
    tokens, at the first credential of the loop in the file's order."""
    index = {credential.name: i for i, credential in enumerate(credentials)}
    edges: dict[str, str] = {}
    for credential in credentials:
        rotator = rotators.get(credential.rotation.rotator) if credential.rotation else None
        auth = getattr(rotator, "auth", None)
        if isinstance(auth, CredentialAuth) and auth.name in index:
            edges[credential.name] = auth.name
    reported: set[str] = set()
    for start in edges:
        path = [start]
        while path[-1] in edges and edges[path[-1]] not in path:
            path.append(edges[path[-1]])
        following = edges.get(path[-1])
        if following is None:
            continue
        loop = path[path.index(following) :]
        if reported & set(loop):
            continue
        reported |= set(loop)
        first = min(loop, key=index.__getitem__)
        at = loop.index(first)
        ordered = [*loop[at:], *loop[:at], first]
        where: Where = ("credentials", index[first], "rotation", "rotator")
        message = (
            f"authenticates through a loop of credentials: {' -> '.join(ordered)} (each "
            "one's rotator uses the token of the next); expected a chain that ends in a "
            "credential authenticated otherwise"
        )
        yield where, message
