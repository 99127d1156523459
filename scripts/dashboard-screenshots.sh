#!/usr/bin/env bash
# Regenerates the dashboard screenshots docs/sandbox.md shows (docs/img/dashboard*.png) by
# running the dashboard's browser test with KEYTURN_DASHBOARD_SCREENSHOTS pointing there.
# Needs `make .venv/.installed` and scripts/system-deps.sh (chromium, chromium-driver).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p docs/img
KEYTURN_DASHBOARD_SCREENSHOTS="$PWD/docs/img" .venv/bin/pytest -q -p no:cacheprovider \
  tests/integration/test_sandbox_dashboard_browser.py
ls -l docs/img/dashboard*.png
