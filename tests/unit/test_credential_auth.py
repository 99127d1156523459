"""`auth = "credential:NAME"`: an http rotator authenticated with the token keyturn keeps for
another credential. At load: an unknown name and a loop are refused, one line each. At run
time: the token is read from where that credential is published, afresh at each call."""

from __future__ import annotations

import random

import httpx
import pytest

from keyturn.clock import FakeClock
from keyturn.config import parse_config
from keyturn.config.credential_auth import CredentialAuth
from keyturn.errors import ConfigError, ProviderUnavailable, RotationError
from keyturn.jobs.job import JobDeps
from keyturn.jobs.steps import ProbeAuth, send_probe
from keyturn.kinds.registry import published_value
from keyturn.providers.client import ProviderClient
from keyturn.references import ReferenceResolver, SecretRef
from keyturn.rotators.base import RotationRequest
from keyturn.rotators.build import build_rotator
from keyturn.rotators.http import HttpRotator
from keyturn.secret import Secret
from keyturn.testing.observer import RecordingObserver
from keyturn.testing.vault import FakeVaultStore
from keyturn_devkit.harness.configs import VAULT

PROVIDER = """
[[providers]]
name = "kc"
base_url = "https://kc.example.com"
"""


def rotator(name: str, auth: str) -> str:
    return f"""
[[rotators]]
name = "{name}"
type = "http"
provider = "kc"
auth = "{auth}"
create = {{ path = "/clients/{{client_id}}/client-secret", value = "/value", id = "/id" }}
revoke = {{ path = "/secrets/{{key_id}}" }}
"""


def credential(name: str, rotated_by: str | None = None) -> str:
    rotation = f'rotation = {{ max_age = "30d", rotator = "{rotated_by}" }}\n' if rotated_by else ""
    return f"""
[[credentials]]
name = "{name}"
provider = "kc"
kind = "oauth_client"
client_id = "{name}-app"
client_secret = "env:{name.upper().replace("-", "_")}_SECRET"
publish_to = "apps/{name}/kc"
{rotation}"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(VAULT + PROVIDER + text, "k.toml", {})
    return caught.value.problems


def test_a_credential_auth_loads() -> None:
    text = rotator("kc-secrets", "credential:kc-admin")
    text += credential("kc-admin") + credential("billing", "kc-secrets")
    config = parse_config(VAULT + PROVIDER + text, "k.toml", {})
    auth = config.rotators["kc-secrets"].auth  # type: ignore[union-attr]
    assert auth == CredentialAuth("kc-admin")
    assert str(auth) == "credential:kc-admin"
    assert published_value(config, config.credential("kc-admin")) == SecretRef.vault(
        "secret", "apps/kc-admin/kc", "access_token"
    )


def test_an_unknown_credential_is_refused_naming_it() -> None:
    [line] = problems(rotator("kc-secrets", "credential:nobody") + credential("billing"))
    assert line == (
        'k.toml: rotators["kc-secrets"].auth: names credential "nobody", which is not a '
        '[[credentials]] entry; expected one of: "billing"'
    )


@pytest.mark.parametrize("value", ["credential:", "credential:Bad Name", "inline-token"])
def test_a_malformed_auth_is_refused(value: str) -> None:
    [line] = problems(rotator("kc-secrets", value) + credential("billing"))
    assert line.startswith('k.toml: rotators["kc-secrets"].auth: ')
    assert 'or "credential:<name>"' in line
    assert "inline-token" not in line  # a pasted secret is never echoed


def test_a_loop_is_refused_in_one_line_naming_it() -> None:
    text = rotator("by-b", "credential:b") + rotator("by-a", "credential:a")
    text += credential("a", "by-b") + credential("b", "by-a") + credential("c", "by-a")
    [line] = problems(text)
    assert line == (
        'k.toml: credentials["a"].rotation.rotator: authenticates through a loop of '
        "credentials: a -> b -> a (a's rotator uses b's token; b's rotator uses a's token); "
        "expected a chain that ends in a credential authenticated otherwise"
    )


def test_a_credential_rotated_with_its_own_token_is_a_loop() -> None:
    [line] = problems(rotator("self", "credential:a") + credential("a", "self"))
    assert "a loop of credentials: a -> a " in line


def test_a_chain_is_not_a_loop() -> None:
    text = rotator("by-b", "credential:b") + rotator("by-c", "credential:c")
    text += credential("a", "by-b") + credential("b", "by-c") + credential("c")
    parse_config(VAULT + PROVIDER + text, "k.toml", {})


# -- at run time -----------------------------------------------------------------------------

CONFIG = parse_config(
    VAULT + PROVIDER + rotator("kc-secrets", "credential:kc-admin") + credential("kc-admin"),
    "k.toml",
    {},
)
REQUEST = RotationRequest("billing", "oauth_client", "r1", "keyturn-billing-r1", "billing-app")


async def built(
    store: FakeVaultStore,
    seen: list[httpx.Request],
    answer: httpx.Response | None = None,
) -> HttpRotator:
    created = httpx.Response(201, json={"value": "new-secret-value", "id": "s1"})

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer or created

    made = await build_rotator(
        CONFIG.rotators["kc-secrets"],
        providers=CONFIG.providers,
        resolver=ReferenceResolver({}, store),
        clock=FakeClock(),
        transport=httpx.MockTransport(handle),
        published=lambda name: published_value(CONFIG, CONFIG.credential(name)),
    )
    assert isinstance(made, HttpRotator)
    return made


async def test_the_token_is_read_afresh_at_each_call() -> None:
    store = FakeVaultStore()
    seen: list[httpx.Request] = []
    made = await built(store, seen)
    await store.write("apps/kc-admin/kc", {"access_token": "admin-token-1"}, cas=None)
    await made.create(REQUEST)
    await store.write("apps/kc-admin/kc", {"access_token": "admin-token-2"}, cas=None)
    await made.revoke(REQUEST, "s0")
    assert [r.headers["Authorization"] for r in seen] == [
        "Bearer admin-token-1",
        "Bearer admin-token-2",
    ]
    await made.aclose()


async def test_no_published_token_fails_the_call_naming_the_auth() -> None:
    seen: list[httpx.Request] = []
    made = await built(FakeVaultStore(), seen)
    with pytest.raises(RotationError) as caught:
        await made.create(REQUEST)
    assert str(caught.value).startswith(
        "billing: rotator kc-secrets: rotators['kc-secrets'].auth: credential:kc-admin: no "
        "published token to use (vault:secret/apps/kc-admin/kc#access_token"
    )
    assert seen == []  # nothing sent without it
    await made.aclose()


async def test_a_refusal_echoing_the_token_does_not_show_it() -> None:
    store = FakeVaultStore()
    await store.write("apps/kc-admin/kc", {"access_token": "tok"}, cas=None)

    made = await built(store, [], httpx.Response(400, json={"error": "tok"}))
    with pytest.raises(RotationError) as caught:
        await made.create(REQUEST)
    assert str(caught.value).endswith("create: unexpected HTTP 400")
    await made.aclose()


def test_the_environment_sets_a_credential_auth() -> None:
    text = rotator("kc-secrets", "env:ADMIN") + credential("kc-admin")
    environ = {"KEYTURN_ROTATORS_KC_SECRETS_AUTH": "credential:kc-admin"}
    config = parse_config(VAULT + PROVIDER + text, "k.toml", environ)
    assert config.rotators["kc-secrets"].auth == CredentialAuth("kc-admin")  # type: ignore[union-attr]


# -- a probe and a registration call authenticated by another credential ----------------------


def key_rotator(name: str, auth: str) -> str:
    """An http rotator for API keys (no {client_id} in its paths)."""
    return rotator(name, auth).replace("/clients/{client_id}/client-secret", "/keys")


def api_key(name: str, rotated_by: str, extra: str = "") -> str:
    return f"""
[[credentials]]
name = "{name}"
provider = "kc"
kind = "api_key"
publish_to = "apps/{name}/key"
probe = "/admin/keys/check"
rotation = {{ max_age = "30d", rotator = "{rotated_by}" }}
{extra}"""


def signing_key(name: str, extra: str) -> str:
    return f"""
[[credentials]]
name = "{name}"
provider = "kc"
kind = "signing_key"
client_id = "{name}-app"
publish_to = "apps/{name}/key"
rotation = {{ max_age = "90d", grace = "1d" }}
registration = {{ method = "rfc7592", client_uri = "https://kc.example.com/reg/{name}"{extra} }}
"""


PROBED = 'probe_auth = "credential:kc-admin"\nprobe_header = "X-Api-Key"\n'


def test_a_probe_and_a_registration_by_another_credential_load() -> None:
    text = key_rotator("kc-secrets", "env:ADMIN") + credential("kc-admin")
    text += api_key("billing", "kc-secrets", PROBED)
    text += signing_key("signer", ', auth = "credential:kc-admin"')
    config = parse_config(VAULT + PROVIDER + text, "k.toml", {})
    billing, signer = config.credential("billing"), config.credential("signer")
    assert billing.probe_auth == CredentialAuth("kc-admin") and billing.probe_header == "X-Api-Key"
    assert signer.registration.auth == CredentialAuth("kc-admin")  # type: ignore[attr-defined]


def test_a_loop_through_a_probe_and_a_registration_is_refused_naming_each_step() -> None:
    text = key_rotator("by-signer", "credential:signer") + credential("kc-admin")
    text += api_key("billing", "by-signer", PROBED.replace("kc-admin", "billing"))
    text += signing_key("signer", ', auth = "credential:billing"')
    text = text.replace('probe_auth = "credential:billing"', 'probe_auth = "credential:signer"')
    [line] = problems(text)
    assert line == (
        'k.toml: credentials["billing"].rotation.rotator: authenticates through a loop of '
        "credentials: billing -> signer -> billing (billing's rotator uses signer's token; "
        "signer's registration uses billing's token); expected a chain that ends in a "
        "credential authenticated otherwise"
    )


def test_a_probe_authenticated_by_its_own_credential_is_a_loop() -> None:
    text = key_rotator("kc-secrets", "env:ADMIN")
    text += api_key("billing", "kc-secrets", PROBED.replace("kc-admin", "billing"))
    [line] = problems(text)
    assert line.startswith('k.toml: credentials["billing"].probe_auth: authenticates through ')
    assert "billing -> billing (billing's probe uses billing's token)" in line


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            'probe_auth = "credential:nobody"\nprobe_header = "X-Api-Key"\n',
            'credentials["billing"].probe_auth: names credential "nobody", which is not a '
            '[[credentials]] entry; expected one of: "billing"',
        ),
        (
            'probe_auth = "credential:billing"\n',
            'credentials["billing"].probe_header: missing, with probe_auth set',
        ),
        (
            'probe_header = "X-Api-Key"\n',
            'credentials["billing"].probe_header: is set without probe_auth',
        ),
        (
            'probe_auth = "env:ADMIN_TOKEN"\nprobe_header = "X-Api-Key"\n',
            'credentials["billing"].probe_auth: got a value that is not one; expected '
            '"credential:<name>"',
        ),
    ],
)
def test_a_probe_auth_problem_names_the_field(extra: str, expected: str) -> None:
    found = problems(
        key_rotator("kc-secrets", "env:ADMIN") + api_key("billing", "kc-secrets", extra)
    )
    assert any(line.startswith(f"k.toml: {expected}") for line in found), found
    assert all("ADMIN_TOKEN" not in line for line in found)


def test_a_registration_with_both_auth_and_an_access_token_is_refused() -> None:
    extra = ', auth = "credential:kc-admin", access_token = "env:RAT"'
    [line] = problems(credential("kc-admin") + signing_key("signer", extra))
    assert line.startswith(
        'k.toml: credentials["signer"].registration.access_token: is set with auth'
    )


def test_an_unknown_registration_auth_is_refused_naming_it() -> None:
    [line] = problems(credential("kc-admin") + signing_key("signer", ', auth = "credential:kc"'))
    assert line.startswith(
        'k.toml: credentials["signer"].registration.auth: names credential "kc", which is not'
    )


async def probed(store: FakeVaultStore, seen: list[httpx.Request], status: int = 200) -> list[int]:
    """Two probes of two new keys, through `probe_auth` (the admin token published in
    `store`), as an api_key's rotation sends them."""
    config = parse_config(
        VAULT
        + PROVIDER
        + key_rotator("kc-secrets", "env:ADMIN")
        + credential("kc-admin")
        + api_key("billing", "kc-secrets", PROBED),
        "k.toml",
        {"ADMIN": "x"},
    )
    deps = JobDeps(
        store=store,
        observer=RecordingObserver(),
        clock=FakeClock(),
        rng=random.Random(1),
        instance_id="i-1",
        published_at=lambda name: published_value(config, config.credential(name)),
    )
    auth = ProbeAuth.of(config.credential("billing"), deps)
    assert auth is not None

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status)

    client = ProviderClient(
        config.providers["kc"], clock=FakeClock(), transport=httpx.MockTransport(handle)
    )
    statuses = []
    for value in ("key-1", "key-2"):
        statuses.append(
            await send_probe(client, "billing", "/admin/keys/check", Secret(value), auth)
        )
        await store.write("apps/kc-admin/kc", {"access_token": "admin-2"}, cas=None)
    await client.aclose()
    return statuses


async def test_a_probe_sends_the_other_credential_s_token_read_afresh_and_its_own_value() -> None:
    store = FakeVaultStore()
    await store.write("apps/kc-admin/kc", {"access_token": "admin-1"}, cas=None)
    seen: list[httpx.Request] = []
    assert await probed(store, seen) == [200, 200]
    assert [(r.headers["Authorization"], r.headers["X-Api-Key"]) for r in seen] == [
        ("Bearer admin-1", "key-1"),
        ("Bearer admin-2", "key-2"),
    ]


async def test_a_probe_with_no_published_admin_token_is_a_probe_without_an_answer() -> None:
    seen: list[httpx.Request] = []
    with pytest.raises(ProviderUnavailable) as caught:
        await probed(FakeVaultStore(), seen)
    assert str(caught.value).startswith(
        "billing: probe_auth: credential:kc-admin: no published token to use"
    )
    assert seen == []


@pytest.mark.parametrize(
    ("tokens", "sent", "status"),
    [
        (["admin-1", "admin-2"], ["admin-1", "admin-2"], 200),  # replaced meanwhile: sent again
        (["admin-1", "admin-1"], ["admin-1"], 401),  # the same token refused: no answer
    ],
)
async def test_a_probe_refused_with_a_token_replaced_meanwhile_is_sent_once_more(
    tokens: list[str], sent: list[str], status: int
) -> None:
    """A server that revokes the admin token at its refresh may refuse the one just read."""
    reads = iter(tokens)
    seen: list[httpx.Request] = []

    async def token() -> Secret:
        return Secret(next(reads))

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200 if request.headers["Authorization"] == "Bearer admin-2" else 401)

    client = ProviderClient(
        CONFIG.providers["kc"], clock=FakeClock(), transport=httpx.MockTransport(handle)
    )
    auth = ProbeAuth(token, "X-Api-Key", "credential:kc-admin")
    if status == 401:
        with pytest.raises(ProviderUnavailable, match="HTTP 401 to probe_auth's token"):
            await send_probe(client, "billing", "/check", Secret("key-1"), auth)
    else:
        assert await send_probe(client, "billing", "/check", Secret("key-1"), auth) == status
    assert [r.headers["Authorization"].removeprefix("Bearer ") for r in seen] == sent
    assert {r.headers["X-Api-Key"] for r in seen} == {"key-1"}
    await client.aclose()
