"""Membership and shares (`keyturn.members`) over the in-memory Vault, on fake clocks: who is
alive, whose each credential is, and what a namesake, a skewed clock or a failing heartbeat do;
the takeover the tokens need, which every instance follows and judges the others by.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from types import SimpleNamespace

import pytest
from structlog.testing import capture_logs

from keyturn.clock import FakeClock
from keyturn.config import parse_config
from keyturn.errors import VaultUnavailable
from keyturn.housekeeping import ShareKeeper
from keyturn.jobs.job import Outcome
from keyturn.members import (
    MIN_TAKEOVER,
    Member,
    Membership,
    members_path,
    owner,
    read_members,
    takeover_needed,
)
from keyturn.policy import RefreshPolicy
from keyturn.scheduler import JobView
from keyturn.secret import Secret
from keyturn.state import CredentialState, TokenRecord
from keyturn.testing.vault import FakeVaultStore
from keyturn_devkit.harness.configs import VAULT

CREDENTIALS = [f"cred-{i}" for i in range(60)]
RUNNING = {1, 2}  # the pids "alive" on every host of these tests
TAKEOVER = 30.0


def member(
    store: FakeVaultStore,
    clock: FakeClock,
    instance: str,
    problems: list[tuple[str, str]] | None = None,
    *,
    host: str | None = None,
    pid: int = 1,
) -> Membership:
    return Membership(
        store,
        state_prefix="keyturn/state",
        instance_id=instance,
        takeover_after=TAKEOVER,
        clock=clock,
        host=host or f"host-{instance}",
        pid=pid,
        process_alive=lambda pid: pid in RUNNING,
        on_problem=(lambda kind, message: problems.append((kind, message)))
        if problems is not None
        else None,
    )


async def pair(store: FakeVaultStore, clock: FakeClock) -> tuple[Membership, Membership]:
    """k0 and k1, joined one after the other, each having seen the other."""
    a, b = member(store, clock, "k0"), member(store, clock, "k1")
    await a.join()
    await b.join()
    await a.beat()
    return a, b


def share(m: Membership) -> set[str]:
    return {name for name in CREDENTIALS if m.owns(name)}


def advance(seconds: float, *clocks: FakeClock) -> None:
    for clock in clocks:
        clock.advance(seconds)


async def test_a_lone_instance_owns_every_credential_and_its_entry_holds_no_secret() -> None:
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    alone = member(store, vault, "k0")
    await alone.join()
    assert share(alone) == set(CREDENTIALS)
    entry = await store.read(members_path("keyturn/state"))
    assert entry is not None and set(entry.data) == {"k0"}
    fields = json.loads(entry.data["k0"])
    assert set(fields) == {
        *("session", "host", "address", "pid", "started", "beat", "beat_at", "skew", "takeover")
    }
    assert fields["beat"] == 1
    assert fields["takeover"] == TAKEOVER  # no need known: the configured cap; `needs` absent


async def test_shares_are_disjoint_cover_everything_and_a_newcomer_takes_only_its_own() -> None:
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    a, b = await pair(store, vault)
    assert a.live == b.live == ("k0", "k1")
    assert share(a) | share(b) == set(CREDENTIALS) and not share(a) & share(b)
    assert share(a) and share(b)
    before = {"k0": share(a), "k1": share(b)}

    c = member(store, vault, "k2")
    await c.join()
    await a.beat()
    await b.beat()
    after = {"k0": share(a), "k1": share(b), "k2": share(c)}
    assert set().union(*after.values()) == set(CREDENTIALS)
    assert after["k2"], "the newcomer owns some"
    # Only credentials that went to the newcomer moved: none between k0 and k1.
    assert after["k0"] == before["k0"] - after["k2"]
    assert after["k1"] == before["k1"] - after["k2"]
    assert all(owner(name, ["k0", "k1", "k2"]) == "k2" for name in after["k2"])


async def test_a_silent_instance_is_gone_after_takeover_after_not_before() -> None:
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    a, b = await pair(store, vault)
    b_share = share(b)
    # b dies (no more beats); a keeps beating every interval.
    elapsed = 0.0
    while elapsed + a.interval < TAKEOVER:
        advance(a.interval, vault)
        elapsed += a.interval
        assert not await a.beat() or a.live == ("k0", "k1")
        assert a.live == ("k0", "k1"), f"gone after only {elapsed}s"
    advance(TAKEOVER - elapsed, vault)
    assert await a.beat() is True
    assert a.live == ("k0",)
    assert share(a) == set(CREDENTIALS) and b_share <= share(a)


async def test_an_instance_that_leaves_is_gone_at_once() -> None:
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    a, b = await pair(store, vault)
    await b.leave()
    assert await a.beat() is True
    assert a.live == ("k0",) and share(a) == set(CREDENTIALS)
    entry = await store.read(members_path("keyturn/state"))
    assert entry is not None and set(entry.data) == {"k0"}


async def test_a_skewed_clock_does_not_move_a_takeover_and_is_reported() -> None:
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    behind = FakeClock(start=vault.time() - 10.0)  # b's wall clock: 10 s behind Vault's and a's
    problems: list[tuple[str, str]] = []
    a, b = member(store, vault, "k0"), member(store, behind, "k1", problems)
    await a.join()
    await b.join()
    await a.beat()
    # b keeps beating: never gone for a, although its beat_at looks 10 s old.
    for _ in range(12):
        advance(b.interval, vault, behind)
        await b.beat()  # (measures its skew by a read right after its beat, once a minute)
        await a.beat()
        assert a.live == ("k0", "k1")
    written = read_members(await store.read(members_path("keyturn/state")), "members")["k1"]
    assert written.skew is not None and abs(written.skew + 10.0) < 0.01  # what status shows
    assert [kind for kind, _ in problems] == ["clock_skew"]  # once, not at every beat
    assert "k1" in problems[0][1] and "-10.0s" in problems[0][1]
    # b dies: gone after takeover_after on a's clock, neither 10 s earlier nor later.
    advance(TAKEOVER - 1.0, vault, behind)
    await a.beat()
    assert a.live == ("k0", "k1")
    advance(1.0, vault, behind)
    await a.beat()
    assert a.live == ("k0",)


async def test_a_namesake_stands_down_and_comes_back_when_the_elder_leaves() -> None:
    """The younger takes the elder's entry for a crashed predecessor's and replaces it (a
    restart must not wait); the elder's next beat shows it alive: both report it, and the
    younger owns nothing until the elder is gone."""
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    problems: list[tuple[str, str]] = []
    elder = member(store, vault, "k0", problems)
    await elder.join()
    advance(1.0, vault)
    younger = member(store, vault, "k0", problems)
    await younger.join()
    assert not younger.standing_down and problems == []
    advance(1.0, vault)
    await elder.beat()  # finds the younger's session under its id: reports, keeps its place
    assert not elder.standing_down
    advance(1.0, vault)
    assert await younger.beat() is True  # finds the elder's, moving: stands down
    assert younger.standing_down and share(younger) == set()
    assert share(elder) == set(CREDENTIALS)
    assert {kind for kind, _ in problems} == {"duplicate_instance_id"}
    assert all("k0" in message for _, message in problems)
    # The elder stops: the younger takes the id back and owns everything again.
    await elder.leave()
    advance(younger.interval, vault)
    assert await younger.beat() is True
    assert not younger.standing_down and share(younger) == set(CREDENTIALS)


async def test_a_namesake_on_another_host_is_waited_for_and_stood_down_from_at_join() -> None:
    """A recent entry under our id from another host may be a live namesake's: join waits one
    beat before the first runs; it moved, so this process starts owning nothing."""
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    problems: list[tuple[str, str]] = []
    elder = member(store, vault, "k0", problems, host="a")
    await elder.join()
    younger = member(store, vault, "k0", problems, host="b")
    joining = asyncio.ensure_future(younger.join())
    await asyncio.sleep(0)
    assert vault.sleepers == 1  # waiting
    for _ in range(12):
        advance(1.0, vault)
        await elder.beat()
        await asyncio.sleep(0)
    await joining
    assert younger.standing_down and share(younger) == set()
    assert share(elder) == set(CREDENTIALS)
    assert {kind for kind, _ in problems} == {"duplicate_instance_id"}


async def test_a_restart_on_the_same_host_after_a_crash_does_not_wait() -> None:
    """The entry is recent, but its process (same host) is gone: replaced at once."""
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    problems: list[tuple[str, str]] = []
    crashed = member(store, vault, "k0", pid=77)  # not running any more
    await crashed.join()
    advance(2.0, vault)
    restarted = member(store, vault, "k0", problems, pid=2)
    await restarted.join()
    assert vault.sleepers == 0 and not restarted.standing_down and problems == []
    assert share(restarted) == set(CREDENTIALS)


async def test_a_restart_after_a_crash_takes_its_predecessors_place_without_a_report() -> None:
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    problems: list[tuple[str, str]] = []
    crashed = member(store, vault, "k0")
    await crashed.join()
    advance(2.0, vault)
    restarted = member(store, vault, "k0", problems)
    await restarted.join()  # at once: no wait before the first runs
    assert vault.sleepers == 0
    assert not restarted.standing_down and problems == []
    assert share(restarted) == set(CREDENTIALS)
    for _ in range(3):  # the predecessor never beats again: never a namesake
        advance(restarted.interval, vault)
        await restarted.beat()
    assert problems == [] and not restarted.standing_down


async def test_a_heartbeat_that_cannot_be_written_keeps_the_view_and_is_reported() -> None:
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    problems: list[tuple[str, str]] = []
    a, b = member(store, vault, "k0"), member(store, vault, "k1", problems)
    await a.join()
    await b.join()
    await a.beat()
    b_share = share(b)
    elapsed = 0.0
    while elapsed < TAKEOVER + b.interval:
        advance(b.interval, vault)
        elapsed += b.interval
        store.fail_next(VaultUnavailable("vault is sealed"))
        assert await b.beat() is False
        await a.beat()
    assert share(b) == b_share, "b keeps running its share"
    assert b_share <= share(a), "and a took it over: no credential without an owner"
    assert [kind for kind, _ in problems] == ["beat_failed"]  # once, not at every beat
    assert "k1" in problems[0][1]


async def test_a_malformed_entry_is_left_out_and_dropped_by_the_next_beat() -> None:
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    a = member(store, vault, "k0")
    await a.join()
    path = members_path("keyturn/state")
    entry = await store.read(path)
    assert entry is not None
    await store.write(path, {**entry.data, "broken": "{not json"}, cas=entry.version)
    advance(a.interval, vault)
    await a.beat()
    assert a.live == ("k0",)
    entry = await store.read(path)
    assert entry is not None and set(entry.data) == {"k0"}


class RacedStore(FakeVaultStore):
    """Another instance's beat lands between our read of the members record and our write,
    `races` times."""

    races = 0

    async def write(
        self,
        path: str,
        data: Mapping[str, str | Secret],
        *,
        cas: int | None,
        custom_metadata: Mapping[str, str] | None = None,
    ) -> int:
        if self.races and path == members_path("keyturn/state"):
            self.races -= 1
            current = await self.read(path)
            self.external_write(path, dict(current.data) if current else {})
        return await super().write(path, data, cas=cas, custom_metadata=custom_metadata)


@pytest.mark.parametrize("races", [1, 3])  # the second attempt wins; every attempt loses
async def test_a_beat_that_loses_a_race_still_tells_that_the_view_moved(races: int) -> None:
    """The read shows another instance gone, then the check-and-set loses: the beat must still
    say the share changed, or the scheduler would keep planning the old share (found by the
    benchmark: two instances planned 351 credentials each for minutes)."""
    vault = FakeClock()
    store = RacedStore(clock=vault)
    a, _ = await pair(store, vault)
    advance(TAKEOVER, vault)  # b silent since
    store.races = races
    assert await a.beat() is True
    assert a.live == ("k0",) and share(a) == set(CREDENTIALS)
    assert await a.beat() is False  # told once


# -- the takeover the tokens need --------------------------------------------------------------

DEFAULT = RefreshPolicy()
T0 = 1_800_000_000.0


def test_the_takeover_needed_is_a_third_of_the_least_slack_and_at_least_the_minimum() -> None:
    """The slack of a token is what is left after its latest planned refresh: for 30 s with
    the default policy (margin 60 s) the midpoint, 15 s, so 5 s; for 10 s tokens 1.7 s, raised
    to the minimum; for one-hour tokens the latest refresh is at 0.76 of the hour (864 s left);
    a smaller `at` leaves more."""
    assert takeover_needed([]) is None
    assert takeover_needed([(T0, T0 + 30, DEFAULT)]) == pytest.approx(5.0)
    assert takeover_needed([(T0, T0 + 10, DEFAULT)]) == MIN_TAKEOVER == 3.0
    assert takeover_needed([(T0, T0 + 3600, DEFAULT)]) == pytest.approx(288.0)
    early = RefreshPolicy(at=0.3, jitter=0.1, margin=2.0)
    assert takeover_needed([(T0, T0 + 30, early)]) == pytest.approx(6.0)  # 18 s left
    mixed = [(T0, T0 + 3600, DEFAULT), (T0 + 7, T0 + 37, DEFAULT), (T0, T0 + 60, early)]
    assert takeover_needed(mixed) == pytest.approx(5.0)


async def beat_all(*members: Membership) -> None:
    for m in members:
        await m.beat()


async def test_every_instance_follows_the_smallest_need_of_the_live_instances() -> None:
    """k0's tokens need 6 s, k1's 12 s, k2 has none: after one beat each, all three beat to
    6 s (a third of it apart), each advertising its takeover and its own need. When k0 dies,
    the survivors count it gone 6 s after its last beat and follow k1's 12 s from then on."""
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    a, b, c = (member(store, vault, f"k{i}") for i in range(3))
    for m in (a, b, c):
        await m.join()
    assert {m.takeover for m in (a, b, c)} == {TAKEOVER}
    a.need(6.0)
    b.need(12.0)
    await beat_all(a, b, c)
    await beat_all(a, b, c)  # each has read the others' latest entries
    assert [m.takeover for m in (a, b, c)] == [6.0, 6.0, 6.0]
    assert [m.interval for m in (a, b, c)] == [2.0, 2.0, 2.0]
    written = read_members(await store.read(members_path("keyturn/state")), "members")
    assert {name: (e.takeover, e.needs) for name, e in written.items()} == {
        "k0": (6.0, 6.0),
        "k1": (6.0, 12.0),
        "k2": (6.0, None),
    }
    # k0 dies; k1 and k2 beat every 2 s.
    for _ in range(2):
        advance(2.0, vault)
        await beat_all(b, c)
        assert b.live == c.live == ("k0", "k1", "k2")
    advance(2.0, vault)
    await beat_all(b, c)
    assert b.live == c.live == ("k1", "k2")
    assert b.takeover == c.takeover == 12.0
    assert b.interval == pytest.approx(4.0)


async def test_a_member_is_judged_by_the_takeover_it_advertises() -> None:
    """k1's tokens come to need 6 s while k0 still beats to 30 s (every 10 s): k1 does not
    count k0 gone after 6 s of k0's silence, for k0 said it beats every 10 s. k0's next beat
    follows k1's need; once k0 dies, k1 counts it gone 6 s after that last beat, not 30."""
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    a, b = await pair(store, vault)
    b.need(6.0)
    await b.beat()
    assert b.takeover == 6.0 and a.takeover == TAKEOVER
    elapsed = 0.0
    while elapsed + b.interval < a.interval:
        advance(b.interval, vault)
        elapsed += b.interval
        await b.beat()
        assert b.live == ("k0", "k1"), f"k0 judged gone after {elapsed:.1f}s"
    advance(a.interval - elapsed, vault)
    await a.beat()  # its last: it reads k1's need and advertises 6 s
    await b.beat()  # (due too: 10 s is a multiple of its 2 s)
    assert a.takeover == 6.0
    advance(5.0, vault)
    await b.beat()
    assert b.live == ("k0", "k1")
    advance(1.0, vault)
    await b.beat()
    assert b.live == ("k1",)


async def test_an_entry_of_an_older_keyturn_parses_and_is_judged_by_takeover_after() -> None:
    """An entry without `takeover` and `needs` (written by a keyturn before them) still reads,
    and is gone once silent for this instance's configured takeover_after, whatever takeover
    this instance beats to."""
    old = json.dumps(
        {"session": "s", "host": "h", "address": None, "pid": 9, "started": T0, "beat": 4}
        | {"beat_at": T0, "skew": None}
    )
    parsed = Member.from_json("old", old, "members")
    assert (parsed.takeover, parsed.needs, parsed.beat) == (None, None, 4)
    vault = FakeClock(start=T0)
    store = FakeVaultStore(clock=vault)
    store.external_write(members_path("keyturn/state"), {"old": old})
    a = member(store, vault, "k0")
    a.need(6.0)
    await a.join()
    assert a.takeover == 6.0 and a.live == ("k0", "old")
    while vault.time() + a.interval < T0 + TAKEOVER:
        advance(a.interval, vault)
        await a.beat()
        assert a.live == ("k0", "old"), f"gone after {vault.time() - T0:.1f}s"
    advance(T0 + TAKEOVER - vault.time(), vault)
    await a.beat()
    assert a.live == ("k0",)
    # A value that is not a positive number of seconds counts as none.
    odd = json.loads(old) | {"takeover": "soon", "needs": -1}
    assert Member.from_json("odd", json.dumps(odd), "members").takeover is None


async def test_a_lone_instance_whose_heartbeat_fails_logs_it_and_reports_nothing() -> None:
    """Alone, no other instance would take its share: a failing beat (Vault sealed) is logged
    at every beat, never reported as an instance_membership problem."""
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    problems: list[tuple[str, str]] = []
    alone = member(store, vault, "k0", problems)
    await alone.join()
    with capture_logs() as logs:
        for _ in range(2 * round(TAKEOVER / alone.interval)):
            advance(alone.interval, vault)
            store.fail_next(VaultUnavailable("vault is sealed"))
            await alone.beat()
    assert problems == []
    failed = [entry for entry in logs if entry["event"] == "members.beat_failed"]
    assert len(failed) == 2 * round(TAKEOVER / alone.interval)
    assert all(entry["log_level"] == "warning" for entry in failed)


async def test_a_failing_heartbeat_is_reported_when_the_others_count_it_gone() -> None:
    """With another live instance, the report comes once this one has been silent for the
    takeover it advertised (6 s here, its tokens' need), when the other takes its share."""
    vault = FakeClock()
    store = FakeVaultStore(clock=vault)
    problems: list[tuple[str, str]] = []
    a, b = member(store, vault, "k0"), member(store, vault, "k1", problems)
    await a.join()
    b.need(6.0)
    await b.join()
    await a.beat()
    assert b.takeover == 6.0
    for _ in range(2):
        advance(b.interval, vault)
        store.fail_next(VaultUnavailable("vault is sealed"))
        await b.beat()
    assert problems == []  # silent for 4 s: not yet gone
    advance(b.interval, vault)
    store.fail_next(VaultUnavailable("vault is sealed"))
    await b.beat()
    assert [kind for kind, _ in problems] == ["beat_failed"]
    assert "k1" in problems[0][1] and "for 6s" in problems[0][1]


# -- the daemon's side: the need of its share --------------------------------------------------

SHARE_CONFIG = VAULT + """
[[providers]]
name = "acme"
base_url = "https://acme.example.com"

[[rotators]]
name = "by-hand"
type = "manual"

[[credentials]]
name = "short"
provider = "acme"
kind = "oauth_client"
client_id = "vault:secret/keyturn/inputs/short#client_id"
client_secret = "vault:secret/keyturn/inputs/short#client_secret"
publish_to = "apps/short/acme"

[[credentials]]
name = "early"
provider = "acme"
kind = "oauth_client"
client_id = "vault:secret/keyturn/inputs/early#client_id"
client_secret = "vault:secret/keyturn/inputs/early#client_secret"
publish_to = "apps/early/acme"
refresh = { at = 0.3, jitter = 0.1, margin = "2s" }

[[credentials]]
name = "key"
provider = "acme"
kind = "api_key"
publish_to = "apps/key/acme"
probe = "/v1/users"
rotation = { max_age = "30d", rotator = "by-hand" }
"""


def view(name: str, kind: str, token: TokenRecord | None) -> JobView:
    outcome = None if token is None else Outcome("refreshed", T0, CredentialState(token=token))
    return JobView(name, kind, None, outcome, running=False)


def keeper(members: Membership, views: list[JobView]) -> tuple[ShareKeeper, list[int]]:
    """A ShareKeeper over stand-ins: the configuration above, a scheduler whose share holds
    `views`, metrics that keep what they were told."""
    config = parse_config(SHARE_CONFIG, "keyturn.toml", {"VAULT_TOKEN": "unused"})
    told: list[int] = []
    scheduler = SimpleNamespace(
        statuses=lambda: views, owned=frozenset(v.name for v in views), reassign=None
    )
    metrics = SimpleNamespace(membership=lambda live, owned: told.append(live), forget=None)
    runtime = SimpleNamespace(config=config)
    return ShareKeeper(members, runtime, scheduler, metrics), told  # type: ignore[arg-type]


async def test_the_share_keeper_derives_the_need_from_its_shares_tokens() -> None:
    """Each oauth_client token it knows counts with its own credential's refresh policy; an
    API key (its expires_at is its rotation date) and a credential not yet run do not. The
    need goes to the membership before each beat. Until a token of its share is known, it
    beats every second (to advertise the need soon after its first runs)."""
    vault = FakeClock(start=T0)
    store = FakeVaultStore(clock=vault)
    alone = member(store, vault, "k0")
    await alone.join()
    thirty = TokenRecord(issued_at=T0, expires_at=T0 + 30)
    early = TokenRecord(issued_at=T0, expires_at=T0 + 12)  # 0.4 of 12 s: 7.2 s left, 2.4 s
    key = TokenRecord(issued_at=T0, expires_at=T0 + 6)  # a key due for rotation in 6 s
    none_yet, _ = keeper(alone, [view("short", "oauth_client", None), view("key", "api_key", key)])
    assert none_yet.interval() == 1.0  # before any beat: its tokens are unknown
    assert none_yet.need() is None
    assert none_yet.waiting_for_tokens and none_yet.interval() == 1.0  # a first run on its way
    keys_only, _ = keeper(alone, [view("key", "api_key", key)])
    assert keys_only.need() is None
    assert not keys_only.waiting_for_tokens and keys_only.interval() == TAKEOVER / 3
    only_short, told = keeper(
        alone, [view("short", "oauth_client", thirty), view("key", "api_key", key)]
    )
    assert only_short.need() == pytest.approx(5.0)
    both, _ = keeper(
        alone, [view("short", "oauth_client", thirty), view("early", "oauth_client", early)]
    )
    assert both.need() == MIN_TAKEOVER  # 2.4 s, raised to the least takeover
    await only_short.beat()
    assert alone.takeover == pytest.approx(5.0) and only_short.interval() == pytest.approx(5 / 3)
    entry = read_members(await store.read(members_path("keyturn/state")), "members")["k0"]
    assert (entry.takeover, entry.needs) == (pytest.approx(5.0), pytest.approx(5.0))
    assert told == [1]
