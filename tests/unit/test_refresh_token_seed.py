"""A starting refresh token: the `refresh_token` input seeds keyturn's private record once, is
read again only after the provider refused the held token, and is used again only if it has
changed since (told by a salted fingerprint, never the value). And the hand-over of
`keyturn import-refresh-token` (`TokenRefresh.accept_refresh_token`) on the same fakes:
FakeVaultStore, FakeOAuthServer (MockTransport), FakeClock."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from keyturn.clock import FakeClock
from keyturn.config import Config, CredentialConfig, ProviderConfig, parse_config
from keyturn.errors import ConfigError, SecretReferenceError, VaultDataError, VaultUnavailable
from keyturn.events import Suspicious
from keyturn.jobs.job import CredentialJob, JobDeps, Outcome
from keyturn.kinds import build_job
from keyturn.kinds.oauth_client.refresh import RefreshTokenRefused, TokenRefresh
from keyturn.policy import BackoffPolicy, RefreshPolicy
from keyturn.providers.client import ProviderClient
from keyturn.references import SecretRef
from keyturn.secret import Secret
from keyturn.state import CredentialState, RefreshTokenRecord, fingerprint, fingerprint_matches
from keyturn.testing.oauth import FakeOAuthServer
from keyturn.testing.observer import RecordingObserver
from keyturn.testing.vault import FakeVaultStore

STATE = "keyturn/state/reporting"
PUBLISHED = "apps/reporting/acme"
CONSENT = "rt-consent-first-7f3a9c"  # what a person got from the provider's consent flow
CONSENT_2 = "rt-consent-second-b61e04"


@dataclass
class Input:
    """The `refresh_token` input at its source: a value, or an error when it cannot be read;
    `reads` counts how often keyturn read it."""

    value: str | None = CONSENT
    error: Exception | None = None
    reads: int = 0

    async def __call__(self) -> Secret:
        self.reads += 1
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return Secret(self.value)


@dataclass
class Inputs:
    """The credential's inputs: the client secret, and the `refresh_token` input if set."""

    client_secret: str
    seed: Input | None

    async def client(self, *, fresh: bool = False) -> tuple[str, Secret]:
        return "cid", Secret(self.client_secret)

    async def refresh_token(self) -> Secret | None:
        return None if self.seed is None else await self.seed()

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        return None


@dataclass
class World:
    clock: FakeClock = field(default_factory=FakeClock)
    server: FakeOAuthServer = field(default_factory=FakeOAuthServer)
    observer: RecordingObserver = field(default_factory=RecordingObserver)
    seed: Input = field(default_factory=Input)
    store: FakeVaultStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = FakeVaultStore(clock=self.clock)
        self.server.live_refresh.update({CONSENT, CONSENT_2})  # issued by the provider earlier

    def job(self, name: str = "reporting", *, seeded: bool = True) -> CredentialJob:
        client = ProviderClient(
            ProviderConfig(name="acme", base_url="https://acme.test", revoke_path="/oauth/revoke"),
            clock=self.clock,
            transport=self.server.transport(),
        )
        credential = CredentialConfig(
            name=name,
            provider="acme",
            client_id=SecretRef.inline("cid"),
            client_secret=SecretRef.env("CLIENT_SECRET"),
            publish_to=f"apps/{name}/acme",
            probe="/v1/projects",
            refresh=RefreshPolicy(at=0.66, jitter=0.1, margin=60),
            backoff=BackoffPolicy(initial=1, maximum=300),
            refresh_token=SecretRef.env("REFRESH_TOKEN") if seeded else None,
        )
        deps = JobDeps(
            store=self.store,
            observer=self.observer,
            clock=self.clock,
            rng=random.Random(7),
            instance_id="i-1",
            state_prefix="keyturn/state",
        )
        inputs = Inputs(self.server.client_secret, self.seed if seeded else None)
        return build_job(credential, client, None, inputs, deps)

    async def state(self, name: str = "reporting") -> CredentialState:
        entry = await self.store.read(f"keyturn/state/{name}")
        assert entry is not None
        return CredentialState.from_data(entry.data, name)

    async def record(self) -> dict[str, str]:
        entry = await self.store.read(STATE)
        assert entry is not None
        return dict(entry.data)

    async def refuse_held_token(self) -> None:
        """The provider forgets the token keyturn holds (revoked, expired, reused elsewhere)."""
        held = (await self.state()).refresh.token
        assert held is not None
        self.server.live_refresh.discard(held.reveal())

    async def published_token(self) -> str:
        entry = await self.store.read(PUBLISHED)
        assert entry is not None
        return entry.data["access_token"]


async def due(world: World) -> None:
    """Let the clock run to the job's next refresh."""
    state = await world.state()
    assert state.token.next_due is not None
    world.clock.advance(max(0.0, state.token.next_due - world.clock.time()))


@pytest.fixture
def world() -> World:
    return World()


# ---- seeding --------------------------------------------------------------------------------


async def test_the_input_seeds_the_first_refresh_which_uses_the_refresh_token_grant(
    world: World,
) -> None:
    outcome = await world.job().run()
    assert outcome.action == "refreshed"
    assert world.server.grants == ["refresh_token"]  # no client_credentials grant at all
    assert world.server.used_refresh == [CONSENT]
    state = await world.state()
    assert state.refresh.token == Secret("rt-1-secretvalue")  # rotated: keyturn owns it now
    assert state.refresh.input_fingerprint is not None
    assert fingerprint_matches(state.refresh.input_fingerprint, Secret(CONSENT))
    assert state.refresh.refused_at is None
    assert await world.published_token() == "at-1-secretvalue"
    assert world.seed.reads == 1


async def test_the_seeded_token_is_stored_before_it_is_sent(world: World) -> None:
    world.server.lose_answers = 1  # the provider rotates it, the answer never arrives
    outcome = await world.job().run()
    assert outcome.action == "failed"
    assert world.server.used_refresh == [CONSENT]
    state = await world.state()
    # Stored before use, so a lost answer burns it: it is never presented again.
    assert state.refresh.token is None and state.refresh.burned == Secret(CONSENT)
    assert state.refresh.input_fingerprint is not None
    world.clock.advance(400)
    assert (await world.job().run()).action == "refreshed"
    assert world.server.used_refresh == [CONSENT]  # no reuse, no second seed
    assert world.server.grants[-1] == "client_credentials"
    assert world.seed.reads == 1


async def test_after_seeding_the_input_is_never_read_again(world: World) -> None:
    job = world.job()
    await job.run()
    world.seed.value = CONSENT_2  # changed at its source: keyturn owns the token, not the input
    for _ in range(4):
        await due(world)
        assert (await job.run()).action == "refreshed"
    # a new process (a restart) does not read it either
    await due(world)
    assert (await world.job().run()).action == "refreshed"
    assert world.seed.reads == 1
    assert world.server.grants == ["refresh_token"] * 6
    assert CONSENT_2 not in world.server.used_refresh
    assert len(set(world.server.used_refresh)) == 6  # each refresh token used once


async def test_an_unchanged_input_is_not_used_again_after_invalid_grant(world: World) -> None:
    job = world.job()
    await job.run()
    await world.refuse_held_token()
    await due(world)
    outcome = await job.run()
    assert outcome.action == "refreshed"
    assert world.seed.reads == 2  # read once more, to compare
    # the held token was refused, the unchanged input is not presented: client_credentials
    assert world.server.grants == ["refresh_token", "refresh_token", "client_credentials"]
    assert world.server.used_refresh == [CONSENT, "rt-1-secretvalue"]
    assert [s.detector for s in world.observer.of(Suspicious)] == ["refresh_token_rejected"]
    state = await world.state()
    assert state.refresh.token == Secret("rt-2-secretvalue")  # from client_credentials
    assert state.refresh.refused_at is None  # holding a refresh token again ends it
    # Holding one again, keyturn does not read the input at later refreshes.
    await due(world)
    await job.run()
    assert world.seed.reads == 2


async def test_a_changed_input_is_seeded_and_used_at_once_after_invalid_grant(
    world: World,
) -> None:
    job = world.job()
    await job.run()
    first = (await world.state()).refresh.input_fingerprint
    world.seed.value = CONSENT_2  # a person went through the consent flow again
    await world.refuse_held_token()
    await due(world)
    outcome = await job.run()
    assert outcome.action == "refreshed"
    assert world.server.grants == ["refresh_token"] * 3
    assert world.server.used_refresh == [CONSENT, "rt-1-secretvalue", CONSENT_2]
    state = await world.state()
    assert state.refresh.token == Secret("rt-2-secretvalue")
    fp = state.refresh.input_fingerprint
    assert fp is not None and fp != first
    assert fingerprint_matches(fp, Secret(CONSENT_2))
    assert not fingerprint_matches(fp, Secret(CONSENT))
    assert state.refresh.refused_at is None


async def test_a_refused_changed_input_falls_back_once_and_is_not_retried(world: World) -> None:
    job = world.job()
    await job.run()
    world.seed.value = "rt-never-issued-0000"
    await world.refuse_held_token()
    await due(world)
    assert (await job.run()).action == "refreshed"
    # held token refused, the changed input refused too, then client_credentials: no loop
    assert world.server.grants == [
        "refresh_token",
        "refresh_token",
        "refresh_token",
        "client_credentials",
    ]
    assert [s.detector for s in world.observer.of(Suspicious)] == ["refresh_token_rejected"] * 2
    assert world.seed.reads == 2  # the seed, and once after the refusal: not after its own


async def test_while_refused_without_a_refresh_token_the_input_is_checked_each_run(
    world: World,
) -> None:
    """A provider that issues no refresh token with client_credentials: after a refusal keyturn
    holds none, so each run checks the input, and a new value is picked up when it appears."""
    job = world.job()
    await job.run()
    world.server.issue_refresh = False
    await world.refuse_held_token()
    await due(world)
    assert (await job.run()).action == "refreshed"  # client_credentials, no refresh token
    state = await world.state()
    assert state.refresh.token is None and state.refresh.refused_at is not None
    await due(world)
    await job.run()
    assert world.seed.reads == 3  # the seed, then once per run while refused
    assert world.server.grants[-1] == "client_credentials"
    world.server.issue_refresh = True
    world.seed.value = CONSENT_2
    await due(world)
    await job.run()
    assert world.server.used_refresh[-1] == CONSENT_2
    state = await world.state()
    assert state.refresh.token is not None and state.refresh.refused_at is None
    await due(world)
    await job.run()
    assert world.seed.reads == 4  # holding one again: not read any more


async def test_a_credential_without_the_input_never_reads_it(world: World) -> None:
    outcome = await world.job(seeded=False).run()
    assert outcome.action == "refreshed"
    assert world.server.grants == ["client_credentials"]
    assert world.seed.reads == 0
    assert (await world.state()).refresh.input_fingerprint is None


async def test_a_token_held_before_the_input_appears_is_kept(world: World) -> None:
    """The input seeds a record that holds no refresh token; one keyturn already holds (from an
    import, or a client_credentials grant) is not replaced by it."""
    job = world.job(seeded=False)
    await job.run()
    await due(world)
    assert (await world.job().run()).action == "refreshed"
    assert world.seed.reads == 0
    assert CONSENT not in world.server.used_refresh


# ---- an input that cannot be read ------------------------------------------------------------


async def test_an_unreadable_first_seed_fails_the_credential_with_backoff(world: World) -> None:
    world.seed.error = SecretReferenceError("env:RT: environment variable RT is not set")
    job = world.job()
    outcome = await job.run()
    assert outcome.action == "failed"
    assert str(outcome.error) == (
        "reporting: refresh_token: env:RT: environment variable RT is not set"
    )
    assert world.server.grants == []  # no silent client_credentials instead
    state = await world.state()
    assert state.token.phase == "failing" and state.token.consecutive_failures == 1
    assert state.token.last_error == str(outcome.error)
    assert outcome.next_due > world.clock.time()
    assert await world.store.read(PUBLISHED) is None
    # Another credential in the same process is not affected.
    other = await world.job("billing", seeded=False).run()
    assert other.action == "refreshed"
    # The retry, after the backoff, seeds once the input can be read.
    world.seed.error = None
    world.clock.advance(outcome.next_due - world.clock.time())
    assert (await job.run()).action == "refreshed"
    assert world.server.used_refresh == [CONSENT]


async def test_a_vault_outage_at_seed_time_keeps_its_type(world: World) -> None:
    world.seed.error = VaultUnavailable("vault read: connection refused")
    outcome = await world.job().run()
    assert isinstance(outcome.error, VaultUnavailable)  # retried at once when Vault is back
    assert str(outcome.error) == "reporting: refresh_token: vault read: connection refused"


async def test_an_input_that_is_no_token_is_refused_without_its_value(world: World) -> None:
    world.seed.value = "rt-with-a-newline\nX-Injected: 1"
    outcome = await world.job().run()
    assert outcome.action == "failed"
    assert "reporting: refresh_token:" in str(outcome.error)
    assert "VSCHAR" in str(outcome.error)
    assert "rt-with-a-newline" not in str(outcome.error)
    assert world.server.grants == []


async def test_after_a_refusal_an_unreadable_input_means_client_credentials(
    world: World,
) -> None:
    job = world.job()
    await job.run()
    world.seed.error = SecretReferenceError("env:RT: environment variable RT is not set")
    await world.refuse_held_token()
    await due(world)
    outcome = await job.run()
    assert outcome.action == "refreshed"
    assert world.server.grants[-1] == "client_credentials"


# ---- the fingerprint -------------------------------------------------------------------------


async def test_the_record_never_holds_the_input_value_once_it_is_rotated(world: World) -> None:
    job = world.job()
    await job.run()
    record = await world.record()
    assert all(CONSENT not in value for value in record.values())
    assert CONSENT not in repr(await world.state())
    fp = record["refresh_token_input_fingerprint"]
    assert fp.startswith("hmac-sha256:")


def test_fingerprints_are_salted_and_compare_by_value() -> None:
    a, b = fingerprint(Secret(CONSENT)), fingerprint(Secret(CONSENT))
    assert a != b  # a fresh salt: equal values do not look equal across records
    assert CONSENT not in a
    assert fingerprint_matches(a, Secret(CONSENT)) and fingerprint_matches(b, Secret(CONSENT))
    assert not fingerprint_matches(a, Secret(CONSENT_2))
    assert not fingerprint_matches("sha256:abc", Secret(CONSENT))
    salt = bytes(range(16))
    assert fingerprint(Secret(CONSENT), salt) == fingerprint(Secret(CONSENT), salt)


async def test_a_tampered_fingerprint_is_reported_naming_the_field(world: World) -> None:
    await world.store.write(
        STATE, {"refresh_token_input_fingerprint": "rt-consent-first-7f3a9c"}, cas=0
    )
    outcome = await world.job().run()
    assert isinstance(outcome.error, VaultDataError)
    assert "refresh_token_input_fingerprint" in str(outcome.error)
    assert CONSENT not in str(outcome.error)
    assert world.server.grants == []


def test_the_new_fields_round_trip_through_the_record() -> None:
    fp = fingerprint(Secret(CONSENT))
    state = CredentialState(refresh=RefreshTokenRecord(input_fingerprint=fp, refused_at=12.5))
    again = CredentialState.from_data(state.to_data(), "reporting")
    assert again.refresh.input_fingerprint == fp
    assert again.refresh.refused_at == 12.5
    with pytest.raises(VaultDataError, match="refresh_token_refused_at"):
        CredentialState.from_data({"refresh_token_refused_at": "soon"}, "reporting")


# ---- the hand-over of `keyturn import-refresh-token` -----------------------------------------


async def import_token(world: World, value: str, job: CredentialJob | None = None) -> Outcome:
    """What the command does: accept the token under the lease, then a forced refresh."""
    job = job or world.job(seeded=False)
    task = job.task("refresh")
    assert isinstance(task, TokenRefresh)
    return await job.run(
        force={"refresh"}, prepare=lambda journal: task.accept_refresh_token(journal, Secret(value))
    )


async def test_an_imported_token_is_used_and_the_previous_chain_revoked(world: World) -> None:
    job = world.job(seeded=False)
    await job.run()  # client_credentials: keyturn holds rt-1
    outcome = await import_token(world, CONSENT)
    assert outcome.action == "refreshed"
    assert world.server.grants == ["client_credentials", "refresh_token"]
    assert world.server.used_refresh == [CONSENT]
    assert world.server.revoked == ["rt-1-secretvalue"]  # the chain it held before
    state = await world.state()
    assert state.refresh.token == Secret("rt-2-secretvalue")
    assert state.refresh.burned is None
    assert await world.published_token() == "at-2-secretvalue"


async def test_a_refused_import_leaves_the_record_as_it_was(world: World) -> None:
    job = world.job(seeded=False)
    await job.run()
    before = await world.state()
    outcome = await import_token(world, "rt-typo-not-issued")
    assert outcome.action == "failed"
    assert isinstance(outcome.error, RefreshTokenRefused)
    assert "reporting: refresh_token: the provider refused the imported refresh token" in str(
        outcome.error
    )
    assert "invalid_grant" in str(outcome.error)
    assert "rt-typo-not-issued" not in str(outcome.error)
    state = await world.state()
    assert state.refresh.token == before.refresh.token == Secret("rt-1-secretvalue")
    assert state.refresh.burned is None and state.refresh.in_flight is None
    assert all("rt-typo-not-issued" not in v for v in (await world.record()).values())
    # the credential's own standing is untouched: no failure counted, same schedule
    assert state.token.consecutive_failures == 0 and state.token.phase == "ok"
    assert state.token.next_due == before.token.next_due
    assert world.server.grants[-1] == "refresh_token"  # no fall back to client_credentials
    assert world.observer.of(Suspicious) == []  # an operator's typo is no theft
    assert world.server.revoked == []
    await due(world)
    assert (await job.run()).action == "refreshed"  # the previous chain still works
    assert world.server.used_refresh[-1] == "rt-1-secretvalue"


async def test_a_refused_import_that_cannot_be_put_back_is_never_sent_again(
    world: World,
) -> None:
    job = world.job(seeded=False)
    await job.run()
    answer = world.server.handle

    def vault_fails_after_the_answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/oauth/token":  # the next Vault write (the put-back) fails
            world.store.fail_next(VaultUnavailable("vault write: HTTP 503"))
        return answer(request)

    world.server.handle = vault_fails_after_the_answer  # type: ignore[method-assign]
    outcome = await import_token(world, "rt-typo-not-issued")
    assert isinstance(outcome.error, VaultUnavailable)  # retried as a Vault outage
    assert str(outcome.error).startswith(
        "reporting: refresh_token: the provider refused the imported refresh token"
    )
    assert "never sent again" in str(outcome.error)
    state = await world.state()
    assert state.refresh.token == Secret("rt-typo-not-issued")
    assert state.refresh.in_flight is not None  # so the next run burns it instead of sending it
    world.server.handle = answer  # type: ignore[method-assign]
    world.clock.advance(400)
    assert (await world.job(seeded=False).run()).action == "refreshed"
    assert world.server.used_refresh.count("rt-typo-not-issued") == 1


async def test_an_import_replaces_a_token_whose_answer_was_lost(world: World) -> None:
    job = world.job(seeded=False)
    await job.run()
    await due(world)
    world.server.lose_answers = 1
    await job.run()
    assert (await world.state()).refresh.burned == Secret("rt-1-secretvalue")
    outcome = await import_token(world, CONSENT)
    assert outcome.action == "refreshed"
    assert world.server.used_refresh == ["rt-1-secretvalue", CONSENT]  # never rt-1 twice
    assert "rt-1-secretvalue" in world.server.revoked


async def test_an_import_keeps_the_input_fingerprint(world: World) -> None:
    job = world.job()
    await job.run()
    seeded = (await world.state()).refresh.input_fingerprint
    outcome = await import_token(world, CONSENT_2, job)
    assert outcome.action == "refreshed"
    state = await world.state()
    assert state.refresh.input_fingerprint == seeded
    assert world.seed.reads == 1


# ---- configuration ---------------------------------------------------------------------------

CONFIG = """\
[vault]
address = "https://vault.example.com"
auth = {{ method = "token", token = "env:VAULT_TOKEN" }}

[[providers]]
name = "acme"
base_url = "https://acme.example.com"

[[credentials]]
name = "reporting"
provider = "acme"
kind = "{kind}"
publish_to = "apps/reporting/acme"
probe = "/v1/projects"
{extra}
"""
OAUTH = 'client_id = "cid"\nclient_secret = "env:CS"\n'


def load(text: str, environ: dict[str, str] | None = None) -> Config:
    return parse_config(text, Path("/etc/keyturn/keyturn.toml"), environ or {})


def test_the_input_is_a_reference_of_an_oauth_client() -> None:
    config = load(
        CONFIG.format(
            kind="oauth_client",
            extra=OAUTH + 'refresh_token = "vault:secret/keyturn/inputs/reporting#refresh_token"',
        )
    )
    assert config.credential("reporting").refresh_token == SecretRef.vault(
        "secret", "keyturn/inputs/reporting", "refresh_token"
    )
    plain = load(CONFIG.format(kind="oauth_client", extra=OAUTH))
    assert plain.credential("reporting").refresh_token is None


def test_an_environment_override_sets_the_input() -> None:
    config = load(
        CONFIG.format(kind="oauth_client", extra=OAUTH),
        {"KEYTURN_CREDENTIALS_REPORTING_REFRESH_TOKEN": "env:RT"},
    )
    assert config.credential("reporting").refresh_token == SecretRef.env("RT")


def test_an_inline_refresh_token_is_refused_without_its_value() -> None:
    with pytest.raises(ConfigError) as caught:
        load(CONFIG.format(kind="oauth_client", extra=OAUTH + f'refresh_token = "{CONSENT}"'))
    [problem] = caught.value.problems
    assert 'credentials["reporting"].refresh_token: got an inline secret' in problem
    assert "refresh_token = " in problem  # how to write it instead
    assert CONSENT not in problem


def test_an_api_key_takes_no_refresh_token() -> None:
    rotation = 'rotation = { max_age = "30d", rotator = "m" }\n'
    rotators = '\n[[rotators]]\nname = "m"\ntype = "manual"\n'
    with pytest.raises(ConfigError) as caught:
        load(CONFIG.format(kind="api_key", extra=rotation + 'refresh_token = "env:RT"') + rotators)
    [problem] = caught.value.problems
    assert 'credentials["reporting"].refresh_token: not allowed for kind "api_key"' in problem
