#!/usr/bin/env bash
# Debian packages the test suite needs; installed only when missing (apt-get needs root).
set -euo pipefail
needed=()
# A real Alertmanager for the alert-hook integration tests (tests/integration/test_alerts_hooks.py).
command -v prometheus-alertmanager >/dev/null 2>&1 || needed+=(prometheus-alertmanager)
# promtool (rule tests) and a real Prometheus (dashboard queries): tests/integration/test_prometheus_rules.py.
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || needed+=(prometheus)
# systemd-analyze (unit verify/security) and systemd-sysusers: tests/integration/test_systemd.py.
command -v systemd-analyze >/dev/null 2>&1 && command -v systemd-sysusers >/dev/null 2>&1 || needed+=(systemd)
# libfaketime (LD_PRELOAD) to step keyturn's wall clock alone: tests/integration/test_faults.py.
compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || compgen -G "/usr/lib/faketime/libfaketime.so.1" >/dev/null || needed+=(libfaketime)
# openssl makes the throwaway CA and server certificate of the TLS OpenBao: tests/integration/test_docs_real_vault.py.
command -v openssl >/dev/null 2>&1 || needed+=(openssl)
# A real browser for the sandbox dashboard's test (tests/integration/test_sandbox_dashboard_browser.py):
# Debian's chromium and its chromedriver, which Selenium is pointed at (no driver download).
command -v chromium >/dev/null 2>&1 || needed+=(chromium)
[ -x /usr/bin/chromedriver ] || needed+=(chromium-driver)
# Glewlwyd, a second OpenID Connect server (in C), for private_key_jwt: tests/integration/test_glewlwyd.py.
command -v glewlwyd >/dev/null 2>&1 || needed+=(glewlwyd)
# buildah builds deploy/Dockerfile, podman boots it (runc as its runtime) and mmdebstrap makes the
# stand-in for its Python base image: scripts/build-image.sh, tests/integration/test_image.py.
command -v buildah >/dev/null 2>&1 || needed+=(buildah)
command -v podman >/dev/null 2>&1 || needed+=(podman)
command -v runc >/dev/null 2>&1 || needed+=(runc)
command -v mmdebstrap >/dev/null 2>&1 || needed+=(mmdebstrap)
if ((${#needed[@]})); then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${needed[@]}"
fi
# panva/oidc-provider, pinned by devkit/oidc/package-lock.json: tests/integration/test_client_auth.py
# (node and npm are needed; the harness keyturn_devkit.dev.oidc_provider also runs this on first use).
[ -d "$(dirname "$0")/../devkit/oidc/node_modules/oidc-provider" ] || npm ci --prefix "$(dirname "$0")/../devkit/oidc" --no-audit --no-fund --silent
