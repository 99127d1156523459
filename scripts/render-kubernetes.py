"""Write deploy/kubernetes/*.yaml from the Helm chart deploy/helm/keyturn: one source of truth.

The kustomize manifests are the chart rendered with its defaults, as the release `keyturn` in
the namespace `keyturn` (the ServiceMonitor with serviceMonitor.enabled, a file kustomization.yaml
leaves out). namespace.yaml and kustomization.yaml are kustomize's own and kept by hand.
Helm's engine is the helm-python-sdk wheel's (no helm binary).

    .venv/bin/python scripts/render-kubernetes.py           # rewrite the files
    .venv/bin/python scripts/render-kubernetes.py --check   # exit 1 if they differ

tests/unit/test_helm_chart.py checks that the committed files equal this rendering.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "keyturn"
KUBERNETES = ROOT / "deploy" / "kubernetes"
RELEASE = NAMESPACE = "keyturn"
HEADER = (
    "# Generated from the Helm chart deploy/helm/keyturn by scripts/render-kubernetes.py (its\n"
    "# defaults; release and namespace keyturn): change the chart and run the script, never\n"
    "# this file. With Helm, install the chart instead (docs/install-containers.md).\n"
)
# Only with the Prometheus Operator's CRDs: rendered enabled, left out of kustomization.yaml.
OPTIONAL = {"servicemonitor.yaml": {"serviceMonitor": {"enabled": True}}}
# The Prometheus rules stay in deploy/prometheus (the chart's PrometheusRule reads them there).
NOT_RENDERED = {"prometheusrule.yaml", "NOTES.txt"}


def render_kubernetes() -> dict[str, str]:
    """file name under deploy/kubernetes -> its text, from the chart's templates."""
    import helm_python  # noqa: PLC0415 - a test dependency (pyproject's `test` extra)

    files: dict[str, str] = {}
    with helm_python.Chart.load(CHART) as chart:
        default = chart.render(name=RELEASE, namespace=NAMESPACE)
        for template, rendered in sorted(default.items()):
            name = Path(template).name
            if name in NOT_RENDERED or name.startswith("_"):
                continue
            text = rendered
            if name in OPTIONAL:
                text = chart.render(OPTIONAL[name], name=RELEASE, namespace=NAMESPACE)[template]
            if not text.strip():
                raise SystemExit(f"{template} renders nothing with the chart's defaults")
            # kubectl, not Helm, applies these files.
            managed = text.replace("managed-by: Helm", "managed-by: kustomize")
            files[name] = HEADER + managed.strip("\n") + "\n"
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs")
    args = parser.parse_args()
    stale = []
    for name, text in render_kubernetes().items():
        path = KUBERNETES / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    verb = "differ from the chart" if args.check else "written"
    for name in stale:
        print(f"deploy/kubernetes/{name}: {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
