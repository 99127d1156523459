"""The manual rotator: create waits for a person, revoke asks a person, find cannot list."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from keyturn.config.schema import ManualRotatorConfig
from keyturn.errors import RotationError
from keyturn.rotators.base import AwaitingManualKey, RotationRequest, Rotator
from keyturn.rotators.manual import ManualRotator

REQUEST = RotationRequest("legacy-key", "api_key", "r1", "keyturn-legacy-key-r1")


async def test_create_waits_for_import_key() -> None:
    rotator = ManualRotator(ManualRotatorConfig(name="by-hand"))
    with pytest.raises(AwaitingManualKey) as caught:
        await rotator.create(REQUEST)
    assert isinstance(caught.value, RotationError)
    assert caught.value.retryable
    assert caught.value.credential == "legacy-key"
    assert str(caught.value).startswith(
        "legacy-key: rotator by-hand: waiting for `keyturn import-key -c FILE legacy-key`"
    )


async def test_revoke_warns_that_the_old_key_must_be_revoked_by_hand() -> None:
    rotator = ManualRotator(ManualRotatorConfig(name="by-hand"))
    with capture_logs() as logs:
        await rotator.revoke(REQUEST, "key_0123")
    [event] = logs
    assert event["event"] == "rotation.revoke_by_hand"
    assert event["log_level"] == "warning"
    assert (event["credential"], event["rotator"], event["key_id"]) == (
        "legacy-key",
        "by-hand",
        "key_0123",
    )
    assert "by hand in the dashboard" in event["detail"]


async def test_find_cannot_list_and_aclose_holds_nothing() -> None:
    rotator: Rotator = ManualRotator(ManualRotatorConfig(name="by-hand"))
    assert rotator.name == "by-hand"
    assert await rotator.find(REQUEST) is None
    await rotator.aclose()
    assert repr(rotator) == "ManualRotator('by-hand')"
