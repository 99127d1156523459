"""The shipped monitoring: Prometheus alerting rules, their promtool unit tests, the example
Prometheus configuration, the runbook every alert links to, and the Grafana dashboard.

Uses Debian's `prometheus` package: `promtool` (rule checks and rule unit tests) and the
`prometheus` server itself, which parses the rules and answers the dashboard's queries. Both
are required; install them with `bash scripts/system-deps.sh`.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from keyturn.alerts.model import DEFAULT_RUNBOOK_BASE, DETECTORS, alert_name, runbook_url
from keyturn_devkit.dev.loopback import HTTP

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "keyturn-rules.yml"
RULE_TESTS = PROMETHEUS_DIR / "tests"
EXAMPLE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "keyturn.json"
RUNBOOK = ROOT / "docs" / "runbook.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"
RUNBOOK_URL = "docs/runbook.md#"  # the runbook's place in the source tree, as hooks name it
SEVERITIES = {"critical", "warning", "{{ $labels.severity }}"}
INSTALL_HINT = "install Debian's `prometheus` package: bash scripts/system-deps.sh"


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` not found on PATH; {INSTALL_HINT}", pytrace=False)
    return path


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _require_success(result: subprocess.CompletedProcess[str]) -> None:
    if result.returncode != 0:
        pytest.fail(
            f"`{' '.join(result.args)}` exited {result.returncode}:\n"
            f"{result.stdout}\n{result.stderr}",
            pytrace=False,
        )


# -- promtool ------------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    promtool = _binary("promtool")
    _require_success(_run([promtool, "check", "rules", str(RULES)]))


def test_promtool_rule_unit_tests_pass() -> None:
    promtool = _binary("promtool")
    files = sorted(RULE_TESTS.glob("*.yml"))
    assert files, f"no promtool test files in {RULE_TESTS}"
    _require_success(_run([promtool, "test", "rules", *map(str, files)]))


def test_example_prometheus_config_is_valid() -> None:
    promtool = _binary("promtool")
    _require_success(_run([promtool, "check", "config", str(EXAMPLE_CONFIG)]))


# -- a real Prometheus server: the parsed rules, and a PromQL parser for the dashboard --------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus server on loopback that loads the rules; yields its base URL."""
    binary = _binary("prometheus")
    workdir = tmp_path_factory.mktemp("prometheus")
    config = workdir / "prometheus.yml"
    config.write_text(f"global:\n  evaluation_interval: 1s\nrule_files:\n  - {RULES}\n")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = workdir / "prometheus.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                pytest.fail(f"prometheus exited {process.returncode}:\n{log_path.read_text()}")
            try:
                if HTTP.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready after 30s:\n{log_path.read_text()}")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def alerts(prometheus: str) -> dict[str, dict[str, Any]]:
    """The alerting rules as Prometheus parsed them, by name."""
    body = HTTP.get(f"{prometheus}/api/v1/rules", params={"type": "alert"}, timeout=10).json()
    rules = [rule for group in body["data"]["groups"] for rule in group["rules"]]
    names = [rule["name"] for rule in rules]
    assert len(names) == len(set(names)), f"duplicate alert names: {sorted(names)}"
    return {rule["name"]: rule for rule in rules}


def test_prometheus_loads_every_rule_of_the_file(alerts: dict[str, dict[str, Any]]) -> None:
    declared = re.findall(r"^\s*- alert:\s*(\S+)\s*$", RULES.read_text(), re.MULTILINE)
    assert sorted(alerts) == sorted(declared)
    assert len(alerts) >= 15


def test_every_alert_has_severity_summary_description_and_runbook(
    alerts: dict[str, dict[str, Any]],
) -> None:
    problems = []
    for name, rule in alerts.items():
        if not re.fullmatch(r"Keyturn[A-Z][A-Za-z]+", name):
            problems.append(f"{name}: name should be Keyturn<CamelCase>")
        severity = rule["labels"].get("severity")
        if severity not in SEVERITIES:
            problems.append(f"{name}: severity {severity!r} not one of {sorted(SEVERITIES)}")
        annotations = rule["annotations"]
        for key in ("summary", "description", "runbook_url"):
            if not annotations.get(key, "").strip():
                problems.append(f"{name}: no {key} annotation")
        url = annotations.get("runbook_url", "")
        if url != RUNBOOK_URL + github_anchor(name):
            problems.append(
                f"{name}: runbook_url {url!r}; expected {RUNBOOK_URL}{github_anchor(name)}"
            )
    assert not problems, "\n".join(problems)


def test_every_alert_is_unit_tested_firing_and_not_firing(
    alerts: dict[str, dict[str, Any]],
) -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in sorted(RULE_TESTS.glob("*.yml")):
        current = None
        for line in path.read_text().splitlines():
            if match := re.match(r"\s*alertname:\s*(\S+)", line):
                current = match.group(1)
            elif (match := re.match(r"\s*exp_alerts:\s*(\[\])?", line)) and current:
                (quiet if match.group(1) else firing).add(current)
                current = None
    missing = [
        f"{name}: no {case} case"
        for name in sorted(alerts)
        for case, seen in (("firing", firing), ("not-firing", quiet))
        if name not in seen
    ]
    assert not missing, "\n".join(missing)
    assert firing | quiet <= set(alerts), (
        f"tests name unknown alerts: {(firing | quiet) - set(alerts)}"
    )


def test_rules_use_only_documented_metrics(alerts: dict[str, dict[str, Any]]) -> None:
    documented = documented_metrics() | {"up"}
    problems = [
        f"{name}: {metric}"
        for name, rule in alerts.items()
        for metric in sorted(metric_names(rule["query"]) - documented)
    ]
    assert not problems, "metrics not in docs/metrics.md:\n" + "\n".join(problems)


# -- the runbook -----------------------------------------------------------------------------


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def runbook_sections() -> list[str]:
    return re.findall(r"^## (.+?)\s*$", RUNBOOK.read_text(), re.MULTILINE)


def hook_alert_names() -> set[str]:
    """The names keyturn's own alert hooks send (`Keyturn<Detector>`), which link here too."""
    return {alert_name(detector) for detector in DETECTORS}


def test_runbook_has_one_section_per_alert(alerts: dict[str, dict[str, Any]]) -> None:
    sections = runbook_sections()
    anchors = [github_anchor(section) for section in sections]
    assert len(anchors) == len(set(anchors)), f"duplicate runbook sections: {sections}"
    linked = {rule["annotations"]["runbook_url"].rpartition("#")[2] for rule in alerts.values()}
    linked |= {runbook_url(RUNBOOK_URL, name).rpartition("#")[2] for name in hook_alert_names()}
    assert linked <= set(anchors), f"runbook_url anchors without a section: {linked - set(anchors)}"
    assert RUNBOOK_URL == DEFAULT_RUNBOOK_BASE + "#"  # hooks and rules link to the same file
    every_alert = set(alerts) | hook_alert_names()
    assert set(sections) == every_alert, (
        f"sections without an alert: {sorted(set(sections) - every_alert)}; "
        f"alerts without a section: {sorted(every_alert - set(sections))}"
    )


def test_runbook_says_which_side_sends_each_alert(alerts: dict[str, dict[str, Any]]) -> None:
    bodies = re.split(r"^## .+$", RUNBOOK.read_text(), flags=re.MULTILINE)[1:]
    hooks = hook_alert_names()
    for heading, body in zip(runbook_sections(), bodies, strict=True):
        match = re.search(r"\*\*Sent by:\*\*(.+?)(?:\n\n|$)", body, re.DOTALL)
        assert match, f"runbook section {heading} has no **Sent by:** line"
        sent_by = " ".join(match.group(1).split())
        assert ("Prometheus" in sent_by) == (heading in alerts), f"{heading}: {sent_by}"
        assert ("alert hooks" in sent_by) == (heading in hooks), f"{heading}: {sent_by}"


def test_runbook_sections_say_what_it_means_how_to_check_and_fix() -> None:
    text = RUNBOOK.read_text()
    bodies = re.split(r"^## .+$", text, flags=re.MULTILINE)[1:]
    for heading, body in zip(runbook_sections(), bodies, strict=True):
        for part in ("**What it means.**", "**Check.**", "**Fix.**"):
            assert part in body, f"runbook section {heading} has no {part}"


def test_runbook_links_resolve() -> None:
    problems = []
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", RUNBOOK.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path = (RUNBOOK.parent / target).resolve() if target else RUNBOOK
        if not path.exists():
            problems.append(f"{target}: no such file")
        elif anchor:
            headings = re.findall(r"^#+ (.+?)\s*$", path.read_text(), re.MULTILINE)
            if anchor not in {github_anchor(h) for h in headings}:
                problems.append(f"{target}#{anchor}: no such heading")
    assert not problems, "\n".join(problems)


# -- the Grafana dashboard -------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    try:
        data = json.loads(DASHBOARD.read_text())
    except json.JSONDecodeError as error:
        pytest.fail(f"{DASHBOARD}: not valid JSON: {error}")
    assert isinstance(data, dict)
    return data


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target."""
    return [
        (f"panel {panel['title']!r} target {target.get('refId')}", target["expr"])
        for panel in all_panels(dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


def test_dashboard_has_fixed_uid_schema_and_datasource_variable() -> None:
    data = dashboard()
    assert data["uid"] == "keyturn-overview"
    assert data.get("id") is None  # importable into any Grafana
    assert isinstance(data["schemaVersion"], int)
    assert 36 <= data["schemaVersion"] <= 41
    variables = {var["name"]: var for var in data["templating"]["list"]}
    datasource = [var for var in variables.values() if var["type"] == "datasource"]
    assert len(datasource) == 1
    assert datasource[0]["query"] == "prometheus"
    assert datasource[0]["name"] == "datasource"


def test_every_panel_and_query_uses_the_datasource_variable() -> None:
    data = dashboard()
    expected = {"type": "prometheus", "uid": "${datasource}"}
    problems = []
    panels = [p for p in all_panels(data["panels"]) if p["type"] != "row"]
    assert len(panels) >= 10
    for panel in panels:
        if panel.get("datasource") != expected:
            problems.append(f"panel {panel['title']!r}: datasource {panel.get('datasource')}")
        if not panel.get("targets"):
            problems.append(f"panel {panel['title']!r}: no queries")
        for target in panel.get("targets", []):
            if target.get("datasource") != expected or not target.get("expr"):
                problems.append(f"panel {panel['title']!r} target {target.get('refId')}")
    for var in data["templating"]["list"]:
        if var["type"] == "query" and var.get("datasource") != expected:
            problems.append(f"variable {var['name']}: datasource {var.get('datasource')}")
    ids = [p["id"] for p in all_panels(data["panels"])]
    if len(ids) != len(set(ids)):
        problems.append(f"duplicate panel ids: {ids}")
    assert not problems, "\n".join(problems)


def test_dashboard_covers_the_metric_contract() -> None:
    used = set().union(*(metric_names(expr) for _, expr in dashboard_queries()))
    for wanted in (
        "keyturn_credential_ready",
        "keyturn_credential_expiry_timestamp_seconds",
        "keyturn_token_requests_total",
        "keyturn_rotations_total",
        "keyturn_suspicious_events_total",
        "keyturn_vault_operations_total",
        "keyturn_vault_operation_duration_seconds_bucket",
        "keyturn_alert_deliveries_total",
        "keyturn_schedule_lateness_seconds_bucket",
        "keyturn_build_info",
    ):
        assert wanted in used, f"no panel shows {wanted}"


def test_dashboard_uses_only_documented_metrics() -> None:
    documented = documented_metrics()
    queries = dashboard_queries()
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            assert match, f"variable {var['name']}: unexpected query {query!r}"
            queries.append((f"variable {var['name']}", match.group(1)))
    problems = [
        f"{where}: {metric}"
        for where, expr in queries
        for metric in sorted(metric_names(expr) - documented)
    ]
    assert not problems, "metrics not in docs/metrics.md:\n" + "\n".join(problems)


def test_dashboard_queries_parse_in_prometheus(prometheus: str) -> None:
    problems = []
    for where, expr in dashboard_queries():
        response = HTTP.get(
            f"{prometheus}/api/v1/query", params={"query": grafana_to_promql(expr)}, timeout=10
        )
        if response.status_code != 200:
            problems.append(f"{where}: {response.json().get('error')}\n    {expr}")
    assert not problems, "\n".join(problems)


# -- PromQL helpers --------------------------------------------------------------------------

_KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan", "atan2",
}  # fmt: skip


def grafana_to_promql(expr: str) -> str:
    """Replace Grafana's variables with values Prometheus accepts."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a small scanner, not a full parser)."""
    text = grafana_to_promql(expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', text)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text
    )  # label lists
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    text = re.sub(r"(?<![\w:])\d[\w.]*", " ", text)  # numbers and durations
    names = set()
    for match in re.finditer(r"[A-Za-z_:][\w:]*", text):
        following = text[match.end() :].lstrip()
        if following.startswith("(") or match.group(0).lower() in _KEYWORDS:
            continue  # a function, an aggregation or a keyword
        names.add(match.group(0))
    return names


def documented_metrics() -> set[str]:
    """Every series name docs/metrics.md promises (histograms as _bucket/_sum/_count)."""
    names: set[str] = set()
    section = ""
    for line in METRICS_DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip().lower()
        elif match := re.match(r"\|\s*`(keyturn_\w+)`\s*\|", line):
            name = match.group(1)
            if section == "histograms":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            else:
                names.add(name)
    assert len(names) > 20, f"could not read the metric names from {METRICS_DOC}"
    return names


def test_metric_name_scanner() -> None:
    assert metric_names(
        'sum without (instance) ((c_total{a="b"} unless c_total offset 15m) or '
        'increase(c_total{x=~"y|z"}[15m])) > 0.1 and on (job) time() - g > 1e3'
    ) == {"c_total", "g"}
    assert metric_names(
        'histogram_quantile(0.95, sum by (le) (rate(h_bucket{i=~"$instance"}[$__rate_interval])))'
    ) == {"h_bucket"}
    assert metric_names('absent(up{job="keyturn"})') == {"up"}
    assert github_anchor("KeyturnCredentialExpired") == "keyturncredentialexpired"
    assert github_anchor("What it's for: a test") == "what-its-for-a-test"
