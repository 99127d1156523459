"""The `manual` rotator: for keys only a person can create (in the provider's dashboard).

`create` never creates anything: it raises `AwaitingManualKey`, which keyturn reports (an
alert, `keyturn status`) while it waits for someone to run `keyturn import-key -c FILE NAME`
with the new key on stdin. `revoke` cannot revoke either: it logs a warning that the old key
must be revoked by hand. `find` cannot list keys.
"""

from __future__ import annotations

from keyturn.config.schema import ManualRotatorConfig
from keyturn.logs import get_logger
from keyturn.rotators.base import AwaitingManualKey, NewKey, RotationRequest


class ManualRotator:
    """Waits for a person; holds no resources."""

    def __init__(self, config: ManualRotatorConfig) -> None:
        self.name = config.name
        self.config = config
        self._log = get_logger("keyturn.rotators.manual")

    def __repr__(self) -> str:
        return f"ManualRotator({self.name!r})"

    async def create(self, request: RotationRequest) -> NewKey:
        raise AwaitingManualKey(
            f"rotator {self.name}: waiting for `keyturn import-key -c FILE "
            f"{request.credential}` (create the key in the provider's dashboard and pipe it "
            "in on stdin)",
            credential=request.credential,
        )

    async def revoke(self, request: RotationRequest, key_id: str) -> None:
        self._log.warning(
            "rotation.revoke_by_hand",
            credential=request.credential,
            rotator=self.name,
            key_id=key_id,
            detail="the grace period is over: revoke the old key by hand in the dashboard",
        )

    async def find(self, request: RotationRequest) -> list[str] | None:
        return None

    async def aclose(self) -> None:
        return None
