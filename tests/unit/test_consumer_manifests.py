"""deploy/consumers/: the Kubernetes consumer examples and the agent's interval, as files.

No cluster runs here, so the manifests in deploy/consumers/kubernetes/ are checked as files:
yamllint; kubernetes-validate for the Kubernetes API's own kinds; `jsonschema` against the
operators' CRD schemas in tests/data/crds/ (External Secrets Operator: vendored; Vault Secrets
Operator: a subset written here, see its README) made strict, so a misspelt field is refused
rather than silently pruned. Every interval is checked against the rule of
deploy/consumers/README.md, computed from keyturn's own refresh policy
(`keyturn_devkit.dev.agent.max_consumer_lag`): a consumer's copy may lag Vault by at most half the
time keyturn's new value is in Vault before the old one expires, 0.12 x the lifetime with the
defaults. The examples are written for 1 h tokens. The paths, names and keys are checked
against each other, against keyturn's configuration in deploy/kubernetes/configmap.yaml and
against the app policy template deploy/vault/app.hcl.

tests/integration/test_consumer_bao_agent.py runs the agent's files for real.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyturn.config import Config, parse_config
from keyturn.policy import RefreshPolicy
from keyturn_devkit.dev.agent import agent_render_interval, max_consumer_lag, replacement_window

ROOT = Path(__file__).resolve().parents[2]
CONSUMERS = ROOT / "deploy" / "consumers"
KUBERNETES = CONSUMERS / "kubernetes"
AGENT = CONSUMERS / "bao-agent"
CRDS = ROOT / "tests" / "data" / "crds"
CrdErrors = Callable[[dict[str, Any]], list[str]]  # the crd_errors fixture (tests/conftest.py)
YAMLLINT_CONFIG = ROOT / "deploy" / ".yamllint.yaml"
KEYTURN_CONFIGMAP = ROOT / "deploy" / "kubernetes" / "configmap.yaml"
APP_HCL = ROOT / "deploy" / "vault" / "app.hcl"

TOKEN_LIFETIME = 3600.0  # the examples are written for access tokens of 1 h
# From a change of the Secret to the pod's files: the kubelet's sync period (1 min by default)
# plus its cache. An app that takes the value from an environment variable needs a rollout
# instead; that must fit here too.
DELIVERY = 120.0
BUILTIN_KINDS = {"ServiceAccount", "Deployment"}
OPERATOR_KINDS = {
    "SecretStore",
    "ExternalSecret",
    "VaultConnection",
    "VaultAuth",
    "VaultStaticSecret",
}


# ---- helpers -------------------------------------------------------------------------------


def documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                yield path, document


def resource(kind: str) -> dict[str, Any]:
    found = [doc for _, doc in documents() if doc["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)")


def go_duration(text: str) -> float:
    """Seconds in a Go duration string (time.ParseDuration: "5m", "1h0m0s", "1.5h", "0")."""
    if text == "0":
        return 0.0
    parts = _GO_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(number) * _GO_UNITS[unit] for number, unit in parts)


def keyturn_config() -> Config:
    """keyturn's own configuration in deploy/kubernetes (the ConfigMap's keyturn.toml)."""
    configmap = yaml.safe_load(KEYTURN_CONFIGMAP.read_text())
    return parse_config(configmap["data"]["keyturn.toml"], str(KEYTURN_CONFIGMAP), {})


def published_credential() -> tuple[str, RefreshPolicy]:
    """The credential the examples consume: its publish_to and refresh policy."""
    (credential,) = [c for c in keyturn_config().credentials if c.name == "reporting"]
    return credential.publish_to, credential.refresh


def interval_problems(
    document: dict[str, Any], lifetime: float, policy: RefreshPolicy
) -> list[str]:
    """What is wrong with a consumer resource's refresh interval, by the README's rule."""
    budget = max_consumer_lag(lifetime, policy)
    spec = document["spec"]
    if document["kind"] == "ExternalSecret":
        if spec.get("refreshPolicy", "Periodic") != "Periodic":
            return [f"refreshPolicy {spec['refreshPolicy']}: the Secret would never follow Vault"]
        text = spec.get("refreshInterval", "1h0m0s")  # the CRD's default
        name = "refreshInterval"
    elif document["kind"] == "VaultStaticSecret":
        if "refreshAfter" not in spec:
            return [
                "no refreshAfter: VSO then reads Vault again only for its drift detection "
                "(about every minute, and never with hmacSecretData: false)"
            ]
        text, name = spec["refreshAfter"], "refreshAfter"
    else:
        return []
    interval = go_duration(text)
    if interval <= 0:
        return [f"{name} {text}: the Secret would never follow Vault"]
    if interval + DELIVERY > budget:
        return [
            f"{name} {text}: {interval:g}s + {DELIVERY:g}s delivery exceeds the lag budget "
            f"{budget:.0f}s for tokens of {lifetime:g}s"
        ]
    return []


# ---- files and schemas ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", sorted(KUBERNETES.glob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_yamllint_finds_nothing(path: Path) -> None:
    from yamllint import linter  # noqa: PLC0415 - test dependency, only here
    from yamllint.config import YamlLintConfig  # noqa: PLC0415

    config = YamlLintConfig(file=str(YAMLLINT_CONFIG))
    problems = [
        f"{path.name}:{p.line}:{p.column} {p.level} {p.message}"
        for p in linter.run(path.read_text(), config, str(path))
    ]
    assert problems == []


def test_the_examples_hold_the_app_and_both_operators_resources() -> None:
    kinds = sorted(doc["kind"] for _, doc in documents())
    assert kinds == sorted(BUILTIN_KINDS | OPERATOR_KINDS)
    by_file: dict[str, set[str]] = {path.name: set() for path, _ in documents()}
    for path, document in documents():
        by_file[path.name].add(document["kind"])
    assert by_file == {
        "app.yaml": {"ServiceAccount", "Deployment"},
        "external-secrets.yaml": {"SecretStore", "ExternalSecret"},
        "vault-secrets-operator.yaml": {"VaultConnection", "VaultAuth", "VaultStaticSecret"},
    }
    for _, document in documents():
        assert document["metadata"]["namespace"] == "reporting", document["kind"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", document["metadata"]["name"])


def test_the_kubernetes_kinds_are_valid_against_the_kubernetes_api_schema() -> None:
    import kubernetes_validate  # noqa: PLC0415 - test dependency, only here

    version = kubernetes_validate.latest_version()
    for _, document in documents():
        if document["kind"] in BUILTIN_KINDS:
            kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("kind", sorted(OPERATOR_KINDS))
def test_the_operator_resources_are_valid_against_their_crd_schemas(
    kind: str, crd_errors: CrdErrors
) -> None:
    assert crd_errors(resource(kind)) == []


def test_the_strict_schemas_refuse_what_a_cluster_would_drop_or_refuse(
    crd_errors: CrdErrors,
) -> None:
    """The schema check can fail: a misspelt field (which an API server would prune, leaving
    the default interval), a wrong type or enumeration, VSO's one-unit duration."""
    external = copy.deepcopy(resource("ExternalSecret"))
    external["spec"]["refreshIntervall"] = external["spec"].pop("refreshInterval")
    assert crd_errors(external) == [
        "spec: Additional properties are not allowed ('refreshIntervall' was unexpected)"
    ]
    store = copy.deepcopy(resource("SecretStore"))
    store["spec"]["provider"]["vault"]["version"] = "v3"
    store["spec"]["provider"]["vault"]["auth"]["kubernetes"]["serviceAccountRef"]["nme"] = "x"
    assert len(crd_errors(store)) == 2
    static = copy.deepcopy(resource("VaultStaticSecret"))
    static["spec"]["refreshAfter"] = "4m30s"
    static["spec"]["type"] = "kv"
    del static["spec"]["mount"]
    assert len(crd_errors(static)) == 3
    connection = copy.deepcopy(resource("VaultConnection"))
    connection["spec"]["skipTLSVerify"] = "false"
    assert len(crd_errors(connection)) == 1


def test_the_vendored_schemas_are_what_their_readme_says() -> None:
    readme = (CRDS / "README.md").read_text()
    for path in CRDS.glob("*.json"):
        assert f"`{path.name}`" in readme or path.name.startswith("secrets.hashicorp.com_")
        schema = json.loads(path.read_text())
        assert schema["type"] == "object"
        assert {"apiVersion", "kind", "metadata", "spec"} <= set(schema["properties"])
    store = json.loads((CRDS / "external-secrets.io_v1_SecretStore.json").read_text())
    providers = store["properties"]["spec"]["properties"]["provider"]["properties"]
    assert set(providers) == {"vault"}
    assert "x-kubernetes-validations" not in json.dumps(store)


# ---- intervals -----------------------------------------------------------------------------


def test_the_lag_budget_follows_keyturns_refresh_policy() -> None:
    default = RefreshPolicy()
    # keyturn replaces a token no later than at + jitter = 0.76 of its life ...
    assert replacement_window(TOKEN_LIFETIME, default) == pytest.approx(0.24 * 3600 - 1)
    # ... and a consumer may lag by half of what is left: 7 min 11 s for 1 h tokens.
    assert max_consumer_lag(TOKEN_LIFETIME, default) == pytest.approx(431.5)
    assert agent_render_interval(TOKEN_LIFETIME, default) == 431
    # A later refresh leaves less: the budget shrinks with it.
    late = RefreshPolicy(at=0.8, jitter=0.1)
    assert max_consumer_lag(TOKEN_LIFETIME, late) == pytest.approx((360 - 1) / 2)
    # Short tokens: the agent needs 2 s at least, so with keyturn's defaults 21 s tokens are
    # the shortest it can serve; refreshing earlier (at 0.5) leaves room for shorter ones.
    assert agent_render_interval(21, RefreshPolicy(margin=1.0)) == 2
    with pytest.raises(ValueError, match="too short for an agent"):
        agent_render_interval(20, RefreshPolicy(margin=1.0))
    assert agent_render_interval(13, RefreshPolicy(at=0.5, jitter=0.1, margin=1.0)) == 2
    with pytest.raises(ValueError, match="too short for an agent"):
        agent_render_interval(13, RefreshPolicy(margin=1.0))


def test_the_operators_intervals_follow_the_lifetime_rule() -> None:
    _, policy = published_credential()
    external, static = resource("ExternalSecret"), resource("VaultStaticSecret")
    assert interval_problems(external, TOKEN_LIFETIME, policy) == []
    assert interval_problems(static, TOKEN_LIFETIME, policy) == []
    assert external["spec"]["refreshPolicy"] == "Periodic"
    # The figures the README and the comments give.
    assert go_duration(external["spec"]["refreshInterval"]) == 300
    assert go_duration(static["spec"]["refreshAfter"]) == 300
    for name in ("external-secrets.yaml", "vault-secrets-operator.yaml"):
        assert "For access tokens of 1 h" in (KUBERNETES / name).read_text(), name


@pytest.mark.parametrize(
    ("kind", "change", "lifetime"),
    [
        ("ExternalSecret", {"refreshInterval": "1h"}, TOKEN_LIFETIME),  # 1 h tokens, 1 h sync
        ("ExternalSecret", {"refreshInterval": None}, TOKEN_LIFETIME),  # ESO's default: 1h0m0s
        ("ExternalSecret", {"refreshInterval": "10m"}, TOKEN_LIFETIME),
        ("ExternalSecret", {"refreshInterval": "0s"}, TOKEN_LIFETIME),  # created once
        ("ExternalSecret", {"refreshPolicy": "CreatedOnce"}, TOKEN_LIFETIME),
        ("ExternalSecret", {"refreshPolicy": "OnChange"}, TOKEN_LIFETIME),
        ("ExternalSecret", {}, 1800.0),  # 5 min is too slow for 30 min tokens
        ("VaultStaticSecret", {"refreshAfter": "1h"}, TOKEN_LIFETIME),
        ("VaultStaticSecret", {"refreshAfter": None}, TOKEN_LIFETIME),  # never re-read
        ("VaultStaticSecret", {"refreshAfter": "6m"}, TOKEN_LIFETIME),
    ],
)
def test_the_interval_check_refuses_intervals_too_long_for_the_tokens(
    kind: str, change: dict[str, str | None], lifetime: float
) -> None:
    _, policy = published_credential()
    document = copy.deepcopy(resource(kind))
    for key, value in change.items():
        if value is None:
            del document["spec"][key]
        else:
            document["spec"][key] = value
    assert interval_problems(document, lifetime, policy) != []


def test_go_durations_parse_as_go_does() -> None:
    assert go_duration("5m") == 300
    assert go_duration("1h0m0s") == 3600
    assert go_duration("1.5h") == 5400
    assert go_duration("4m30s") == 270
    assert go_duration("500ms") == 0.5
    assert go_duration("0") == 0
    for bad in ("", "5", "5 m", "1d", "m5", "-5m"):
        with pytest.raises(ValueError, match="not a Go duration"):
            go_duration(bad)


def test_the_agents_render_interval_follows_the_lifetime_rule() -> None:
    text = (AGENT / "agent.hcl").read_text()
    (interval,) = re.findall(r'^\s*static_secret_render_interval\s*=\s*"([^"]+)"', text, re.M)
    seconds = go_duration(interval)
    assert seconds == int(seconds) >= 2  # whole seconds (the agent truncates), 2 s at least
    _, policy = published_credential()
    assert seconds <= agent_render_interval(TOKEN_LIFETIME, policy)
    assert "for access tokens of 1 h" in text


# ---- what the consumers read, and how it reaches the app -----------------------------------


def test_the_consumers_read_the_path_keyturn_publishes_with_the_apps_policy() -> None:
    config = keyturn_config()
    publish_to, _ = published_credential()
    mount = config.vault.mount
    data_path = f"{mount}/data/{publish_to}"
    # The app's policy (app.hcl instantiated for publish_to) grants read on exactly that path.
    policy = APP_HCL.read_text().replace("APP_PATH", publish_to)
    assert re.findall(r'^path "([^"]+)"', policy, re.M) == [data_path]
    # ESO: KV v2 at the mount, the key relative to it, data only (no metadata read).
    vault = resource("SecretStore")["spec"]["provider"]["vault"]
    assert (vault["path"], vault["version"]) == (mount, "v2")
    for item in resource("ExternalSecret")["spec"]["data"]:
        assert item["remoteRef"]["key"] == publish_to
        assert item["remoteRef"].get("metadataPolicy", "None") == "None"
    # VSO: the same.
    static = resource("VaultStaticSecret")["spec"]
    assert (static["mount"], static["path"], static["type"]) == (mount, publish_to, "kv-v2")
    # The agent's templates read the same path (the example app is the same one).
    for template in AGENT.glob("*.ctmpl"):
        assert re.findall(r'secret "([^"]+)"', template.read_text()) == [data_path], template
    # Both operators talk to the Vault keyturn uses, over TLS, verifying its certificate.
    assert vault["server"] == config.vault.address.rstrip("/")
    connection = resource("VaultConnection")["spec"]
    assert connection["address"] == config.vault.address.rstrip("/")
    assert connection["skipTLSVerify"] is False
    assert config.vault.address.startswith("https://")


def test_the_operators_log_in_as_the_apps_service_account() -> None:
    account = resource("ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    name = account["metadata"]["name"]
    kubernetes = resource("SecretStore")["spec"]["provider"]["vault"]["auth"]["kubernetes"]
    assert kubernetes["serviceAccountRef"]["name"] == name
    assert kubernetes["role"] == name  # the Vault role of deploy/vault/README.md ("Apps")
    external = resource("ExternalSecret")["spec"]["secretStoreRef"]
    assert external == {"kind": "SecretStore", "name": resource("SecretStore")["metadata"]["name"]}
    auth = resource("VaultAuth")
    assert auth["spec"]["method"] == "kubernetes"
    assert auth["spec"]["kubernetes"] == {"role": name, "serviceAccount": name}
    assert auth["spec"]["vaultConnectionRef"] == resource("VaultConnection")["metadata"]["name"]
    assert resource("VaultStaticSecret")["spec"]["vaultAuthRef"] == auth["metadata"]["name"]
    readme = (ROOT / "deploy" / "vault" / "README.md").read_text()
    assert f"bao write auth/kubernetes/role/{name}" in readme
    assert f"bound_service_account_names={name}" in readme


def test_the_secret_reaches_the_app_as_files_that_update_in_place() -> None:
    external = resource("ExternalSecret")["spec"]
    static = resource("VaultStaticSecret")["spec"]["destination"]
    pod = resource("Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == resource("ServiceAccount")["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False  # the pod never talks to Vault
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    secret = volume["secret"]["secretName"]
    assert external["target"]["name"] == static["name"] == secret
    assert static["create"] is True
    # rolloutRestartTargets (README, for env-configured apps) needs VSO's HMAC of the data.
    assert resource("VaultStaticSecret")["spec"].get("hmacSecretData", True) is True
    keys = {item["key"] for item in volume["secret"]["items"]}
    assert keys == {"authorization", "expires_at", "refresh_at"}
    # Exactly those keys reach the Secret, from either operator (not the whole record).
    assert {item["secretKey"] for item in external["data"]} == keys
    assert {item["remoteRef"]["property"] for item in external["data"]} == keys
    transformation = static["transformation"]
    assert transformation["excludeRaw"] is True
    fields = ["access_token", "token_type", "issued_at", *sorted(keys)]
    included = {f for f in fields if any(re.search(p, f) for p in transformation["includes"])}
    assert included == keys
    # Mounted as a directory (a subPath mount is never updated), read-only, not world-readable.
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert "subPath" not in mount
    assert mount["readOnly"] is True
    assert volume["secret"]["defaultMode"] & 0o007 == 0
    # The app is not handed the value in an environment variable (it would go stale).
    for variable in container.get("env", []):
        assert "valueFrom" not in variable, variable["name"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
