"""The HTTPS variants the deploy files carry for `[metrics] web_config`, commented out between
"-- HTTPS variant: uncomment --" and "-- end of the HTTPS variant --": uncommented, the
Prometheus configurations pass promtool and the ServiceMonitor has the Prometheus Operator's
fields; the ConfigMap's web.yml uses only keys keyturn reads."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from keyturn.config.webconfig import parse_web_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BEGIN, END = "# -- HTTPS variant: uncomment --", "# -- end of the HTTPS variant --"


def uncommented(text: str) -> str:
    """The file with its HTTPS variant uncommented (and its markers gone)."""
    out, inside, found = [], False, False
    for line in text.splitlines():
        if line.strip() == BEGIN:
            inside = found = True
        elif line.strip() == END:
            inside = False
        else:
            out.append(line.replace("# ", "", 1) if inside else line)
    assert found and not inside, "no complete HTTPS variant"
    return "\n".join(out) + "\n"


def promtool_check(config: dict[str, Any], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool: bash scripts/system-deps.sh (Debian's prometheus package)"
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


def with_files_in(job: dict[str, Any], directory: Path) -> None:
    """The job's TLS and password files, made (empty) in `directory`: promtool wants them."""
    tls, auth = job["tls_config"], job["basic_auth"]
    for holder, key in [(tls, "ca_file"), (tls, "cert_file"), (tls, "key_file")]:
        holder[key] = str(directory / Path(holder[key]).name)
        Path(holder[key]).touch()
    auth["password_file"] = str(directory / "password")
    Path(auth["password_file"]).touch()


def test_the_example_prometheus_configuration_has_an_https_variant(tmp_path: Path) -> None:
    config = yaml.safe_load(uncommented((DEPLOY / "prometheus" / "prometheus.yml").read_text()))
    (job,) = config["scrape_configs"]
    assert job["scheme"] == "https"
    assert set(job["tls_config"]) == {"ca_file", "cert_file", "key_file"}
    assert set(job["basic_auth"]) == {"username", "password_file"}
    with_files_in(job, tmp_path)
    promtool_check(config, tmp_path)


def test_the_kubernetes_prometheus_configuration_has_an_https_variant(tmp_path: Path) -> None:
    text = uncommented((DEPLOY / "prometheus" / "kubernetes.yml").read_text())
    config = yaml.safe_load(text)
    (job,) = config["scrape_configs"]
    assert job["scheme"] == "https"
    assert job["tls_config"]["server_name"] == "keyturn-metrics.keyturn.svc"
    with_files_in(job, tmp_path)
    del job["kubernetes_sd_configs"]  # Debian's promtool has no Kubernetes discovery
    job["static_configs"] = [{"targets": ["127.0.0.1:9797"]}]
    promtool_check(config, tmp_path)


def test_the_servicemonitor_has_an_https_variant_with_the_operators_fields() -> None:
    text = (DEPLOY / "kubernetes" / "servicemonitor.yaml").read_text()
    (endpoint,) = yaml.safe_load(uncommented(text))["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    tls = endpoint["tlsConfig"]
    assert set(tls) == {"serverName", "ca", "cert", "keySecret"}  # the operator's SafeTLSConfig
    assert set(tls["ca"]["secret"]) == set(tls["cert"]["secret"]) == {"name", "key"}
    assert set(tls["keySecret"]) == {"name", "key"}
    auth = endpoint["basicAuth"]
    assert set(auth) == {"username", "password"}
    assert all(set(ref) == {"name", "key"} for ref in auth.values())
    # the Service's DNS name, which the server certificate must carry
    service = yaml.safe_load((DEPLOY / "kubernetes" / "service.yaml").read_text())
    meta = service["metadata"]
    assert tls["serverName"] == f"{meta['name']}.{meta['namespace']}.svc"


def test_the_configmaps_web_yml_uses_only_keys_keyturn_reads() -> None:
    text = (DEPLOY / "kubernetes" / "configmap.yaml").read_text()
    lines = text.splitlines()
    start = lines.index("  # web.yml: |")
    body = [line.removeprefix("  #   ") for line in lines[start + 1 :] if line.startswith("  #")]
    example = "\n".join(body).replace(
        "$2b$12$...", bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=4)).decode()
    )
    web, problems = parse_web_config(yaml.safe_load(example), Path("/etc/keyturn/web.yml"))
    # the certificate is not here: loading it is the one problem
    assert web is None
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        "tls_server_config: cannot load the certificate, key or CA "
        "(/etc/keyturn-tls/tls.crt, /etc/keyturn-tls/tls.key)"
    )
