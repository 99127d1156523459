"""A credential's own token-request parameters (audience, resource, token_params) and the
refresh-token family's end, over fakes: the configuration's rules, the bodies sent in JSON and
form, a refusal that names the key, grant drift in `aud`, and the family's end in the record,
the metric event and `keyturn status`."""

from __future__ import annotations

import base64
import json
import random
from urllib.parse import parse_qs

import httpx
import pytest

from keyturn.clock import FakeClock, rfc3339
from keyturn.commands.check import _check_references, vault_references
from keyturn.commands.status import render_table, status_rows
from keyturn.config import CredentialConfig, ProviderConfig, parse_config
from keyturn.errors import ConfigError, OAuthError, SecretReferenceError
from keyturn.events import Failed, RefreshTokenPlanned, Suspicious
from keyturn.jobs.job import JobDeps
from keyturn.kinds import build_job
from keyturn.policy import RefreshPolicy
from keyturn.providers.client import ProviderClient
from keyturn.providers.params import ParameterRefused, TokenParams, token_audience
from keyturn.providers.tokens import parse_token_response
from keyturn.references import SecretRef
from keyturn.secret import Secret
from keyturn.state import CredentialState, RefreshTokenRecord
from keyturn.testing.oauth import FakeOAuthServer
from keyturn.testing.observer import RecordingObserver
from keyturn.testing.vault import FakeVaultStore
from keyturn_devkit.harness.configs import VAULT

CONFIG = VAULT + """
[[providers]]
name = "idp"
base_url = "https://idp.example.com"
token_request = "form"
refresh_token_max_lifetime = "30d"

[[credentials]]
name = "billing"
provider = "idp"
kind = "oauth_client"
client_id = "billing-app"
client_secret = "env:BILLING_SECRET"
publish_to = "apps/billing/idp"
"""


def load(extra: str, environ: dict[str, str] | None = None) -> CredentialConfig:
    return parse_config(CONFIG + extra, "k.toml", environ or {}).credential("billing")


def refused(extra: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(extra)
    return caught.value.problems


# -- the configuration ----------------------------------------------------------------------


def test_the_keys_load_as_typed_values() -> None:
    credential = load(
        'audience = "https://api.example.com"\n'
        'resource = ["https://a.example/", "urn:example:b", "https://a.example/"]\n'
        'token_params = { organization = "org_42", tenant = "env:TENANT" }\n'
    )
    assert credential.audience == "https://api.example.com"
    assert credential.resource == ("https://a.example/", "urn:example:b")  # once each
    assert credential.token_params == (
        ("organization", SecretRef.inline("org_42")),
        ("tenant", SecretRef.env("TENANT")),
    )
    assert load('resource = "https://a.example/"\n').resource == ("https://a.example/",)


@pytest.mark.parametrize(
    "name", ["grant_type", "client_id", "client_secret", "refresh_token", "scope", "resource"]
)
def test_a_name_keyturn_sets_is_refused_naming_credential_and_key(name: str) -> None:
    [line] = refused(f'token_params = {{ {name} = "x" }}\n')
    assert line.startswith(f'k.toml: credentials["billing"].token_params: has "{name}", ')
    assert "a parameter keyturn sets itself" in line


@pytest.mark.parametrize(
    ("extra", "where", "words"),
    [
        ('resource = "https://a.example/#frag"\n', ".resource:", "without a #fragment"),
        ('resource = "not a uri"\n', ".resource:", "an absolute URI"),
        ("resource = []\n", ".resource:", "got an empty array"),
        ('audience = "two words"\n', ".audience:", "without spaces"),
        ('token_params = { "bad name" = "x" }\n', ".token_params:", "letters, digits"),
        ('token_params = { org = "vault:nope" }\n', ".token_params:", "org: malformed reference"),
        ("token_params = 5\n", ".token_params:", "a table of parameter names"),
    ],
)
def test_bad_values_name_the_key(extra: str, where: str, words: str) -> None:
    [line] = refused(extra)
    assert line.startswith(f'k.toml: credentials["billing"]{where}'), line
    assert words in line


def test_an_api_key_refuses_them() -> None:
    text = CONFIG.replace('kind = "oauth_client"', 'kind = "api_key"').replace(
        'client_id = "billing-app"\nclient_secret = "env:BILLING_SECRET"\n', ""
    )
    text += 'probe = "/v1/me"\nrotation = { max_age = "30d", rotator = "m" }\n'
    text += 'audience = "https://api.example.com"\n[[rotators]]\nname = "m"\ntype = "manual"\n'
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "k.toml", {})
    [line] = caught.value.problems
    assert line.startswith('k.toml: credentials["billing"].audience: not allowed for kind "api')


def test_the_environment_sets_them() -> None:
    credential = load(
        "",
        {
            "KEYTURN_CREDENTIALS_BILLING_RESOURCE": "https://a.example/,https://b.example/",
            "KEYTURN_CREDENTIALS_BILLING_TOKEN_PARAMS": '{"organization": "org_7"}',
        },
    )
    assert credential.resource == ("https://a.example/", "https://b.example/")
    assert credential.token_params == (("organization", SecretRef.inline("org_7")),)


# -- the request body -----------------------------------------------------------------------

PARAMS = TokenParams(
    "https://api.example.com",
    ("https://a.example/", "https://b.example/"),
    (("organization", Secret("org_42")),),
)


def client_for(handler: httpx.MockTransport, token_request: str) -> ProviderClient:
    provider = ProviderConfig(
        name="idp",
        base_url="https://idp.example.com",
        token_request=token_request,  # type: ignore[arg-type]
    )
    return ProviderClient(provider, clock=FakeClock(), transport=handler)


def answering(sent: list[httpx.Request], response: httpx.Response) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return response

    return httpx.MockTransport(handle)


OK = httpx.Response(200, json={"access_token": "at", "token_type": "Bearer", "expires_in": 60})


async def request(client: ProviderClient, params: TokenParams) -> None:
    await client.request_token(
        "billing",
        grant_type="client_credentials",
        client_id="billing-app",
        client_secret=Secret("cs-value"),
        params=params,
    )


async def test_a_form_body_repeats_each_resource() -> None:
    sent: list[httpx.Request] = []
    await request(client_for(answering(sent, OK), "form"), PARAMS)
    body = parse_qs(sent[0].content.decode())
    assert body["resource"] == ["https://a.example/", "https://b.example/"]
    assert body["audience"] == ["https://api.example.com"]
    assert body["organization"] == ["org_42"]
    assert body["grant_type"] == ["client_credentials"]


async def test_a_json_body_has_one_resource_as_a_string_and_several_as_an_array() -> None:
    sent: list[httpx.Request] = []
    client = client_for(answering(sent, OK), "json")
    await request(client, PARAMS)
    await request(client, TokenParams(resources=("https://a.example/",)))
    several, one = (json.loads(r.content) for r in sent)
    assert several["resource"] == ["https://a.example/", "https://b.example/"]
    assert several["audience"] == "https://api.example.com"
    assert several["organization"] == "org_42"
    assert one["resource"] == "https://a.example/" and "audience" not in one


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            {"error": "invalid_target", "error_description": "unknown resource"},
            "the server refused resource in the credential's configuration",
        ),
        (
            {"error": "invalid_request", "error_description": "Unknown parameter organization"},
            "the server refused token_params.organization in the",
        ),
        (
            {"error": "access_denied", "error_description": "Service not found"},
            "check audience, resource, token_params.organization in the",
        ),
    ],
)
async def test_a_refusal_names_the_key(answer: dict[str, str], message: str) -> None:
    sent: list[httpx.Request] = []
    client = client_for(answering(sent, httpx.Response(400, json=answer)), "form")
    with pytest.raises(ParameterRefused) as caught:
        await request(client, PARAMS)
    assert str(caught.value).startswith(f"billing: token endpoint returned {answer['error']}")
    assert message in str(caught.value)
    assert caught.value.error == answer["error"]  # the metric's outcome is the server's code


async def test_a_refusal_without_parameters_is_unchanged() -> None:
    sent: list[httpx.Request] = []
    answer = httpx.Response(400, json={"error": "invalid_request"})
    with pytest.raises(OAuthError) as caught:
        await request(client_for(answering(sent, answer), "form"), TokenParams())
    assert not isinstance(caught.value, ParameterRefused)


async def test_a_description_echoing_a_parameter_value_is_withheld() -> None:
    sent: list[httpx.Request] = []
    answer = httpx.Response(400, json={"error": "invalid_request", "error_description": "org_42"})
    with pytest.raises(OAuthError) as caught:
        await request(client_for(answering(sent, answer), "form"), PARAMS)
    assert "org_42" not in str(caught.value)


# -- what the server returned ---------------------------------------------------------------


def jwt(claims: object) -> Secret:
    def part(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return Secret(f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl")


@pytest.mark.parametrize(
    ("token", "audience"),
    [
        (jwt({"aud": "https://api.example.com"}), ("https://api.example.com",)),
        (jwt({"aud": ["a", "b"]}), ("a", "b")),
        (jwt({"sub": "x"}), None),
        (jwt({"aud": 5}), None),
        (jwt([1]), None),
        (Secret("opaque-token"), None),
        (Secret("a.!!!.c"), None),
        (Secret("a.bm90IGpzb24.c"), None),
    ],
)
def test_the_aud_of_a_jwt_access_token(token: Secret, audience: tuple[str, ...] | None) -> None:
    assert token_audience(token) == audience


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(86400, 86400.0), ("3600", 3600.0), (0, None), (-5, None), ("soon", None), (None, None)],
)
def test_refresh_expires_in_is_read_or_ignored(value: object, seconds: float | None) -> None:
    body = {"access_token": "at", "token_type": "Bearer", "refresh_token": "rt"}
    if value is not None:
        body["refresh_expires_in"] = value  # type: ignore[assignment]
    token = parse_token_response(json.dumps(body).encode(), "billing")
    assert token.refresh_expires_in == seconds
    assert token.refresh_token == Secret("rt")  # never lost over it


def test_the_family_ends_at_the_earlier_end() -> None:
    held = RefreshTokenRecord(token=Secret("rt"), expires_at=5000.0, family_started=1000.0)
    assert held.family_ends_at(None) == 5000.0
    assert held.family_ends_at(3000.0) == 4000.0
    assert held.family_ends_at(10000.0) == 5000.0
    assert RefreshTokenRecord(token=Secret("rt"), family_started=1.0).family_ends_at(None) is None
    assert RefreshTokenRecord(expires_at=5.0).family_ends_at(None) is None  # none held
    assert held.burn().family_ends_at(1.0) is None


# -- the refresh, over fakes ----------------------------------------------------------------

DAY = 86400.0


class Inputs:
    async def client(self, *, fresh: bool = False) -> tuple[str, Secret]:
        return "cid", Secret("cs-secret-value")

    async def refresh_token(self) -> Secret | None:
        return None

    async def initial_key(self) -> tuple[Secret, str | None] | None:
        return None


class World:
    def __init__(self, **server: object) -> None:
        self.clock = FakeClock()
        self.store = FakeVaultStore(clock=self.clock)
        self.server = FakeOAuthServer(**server)  # type: ignore[arg-type]
        self.observer = RecordingObserver()
        self.provider = ProviderConfig(
            name="acme", base_url="https://acme.test", refresh_token_max_lifetime=30 * DAY
        )

    def job(self, environ: dict[str, str] | None = None, **options: object) -> object:
        client = ProviderClient(self.provider, clock=self.clock, transport=self.server.transport())
        credential = CredentialConfig(
            name="reporting",
            provider="acme",
            client_id=SecretRef.inline("cid"),
            client_secret=SecretRef.env("UNUSED"),
            publish_to="apps/reporting/acme",
            refresh=RefreshPolicy(at=0.66, jitter=0.1, margin=60),
            **options,  # type: ignore[arg-type]
        )
        deps = JobDeps(
            store=self.store,
            observer=self.observer,
            clock=self.clock,
            rng=random.Random(3),
            instance_id="i-1",
            environ=environ or {},
        )
        return build_job(credential, client, None, Inputs(), deps)

    async def state(self) -> CredentialState:
        entry = await self.store.read("keyturn/state/reporting")
        assert entry is not None
        return CredentialState.from_data(entry.data, "reporting")


async def test_every_grant_carries_the_parameters_with_references_read_afresh() -> None:
    world = World()
    environ = {"TENANT": "t-1"}
    job = world.job(
        environ,
        audience="https://api.example.com",
        resource=("https://a.example/",),
        token_params=(("tenant", SecretRef.env("TENANT")),),
    )
    await job.run()  # type: ignore[attr-defined]
    environ["TENANT"] = "t-2"
    world.clock.advance(600)
    await job.run()  # type: ignore[attr-defined]
    first, second = world.server.bodies
    assert (first["grant_type"], second["grant_type"]) == ("client_credentials", "refresh_token")
    for body, tenant in ((first, "t-1"), (second, "t-2")):
        assert body["audience"] == "https://api.example.com"
        assert body["resource"] == "https://a.example/"
        assert body["tenant"] == tenant


async def test_an_unreadable_parameter_reference_names_the_key() -> None:
    world = World()
    job = world.job(token_params=(("tenant", SecretRef.env("MISSING")),))
    outcome = await job.run()  # type: ignore[attr-defined]
    assert outcome.action == "failed"
    assert isinstance(outcome.error, SecretReferenceError)
    assert str(outcome.error).startswith("reporting: token_params.tenant: env:MISSING")
    assert world.server.bodies == []  # nothing sent without it


async def test_a_refused_parameter_fails_the_run_naming_it_and_backs_off() -> None:
    world = World()
    world.server.next_responses = [
        httpx.Response(400, json={"error": "invalid_target", "error_description": "no"})
    ] * 3
    job = world.job(resource=("https://a.example/",))
    dues = []
    for _ in range(3):
        outcome = await job.run()  # type: ignore[attr-defined]
        dues.append(outcome.next_due - world.clock.time())
        world.clock.advance(dues[-1])
    assert "the server refused resource" in str(outcome.error)
    failed = [e for e in world.observer.events if isinstance(e, Failed)]
    assert [e.failures for e in failed] == [1, 2, 3]  # the third raises credential_failing
    assert dues[0] < dues[2]  # backing off
    assert "the server refused resource" in ((await world.state()).token.last_error or "")


async def test_grant_drift_learns_the_aud() -> None:
    world = World(access_claims={"aud": "https://api.example.com"})
    job = world.job(audience="https://api.example.com")
    await job.run()  # type: ignore[attr-defined]
    assert (await world.state()).token.audience == "https://api.example.com"
    assert not [e for e in world.observer.events if isinstance(e, Suspicious)]
    world.server.access_claims = {"aud": ["https://other.example.com"]}
    world.clock.advance(600)
    await job.run()  # type: ignore[attr-defined]
    [drift] = [e for e in world.observer.events if isinstance(e, Suspicious)]
    assert drift.detector == "grant_drift"
    assert "does not include the audience asked for ('https://api.example.com')" in drift.detail
    assert "secretvalue" not in drift.detail


async def test_a_changed_aud_is_drift_even_without_an_audience_asked() -> None:
    world = World(access_claims={"aud": "a"})
    job = world.job()
    await job.run()  # type: ignore[attr-defined]
    world.server.access_claims = {"aud": "b"}
    world.clock.advance(600)
    await job.run()  # type: ignore[attr-defined]
    [drift] = [e for e in world.observer.events if isinstance(e, Suspicious)]
    assert "aud ['b'] differs from the previous token's ('a')" in drift.detail


async def test_the_family_end_is_kept_in_the_record_and_reported() -> None:
    world = World(refresh_expires_in=int(10 * DAY))
    job = world.job()
    started = world.clock.time()
    await job.run()  # type: ignore[attr-defined]
    state = await world.state()
    assert state.refresh.family_started == started
    assert state.refresh.expires_at == started + 10 * DAY
    # An absolute end counted down by the server reads as one fixed time.
    world.clock.advance(600)
    world.server.refresh_expires_in = int(10 * DAY - 600 + 2)
    await job.run()  # type: ignore[attr-defined]
    assert (await world.state()).refresh.expires_at == started + 10 * DAY
    # A sliding end moves forward.
    world.clock.advance(600)
    world.server.refresh_expires_in = int(10 * DAY)
    await job.run()  # type: ignore[attr-defined]
    state = await world.state()
    assert state.refresh.expires_at == started + 1200 + 10 * DAY
    assert state.refresh.family_started == started  # a refresh keeps the family
    ends = [e.ends_at for e in world.observer.events if isinstance(e, RefreshTokenPlanned)]
    assert ends[-1] == started + 1200 + 10 * DAY


async def test_the_provider_lifetime_ends_the_family_and_status_shows_it() -> None:
    world = World()  # no refresh_expires_in: the provider's 30 days decide
    job = world.job()
    started = world.clock.time()
    await job.run()  # type: ignore[attr-defined]
    world.clock.advance(600)
    await job.run()  # type: ignore[attr-defined]
    ends = [e.ends_at for e in world.observer.events if isinstance(e, RefreshTokenPlanned)]
    assert ends[-1] == started + 30 * DAY
    config = parse_config(
        CONFIG.replace('name = "idp"', 'name = "acme"')
        .replace('provider = "idp"', 'provider = "acme"')
        .replace('name = "billing"', 'name = "reporting"')
        .replace("apps/billing/idp", "apps/reporting/acme"),
        "k.toml",
        {},
    )
    [row] = await status_rows(config, world.store, world.clock)
    assert row.refresh_token_ends_at == started + 30 * DAY
    assert row.as_json()["refresh_token_ends_at"] == rfc3339(started + 30 * DAY)
    header, line = render_table([row], world.clock.time()).splitlines()
    assert "REFRESH TOKEN ENDS" in header
    assert "in 29d" in line


async def test_a_restart_reports_the_family_end_from_the_record() -> None:
    world = World(refresh_expires_in=int(10 * DAY))
    started = world.clock.time()
    await world.job().run()  # type: ignore[attr-defined]
    world.observer.events.clear()
    requests = len(world.server.bodies)
    world.clock.advance(10)
    outcome = await world.job().run()  # type: ignore[attr-defined]  # a new process
    assert outcome.action != "refreshed" and len(world.server.bodies) == requests
    ends = [e.ends_at for e in world.observer.events if isinstance(e, RefreshTokenPlanned)]
    assert ends == [started + 10 * DAY]


async def test_check_resolves_the_parameter_references() -> None:
    tenant = "vault:secret/keyturn/inputs/billing#tenant"
    config = parse_config(
        CONFIG + f'token_params = {{ organization = "org_1", tenant = "{tenant}" }}\n',
        "k.toml",
        {},
    )
    assert vault_references(config) == [
        (
            "credentials['billing'].token_params.tenant",
            SecretRef.vault("secret", "keyturn/inputs/billing", "tenant"),
        )
    ]
    found = await _check_references(config, FakeVaultStore(), skip=set())
    assert [line for line in found if "token_params" in line] == [
        f"credentials['billing'].token_params.tenant: {tenant}: no secret at "
        "secret/keyturn/inputs/billing"
    ], found
