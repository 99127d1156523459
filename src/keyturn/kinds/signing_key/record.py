"""What a signing key keeps of its own in its private record (`CredentialState.own`): the
RFC 7592 registration access token and what keeps it presented at most once, the client
metadata of the server's last answer (what an update sends back, so that it needs no read
first), the key ids the server holds, and a client secret the server issued on an update."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from keyturn.errors import VaultDataError
from keyturn.secret import Secret
from keyturn.state import CredentialState, KindRecord


@dataclass(frozen=True, slots=True)
class Registration:
    # The registration access token (RFC 7591/7592); None before the first or once lost.
    access_token: Secret | None = None
    # Set (to a random attempt id) just before the token is presented, cleared once the answer
    # is stored: found set, the answer was lost and the server may have replaced the token.
    in_flight: str | None = None
    # Why no request may be made with a token until a person hands over a new one (refused
    # by the server, or its answer lost); None otherwise.
    stopped: str | None = None
    # A fingerprint of the `access_token` input keyturn last seeded from (state.fingerprint).
    input_fingerprint: str | None = None
    # The key ids the server held when keyturn last read or wrote the registration.
    registered: tuple[str, ...] = ()
    # A client secret the server issued on a registration update (kept, then published).
    client_secret: Secret | None = None
    # The provider's id of each registered key (kid -> id), registered through a rotator.
    provider_ids: tuple[tuple[str, str], ...] = ()
    # A JWKS document holds the pending key since a time: it signs from this time on, when a
    # server that cached the document before has fetched it again.
    signs_after: float | None = None
    # The client metadata of the server's last successful RFC 7592 answer (or of the RFC 7591
    # registration response handed over), without the fields not sent back and the token: what
    # an update PUTs back with `jwks` changed. None: the next update reads it first.
    # (It may hold the client's `client_secret`: never in a repr.)
    metadata: dict[str, Any] | None = field(default=None, repr=False)

    def with_(self, **changes: object) -> Registration:
        return replace(self, **changes)  # type: ignore[arg-type]


_SECRETS = ("access_token", "client_secret")


def read(state: CredentialState, credential: str) -> Registration:
    """The kind's part of `state` (empty when there is none)."""
    if state.own.data is None:
        return Registration()
    try:
        stored = json.loads(state.own.data.reveal())
        values = {
            "access_token": stored.get("access_token"),
            "in_flight": stored.get("in_flight"),
            "stopped": stored.get("stopped"),
            "input_fingerprint": stored.get("input_fingerprint"),
            "registered": tuple(stored.get("registered", ())),
            "client_secret": stored.get("client_secret"),
            "signs_after": stored.get("signs_after"),
            "provider_ids": tuple(
                (str(kid), str(key_id)) for kid, key_id in stored.get("provider_ids", {}).items()
            ),
            "metadata": stored.get("metadata"),
        }
        for name, value in values.items():
            if name in ("registered", "signs_after", "provider_ids", "metadata") or value is None:
                continue
            if not isinstance(value, str):
                raise TypeError(name)
        if values["signs_after"] is not None and not isinstance(values["signs_after"], float | int):
            raise TypeError("signs_after")
        if values["metadata"] is not None and not isinstance(values["metadata"], dict):
            raise TypeError("metadata")
        if not all(isinstance(kid, str) for kid in values["registered"]):
            raise TypeError("registered")
    except (ValueError, TypeError, AttributeError):
        raise VaultDataError(
            "private state field 'kind_record' is not a signing key's registration record",
            credential=credential,
        ) from None
    for name in _SECRETS:
        if values[name] is not None:
            values[name] = Secret(values[name])
    return Registration(**values)


def write(state: CredentialState, registration: Registration) -> CredentialState:
    """`state` holding `registration` as its kind record."""
    values = asdict(registration)
    for name in _SECRETS:
        value = getattr(registration, name)
        values[name] = value.reveal() if value is not None else None
    values["registered"] = list(registration.registered)
    values["provider_ids"] = dict(registration.provider_ids) or None
    data = {name: value for name, value in values.items() if value is not None}
    return replace(state, own=KindRecord(Secret(json.dumps(data, sort_keys=True))))
