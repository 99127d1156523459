"""The sandbox's domain logic, driven by FakeClock: grants, expiry, refresh rotation and reuse,
client-secret overlap, revocation, usage records. No sockets, no sleeping."""

from __future__ import annotations

import pytest

from keyturn.clock import FakeClock
from keyturn.secret import Secret
from keyturn_devkit.sandbox.config import Settings
from keyturn_devkit.sandbox.model import BearerRejected, NotFound, OAuthApp, OAuthFailure
from keyturn_devkit.sandbox.state import RETENTION_SECONDS, SandboxState


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def state(clock: FakeClock) -> SandboxState:
    return SandboxState(Settings(access_token_lifetime=60, refresh_token_lifetime=600), clock)


@pytest.fixture
def app(state: SandboxState) -> tuple[OAuthApp, Secret]:
    record, _, secret = state.register_app("app", "https://app.example/callback")
    return record, secret


def test_client_credentials_grant_issues_bearer_access_and_refresh_tokens(
    state: SandboxState, app: tuple[OAuthApp, Secret]
) -> None:
    authenticated = state.authenticate_client(app[0].client_id, app[1])
    grant = state.grant_client_credentials(authenticated)
    body = grant.to_json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 60
    assert body["scope"] == "users:read projects:read"
    assert body["access_token"].startswith("ktsb_at_")
    assert body["refresh_token"].startswith("ktsb_rt_")
    principal = state.authenticate_bearer(body["access_token"])
    assert principal.credential_id == app[0].client_id
    assert principal.allows("users:read")


def test_client_credentials_can_be_configured_to_issue_no_refresh_token(
    state: SandboxState, app: tuple[OAuthApp, Secret]
) -> None:
    state.update_settings({"issue_refresh_token_for_client_credentials": False})
    body = state.grant_client_credentials(app[0]).to_json()
    assert "refresh_token" not in body
    assert state.tokens(app[0].client_id)[0].kind == "access"


def test_access_token_is_rejected_as_expired_once_its_lifetime_has_passed(
    state: SandboxState, app: tuple[OAuthApp, Secret], clock: FakeClock
) -> None:
    token = state.grant_client_credentials(app[0]).access_token.reveal()
    clock.advance(59.9)
    state.authenticate_bearer(token)
    clock.advance(0.1)
    with pytest.raises(BearerRejected, match="expired") as caught:
        state.authenticate_bearer(token)
    assert caught.value.error == "invalid_token"
    assert caught.value.status == 401


def test_a_token_response_can_leave_out_expires_in_while_the_token_still_expires(
    state: SandboxState, app: tuple[OAuthApp, Secret], clock: FakeClock
) -> None:
    state.update_settings({"include_expires_in": False})
    grant = state.grant_client_credentials(app[0])
    assert "expires_in" not in grant.to_json()
    clock.advance(61)
    with pytest.raises(BearerRejected, match="expired"):
        state.authenticate_bearer(grant.access_token.reveal())


def test_every_refresh_rotates_the_refresh_token_and_issues_a_working_access_token(
    state: SandboxState, app: tuple[OAuthApp, Secret]
) -> None:
    first = state.grant_client_credentials(app[0])
    assert first.refresh_token is not None
    second = state.grant_refresh_token(app[0], first.refresh_token)
    assert second.refresh_token is not None
    assert second.refresh_token != first.refresh_token
    assert second.access_token != first.access_token
    assert second.family_id == first.family_id
    state.authenticate_bearer(second.access_token.reveal())
    third = state.grant_refresh_token(app[0], second.refresh_token)
    state.authenticate_bearer(third.access_token.reveal())


def test_reusing_a_refresh_token_is_invalid_grant_and_revokes_the_whole_family(
    state: SandboxState, app: tuple[OAuthApp, Secret]
) -> None:
    first = state.grant_client_credentials(app[0])
    assert first.refresh_token is not None
    rotated = state.grant_refresh_token(app[0], first.refresh_token)
    other_family = state.grant_client_credentials(app[0])

    with pytest.raises(OAuthFailure, match="already used") as caught:
        state.grant_refresh_token(app[0], first.refresh_token)
    assert (caught.value.error, caught.value.status) == ("invalid_grant", 400)

    for access in (first.access_token, rotated.access_token):
        with pytest.raises(BearerRejected, match="revoked"):
            state.authenticate_bearer(access.reveal())
    assert rotated.refresh_token is not None
    with pytest.raises(OAuthFailure, match="revoked"):
        state.grant_refresh_token(app[0], rotated.refresh_token)
    # Another grant of the same client is not part of the family and keeps working.
    state.authenticate_bearer(other_family.access_token.reveal())
    statuses = {t.status(0) for t in state.tokens() if t.family.family_id == first.family_id}
    assert statuses == {"revoked"}


def test_refresh_token_of_another_client_is_invalid_grant_without_revoking_it(
    state: SandboxState, app: tuple[OAuthApp, Secret]
) -> None:
    other, _, _ = state.register_app("other", "https://other.example/cb")
    grant = state.grant_client_credentials(app[0])
    assert grant.refresh_token is not None
    with pytest.raises(OAuthFailure, match="another client"):
        state.grant_refresh_token(other, grant.refresh_token)
    state.grant_refresh_token(app[0], grant.refresh_token)


def test_expired_or_unknown_refresh_tokens_are_invalid_grant(
    state: SandboxState, app: tuple[OAuthApp, Secret], clock: FakeClock
) -> None:
    grant = state.grant_client_credentials(app[0])
    assert grant.refresh_token is not None
    clock.advance(600)
    with pytest.raises(OAuthFailure, match="expired"):
        state.grant_refresh_token(app[0], grant.refresh_token)
    with pytest.raises(OAuthFailure, match="unknown"):
        state.grant_refresh_token(app[0], Secret("ktsb_rt_made-up"))


def test_requested_scope_must_be_within_what_the_client_may_have(
    state: SandboxState, app: tuple[OAuthApp, Secret]
) -> None:
    narrow = state.grant_client_credentials(app[0], "users:read")
    assert narrow.scope == "users:read"
    principal = state.authenticate_bearer(narrow.access_token.reveal())
    assert not principal.allows("projects:read")
    with pytest.raises(OAuthFailure) as caught:
        state.grant_client_credentials(app[0], "users:read admin")
    assert caught.value.error == "invalid_scope"
    assert narrow.refresh_token is not None
    with pytest.raises(OAuthFailure, match=r"^invalid_scope: scope not allowed"):
        state.grant_refresh_token(app[0], narrow.refresh_token, "users:read projects:read")


def test_scope_override_and_short_lifetime_change_what_is_granted_at_run_time(
    state: SandboxState, app: tuple[OAuthApp, Secret]
) -> None:
    state.update_settings({"scope_override": "projects:read", "access_token_lifetime": 5})
    grant = state.grant_client_credentials(app[0], "users:read")
    assert (grant.scope, grant.expires_in) == ("projects:read", 5)
    assert not state.authenticate_bearer(grant.access_token.reveal()).allows("users:read")
    state.update_settings({"scope_override": None})
    assert state.grant_client_credentials(app[0]).scope == "users:read projects:read"


def test_rotated_client_secret_keeps_the_old_one_valid_for_the_overlap_only(
    state: SandboxState, app: tuple[OAuthApp, Secret], clock: FakeClock
) -> None:
    client_id, old = app[0].client_id, app[1]
    _, new = state.rotate_client_secret(client_id, overlap=30)
    clock.advance(29)
    state.authenticate_client(client_id, old)
    state.authenticate_client(client_id, new)
    clock.advance(1)
    with pytest.raises(OAuthFailure, match="expired") as caught:
        state.authenticate_client(client_id, old)
    assert (caught.value.error, caught.value.status) == ("invalid_client", 401)
    state.authenticate_client(client_id, new)


def test_rotation_uses_the_overlap_setting_and_an_old_secret_can_be_revoked_early(
    state: SandboxState, app: tuple[OAuthApp, Secret], clock: FakeClock
) -> None:
    state.update_settings({"client_secret_overlap": 100})
    client_id = app[0].client_id
    state.rotate_client_secret(client_id)
    old_record = app[0].secrets[0]
    assert old_record.expires_at == clock.time() + 100
    state.revoke_client_secret(client_id, old_record.secret_id)
    with pytest.raises(OAuthFailure, match="revoked"):
        state.authenticate_client(client_id, app[1])
    with pytest.raises(NotFound):
        state.revoke_client_secret(client_id, "sec_unknown")


def test_wrong_secret_and_unknown_client_are_invalid_client(
    state: SandboxState, app: tuple[OAuthApp, Secret]
) -> None:
    with pytest.raises(OAuthFailure, match="authentication failed"):
        state.authenticate_client(app[0].client_id, Secret("wrong"))
    with pytest.raises(OAuthFailure, match="unknown client"):
        state.authenticate_client("client_nobody", app[1])
    assert app[0].usage.rejected_count == 1


def test_api_keys_authenticate_until_revoked_and_usage_is_recorded(
    state: SandboxState, clock: FakeClock
) -> None:
    key, value = state.create_api_key("ci", "for CI")
    state.authenticate_bearer(value.reveal())
    clock.advance(10)
    principal = state.authenticate_bearer(value.reveal())
    assert (principal.kind, principal.credential_id, principal.scope) == (
        "api_key",
        key.key_id,
        None,
    )
    assert key.usage.request_count == 2
    assert key.usage.last_used_at == clock.time()
    state.revoke_api_key(key.key_id)
    with pytest.raises(BearerRejected, match="revoked"):
        state.authenticate_bearer(value.reveal())
    assert key.usage.rejected_count == 1
    assert state.api_key(key.key_id).status == "revoked"


def test_revoking_an_access_token_spares_its_family_but_revoking_a_refresh_token_does_not(
    state: SandboxState, app: tuple[OAuthApp, Secret]
) -> None:
    one = state.grant_client_credentials(app[0])
    two = state.grant_client_credentials(app[0])
    found = state.find_token(one.access_token)
    assert found is not None
    state.revoke_token(found)
    with pytest.raises(BearerRejected):
        state.authenticate_bearer(one.access_token.reveal())
    assert one.refresh_token is not None
    state.grant_refresh_token(app[0], one.refresh_token)

    assert two.refresh_token is not None
    refresh = state.find_token(two.refresh_token)
    assert refresh is not None
    state.revoke_token(refresh)
    with pytest.raises(BearerRejected):
        state.authenticate_bearer(two.access_token.reveal())


def test_revoking_every_grant_of_a_client(
    state: SandboxState, app: tuple[OAuthApp, Secret]
) -> None:
    grants = [state.grant_client_credentials(app[0]) for _ in range(3)]
    assert state.revoke_client_tokens(app[0].client_id) == 3
    for grant in grants:
        with pytest.raises(BearerRejected):
            state.authenticate_bearer(grant.access_token.reveal())
    with pytest.raises(NotFound):
        state.revoke_client_tokens("client_nobody")


def test_long_expired_tokens_are_forgotten_so_memory_stays_bounded(
    state: SandboxState, app: tuple[OAuthApp, Secret], clock: FakeClock
) -> None:
    for _ in range(5):
        state.grant_client_credentials(app[0])
    assert state.token_count() == 10
    clock.advance(600 + RETENTION_SECONDS + 1)
    state.grant_client_credentials(app[0])  # issuing is what triggers the sweep
    assert state.token_count() == 2


def test_records_and_grants_never_show_a_secret_value(
    state: SandboxState, app: tuple[OAuthApp, Secret]
) -> None:
    key, value = state.create_api_key("k")
    grant = state.grant_client_credentials(app[0])
    shown = " ".join(
        [repr(key), repr(app[0]), repr(grant), str(key.to_json()), str(app[0].to_json(0))]
        + [repr(t) for t in state.tokens()]
    )
    for secret in (value, app[1], grant.access_token, grant.refresh_token):
        assert secret is not None
        assert secret.reveal() not in shown
