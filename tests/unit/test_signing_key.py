"""The signing_key kind over fakes: the journal's steps with a fake RFC 7592 server (an httpx
MockTransport), a fake proof, FakeVaultStore and FakeClock."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from keyturn.clock import FakeClock
from keyturn.commands.check import required_capabilities, vault_references
from keyturn.commands.import_signing_key import parse
from keyturn.commands.rotate import report
from keyturn.commands.status import render_json, render_table, status_rows
from keyturn.config import ProviderConfig, RotationPolicy, parse_config
from keyturn.config.credential_auth import CredentialAuth
from keyturn.config.credentials import (
    JwksRegistration,
    Rfc7592Registration,
    RotatorRegistration,
    SigningKeyCredential,
)
from keyturn.errors import ConfigError, KeyMaterialError, ProviderUnavailable, VerificationFailed
from keyturn.events import Suspicious
from keyturn.jobs.job import CredentialJob, JobDeps, Journal, Outcome
from keyturn.jobs.rotation import KeyRotation
from keyturn.kinds.signing_key import (
    accept,
    make_job,
    prove_with_assertion,
    record,
    registrar_for,
    status_details,
)
from keyturn.kinds.signing_key.keys import SigningKey, generate, stored
from keyturn.kinds.signing_key.registration import (
    NOT_SENT_BACK,
    REGISTRATION_DROPPED_KEY,
    REGISTRATION_REFUSED,
)
from keyturn.policy import BackoffPolicy
from keyturn.providers.assertions import CLIENT_ASSERTION_TYPE
from keyturn.providers.client import ProviderClient
from keyturn.references import SecretRef, parse_reference
from keyturn.rotators.base import RotationRequest
from keyturn.secret import Secret
from keyturn.state import CredentialState, RotationJournal
from keyturn.testing.observer import RecordingObserver
from keyturn.testing.vault import FakeVaultStore

DAY = 86400.0
PUBLISHED = "apps/billing/key"
STATE = "keyturn/state/billing-key"
CLIENT_URI = "https://idp.test/reg/billing"


class Registration:
    """An RFC 7592 client registration endpoint: rotates its registration access token on
    every answer (as oidc-provider can), keeps each token ever issued to count presentations."""

    def __init__(self) -> None:
        self.metadata: dict[str, object] = {
            "client_id": "billing",
            "token_endpoint_auth_method": "private_key_jwt",
            "grant_types": ["client_credentials"],
            "jwks": {"keys": []},
        }
        self.token = "rat-0"
        self.issued = 0
        self.presented: list[str] = []
        self.methods: list[str] = []
        self.refuse_all = False
        self.drop_old = False
        self.lose_next_answer = False
        self.new_secret_on_update: str | None = None
        self.admin_tokens: set[str] = set()  # accepted too, as Keycloak takes an admin's token

    def handler(self, request: httpx.Request) -> httpx.Response:
        assert str(request.url) == CLIENT_URI
        presented = request.headers["Authorization"].removeprefix("Bearer ")
        self.presented.append(presented)
        self.methods.append(request.method)
        if self.refuse_all or presented not in {self.token, *self.admin_tokens}:
            return httpx.Response(401, json={"error": "invalid_token"})
        if request.method == "PUT":
            body = json.loads(request.content)
            sent_back = {k: v for k, v in body.items() if k != "jwks"}
            held = {k: v for k, v in self.metadata.items() if k != "jwks"}
            if sent_back != held:
                return httpx.Response(400, json={"error": "invalid_client_metadata"})
            keys = body["jwks"]["keys"]
            if self.drop_old:
                keys = keys[-1:]
            self.metadata["jwks"] = {"keys": keys}
            if self.new_secret_on_update:
                self.metadata["client_secret"] = self.new_secret_on_update
        self.issued += 1
        self.token = f"rat-{self.issued}"
        if self.lose_next_answer:
            self.lose_next_answer = False
            raise httpx.ReadTimeout("answer lost", request=request)
        answer = {**self.metadata, "registration_access_token": self.token}
        answer["registration_client_uri"] = CLIENT_URI
        return httpx.Response(200, json=answer)

    def kids(self) -> list[str]:
        jwks = self.metadata["jwks"]
        assert isinstance(jwks, dict)
        return [key["kid"] for key in jwks["keys"]]


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = FakeVaultStore(clock=self.clock)
        self.observer = RecordingObserver()
        self.server = Registration()
        self.proven: list[str] = []
        self.refuse_proof = False
        self.environ = {"RAT": "rat-0"}
        self.published_at: Callable[[str], SecretRef] | None = None

    async def prove(
        self,
        credential: SigningKeyCredential,
        client: object,
        client_id: str,
        key: SigningKey,
    ) -> None:
        """A token request signed with `key`: the server takes it if it holds the key."""
        if self.refuse_proof or key.kid not in self.server.kids():
            raise VerificationFailed("assertion refused (invalid_client)", credential="billing-key")
        self.proven.append(key.kid)

    def credential(self, registration: object = None, grace: float = DAY) -> SigningKeyCredential:
        return SigningKeyCredential(
            name="billing-key",
            provider="idp",
            client_id=SecretRef.inline("billing"),
            publish_to=PUBLISHED,
            rotation=RotationPolicy(max_age=30 * DAY, grace=grace, verify_attempts=2),
            backoff=BackoffPolicy(initial=5.0, maximum=300.0),
            registration=registration
            or Rfc7592Registration(client_uri=CLIENT_URI, access_token=parse_reference("env:RAT")),
        )

    def job(self, registration: object = None, grace: float = DAY) -> CredentialJob:
        client = ProviderClient(
            ProviderConfig(name="idp", base_url="https://idp.test"),
            clock=self.clock,
            transport=httpx.MockTransport(self.dispatch),
        )
        credential = self.credential(registration, grace)
        deps = JobDeps(
            store=self.store,
            observer=self.observer,
            clock=self.clock,
            rng=random.Random(2),
            instance_id="i-1",
            environ=self.environ,
            published_at=self.published_at,
        )
        return make_job(self.prove, registrar_for)(credential, client, None, _NoInputs(), deps)

    def dispatch(self, request: httpx.Request) -> httpx.Response:
        """To the server's handler of the moment (a test may replace it)."""
        return self.server.handler(request)

    async def state(self) -> CredentialState:
        entry = await self.store.read(STATE)
        assert entry is not None
        return CredentialState.from_data(entry.data, "billing-key")

    async def run_until_idle(self, job: CredentialJob, limit: int = 12) -> None:
        for _ in range(limit):
            await job.run()
            state = await self.state()
            if state.rotation.phase == "idle" and state.rotation.key is not None:
                return
            self.clock.advance(
                max(1.0, (state.rotation.previous_retire_at or 0) - self.clock.time())
            )
        raise AssertionError(f"not idle after {limit} runs: {state.rotation.phase}")


class _NoInputs:
    async def client(self, *, fresh: bool = False) -> tuple[str, Secret]:
        raise AssertionError("a signing key has no client secret")

    async def refresh_token(self) -> Secret | None:
        return None

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        return None


async def test_the_first_key_is_made_registered_proven_then_published() -> None:
    world = World()
    job = world.job()
    await world.run_until_idle(job)
    state = await world.state()
    kid = state.rotation.key_id
    assert kid is not None and world.server.kids() == [kid] and world.proven == [kid]
    published = await world.store.read(PUBLISHED)
    assert published is not None and published.data["kid"] == kid
    assert "BEGIN PRIVATE KEY" in str(published.data["private_key"])
    # The token the server returned last is the one keyturn keeps, and each was presented once.
    held = record.read(state, "billing-key")
    assert held.access_token is not None and held.access_token.reveal() == world.server.token
    assert len(world.server.presented) == len(set(world.server.presented))
    assert status_details(state, "billing-key") == {"registered": kid}


async def test_a_rotation_registers_both_keys_through_grace_then_only_the_new_one() -> None:
    world = World()
    job = world.job()
    await world.run_until_idle(job)
    first = (await world.state()).rotation.key_id
    world.clock.advance(30 * DAY)
    await job.run()  # creates, registers beside the old key, proves, publishes
    state = await world.state()
    second = state.rotation.key_id
    assert state.rotation.phase == "retiring" and second != first
    assert world.server.kids() == [first, second]
    world.clock.advance(DAY)
    await job.run()
    assert (await world.state()).rotation.phase == "idle"
    assert world.server.kids() == [second]
    assert len(world.server.presented) == len(set(world.server.presented))


async def test_a_rotated_registration_token_is_stored_before_anything_else() -> None:
    """Every answer brings a new token: the record holds it before the next request goes."""
    world = World()
    seen: list[str] = []
    handler = world.server.handler

    def watching(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Authorization"])
        return handler(request)

    world.server.handler = watching  # type: ignore[method-assign]
    job = world.job()
    await world.run_until_idle(job)
    issued = [f"Bearer rat-{n}" for n in range(len(seen))]
    assert len(seen) >= 2 and seen == issued  # each carried the token the last answer issued


async def test_a_refused_registration_token_alerts_once_and_is_never_presented_again() -> None:
    world = World()
    world.server.refuse_all = True
    job = world.job()
    outcome = await job.run()
    assert outcome.error is not None and "import-signing-key" in str(outcome.error)
    alerts = [e for e in world.observer.of(Suspicious) if e.detector == REGISTRATION_REFUSED]
    assert len(alerts) == 1 and "registration access token" in alerts[0].detail
    presented = len(world.server.presented)
    for _ in range(3):  # no retry loop: later runs make no request
        world.clock.advance(3600)
        await job.run()
    assert len(world.server.presented) == presented == 1
    state = await world.state()
    assert state.rotation.key is None and state.rotation.phase == "pending"
    assert record.read(state, "billing-key").access_token is None


async def test_an_answer_lost_burns_the_token_and_a_person_must_hand_over_a_new_one() -> None:
    world = World()
    world.server.lose_next_answer = True
    job = world.job()
    outcome = await job.run()
    assert outcome.error is not None and "lost" in str(outcome.error)
    assert [e.detector for e in world.observer.of(Suspicious)] == [REGISTRATION_REFUSED]
    world.clock.advance(3600)
    await job.run()
    assert world.server.presented == ["rat-0"]


ADMIN = CredentialAuth("kc-admin")


def _by_admin(world: World) -> Rfc7592Registration:
    """`registration.auth = "credential:kc-admin"`, whose token is published in Vault."""
    world.published_at = lambda name: SecretRef.vault("secret", f"apps/{name}/kc", "access_token")
    return Rfc7592Registration(client_uri=CLIENT_URI, auth=ADMIN)


async def test_a_registration_by_another_credential_s_token_reads_it_afresh_and_keeps_none() -> (
    None
):
    world = World()
    registration = _by_admin(world)
    world.server.admin_tokens = {"admin-1", "admin-2"}
    await world.store.write("apps/kc-admin/kc", {"access_token": "admin-1"}, cas=None)
    job = world.job(registration)
    await world.run_until_idle(job)
    first = (await world.state()).rotation.key_id
    assert world.server.kids() == [first]
    await world.store.write("apps/kc-admin/kc", {"access_token": "admin-2"}, cas=None)
    world.clock.advance(30 * DAY)
    await world.run_until_idle(job)
    presented = world.server.presented
    assert presented[0] == "admin-1" and presented[-1] == "admin-2"
    assert set(presented) == {"admin-1", "admin-2"}  # never a registration access token
    held = record.read(await world.state(), "billing-key")
    assert held.access_token is None and held.stopped is None


async def test_a_refused_or_missing_admin_token_fails_the_run_without_stopping_it() -> None:
    world = World()
    registration = _by_admin(world)
    job = world.job(registration)
    missing = await job.run()
    assert missing.error is not None and world.server.presented == []
    assert "registration.auth: credential:kc-admin: no published token to use" in str(missing.error)
    await world.store.write("apps/kc-admin/kc", {"access_token": "stale"}, cas=None)
    world.clock.advance(3600)
    refused = await job.run()
    assert refused.error is not None and "credential:kc-admin" in str(refused.error)
    assert "stale" not in str(refused.error)
    assert world.observer.of(Suspicious) == []  # nothing a person must hand over
    world.server.admin_tokens = {"fresh"}
    await world.store.write("apps/kc-admin/kc", {"access_token": "fresh"}, cas=None)
    world.clock.advance(3600)
    await world.run_until_idle(job)
    assert world.server.presented[-1] == "fresh"


async def test_an_update_sends_back_the_last_answer_with_no_read_first() -> None:
    """The metadata of the server's last answer is kept in the record (without the token and
    the fields not sent back): later updates PUT it back, with no GET before them."""
    world = World()
    job = world.job()
    await world.run_until_idle(job)
    assert world.server.methods == ["GET", "PUT"]  # a seeded token: nothing held to send back
    held = record.read(await world.state(), "billing-key").metadata
    assert held == world.server.metadata and held is not world.server.metadata
    assert "private_key_jwt" not in repr(record.read(await world.state(), "billing-key"))
    world.clock.advance(30 * DAY)
    await job.run()  # adds the new key
    world.clock.advance(DAY)
    await job.run()  # removes the old one after the grace
    assert (await world.state()).rotation.phase == "idle"
    assert world.server.methods == ["GET", "PUT", "PUT", "PUT"]
    assert len(world.server.presented) == len(set(world.server.presented))
    stored = json.loads(_own(await world.state()))["metadata"]
    assert stored == world.server.metadata and not set(NOT_SENT_BACK) & set(stored)


def _own(state: CredentialState) -> str:
    assert state.own.data is not None
    return state.own.data.reveal()


async def test_an_update_refused_for_its_metadata_reads_again_then_keeps_the_key_in_use() -> (
    None
):
    world = World()
    job = world.job()
    await world.run_until_idle(job)
    first = (await world.state()).rotation.key_id
    # Changed at the server since its last answer: the metadata keyturn sends back is refused
    # (HTTP 400, the token not rotated) and dropped; the next attempt reads it (GET) first.
    world.server.metadata["client_name"] = "billing"
    world.clock.advance(30 * DAY)
    refused = await job.run()
    assert refused.error is not None and "invalid_client_metadata" in str(refused.error)
    assert "reads the registration again (GET) before its next attempt" in str(refused.error)
    state = await world.state()
    assert record.read(state, "billing-key").metadata is None and state.rotation.key_id == first
    token = world.server.presented[-1]
    world.clock.advance(3600)
    await job.run()
    assert world.server.methods[2:5] == ["PUT", "GET", "PUT"]
    # The read presented the token the refused update left valid; it worked.
    assert world.server.presented[3] == token
    assert (await world.state()).rotation.key_id != first
    # A server that refuses what is sent back, read or not, leaves the key in use alone.
    world.clock.advance(DAY)
    await job.run()
    current = (await world.state()).rotation.key_id
    real = world.server.handler

    def refusing(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            world.server.presented.append(request.headers["Authorization"][7:])
            world.server.methods.append("PUT")
            return httpx.Response(400, json={"error": "invalid_client_metadata"})
        return real(request)

    world.server.handler = refusing  # type: ignore[method-assign]
    world.clock.advance(30 * DAY)
    seen = len(world.server.methods)
    for _ in range(2):  # the held metadata refused, then what was read again refused too
        outcome = await job.run()
        world.clock.advance(3600)
    assert world.server.methods[seen:] == ["PUT", "GET", "PUT"]
    assert outcome.error is not None
    assert "registration (PUT" in str(outcome.error) and "invalid_client_metadata" in str(
        outcome.error
    )
    assert "see the server's logs for the field it refuses" in str(outcome.error)
    state = await world.state()
    assert state.rotation.key_id == current and state.rotation.phase == "pending"
    published = await world.store.read(PUBLISHED)
    assert published is not None and published.data["kid"] == current


async def test_a_field_read_back_as_a_one_element_array_is_sent_back_as_its_string() -> None:
    """Glewlwyd 2.7 reads `token_endpoint_auth_method` back as ["private_key_jwt"] and refuses
    that array in an update (HTTP 400 invalid_client_metadata); RFC 7591 makes it a string."""
    world = World()
    real = world.server.handler

    def glewlwyd(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            sent = json.loads(request.content)["token_endpoint_auth_method"]
            if not isinstance(sent, str):
                world.server.presented.append(request.headers["Authorization"][7:])
                return httpx.Response(400, json={"error": "invalid_client_metadata"})
        answer = real(request)
        if request.method != "GET":
            return answer
        document = answer.json()
        document["token_endpoint_auth_method"] = [document["token_endpoint_auth_method"]]
        return httpx.Response(200, json=document)

    world.server.handler = glewlwyd  # type: ignore[method-assign]
    job = world.job()
    await world.run_until_idle(job)
    first = (await world.state()).rotation.key_id
    world.clock.advance(30 * DAY)
    await world.run_until_idle(job)
    state = await world.state()
    assert state.rotation.key_id != first and world.server.kids() == [state.rotation.key_id]
    assert world.server.metadata["token_endpoint_auth_method"] == "private_key_jwt"


async def test_a_server_that_drops_the_old_key_at_once_is_reported_and_the_new_key_used() -> None:
    world = World()
    job = world.job()
    await world.run_until_idle(job)
    world.server.drop_old = True
    world.clock.advance(30 * DAY)
    await job.run()
    state = await world.state()
    assert world.server.kids() == [state.rotation.key_id]
    published = await world.store.read(PUBLISHED)
    assert published is not None and published.data["kid"] == state.rotation.key_id
    detectors = [e.detector for e in world.observer.of(Suspicious)]
    assert detectors == [REGISTRATION_DROPPED_KEY]


async def test_a_client_secret_issued_on_update_is_kept_and_published() -> None:
    world = World()
    world.server.new_secret_on_update = "s3cr3t-issued"
    job = world.job()
    await world.run_until_idle(job)
    published = await world.store.read(PUBLISHED)
    assert published is not None and published.data["client_secret"] == "s3cr3t-issued"


async def test_a_key_the_proof_refuses_is_removed_from_the_registration_and_made_anew() -> None:
    world = World()
    world.refuse_proof = True
    job = world.job()
    for _ in range(2):  # verify_attempts = 2
        await job.run()
        world.clock.advance(600)
    assert world.server.kids() == []  # the refused key left the registration
    state = await world.state()
    assert state.rotation.phase == "creating" and state.rotation.key is None
    world.refuse_proof = False
    await world.run_until_idle(job)
    assert world.server.kids() == [(await world.state()).rotation.key_id]


async def test_a_jwks_document_holds_the_new_key_before_it_signs_and_drops_the_old_after_grace(
    tmp_path: Path,
) -> None:
    """A server that fetched the document keeps it `server_cache`: the new key is in the
    document that long before a token request is signed with it."""
    world = World()
    document = tmp_path / "jwks.json"
    cache = 60.0
    proofs: list[tuple[float, str, list[str]]] = []

    async def prove_from_document(
        credential: object, client: object, client_id: str, key: SigningKey
    ) -> None:
        kids = [k["kid"] for k in json.loads(document.read_text())["keys"]]
        proofs.append((world.clock.time(), key.kid, kids))
        if key.kid not in kids:
            raise VerificationFailed("not in the document", credential="billing-key")

    world.prove = prove_from_document  # type: ignore[method-assign]
    registration = JwksRegistration(
        publish_to="apps/billing/jwks", file=document, server_cache=cache
    )
    job = world.job(registration)
    added = world.clock.time()
    outcome = await job.run()
    assert outcome.action == "waiting" and outcome.error is None and proofs == []
    assert outcome.next_due == added + cache
    state = await world.state()
    first = state.rotation.pending_key_id
    assert state.rotation.phase == "pending" and state.rotation.key is None
    assert [k["kid"] for k in json.loads(document.read_text())["keys"]] == [first]
    world.clock.advance(cache)
    await job.run()
    state = await world.state()
    assert state.rotation.key_id == first and state.rotation.phase == "idle"
    assert proofs == [(added + cache, first, [first])]

    world.clock.advance(30 * DAY)
    await job.run()  # the next key joins the document beside the first, and waits
    second = (await world.state()).rotation.pending_key_id
    in_vault = await world.store.read("apps/billing/jwks")
    assert in_vault is not None
    assert [k["kid"] for k in json.loads(str(in_vault.data["jwks"]))["keys"]] == [first, second]
    world.clock.advance(cache)
    await job.run()  # proven, published: the first one retires after the grace
    state = await world.state()
    assert state.rotation.key_id == second and state.rotation.phase == "retiring"
    world.clock.advance(DAY)
    await job.run()
    assert [k["kid"] for k in json.loads(document.read_text())["keys"]] == [second]
    assert [kid for _, kid, _ in proofs] == [first, second]


async def test_a_new_key_signs_server_cache_after_the_write_that_published_it_ended() -> None:
    """A server's fetch may read the old document until the write completes (a Vault write
    that took 5 s here): the wait counts from its end, not from when it began."""
    world = World()
    took = 5.0

    class SlowVault(FakeVaultStore):
        async def write(
            self,
            path: str,
            data: Mapping[str, str | Secret],
            *,
            cas: int | None,
            custom_metadata: Mapping[str, str] | None = None,
        ) -> int:
            if path == "apps/billing/jwks":
                world.clock.advance(took)
            return await super().write(path, data, cas=cas, custom_metadata=custom_metadata)

    proofs: list[float] = []

    async def accept(credential: object, client: object, client_id: str, key: SigningKey) -> None:
        proofs.append(world.clock.time())

    world.prove = accept  # type: ignore[method-assign]
    world.store = SlowVault(clock=world.clock)
    job = world.job(JwksRegistration(publish_to="apps/billing/jwks", server_cache=60.0))
    began = world.clock.time()
    outcome = await job.run()
    assert outcome.action == "waiting" and outcome.error is None
    assert outcome.next_due == began + took + 60.0
    world.clock.advance(began + 60.0 - world.clock.time())  # 60 s after it began: not yet
    await job.run()
    assert (await world.state()).rotation.key is None and proofs == []
    world.clock.advance(took)
    await job.run()
    assert proofs == [began + took + 60.0]


async def test_a_failed_jwks_publication_keeps_the_key_in_use(tmp_path: Path) -> None:
    world = World()
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    job = world.job(JwksRegistration(file=blocked / "jwks.json"))
    outcome = await job.run()
    assert outcome.error is not None and "registration.file" in str(outcome.error)
    state = await world.state()
    assert state.rotation.key is None and state.rotation.phase == "pending"


def test_a_key_never_shows_its_private_half() -> None:
    key = generate("billing-key", "EdDSA")
    pem = key.pem.reveal()
    assert pem not in repr(key) and pem not in str(key.pem)
    assert "d" not in key.public_jwk()
    assert generate("billing-key", "RS256", 2048).public_jwk()["kty"] == "RSA"


def _token_endpoint(registered: list[dict[str, object]], clock: FakeClock) -> httpx.MockTransport:
    """A token endpoint that takes a client_credentials request only with an assertion signed
    by a registered key (checked with PyJWT: signature, iss = sub = client_id, aud; exp within
    a minute of the fake clock)."""

    def handle(request: httpx.Request) -> httpx.Response:
        form = dict(httpx.QueryParams(request.content.decode()))
        assertion = form["client_assertion"]
        kid = jwt.get_unverified_header(assertion)["kid"]
        jwk = next((key for key in registered if key["kid"] == kid), None)
        if jwk is None or form["client_assertion_type"] != CLIENT_ASSERTION_TYPE:
            return httpx.Response(401, json={"error": "invalid_client"})
        public = jwt.PyJWK.from_dict(jwk).key
        claims = jwt.decode(
            assertion,
            public,
            algorithms=[str(jwk["alg"])],
            audience="https://idp.test/oauth/token",
            options={"verify_exp": False, "verify_iat": False},
        )
        assert 0 < claims["exp"] - clock.time() <= 60
        assert claims["iss"] == claims["sub"] == form["client_id"] == "billing"
        return httpx.Response(
            200, json={"access_token": "at", "token_type": "Bearer", "expires_in": 60}
        )

    return httpx.MockTransport(handle)


@pytest.mark.parametrize("alg", ["RS256", "PS256", "ES256", "EdDSA"])
async def test_a_key_is_proven_by_a_token_request_signed_with_it(alg: str) -> None:
    registered: list[dict[str, object]] = []
    clock = FakeClock()
    client = ProviderClient(
        ProviderConfig(name="idp", base_url="https://idp.test"),
        clock=clock,
        transport=_token_endpoint(registered, clock),
    )
    credential = World().credential()
    key = generate("billing-key", alg, 2048 if alg in ("RS256", "PS256") else None)  # type: ignore[arg-type]
    with pytest.raises(VerificationFailed, match=r"was refused .*invalid_client.*nothing switched"):
        await prove_with_assertion(credential, client, "billing", key)
    registered.append(key.public_jwk())
    await prove_with_assertion(credential, client, "billing", key)
    await client.aclose()


def _pem(private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


@pytest.mark.parametrize(
    ("given", "field", "words"),
    [
        ("not json", "private_key", "expected a JSON object"),
        ('{"private_key": 3}', "private_key", "expected a JSON object"),
        ("RSA-1024", "private_key", "an RSA key of 1024 bits; expected an RSA key of at least"),
        ("EC", "private_key", "an EC key on secp256r1; expected an RSA key"),
        ("RSA-2048 with token 7", "registration_access_token", "not a non-empty string"),
    ],
)
def test_an_import_refuses_a_weak_or_wrong_key_naming_the_field(
    given: str, field: str, words: str
) -> None:
    credential = World().credential()
    credential = dataclasses.replace(credential, algorithm="PS256")
    if given.startswith("RSA-1024"):
        given = json.dumps({"private_key": _pem(rsa.generate_private_key(65537, 1024))})
    elif given == "EC":
        given = json.dumps({"private_key": _pem(ec.generate_private_key(ec.SECP256R1()))})
    elif given.startswith("RSA-2048"):
        pem = _pem(rsa.generate_private_key(65537, 2048))
        given = json.dumps({"private_key": pem, "registration_access_token": 7})
    with pytest.raises(KeyMaterialError) as raised:
        parse(given, credential)
    assert raised.value.field == field and words in str(raised.value)
    assert raised.value.credential == "billing-key"
    assert "BEGIN" not in str(raised.value)


async def test_an_imported_key_pair_and_token_are_adopted_through_the_journal() -> None:
    """A key registered by hand, with the token its registration returned: stored, found
    registered already (no second key added), proven, published as the key in use."""
    world = World()
    key = generate("billing-key", "ES256")
    world.server.metadata["jwks"] = {"keys": [key.public_jwk()]}
    world.server.token = "rat-by-hand"
    job = world.job()
    handed, token, registration = parse(
        json.dumps({"private_key": key.pem.reveal(), "registration_access_token": "rat-by-hand"}),
        world.credential(),
    )
    assert token is not None and registration is None
    rotation = job.task("rotation")
    assert isinstance(rotation, KeyRotation)

    def hand_over(journal: Journal) -> None:
        journal.stage(accept(journal.state, "billing-key", token))
        rotation.accept_key(journal, stored(handed), handed.kid)

    await job.run(force={"rotation"}, prepare=hand_over)
    state = await world.state()
    assert state.rotation.key_id == key.kid and state.rotation.phase == "idle"
    assert world.server.kids() == [key.kid] and world.server.presented[0] == "rat-by-hand"
    published = await world.store.read(PUBLISHED)
    assert published is not None and published.data["kid"] == key.kid


async def test_an_import_with_the_registration_response_needs_no_read_before_its_update() -> (
    None
):
    """The RFC 7591 registration response handed over: its token is kept, its metadata is what
    the first update sends back; the key it holds is found registered with no request."""
    world = World()
    key = generate("billing-key", "ES256")
    world.server.metadata["jwks"] = {"keys": [key.public_jwk()]}
    world.server.token = "rat-by-hand"
    response = {
        **world.server.metadata,
        "registration_access_token": "rat-by-hand",
        "registration_client_uri": CLIENT_URI,
        "client_id_issued_at": 1_800_000_000,
    }
    job = world.job()
    handed, token, registration = parse(
        json.dumps({"private_key": key.pem.reveal(), "registration": response}), world.credential()
    )
    assert token is not None and token.reveal() == "rat-by-hand" and registration == response
    rotation = job.task("rotation")
    assert isinstance(rotation, KeyRotation)

    def hand_over(journal: Journal) -> None:
        journal.stage(accept(journal.state, "billing-key", token, registration))
        rotation.accept_key(journal, stored(handed), handed.kid)

    await job.run(force={"rotation"}, prepare=hand_over)
    state = await world.state()
    assert state.rotation.key_id == key.kid and state.rotation.phase == "idle"
    assert world.server.presented == []  # found registered in what was handed over
    held = record.read(state, "billing-key")
    assert held.metadata == world.server.metadata and held.registered == (key.kid,)
    world.clock.advance(30 * DAY)
    await job.run()
    assert world.server.methods == ["PUT"] and world.server.presented == ["rat-by-hand"]
    assert world.server.kids() == [key.kid, (await world.state()).rotation.key_id]


@pytest.mark.parametrize(
    ("given", "field", "words"),
    [
        ({"registration": ["not", "an", "object"]}, "registration", "RFC 7591"),
        ({"registration": {"client_id": "billing"}}, "registration", "without a registration"),
        (
            {"registration_access_token": "a", "registration": {"registration_access_token": "b"}},
            "registration_access_token",
            "differs from registration.registration_access_token",
        ),
    ],
)
def test_an_import_refuses_a_registration_response_it_cannot_use_naming_the_field(
    given: dict[str, object], field: str, words: str
) -> None:
    pem = generate("billing-key", "ES256").pem.reveal()
    with pytest.raises(KeyMaterialError) as raised:
        parse(json.dumps({"private_key": pem, **given}), World().credential())
    assert raised.value.field == field and words in str(raised.value)
    assert '"b"' not in str(raised.value) and "'b'" not in str(raised.value)


class Registry:
    """A provider's key API as an exec rotator's register/revoke/find see it."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[str, dict[str, object]]] = {}  # id -> (name, jwk)
        self.calls: list[str] = []
        self.lose_next_register = False
        self.name = "provider-keys"

    async def register(self, request: RotationRequest) -> str:
        assert request.public_key is not None and "d" not in request.public_key
        key_id = f"id-{len(self.keys) + 1}"
        self.keys[key_id] = (request.key_name, dict(request.public_key))
        self.calls.append(f"register {key_id}")
        if self.lose_next_register:
            self.lose_next_register = False
            raise ProviderUnavailable("register: timed out", credential=request.credential)
        return key_id

    async def revoke(self, request: RotationRequest, key_id: str) -> None:
        self.calls.append(f"revoke {key_id}")
        self.keys.pop(key_id, None)

    async def find(self, request: RotationRequest) -> list[str] | None:
        return [key_id for key_id, (name, _) in self.keys.items() if name == request.key_name]

    async def aclose(self) -> None:
        return None

    def kids(self) -> list[str]:
        return [str(jwk["kid"]) for _, jwk in self.keys.values()]


async def test_a_key_registered_through_a_rotator_is_found_again_after_a_lost_answer() -> None:
    """The provider's id is stored before anything else; a registration whose answer was lost
    is found by its name (derived from the kid) and kept, not registered twice."""
    world = World()
    registry = Registry()
    registry.lose_next_register = True
    credential = dataclasses.replace(
        world.credential(RotatorRegistration()),
        rotation=RotationPolicy(max_age=30 * DAY, grace=DAY, rotator="provider-keys"),
    )

    async def prove(credential: object, client: object, client_id: str, key: SigningKey) -> None:
        if key.kid not in registry.kids():
            raise VerificationFailed("unknown key", credential="billing-key")

    deps = JobDeps(
        store=world.store,
        observer=world.observer,
        clock=world.clock,
        rng=random.Random(2),
        instance_id="i-1",
    )
    client = ProviderClient(
        ProviderConfig(name="idp", base_url="https://idp.test"), clock=world.clock
    )
    job = make_job(prove, registrar_for)(credential, client, registry, _NoInputs(), deps)
    outcome = await job.run()
    assert outcome.error is not None and "timed out" in str(outcome.error)
    world.clock.advance(600)
    await job.run()
    state = await world.state()
    first = state.rotation.key_id
    assert registry.kids() == [first] and registry.calls == ["register id-1"]
    assert dict(record.read(state, "billing-key").provider_ids) == {first: "id-1"}
    world.clock.advance(30 * DAY)
    await job.run()
    world.clock.advance(DAY)
    await job.run()
    state = await world.state()
    assert registry.kids() == [state.rotation.key_id] != [first]
    assert registry.calls == ["register id-1", "register id-2", "revoke id-1"]
    assert status_details(state, "billing-key") == {"registered": state.rotation.key_id}


SIGNING_CONFIG = """
[vault]
address = "https://vault.test:8200"
auth = { method = "token", token = "env:VT" }
[[providers]]
name = "idp"
base_url = "https://idp.test"
[[rotators]]
name = "okta-keys"
type = "exec"
command = ["/usr/local/bin/okta-keys"]
[[rotators]]
name = "by-hand"
type = "manual"
[[credentials]]
name = "k"
kind = "signing_key"
provider = "idp"
publish_to = "apps/k/key"
client_id = "k"
"""


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        (
            'rotation = { max_age = "90d", rotator = "by-hand" }\n'
            'registration = { method = "rotator" }',
            'rotation.rotator: "by-hand" is a manual rotator; expected an exec rotator',
        ),
        (
            'rotation = { max_age = "90d" }\nregistration = { method = "rotator" }',
            'rotation.rotator: missing; registration = { method = "rotator" } needs the name',
        ),
        (
            'rotation = { max_age = "90d", rotator = "okta-keys" }\n'
            'registration = { method = "jwks", file = "/srv/jwks.json" }',
            'rotation.rotator: is "okta-keys" for a signing_key registered by "jwks"',
        ),
        (
            'key_size = 4096\nrotation = { max_age = "90d" }\n'
            'registration = { method = "jwks", file = "/srv/jwks.json" }',
            'key_size: is set for algorithm "ES256", whose key size is fixed',
        ),
        (
            'algorithm = "RS256"\nkey_size = 1024\nrotation = { max_age = "90d" }\n'
            'registration = { method = "jwks", file = "/srv/jwks.json" }',
            "key_size: got 1024, which is out of range; expected an integer between 2048",
        ),
        (
            'rotation = { max_age = "90d" }\nregistration = { method = "jwks" }',
            "registration.publish_to: missing, and so is file",
        ),
        (
            'client_secret = "env:S"\nrotation = { max_age = "90d" }\n'
            'registration = { method = "jwks", file = "/srv/jwks.json" }',
            'client_secret: not allowed for kind "signing_key"',
        ),
    ],
)
def test_a_signing_key_s_configuration_problem_names_the_field(keys: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(SIGNING_CONFIG + keys + "\n", "k.toml", {"VT": "x"})
    [line] = raised.value.problems
    assert line.startswith(f'k.toml: credentials["k"].{problem}'), line


def test_check_resolves_the_registration_token_and_covers_the_jwks_path() -> None:
    jwks = (
        'rotation = { max_age = "90d" }\n'
        'registration = { method = "jwks", publish_to = "apps/k/jwks" }\n'
    )
    rfc = (
        'rotation = { max_age = "90d" }\nregistration = { method = "rfc7592", client_uri = '
        '"https://idp.test/reg/k", access_token = "vault:secret/keyturn/inputs/k#rat" }\n'
    )
    needed = required_capabilities(parse_config(SIGNING_CONFIG + jwks, "k.toml", {"VT": "x"}))
    assert needed["secret/data/apps/k/jwks"] == {"create", "update", "read"}
    assert needed["secret/metadata/apps/k/jwks"] == {"create", "update", "read"}
    config = parse_config(SIGNING_CONFIG + rfc, "k.toml", {"VT": "x"})
    assert (
        "credentials['k'].registration.access_token",
        parse_reference("vault:secret/keyturn/inputs/k#rat"),
    ) in vault_references(config)
    assert required_capabilities(config)["secret/data/keyturn/inputs/k"] == {"read"}


async def test_a_new_value_of_the_token_input_resumes_after_a_refusal() -> None:
    """After a refusal the input is read again each run (no request), and a value that differs
    from the one last used is taken: the rotation resumes."""
    world = World()
    world.server.refuse_all = True
    job = world.job()
    await job.run()
    assert world.server.presented == ["rat-0"]
    world.server.refuse_all = False
    world.clock.advance(3600)
    await job.run()  # the input still holds the refused token: not presented again
    assert world.server.presented == ["rat-0"]
    world.environ["RAT"] = world.server.token = "rat-from-the-admin"
    world.clock.advance(3600)
    await world.run_until_idle(job)
    assert world.server.presented[:2] == ["rat-0", "rat-from-the-admin"]
    state = await world.state()
    assert state.rotation.phase == "idle" and world.server.kids() == [state.rotation.key_id]


def test_rotate_says_until_when_a_new_key_waits(capsys: pytest.CaptureFixture[str]) -> None:
    pending = CredentialState(
        rotation=RotationJournal(phase="pending", pending_key_id="kid-2", pending_key=Secret("k"))
    )
    waiting = Outcome("waiting", 1_800_000_060.0, pending)
    assert report("billing-key", waiting, "rotate") == 1
    line = capsys.readouterr().err
    assert "billing-key: the new key kid-2 waits until 2027-01-15T08:01:00Z" in line


async def test_status_shows_the_kid_in_use_the_ids_registered_and_the_next_rotation() -> None:
    config = parse_config(
        SIGNING_CONFIG
        + 'rotation = { max_age = "90d", grace = "1d" }\n'
        + 'registration = { method = "jwks", file = "/srv/jwks.json" }\n',
        "k.toml",
        {"VT": "x"},
    )
    clock = FakeClock()
    store = FakeVaultStore(clock=clock)
    now = clock.time()
    journal = RotationJournal(
        key=Secret("k"),
        key_id="kid-new",
        key_created_at=now,
        phase="retiring",
        previous_key_id="kid-old",
        previous_retire_at=now + DAY,
    )
    state = record.write(
        CredentialState(rotation=journal), record.Registration(registered=("kid-old", "kid-new"))
    )
    await store.write("keyturn/state/k", state.to_data(), cas=0)
    [row] = await status_rows(config, store, clock)
    assert row.key_id == "kid-new" and row.rotates_at == now + DAY
    assert row.details == {"registered": "kid-old, kid-new"}
    assert "retiring; registered: kid-old, kid-new" in render_table([row], now)
    assert json.loads(render_json([row]))["details"] == {"registered": "kid-old, kid-new"}


async def test_what_apps_read_changed_by_someone_else_is_put_back_not_rotated() -> None:
    """The watcher's run-now (`republish`) writes the key in use back; no new key is made."""
    world = World()
    job = world.job()
    await world.run_until_idle(job)
    state = await world.state()
    entry = await world.store.read(PUBLISHED)
    assert entry is not None
    await world.store.write(PUBLISHED, {"private_key": "tampered"}, cas=entry.version)
    outcome = await job.run(force={"republish"})
    assert outcome.action == "republished"
    published = await world.store.read(PUBLISHED)
    assert published is not None and published.data["kid"] == state.rotation.key_id
    assert (await world.state()).rotation.key_id == state.rotation.key_id
    assert world.server.kids() == [state.rotation.key_id]
