"""`keyturn status`: rows from keyturn's private state (FakeVaultStore, FakeClock), the table's
columns and relative times, the JSON fields, NAME selection and the exit code; a rotation
waiting for consumers, and the consumers column from the daemon."""

from __future__ import annotations

import json

import pytest

from keyturn.clock import FakeClock, rfc3339
from keyturn.commands.status import (
    _INSTANCE_COLUMNS,
    EXIT_ERROR,
    EXIT_NOT_OK,
    EXIT_OK,
    StatusRow,
    exit_code,
    instance_rows,
    relative,
    render_columns,
    render_json,
    render_table,
    select,
    span,
    status_rows,
)
from keyturn.config import Config, parse_config
from keyturn.layout import state_path
from keyturn.members import Membership, members_path
from keyturn.state import CredentialState, LeaseRecord, RotationJournal, TokenRecord
from keyturn.testing.vault import FakeVaultStore
from keyturn_devkit.harness.configs import VAULT

DAY = 86400.0

CONFIG = VAULT + """
[[providers]]
name = "acme"
base_url = "https://acme.example.com"

[[rotators]]
name = "by-hand"
type = "manual"

[[credentials]]
name = "reporting"
provider = "acme"
kind = "oauth_client"
client_id = "vault:secret/keyturn/inputs/reporting#client_id"
client_secret = "vault:secret/keyturn/inputs/reporting#client_secret"
publish_to = "apps/reporting/acme"

[[credentials]]
name = "billing"
provider = "acme"
kind = "api_key"
publish_to = "apps/billing/acme"
probe = "/v1/users"
rotation = { max_age = "30d", grace = "1d", rotator = "by-hand" }

[[credentials]]
name = "ledger"
provider = "acme"
kind = "oauth_client"
client_id = "vault:secret/keyturn/inputs/ledger#client_id"
client_secret = "vault:secret/keyturn/inputs/ledger#client_secret"
publish_to = "apps/ledger/acme"
"""

# The fields `--json` has always had; a renamed or dropped one breaks scripts that read them.
JSON_FIELDS = {
    "credential",
    "kind",
    "provider",
    "phase",
    "expires_at",
    "next_refresh",
    "last_success",
    "last_error",
    "consecutive_failures",
    "refreshing",
    "owner",
    "published_version",
    "key_id",
    "rotation_phase",
    "rotates_at",
    "rotation_error",
    # with [usage]: whom a rotation waits for (from the journal), and how many read it
    "waiting_for_consumers",
    "waiting_reason",
    "consumers",
    # false while the published token went out without its probe's answer
    "verified",
    # what the kind adds (a signing key: the key ids its server holds), else null
    "details",
    # when the refresh token held stops working at the latest (a person consents again)
    "refresh_token_ends_at",
}


@pytest.fixture
def config() -> Config:
    return parse_config(CONFIG, "keyturn.toml", {"VAULT_TOKEN": "unused"})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> FakeVaultStore:
    return FakeVaultStore(clock=clock)


def save(store: FakeVaultStore, config: Config, name: str, state: CredentialState) -> None:
    data = {k: v for k, v in state.to_data().items() if isinstance(v, str)}
    assert len(data) == len(state.to_data())  # no Secret in these records
    store.external_write(state_path(config.keyturn.state_prefix, name), data)


def failing(consecutive_failures: int) -> CredentialState:
    return CredentialState(
        token=TokenRecord(phase="failing", consecutive_failures=consecutive_failures)
    )


def healthy(store: FakeVaultStore, config: Config, now: float) -> None:
    """reporting: a token valid 4 more minutes; billing: a key due for rotation in 29 days."""
    save(
        store,
        config,
        "reporting",
        CredentialState(
            token=TokenRecord(
                phase="ok",
                issued_at=now - 600,
                expires_at=now + 240,
                next_due=now + 90,
                last_success=now - 180,
                published_version=7,
                writer="host-a",
            )
        ),
    )
    save(
        store,
        config,
        "billing",
        CredentialState(
            token=TokenRecord(
                phase="ok",
                expires_at=now + 29 * DAY,
                last_success=now - DAY,
                next_due=now + 3600,
                published_version=2,
                writer="host-a",
            ),
            rotation=RotationJournal(key_created_at=now - DAY, key_id="key_42"),
        ),
    )
    save(
        store,
        config,
        "ledger",
        CredentialState(
            token=TokenRecord(phase="ok", expires_at=now + 3000, last_success=now - 600)
        ),
    )


async def rows_of(config: Config, store: FakeVaultStore, clock: FakeClock) -> list[StatusRow]:
    return await status_rows(config, store, clock)


def table_rows(text: str) -> dict[str, str]:
    """The table's lines by credential name (the header under "CREDENTIAL")."""
    return {line.split()[0]: line for line in text.splitlines()}


# -- relative times -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "0s"),
        (42.9, "42s"),
        (119, "119s"),
        (120, "2m"),
        (4 * 60 + 59, "4m"),
        (2 * 3600 - 1, "119m"),
        (2 * 3600, "2h"),
        (2 * DAY - 1, "47h"),
        (2 * DAY, "2d"),
        (29 * DAY + 5, "29d"),
    ],
)
def test_span_rounds_down_in_the_largest_fitting_unit(seconds: float, expected: str) -> None:
    assert span(seconds) == expected


def test_relative_says_in_ago_or_now() -> None:
    assert relative(1000 + 240, 1000) == "in 4m"
    assert relative(1000 - 180, 1000) == "3m ago"
    assert relative(1000.4, 1000) == "now"
    assert relative(999.6, 1000) == "now"


# -- the table ----------------------------------------------------------------------------------


async def test_table_has_every_documented_column(
    config: Config, store: FakeVaultStore, clock: FakeClock
) -> None:
    healthy(store, config, clock.time())
    header = render_table(await rows_of(config, store, clock), clock.time()).splitlines()[0]
    for column in (
        "CREDENTIAL",
        "KIND",
        "PROVIDER",
        "PHASE",
        "EXPIRY",
        "NEXT RUN",
        "LAST SUCCESS",
        "FAILURES",
        "REFRESHING",
        "VERSION",
        "ROTATION",
        "ROTATES AT",
        "OWNER",
        "CONSUMERS",
        "LAST ERROR",
    ):
        assert column in header, column
    # The consumers column comes last but for the error: every other column stays in place.
    assert header.index("OWNER") < header.index("CONSUMERS") < header.index("LAST ERROR")


async def test_times_are_relative_and_absolute(
    config: Config, store: FakeVaultStore, clock: FakeClock
) -> None:
    now = clock.time()
    healthy(store, config, now)
    line = table_rows(render_table(await rows_of(config, store, clock), now))["reporting"]
    assert f"expires in 4m ({rfc3339(now + 240)})" in line
    assert f"in 90s ({rfc3339(now + 90)})" in line  # next run
    assert f"3m ago ({rfc3339(now - 180)})" in line  # last success
    assert " acme " in line and " oauth_client " in line
    assert " 7 " in line  # published version
    assert " host-a " in line


async def test_an_api_key_rotates_it_does_not_expire(
    config: Config, store: FakeVaultStore, clock: FakeClock
) -> None:
    now = clock.time()
    healthy(store, config, now)
    line = table_rows(render_table(await rows_of(config, store, clock), now))["billing"]
    assert f"rotates in 29d ({rfc3339(now + 29 * DAY)})" in line
    assert "expire" not in line
    assert " idle " in line  # the rotation's phase

    clock.advance(30 * DAY)  # past its rotation date: overdue, and still the working key
    rows = await rows_of(config, store, clock)
    line = table_rows(render_table(rows, clock.time()))["billing"]
    assert "rotation due 24h ago" in line
    assert "expire" not in line
    assert {row.credential: row.phase for row in rows}["billing"] == "ok"


async def test_an_access_token_past_its_expiry_is_expired(
    config: Config, store: FakeVaultStore, clock: FakeClock
) -> None:
    healthy(store, config, clock.time())
    clock.advance(240 + 180)
    rows = await rows_of(config, store, clock)
    line = table_rows(render_table(rows, clock.time()))["reporting"]
    assert "expired 3m ago" in line
    assert {row.credential: row.phase for row in rows}["reporting"] == "expired"
    assert exit_code(rows) == EXIT_NOT_OK


async def test_a_failing_credential_shows_its_failures_lease_and_error(
    config: Config, store: FakeVaultStore, clock: FakeClock
) -> None:
    now = clock.time()
    healthy(store, config, now)
    save(
        store,
        config,
        "reporting",
        CredentialState(
            token=TokenRecord(
                phase="failing",
                expires_at=now + 60,
                consecutive_failures=4,
                last_error="reporting: HTTP 503, retry after 5s",
            ),
            lease=LeaseRecord("host-b", now + 20),
        ),
    )
    line = table_rows(render_table(await rows_of(config, store, clock), now))["reporting"]
    assert " failing " in line
    assert " 4 " in line
    assert " yes " in line  # refreshing: host-b holds the lease
    assert " host-b " in line
    assert line.endswith("reporting: HTTP 503, retry after 5s")


async def test_control_and_bidi_characters_are_escaped(
    config: Config, store: FakeVaultStore, clock: FakeClock
) -> None:
    healthy(store, config, clock.time())
    save(
        store,
        config,
        "ledger",
        CredentialState(
            token=TokenRecord(phase="failing", last_error="ledger: bad\x1b[2J\u202eevil\nnext")
        ),
    )
    text = render_table(await rows_of(config, store, clock), clock.time())
    assert len(text.splitlines()) == 4  # a header and three rows, the error on its own row
    assert "\x1b" not in text and "\u202e" not in text
    assert "bad\\u001b[2J\\u202eevil\\u000anext" in table_rows(text)["ledger"]


async def test_a_credential_never_run_is_pending_with_dashes(
    config: Config, store: FakeVaultStore, clock: FakeClock
) -> None:
    rows = await rows_of(config, store, clock)
    line = table_rows(render_table(rows, clock.time()))["reporting"]
    assert line.split()[3] == "pending"
    assert " no " in line  # not refreshing
    assert [row.phase for row in rows] == ["pending"] * 3
    assert exit_code(rows) == EXIT_NOT_OK


# -- JSON -------------------------------------------------------------------------------------


async def test_json_keeps_its_fields_with_rfc3339_times(
    config: Config, store: FakeVaultStore, clock: FakeClock
) -> None:
    now = clock.time()
    healthy(store, config, now)
    lines = [
        json.loads(line) for line in render_json(await rows_of(config, store, clock)).split("\n")
    ]
    assert [set(line) for line in lines] == [JSON_FIELDS] * 3
    reporting, billing, ledger = lines
    assert reporting["expires_at"] == rfc3339(now + 240)
    assert reporting["last_success"] == rfc3339(now - 180)
    assert reporting["rotates_at"] is None and reporting["rotation_phase"] is None
    assert reporting["refreshing"] is False and reporting["published_version"] == 7
    assert billing["rotates_at"] == rfc3339(now + 29 * DAY)  # key_created_at + max_age
    assert billing["key_id"] == "key_42" and billing["rotation_phase"] == "idle"
    assert ledger["next_refresh"] is None


# -- NAME… and the exit code --------------------------------------------------------------------


def test_names_select_in_the_order_given_once_each(config: Config) -> None:
    chosen, unknown = select(config, ["ledger", "reporting", "ledger"])
    assert [c.name for c in chosen] == ["ledger", "reporting"]
    assert unknown == []
    assert [c.name for c in select(config, [])[0]] == ["reporting", "billing", "ledger"]
    assert select(config, ["reporting", "nope", "typo"])[1] == ["nope", "typo"]


async def test_rows_of_the_named_credentials_only(
    config: Config, store: FakeVaultStore, clock: FakeClock
) -> None:
    healthy(store, config, clock.time())
    chosen, _ = select(config, ["billing"])
    rows = await status_rows(config, store, clock, chosen)
    assert [row.credential for row in rows] == ["billing"]
    assert exit_code(rows) == EXIT_OK
    # Another credential failing does not change the exit code of a status that skips it.
    save(store, config, "ledger", failing(consecutive_failures=1))
    assert exit_code(await status_rows(config, store, clock, chosen)) == EXIT_OK
    assert exit_code(await rows_of(config, store, clock)) == EXIT_NOT_OK


async def test_exit_codes(config: Config, store: FakeVaultStore, clock: FakeClock) -> None:
    healthy(store, config, clock.time())
    assert exit_code(await rows_of(config, store, clock)) == EXIT_OK == 0
    save(store, config, "ledger", failing(consecutive_failures=2))
    assert exit_code(await rows_of(config, store, clock)) == EXIT_NOT_OK == 3
    # A record that cannot be read: status could not be read, whatever the other rows say.
    store.external_write(
        state_path(config.keyturn.state_prefix, "billing"), {"phase": "ok", "expires_at": "soon"}
    )
    rows = await rows_of(config, store, clock)
    billing = {row.credential: row for row in rows}["billing"]
    assert billing.phase == "unknown"
    assert "expires_at" in (billing.last_error or "")
    assert exit_code(rows) == EXIT_ERROR == 1


# -- with [usage]: waiting for consumers, and the consumers column ----------------------------


async def test_a_rotation_waiting_for_consumers_names_them(
    config: Config, store: FakeVaultStore, clock: FakeClock
) -> None:
    now = clock.time()
    healthy(store, config, now)
    waiting = RotationJournal(
        key_created_at=now - 2 * DAY,
        key_id="key_43",
        phase="retiring",
        previous_key_id="key_42",
        previous_retire_at=now - DAY,
        previous_version=2,
        waiting_consumers=("approle/batch", "token-laptop"),
    )
    save(store, config, "billing", CredentialState(token=TokenRecord(phase="ok"), rotation=waiting))
    rows = await rows_of(config, store, clock)
    line = table_rows(render_table(rows, now))["billing"]
    assert " retiring (waiting for consumers: approle/batch, token-laptop) " in line
    billing = json.loads(render_json(rows).split("\n")[1])
    assert billing["waiting_for_consumers"] == ["approle/batch", "token-laptop"]
    assert billing["waiting_reason"] is None

    unsure = "the file audit source cannot be read (Permission denied)"
    save(
        store,
        config,
        "billing",
        CredentialState(
            token=TokenRecord(phase="ok"),
            rotation=RotationJournal(phase="retiring", waiting_consumers=(), waiting_reason=unsure),
        ),
    )
    line = table_rows(render_table(await rows_of(config, store, clock), now))["billing"]
    assert f" retiring (waiting for consumers: unknown; not ruled out: {unsure}) " in line


async def test_the_consumers_column_shows_the_daemons_counts_or_a_dash(
    config: Config, store: FakeVaultStore, clock: FakeClock
) -> None:
    now = clock.time()
    healthy(store, config, now)
    rows = await status_rows(config, store, clock, consumers={"reporting": 3, "billing": 0})
    lines = table_rows(render_table(rows, now))
    header = render_table(rows, now).splitlines()[0]
    column = header.index("CONSUMERS")
    cells = {name: line[column:].split()[0] for name, line in lines.items() if name != "CREDENTIAL"}
    assert cells == {"reporting": "3", "billing": "0", "ledger": "-"}
    assert [row.consumers for row in rows] == [3, 0, None]
    unknown = await rows_of(config, store, clock)  # the daemon could not be reached
    assert all(row.consumers is None for row in unknown)
    assert [json.loads(line)["consumers"] for line in render_json(unknown).split("\n")] == [
        None
    ] * 3


# -- --instances ------------------------------------------------------------------------------


async def test_instances_lists_live_and_gone_members_with_their_shares() -> None:
    """Rows come from the members record the daemons write (`Membership`), judged by the age
    of each last beat; the shares of the live ones add up to every credential."""
    clock = FakeClock()
    store = FakeVaultStore(clock=clock)
    config = parse_config(CONFIG, "keyturn.toml", {"VAULT_TOKEN": "unused"})

    def member(instance: str) -> Membership:
        return Membership(
            store,
            state_prefix=config.keyturn.state_prefix,
            instance_id=instance,
            takeover_after=config.keyturn.takeover_after,
            clock=clock,
            host=f"host-{instance}",
            address=f"http://10.0.0.{instance[-1]}:9464",
            pid=100 + int(instance[-1]),
        )

    gone, alive = member("k1"), member("k2")
    await gone.join()
    clock.advance(60.0)  # k1 stopped beating a minute ago
    await alive.join()
    rows = await instance_rows(config, store, clock)
    assert [(row.instance, row.live) for row in rows] == [("k2", True), ("k1", False)]
    assert rows[0].credentials == len(config.credentials) and rows[1].credentials == 0
    assert rows[0].host == "host-k2" and rows[0].pid == 102
    table = render_columns(rows, clock.time(), _INSTANCE_COLUMNS)
    header, first, second = table.splitlines()
    assert header.split()[:3] == ["INSTANCE", "STATE", "HOST"]
    assert first.split()[:2] == ["k2", "live"] and second.split()[:2] == ["k1", "gone"]
    assert "60s ago" in second
    assert json.loads(json.dumps(rows[1].as_json()))["last_beat"] == rfc3339(clock.time() - 60.0)


async def test_instances_are_judged_by_the_takeover_each_advertises_and_show_it() -> None:
    """An instance whose tokens need a 6 s takeover beats to it and says so: it is gone once
    its last beat is 6 s old, although takeover_after is 30 s; an entry of an older keyturn
    (no takeover) is judged by takeover_after and shows `-`."""
    clock = FakeClock()
    store = FakeVaultStore(clock=clock)
    config = parse_config(CONFIG, "keyturn.toml", {"VAULT_TOKEN": "unused"})
    quick = Membership(
        store,
        state_prefix=config.keyturn.state_prefix,
        instance_id="k1",
        takeover_after=config.keyturn.takeover_after,
        clock=clock,
        host="host-k1",
    )
    quick.need(6.0)
    await quick.join()
    path = members_path(config.keyturn.state_prefix)
    entry = await store.read(path)
    assert entry is not None
    old = {"session": "s", "host": "host-k0", "address": None, "pid": 7, "started": 0}
    old |= {"beat": 1, "beat_at": clock.time()}
    store.external_write(path, {**entry.data, "k0": json.dumps(old)})
    clock.advance(5.0)
    rows = await instance_rows(config, store, clock)
    assert [(row.instance, row.live, row.takeover) for row in rows] == [
        ("k0", True, None),
        ("k1", True, 6.0),
    ]
    table = render_columns(rows, clock.time(), _INSTANCE_COLUMNS)
    header, *lines = table.splitlines()
    column = header.index("TAKEOVER")
    assert [line[column:].split()[0] for line in lines] == ["-", "6s"]
    assert [row.as_json()["takeover"] for row in rows] == [None, 6.0]
    clock.advance(1.0)  # k1 silent for 6 s: gone; k0 (6 s too) is judged by the 30 s
    rows = await instance_rows(config, store, clock)
    assert [(row.instance, row.live) for row in rows] == [("k0", True), ("k1", False)]
