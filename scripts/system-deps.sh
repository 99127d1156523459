#!/usr/bin/env bash
# Debian packages the test suite needs; installed only when missing (apt-get needs root).
set -euo pipefail
needed=()
# (later issues add promtool and alertmanager here)
if ((${#needed[@]})); then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${needed[@]}"
fi
