"""The HTTPS variants the Prometheus configurations carry for `[metrics] web_config`, commented
out between "-- HTTPS variant: uncomment --" and "-- end of the HTTPS variant --": uncommented,
they pass promtool. (On Kubernetes, HTTPS is the Helm chart's metrics.webConfig:
tests/unit/test_helm_chart.py checks its web.yml, probes and ServiceMonitor.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

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
