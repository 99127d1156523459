"""keyturn's Helm chart, deploy/helm/keyturn, through Helm's own engine (no cluster).

The engine is Helm's Go library as the helm-python-sdk wheel bundles it: `helm lint`, the
values schema and the rendering are Helm's, not a re-implementation. What it renders is
checked as test_deploy_files.py checks deploy/kubernetes (which is this chart rendered with its
defaults: scripts/render-kubernetes.py): against the Kubernetes API's schemas, the
ConfigMap's keyturn.toml with keyturn's own configuration loader, the PrometheusRule with
promtool.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
import yaml

import keyturn
from keyturn.config import Config, parse_config

if TYPE_CHECKING:
    from helm_python import Chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "keyturn"
SAMPLES = sorted((CHART / "ci").glob("*.yaml"))
KUBERNETES_AUTH = CHART / "ci" / "kubernetes-auth-values.yaml"
APPROLE = CHART / "ci" / "approle-values.yaml"
RULES = ROOT / "deploy" / "prometheus" / "keyturn-rules.yml"
RELEASE = NAMESPACE = "keyturn"
# Not in the Kubernetes API: the Prometheus Operator's CRDs (their schemas: tests/data/crds).
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
CrdErrors = Callable[[dict[str, Any]], list[str]]  # the crd_errors fixture (tests/conftest.py)


@pytest.fixture(scope="module")
def helm() -> ModuleType:
    """Helm's engine. Imported by the tests that use it, not at collection: importing it starts
    Go's runtime in the process, and only the worker that runs this module needs that."""
    import helm_python  # noqa: PLC0415

    return helm_python


@pytest.fixture(scope="module")
def chart(helm: ModuleType) -> Iterator[Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def sample(path: Path) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(path.read_text())
    return values


def render(chart: Chart, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The objects a `helm install keyturn -n keyturn` with these values would create."""
    manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)
    objects = []
    for template, text in manifests.items():
        if template.endswith(".txt"):
            continue  # NOTES.txt: printed, not applied
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc is not None)
    return objects


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (keyturn_container,) = one(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    return keyturn_container


def lay_out(objects: list[dict[str, Any]], root: Path) -> Path:
    """The pod's files under `root`: the ConfigMap's keys where it is mounted (their paths moved
    under `root` too), a certificate made with openssl where the TLS Secret is mounted, the
    other volumes' directories. Returns the configuration file's path."""
    mounts = {m["name"]: m["mountPath"] for m in container(objects)["volumeMounts"]}
    moved = re.compile("|".join(re.escape(f"{path}/") for path in mounts.values()))
    for path in mounts.values():
        (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    config_dir = root / mounts["config"].lstrip("/")
    for key, text in one(objects, "ConfigMap")["data"].items():
        (config_dir / key).write_text(moved.sub(lambda m: f"{root}{m[0]}", text))
    if "metrics-tls" in mounts:
        tls_dir = root / mounts["metrics-tls"].lstrip("/")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "1", "-subj", "/CN=keyturn-metrics.keyturn.svc",
             "-keyout", str(tls_dir / "tls.key"), "-out", str(tls_dir / "tls.crt")],
            check=True, capture_output=True,
        )  # fmt: skip
    args = container(objects)["args"]
    return root / args[args.index("-c") + 1].lstrip("/")


def pod_config(objects: list[dict[str, Any]], pod: str, root: Path) -> Config:
    """The configuration keyturn loads in `pod`: the ConfigMap's file, the pod's environment."""
    environ = {}
    for variable in container(objects)["env"]:
        if "valueFrom" in variable:
            assert variable["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
            environ[variable["name"]] = pod
        else:
            environ[variable["name"]] = variable["value"]
    path = lay_out(objects, root)
    return parse_config(path.read_text(), str(path), environ)


def test_the_chart_is_released_at_keyturns_version(chart: Chart) -> None:
    metadata = chart.metadata
    versions = (metadata["version"], metadata["appVersion"])
    assert versions == (keyturn.__version__,) * 2, "Chart.yaml: keyturn's __version__, twice"
    objects = render(chart)
    assert container(objects)["image"] == f"registry.example.com/keyturn:{keyturn.__version__}"


@pytest.mark.parametrize("values", [None, *SAMPLES], ids=lambda p: p.name if p else "defaults")
def test_helm_lint_finds_nothing(helm: ModuleType, values: Path | None) -> None:
    report = helm.lint(CHART, sample(values) if values else None, strict=True, namespace=NAMESPACE)
    findings = [m for m in report["messages"] if m["error"] != "icon is recommended"]
    assert (findings, report["errors"]) == ([], [])


def test_the_kustomize_manifests_are_the_chart_rendered_with_its_defaults() -> None:
    spec = importlib.util.spec_from_file_location(
        "render_kubernetes", ROOT / "scripts" / "render-kubernetes.py"
    )
    assert spec is not None
    assert spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rendered = script.render_kubernetes()
    kubernetes = ROOT / "deploy" / "kubernetes"
    on_disk = {p.name for p in kubernetes.glob("*.yaml")} - {"kustomization.yaml", "namespace.yaml"}
    assert set(rendered) == on_disk
    stale = [name for name, text in rendered.items() if (kubernetes / name).read_text() != text]
    assert stale == [], "run: .venv/bin/python scripts/render-kubernetes.py"


@pytest.mark.parametrize("values", [None, *SAMPLES], ids=lambda p: p.name if p else "defaults")
def test_every_object_is_valid_against_the_kubernetes_api_schema(
    chart: Chart, values: Path | None, crd_errors: CrdErrors
) -> None:
    """The API's own kinds with kubernetes-validate, the operator's with its CRDs' schemas."""
    import kubernetes_validate  # noqa: PLC0415 - test dependency, only here

    version = kubernetes_validate.latest_version()
    objects = render(chart, sample(values) if values else None)
    # test_deploy_files.py checks the defaults' lock-down (deploy/kubernetes); no sample loosens it.
    defaults = render(chart)
    assert container(objects)["securityContext"] == container(defaults)["securityContext"]
    pod, default_pod = (
        one(o, "StatefulSet")["spec"]["template"]["spec"] for o in (objects, defaults)
    )
    assert pod["securityContext"] == default_pod["securityContext"]
    for document in objects:
        assert document["metadata"]["namespace"] == NAMESPACE, document["kind"]
        if document["kind"] in OPERATOR_KINDS:
            assert crd_errors(document) == [], document["kind"]
        else:
            kubernetes_validate.validate(document, version, strict=True)
    kinds = sorted(o["kind"] for o in objects)
    expected = {"ConfigMap", "NetworkPolicy", "Service", "ServiceAccount", "StatefulSet"}
    if values != APPROLE:
        expected.add("PodDisruptionBudget")
    if values == KUBERNETES_AUTH:
        expected |= OPERATOR_KINDS
    assert kinds == sorted(expected)


def test_the_three_replica_kubernetes_auth_sample_gives_each_pod_its_configuration(
    chart: Chart, tmp_path: Path
) -> None:
    objects = render(chart, sample(KUBERNETES_AUTH))
    statefulset = one(objects, "StatefulSet")
    pods = [f"keyturn-{ordinal}" for ordinal in range(statefulset["spec"]["replicas"])]
    assert pods == ["keyturn-0", "keyturn-1", "keyturn-2"]
    configs = [pod_config(objects, pod, tmp_path / pod) for pod in pods]
    assert [c.keyturn.instance_id for c in configs] == pods
    config = configs[0]
    # Whole numbers stay integers in the TOML (Helm reads every number as a float).
    assert config.keyturn.max_concurrency == 32
    assert config.vault.timeout == 5.5
    assert config.vault.address == "https://vault.example.com:8200"
    assert config.vault.namespace == "admin/platform"
    auth = config.vault.auth
    assert auth.__class__.__name__ == "KubernetesAuth"
    assert (auth.role, auth.mount) == ("keyturn", "kubernetes-prod")  # type: ignore[union-attr]
    # The token keyturn logs in with is mounted, from the ServiceAccount the Vault role names.
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    assert str(auth.jwt_path) == "/var/run/secrets/kubernetes.io/serviceaccount/token"  # type: ignore[union-attr]
    # Vault's CA is where [vault] ca_cert says, from the extra volume.
    mounts = {m["mountPath"]: m["name"] for m in container(objects)["volumeMounts"]}
    assert config.vault.ca_cert is not None
    assert mounts[f"/{config.vault.ca_cert.parent.relative_to(tmp_path / pods[0])}"] == "vault-ca"
    assert "vault-ca" in {v["name"] for v in pod["volumes"]}
    assert container(objects)["resources"]["limits"] == {"memory": "1Gi"}


def test_https_metrics_load_with_the_certificate_from_the_tls_secret(
    chart: Chart, tmp_path: Path
) -> None:
    """web.yml beside keyturn.toml, the certificate from the Secret, the probes in HTTPS."""
    objects = render(chart, sample(KUBERNETES_AUTH))
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["metrics-tls"]["secret"]["secretName"] == "keyturn-metrics-tls"
    config = pod_config(objects, "keyturn-0", tmp_path)
    assert config.metrics.web_config is not None
    assert config.metrics.web_config.tls is not None
    assert set(config.metrics.web_config.users) == {"prometheus"}
    assert config.metrics.open_paths == {"/healthz", "/readyz"}  # the kubelet has no password
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container(objects)[probe]["httpGet"]["scheme"] == "HTTPS", probe
    # Without web.yml, plain HTTP: no scheme, no web_config.
    plain = render(chart)
    assert "scheme" not in container(plain)["livenessProbe"]["httpGet"]
    assert "web.yml" not in one(plain, "ConfigMap")["data"]
    assert pod_config(plain, "keyturn-0", tmp_path / "plain").metrics.web_config is None


def test_the_servicemonitor_scrapes_https_with_the_operators_fields(chart: Chart) -> None:
    objects = render(chart, sample(KUBERNETES_AUTH))
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"]) == ("metrics", "https")
    tls = endpoint["tlsConfig"]
    assert set(tls) == {"serverName", "ca", "cert", "keySecret"}  # the operator's SafeTLSConfig
    assert set(tls["ca"]["secret"]) == set(tls["cert"]["secret"]) == {"name", "key"}
    assert set(tls["keySecret"]) == {"name", "key"}
    auth = endpoint["basicAuth"]
    assert set(auth) == {"username", "password"}
    assert all(set(ref) == {"name", "key"} for ref in auth.values())
    # the Service's DNS name, which the server certificate must carry
    meta = one(objects, "Service")["metadata"]
    assert tls["serverName"] == f"{meta['name']}.{meta['namespace']}.svc"
    # the user Prometheus sends is one web.yml knows
    web = yaml.safe_load(one(objects, "ConfigMap")["data"]["web.yml"])
    assert set(web["basic_auth_users"]) == {"prometheus"}


def test_a_misspelt_servicemonitor_endpoint_field_is_caught(
    chart: Chart, crd_errors: CrdErrors
) -> None:
    """serviceMonitor.endpoint is the operator's to define: its CRD's schema, not the chart's,
    refuses a field it does not have (an API server would drop it, and scrape plain HTTP)."""
    values = sample(KUBERNETES_AUTH)
    values["serviceMonitor"]["endpoint"]["tlsconfig"] = values["serviceMonitor"]["endpoint"].pop(
        "tlsConfig"
    )
    monitor = one(render(chart, values), "ServiceMonitor")
    assert crd_errors(monitor) == [
        "spec/endpoints/0: Additional properties are not allowed ('tlsconfig' was unexpected)"
    ]


def test_approle_reads_its_ids_from_the_secret_it_mounts(chart: Chart, tmp_path: Path) -> None:
    objects = render(chart, sample(APPROLE))
    config = pod_config(objects, "keyturn-0", tmp_path)
    auth = config.vault.auth
    assert auth.__class__.__name__ == "AppRoleAuth"
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # no Kubernetes token needed
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "keyturn-approle"
    (mount,) = [m for m in container(objects)["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    for ref, key in ((auth.role_id, "role_id"), (auth.secret_id, "secret_id")):  # type: ignore[union-attr]
        assert ref.scheme == "file"
        assert ref.path == f"{tmp_path}{mount['mountPath']}/{key}"


def test_token_file_reads_the_token_vault_agent_keeps_current(chart: Chart, tmp_path: Path) -> None:
    auth = {"method": "token_file", "tokenFile": {"path": "/vault/secrets/token"}}
    objects = render(chart, {"vault": {"auth": auth}})
    config = pod_config(objects, "keyturn-0", tmp_path)
    assert config.vault.auth.__class__.__name__ == "TokenFileAuth"
    assert str(config.vault.auth.path) == "/vault/secrets/token"  # type: ignore[union-attr]
    # Vault Agent's sidecar logs in with the pod's ServiceAccount token.
    assert one(objects, "StatefulSet")["spec"]["template"]["spec"]["automountServiceAccountToken"]


def test_the_whole_file_is_mounted_as_written(chart: Chart) -> None:
    text = (ROOT / "deploy" / "keyturn.example.toml").read_text()
    objects = render(chart, {"config": {"file": text}})
    assert one(objects, "ConfigMap")["data"]["keyturn.toml"].rstrip("\n") == text.rstrip("\n")


def test_the_prometheus_rule_is_the_shipped_rules_file_and_passes_promtool(
    chart: Chart, tmp_path: Path
) -> None:
    rule = one(render(chart, sample(KUBERNETES_AUTH)), "PrometheusRule")
    shipped = yaml.safe_load(RULES.read_text())
    base = sample(KUBERNETES_AUTH)["prometheusRule"]["runbookBaseUrl"]
    runbooks = []
    for group in shipped["groups"]:
        for entry in group["rules"]:
            url = entry.get("annotations", {}).get("runbook_url")
            if url:
                entry["annotations"]["runbook_url"] = url.replace("docs/runbook.md#", base)
                runbooks.append(entry["annotations"]["runbook_url"])
    assert rule["spec"] == {"groups": shipped["groups"]}
    assert runbooks
    assert all(url.startswith("https://wiki.example.com/keyturn/runbook#") for url in runbooks)
    promtool = shutil.which("promtool")
    assert promtool, "promtool: bash scripts/system-deps.sh (Debian's prometheus package)"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "rules.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"replicas": 0}, "/replicas"),
        ({"replicas": "3"}, "/replicas"),
        ({"replicaCount": 3}, "replicaCount"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"vault": {"auth": {"method": "userpass"}}}, "/vault/auth/method"),
        ({"vault": {"auth": {"method": "approle"}}}, "/vault/auth/approle/secretName"),
        ({"vault": {"auth": {"method": "token_file"}}}, "/vault/auth/tokenFile/path"),
        ({"vault": {"caCert": "ca.crt"}}, "/vault/caCert"),
        ({"vault": {"address": "https://vault.example.com:8200/"}}, "/vault/address"),
        ({"config": {"vault": {"address": "https://elsewhere:8200"}}}, "address"),
        ({"config": {"credentials": [{"provider": "acme"}]}}, "/config/credentials/0"),
        ({"metrics": {"port": 70000}}, "/metrics/port"),
        ({"resources": {"limit": {"memory": "1Gi"}}}, "limit"),
    ],
)
def test_the_schema_refuses_a_wrong_value_naming_it(
    helm: ModuleType, chart: Chart, values: dict[str, Any], named: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    lines = [line for line in str(refused.value).splitlines() if line.lstrip().startswith("- at")]
    assert lines, str(refused.value)
    assert any(named in line for line in lines), lines


def test_every_value_is_in_the_schema_and_the_defaults_pass_it(chart: Chart) -> None:
    """values.yaml and values.schema.json list the same keys, two levels down."""
    schema = chart.schema
    assert schema is not None
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    chart.validate_schema(chart.values)

    def keys(values: dict[str, Any], node: dict[str, Any], prefix: str = "") -> Iterator[str]:
        assert node.get("additionalProperties") is False, prefix or "(top)"
        assert set(values) <= set(node["properties"]), prefix
        for key, value in values.items():
            yield prefix + key
            child = node["properties"][key]
            if isinstance(value, dict) and child.get("additionalProperties") is False:
                yield from keys(value, child, f"{prefix}{key}.")

    listed = set(keys(chart.values, schema))
    assert {"replicas", "vault.auth.kubernetes.role", "vault.auth.approle.secretName"} <= listed
    assert set(schema["properties"]) == set(chart.values)


def documented_sets(helm: ModuleType, command: str) -> dict[str, Any]:
    """The values a documented `helm install|upgrade … --set k=v …` passes, as Helm parses them."""
    values: dict[str, Any] = {}
    for expression in re.findall(r"--set (\S+)", command):
        values = merge(values, helm.parse_set_string(expression))
    return values


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def test_the_documented_helm_commands_use_the_chart_as_it_is(
    helm: ModuleType, chart: Chart, tmp_path: Path
) -> None:
    """docs/install-containers.md: its values file and `--set`s pass the schema and render;
    the refusal it shows is the one Helm gives."""
    docs = (ROOT / "docs" / "install-containers.md").read_text()
    section = docs[docs.index("## Helm") : docs.index("## The image")]
    (values_block,) = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    documented = yaml.safe_load(values_block)
    commands = re.findall(r"^helm (?:install|upgrade) .*$", section, re.MULTILINE)
    assert len(commands) == 2
    for command in commands:
        assert command.split()[1:4] == [command.split()[1], "keyturn", "deploy/helm/keyturn"]
        assert "-f keyturn-values.yaml" in command
        objects = render(chart, merge(documented, documented_sets(helm, command)))
        pod_config(objects, "keyturn-0", tmp_path / command.split()[1])
    refused = re.search(
        r"`(helm\s+install [^`]+)` stops with:\n\n```\n(.*?)```", section, re.DOTALL
    )
    assert refused is not None
    with pytest.raises(helm.HelmValuesError) as error:
        chart.render(documented_sets(helm, " ".join(refused[1].split())), name=RELEASE)
    assert str(error.value).strip() == refused[2].strip()
