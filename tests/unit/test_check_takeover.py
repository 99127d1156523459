"""`keyturn check` on what the published tokens ask of several instances (`takeover_notes`):
read from each credential's private record in the in-memory Vault; notes on stdout, never a
problem (a tight configuration still runs)."""

from __future__ import annotations

from keyturn.clock import FakeClock
from keyturn.commands.check import revocation_notes, takeover_notes
from keyturn.config import Config, parse_config
from keyturn.layout import state_path
from keyturn.state import CredentialState, TokenRecord
from keyturn.testing.vault import FakeVaultStore

T0 = 1_800_000_000.0


def config(takeover_after: str = "30s", revoke_path: str | None = None) -> Config:
    revoke = f'revoke_path = "{revoke_path}"' if revoke_path else ""
    text = f"""\
[keyturn]
takeover_after = "{takeover_after}"

[vault]
address = "https://vault.example.com"
auth = {{ method = "token", token = "env:VAULT_TOKEN" }}

[[providers]]
name = "acme"
base_url = "https://acme.example.com"
{revoke}

[[rotators]]
name = "by-hand"
type = "manual"
"""
    for name in ("hourly", "half-minute", "ten-seconds"):
        text += f"""
[[credentials]]
name = "{name}"
provider = "acme"
kind = "oauth_client"
client_id = "vault:secret/keyturn/inputs/{name}#client_id"
client_secret = "vault:secret/keyturn/inputs/{name}#client_secret"
publish_to = "apps/{name}/acme"
"""
    text += """
[[credentials]]
name = "key"
provider = "acme"
kind = "api_key"
publish_to = "apps/key/acme"
probe = "/v1/users"
rotation = { max_age = "30d", rotator = "by-hand" }
"""
    return parse_config(text, "keyturn.toml", {"VAULT_TOKEN": "unused"})


def store_with(cfg: Config, lifetimes: dict[str, float]) -> FakeVaultStore:
    """Each named credential's record holds a token issued at T0 living that long."""
    store = FakeVaultStore(clock=FakeClock(start=T0))
    for name, lifetime in lifetimes.items():
        state = CredentialState(token=TokenRecord(issued_at=T0, expires_at=T0 + lifetime))
        data = {k: v for k, v in state.to_data().items() if isinstance(v, str)}
        store.external_write(state_path(cfg.keyturn.state_prefix, name), data)
    return store


async def test_long_tokens_ask_nothing_of_the_instances() -> None:
    cfg = config()
    # An hour leaves 864 s after the latest refresh (288 s needed, above the 30 s cap); an
    # API key's expires_at is its rotation date, never judged.
    assert await takeover_notes(cfg, store_with(cfg, {"hourly": 3600, "key": 5})) == []
    assert await takeover_notes(cfg, store_with(cfg, {})) == []  # nothing published yet


async def test_short_tokens_lower_the_beat_with_a_note_that_takeover_after_is_a_cap() -> None:
    cfg = config()
    notes = await takeover_notes(cfg, store_with(cfg, {"hourly": 3600, "half-minute": 30}))
    assert notes == [
        "keyturn.takeover_after: 30s is a cap: credentials['half-minute']'s 30s tokens leave "
        "15.0s after their latest planned refresh and need a takeover within 5.0s, so several "
        "instances of this configuration beat every 1.7s instead of every 10.0s"
    ]
    # A cap already below the need: nothing to say.
    low = config("4s")
    assert await takeover_notes(low, store_with(low, {"half-minute": 30})) == []


async def test_tokens_too_short_for_any_heartbeat_get_a_warning_naming_them() -> None:
    cfg = config()
    notes = await takeover_notes(cfg, store_with(cfg, {"half-minute": 30, "ten-seconds": 10}))
    warning, cap = notes
    assert warning == (
        "warning: credentials['ten-seconds']: its 10s tokens leave 5.0s after their latest "
        "planned refresh; a takeover within a third of that (1.7s) is below keyturn's least "
        "(3s): with several instances, when the one running it dies apps may read an expired "
        "token before another runs it; use longer-lived tokens, or refresh earlier so that at "
        "least 9s are left (a smaller refresh.at, or a larger refresh.margin below the "
        "lifetime)"
    )
    assert cap.startswith("keyturn.takeover_after: 30s is a cap: credentials['ten-seconds']'s")
    assert "beat every 1.0s instead of every 10.0s" in cap



def test_a_provider_of_oauth_credentials_without_revoke_path_is_noted() -> None:
    notes = revocation_notes(config())
    assert len(notes) == 1
    assert notes[0].startswith("note: providers['acme'] has no revoke_path")
    assert "refresh_token.orphaned" in notes[0]
    assert revocation_notes(config(revoke_path="/oauth/revoke")) == []
