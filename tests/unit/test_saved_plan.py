"""The saved plan (`keyturn.saved_plan`): a restart plans from it without a read per credential,
never later than the saved plan nor the verification window, never with a secret in it, and
only for credentials whose settings did not change."""

from __future__ import annotations

import random
from dataclasses import replace

from keyturn.config import Config, parse_config
from keyturn.jobs.job import Outcome
from keyturn.saved_plan import (
    SHARD_SIZE,
    TOUCH_SLACK,
    VERIFY_WINDOW,
    PlanStore,
    touch,
    without_secrets,
)
from keyturn.scheduler import JobView
from keyturn.secret import Secret
from keyturn.state import CredentialState, LeaseRecord, RefreshTokenRecord, TokenRecord
from keyturn.testing.vault import FakeVaultStore
from keyturn_devkit.harness.configs import VAULT

NOW = 1_800_000_000.0

HEAD = (
    VAULT
    + """
[[providers]]
name = "acme"
base_url = "https://acme.example.com"
"""
)

CREDENTIAL = """
[[credentials]]
name = "NAME"
provider = "acme"
kind = "oauth_client"
client_id = "vault:secret/keyturn/inputs/NAME#client_id"
client_secret = "vault:secret/keyturn/inputs/NAME#client_secret"
publish_to = "apps/NAME/acme"
scope = "SCOPE"
"""


def config(names: list[str], scope: str = "read") -> Config:
    text = HEAD + "".join(CREDENTIAL.replace("NAME", n).replace("SCOPE", scope) for n in names)
    return parse_config(text, "keyturn.toml", {"VAULT_TOKEN": "unused"})


def state(version: int) -> CredentialState:
    """A record as a run leaves it: with secrets the plan must not keep."""
    return CredentialState(
        lease=LeaseRecord("i-1", NOW + 30),
        refresh=RefreshTokenRecord(token=Secret("rt-secret-value")),
        token=TokenRecord(
            issued_at=NOW - 100,
            expires_at=NOW + 3500,
            published_version=version,
            last_success=NOW - 100,
            next_due=NOW + 2000,
            phase="ok",
        ),
    )


def views(names: list[str], due: float = NOW + 2000) -> list[JobView]:
    return [
        JobView(name, "oauth_client", due, Outcome("refreshed", due, state(i + 1)), False, NOW)
        for i, name in enumerate(names)
    ]


def plans(store: FakeVaultStore) -> PlanStore:
    return PlanStore(store, state_prefix="keyturn/state", instance_id="i-1")


async def test_a_saved_plan_restores_each_credential_without_a_secret() -> None:
    store = FakeVaultStore()
    names = ["a", "b", "c"]
    assert await plans(store).save(config(names), views(names), runs=3)
    written = [
        entry.data
        for number in range(1)
        if (entry := await store.read(f"keyturn/state/_plan/i-1/{number}")) is not None
    ]
    assert written and "rt-secret-value" not in str(written)
    restored = await plans(store).restore(config(names), now=NOW, rng=random.Random(1))
    assert sorted(restored) == names
    for i, name in enumerate(names):
        plan = restored[name]
        assert NOW <= plan.due <= NOW + VERIFY_WINDOW  # sooner than the saved due (+2000 s)
        assert plan.state.token.published_version == i + 1
        assert plan.state.token.expires_at == NOW + 3500
        assert plan.state.refresh.token is None and plan.state.lease.owner is None


async def test_a_due_sooner_than_the_window_is_kept() -> None:
    store = FakeVaultStore()
    assert await plans(store).save(config(["a"]), views(["a"], due=NOW + 5), runs=1)
    restored = await plans(store).restore(config(["a"]), now=NOW, rng=random.Random(2))
    assert restored["a"].due <= NOW + 5


async def test_changed_settings_and_unknown_credentials_are_not_restored() -> None:
    store = FakeVaultStore()
    assert await plans(store).save(config(["a", "b"]), views(["a", "b"]), runs=2)
    restored = await plans(store).restore(
        config(["a", "b", "new"], scope="write"), now=NOW, rng=random.Random(3)
    )
    assert restored == {}
    restored = await plans(store).restore(config(["b", "new"]), now=NOW, rng=random.Random(3))
    assert sorted(restored) == ["b"]


ROTATED = """
[[providers]]
name = "other"
base_url = "https://other.example.com"

[[rotators]]
name = "keys"
type = "exec"
command = ["COMMAND"]

[[credentials]]
name = "key"
provider = "other"
kind = "api_key"
publish_to = "apps/key"
probe = "/v1/users"
rotation = { max_age = "30d", rotator = "keys" }
"""


def rotated(command: str = "rotate", base_url: str = "https://acme.example.com") -> Config:
    """Credentials a and b on acme, `key` on another provider with a rotator."""
    text = HEAD.replace("https://acme.example.com", base_url) + "".join(
        CREDENTIAL.replace("NAME", n).replace("SCOPE", "read") for n in ["a", "b"]
    )
    return parse_config(
        text + ROTATED.replace("COMMAND", command), "keyturn.toml", {"VAULT_TOKEN": "x"}
    )


async def test_a_changed_provider_or_rotator_is_not_restored_for_its_credentials() -> None:
    """A credential's plan holds while its own settings, its provider's and its rotator's
    stay; a change to a provider or a rotator drops only the credentials that use it."""
    names = ["a", "b", "key"]
    store = FakeVaultStore()
    assert await plans(store).save(rotated(), views(names), runs=1)
    again = await plans(store).restore(rotated(), now=NOW, rng=random.Random(3))
    rotator_changed = await plans(store).restore(
        rotated(command="rotate-v2"), now=NOW, rng=random.Random(3)
    )
    provider_changed = await plans(store).restore(
        rotated(base_url="https://acme-2.example.com"), now=NOW, rng=random.Random(3)
    )
    assert sorted(again) == names
    assert sorted(rotator_changed) == ["a", "b"]
    assert sorted(provider_changed) == ["key"]


async def test_nothing_is_written_again_until_a_run_finished() -> None:
    store = FakeVaultStore()
    keeper = plans(store)
    assert await keeper.save(config(["a"]), views(["a"]), runs=1)
    before = len(store.writes)
    assert not await keeper.save(config(["a"]), views(["a"]), runs=1)
    assert len(store.writes) == before
    assert await keeper.save(config(["a"]), views(["a"]), runs=2)
    assert len(store.writes) == before + 1


async def test_many_credentials_span_shards_and_a_shrunk_plan_reads_only_its_own() -> None:
    store = FakeVaultStore()
    many = [f"c{i}" for i in range(2 * SHARD_SIZE + 7)]
    assert await plans(store).save(config(many), views(many), runs=1)
    assert await store.read("keyturn/state/_plan/i-1/2") is not None
    restored = await plans(store).restore(config(many), now=NOW, rng=random.Random(4))
    assert len(restored) == len(many)
    few = many[:3]
    assert await plans(store).save(config(few), views(few), runs=2)
    restored = await plans(store).restore(config(many), now=NOW, rng=random.Random(4))
    assert sorted(restored) == sorted(few)  # the old shards 1 and 2 are not read


async def test_a_save_cut_short_is_not_trusted() -> None:
    store = FakeVaultStore()
    many = [f"c{i}" for i in range(SHARD_SIZE + 1)]
    assert await plans(store).save(config(many), views(many), runs=1)
    # A second save that wrote shard 1 and died before shard 0: generations differ.
    entry = await store.read("keyturn/state/_plan/i-1/1")
    assert entry is not None
    await store.write("keyturn/state/_plan/i-1/1", {**entry.data, "generation": "other"}, cas=None)
    assert await plans(store).restore(config(many), now=NOW, rng=random.Random(5)) == {}


async def test_an_unreadable_plan_restores_nothing() -> None:
    store = FakeVaultStore()
    await store.write(
        "keyturn/state/_plan/i-1/0", {"generation": "g", "shards": "1", "entries": "[1]"}, cas=None
    )
    assert await plans(store).restore(config(["a"]), now=NOW, rng=random.Random(6)) == {}
    entries = '{"a": ["fp", "soon", {}]}'
    await store.write(
        "keyturn/state/_plan/i-1/0",
        {"generation": "g", "shards": "1", "entries": entries},
        cas=None,
    )
    assert await plans(store).restore(config(["a"]), now=NOW, rng=random.Random(6)) == {}


async def test_a_credential_a_command_worked_on_runs_at_once() -> None:
    """`keyturn import-key` & co. mark what they changed: marked since the daemon's last run
    of it (or up to TOUCH_SLACK before), the credential is not restored."""
    store = FakeVaultStore()
    names = ["a", "b", "c"]
    assert await plans(store).save(config(names), views(names), runs=1)  # last runs at NOW
    await touch(store, "keyturn/state", "a", NOW + 1)
    await touch(store, "keyturn/state", "b", NOW - TOUCH_SLACK / 2)
    await touch(store, "keyturn/state", "c", NOW - 2 * TOUCH_SLACK)
    restored = await plans(store).restore(config(names), now=NOW + 10, rng=random.Random(7))
    assert sorted(restored) == ["c"]
    assert restored["c"].finished_at == NOW


def test_the_plan_keeps_no_secret_of_a_rotation() -> None:
    full = replace(
        state(1),
        rotation=replace(
            state(1).rotation, key=Secret("key-secret"), pending_key=Secret("pending-secret")
        ),
    )
    kept = without_secrets(full).to_data()
    assert not any(isinstance(value, Secret) for value in kept.values())
    assert "key-secret" not in str(kept) and "pending-secret" not in str(kept)
