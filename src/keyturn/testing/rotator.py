"""A fake provider key store and a rotator over it, for unit tests of rotation."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import httpx

from keyturn.rotators.base import NewKey, RotationRequest
from keyturn.secret import Secret


@dataclass
class FakeKey:
    key_id: str
    name: str
    value: str
    revoked: bool = False


@dataclass
class FakeKeyProvider:
    """Keys the 'service' issued; `verify` accepts only live ones. `fail_next` injects errors
    into the rotator's next create/revoke/find."""

    name: str = "fake"
    keys: dict[str, FakeKey] = field(default_factory=dict)
    failures: list[Exception] = field(default_factory=list)
    reject_next_verifications: int = 0
    created: int = 0
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def live(self) -> list[FakeKey]:
        return [k for k in self.keys.values() if not k.revoked]

    def add_key(self, value: str, name: str = "by-hand") -> FakeKey:
        key = FakeKey(f"key_{next(self._ids)}", name, value)
        self.keys[key.key_id] = key
        return key

    def probe(self, request: httpx.Request) -> httpx.Response:
        """The service's side of a probe (serve it with httpx.MockTransport): 200 for a live
        key, 401 otherwise."""
        if self.reject_next_verifications > 0:
            self.reject_next_verifications -= 1
            return httpx.Response(401)
        presented = request.headers.get("authorization", "").removeprefix("Bearer ")
        return httpx.Response(200 if any(k.value == presented for k in self.live()) else 401)

    # -- the Rotator protocol ---------------------------------------------------------------

    async def create(self, request: RotationRequest) -> NewKey:
        self._maybe_fail()
        self.created += 1
        key = self.add_key(f"secret-key-{self.created}-value", request.key_name)
        return NewKey(Secret(key.value), key.key_id)

    async def revoke(self, request: RotationRequest, key_id: str) -> None:
        self._maybe_fail()
        if key_id in self.keys:
            self.keys[key_id].revoked = True

    async def find(self, request: RotationRequest) -> list[str] | None:
        self._maybe_fail()
        return [k.key_id for k in self.live() if k.name == request.key_name]

    async def aclose(self) -> None:
        return None

    def _maybe_fail(self) -> None:
        if self.failures:
            raise self.failures.pop(0)
