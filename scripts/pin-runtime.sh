#!/usr/bin/env bash
# Regenerates requirements/runtime.txt: keyturn's runtime dependencies (pyproject.toml's
# [project] dependencies and theirs, transitively: what `pip install .` pulls in, never the
# test extras or the devkit) at exactly the versions constraints.txt pins, each with the
# sha256 of every file PyPI publishes for that version. Run it from anywhere, after any change
# to pyproject.toml's dependencies or to constraints.txt:
#
#   bash scripts/pin-runtime.sh
#
# tests/unit/test_pinned_requirements.py fails until it has been run (and its output
# committed). It needs Python 3.11 (keyturn's oldest, the image's) and PyPI: pip-tools is
# installed into a throwaway venv, and pip runs without any pip configuration (no local
# mirror, find-links or extra index), so that the hashes are those of the files published on
# PyPI. PIN_INDEX_URL names another index that serves PyPI's files unchanged, PYTHON another
# interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
PIN_INDEX_URL=${PIN_INDEX_URL:-https://pypi.org/simple}
PIP_TOOLS=pip-tools==7.6.2
PIP=pip==26.3
OUTPUT=requirements/runtime.txt

version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$version" != "3.11" ]; then
    echo "pin-runtime: $PYTHON is Python $version; the pins are resolved with 3.11 (PYTHON=python3.11)" >&2
    exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# pip without any configuration file or pip variable that adds a source of files.
export PIP_CONFIG_FILE=/dev/null
unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_CONSTRAINT PIP_NO_INDEX PIP_REQUIRE_HASHES
export PIP_DISABLE_PIP_VERSION_CHECK=1

"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --index-url "$PIN_INDEX_URL" "$PIP" "$PIP_TOOLS"

CUSTOM_COMPILE_COMMAND="bash scripts/pin-runtime.sh" "$work/venv/bin/pip-compile" \
    --quiet \
    --generate-hashes \
    --allow-unsafe \
    --strip-extras \
    --no-emit-index-url \
    --no-emit-find-links \
    --index-url "$PIN_INDEX_URL" \
    --constraint constraints.txt \
    --cache-dir "$work/cache" \
    --output-file "$work/runtime.txt" \
    pyproject.toml

mkdir -p "$(dirname "$OUTPUT")"
{
    cat <<'EOF'
# keyturn's runtime dependencies, pinned by version and by hash: what `pip install .` pulls in
# (pyproject.toml's [project] dependencies, transitively), at constraints.txt's versions, with
# the sha256 of every file PyPI publishes for each. Not the test extras, not the devkit.
#
#   pip install --require-hashes -r requirements/runtime.txt
#   pip install --no-deps .            (keyturn itself, from the checkout)
#
# Do not edit by hand. After a change to pyproject.toml's dependencies or constraints.txt,
# regenerate it with `bash scripts/pin-runtime.sh` (pip-tools' pip-compile --generate-hashes)
# and commit it; tests/unit/test_pinned_requirements.py fails while the two disagree.
EOF
    cat "$work/runtime.txt"
} > "$OUTPUT.tmp"
mv "$OUTPUT.tmp" "$OUTPUT"
echo "pin-runtime: wrote $OUTPUT ($(grep -c '^[A-Za-z0-9]' "$OUTPUT") packages)"
