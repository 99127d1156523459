#!/usr/bin/env bash
# Builds keyturn's image from deploy/Dockerfile with buildah: no Docker engine, no image
# registry, and no package index inside the build (`--network none`). `make image` runs it (and
# then boots the image: tests/integration/test_image.py); so does `make test`, through that test.
#
#   1. PYTHON_IMAGE, the Dockerfile's base: Debian bookworm's python3.11 (mmdebstrap) with a
#      virtual environment at /usr/local, where python:3.11-slim-bookworm has its Python and pip,
#      imported as localhost/keyturn-python:3.11-bookworm. PYTHON_IMAGE=NAME uses an image you
#      already have instead.
#   2. The wheelhouse: requirements/runtime.txt's wheels, checked against their hashes, and
#      setuptools' (for the build of keyturn's wheel), downloaded on this host by pip, while
#      step 1 runs.
#   3. buildah bud of deploy/Dockerfile as written, handed the wheelhouse as the `wheelhouse`
#      build context, tagged localhost/keyturn:<version> and localhost/keyturn:latest.
#   4. A CycloneDX SBOM of the image's Python environment (cyclonedx-py over the image's
#      site-packages): build/image/keyturn-<version>.cdx.json.
#   5. The image's size, its Python packages (`pip list` in the image) and its number of Debian
#      packages: printed, and kept in build/image/report.txt.
#
# Needs root, buildah, podman and mmdebstrap (scripts/system-deps.sh installs them), and the
# project's venv (PYTHON, default .venv/bin/python, with pip) and the release tools' venv
# (TOOLS, default build/tools, with cyclonedx-bom: `make build/tools/.installed`). Nothing is
# cached between runs: every step starts from nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
TOOLS=${TOOLS:-build/tools}
OUT=build/image
STANDIN=localhost/keyturn-python:3.11-bookworm
export CONTAINERS_CONF="$PWD/scripts/containers.conf"

version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' src/keyturn/__init__.py)
image=localhost/keyturn:$version
rm -rf "$OUT"
mkdir -p "$OUT"
step() { printf '  %-44s at %4ds\n' "$1" "$SECONDS" | tee -a "$OUT/steps.txt"; }

# ---- 2. the wheelhouse, started first and in the background (mmdebstrap waits on a mirror) --
setuptools=$(grep -i '^setuptools==' constraints.txt)
download() {
    "$PYTHON" -m pip download --quiet --quiet --disable-pip-version-check \
        --dest "$OUT/wheelhouse" --only-binary :all: --python-version 3.11 --implementation cp "$@"
}
{
    download --require-hashes -r requirements/runtime.txt
    download --no-deps "$setuptools"
} &
wheelhouse=$!

# ---- 1. the base image ---------------------------------------------------------------------
if [ -z "${PYTHON_IMAGE:-}" ]; then
    # minbase (apt, dpkg, the essential set) like debian:bookworm-slim; merged /usr without the
    # usrmerge package (which would pull in perl); no manuals, docs or translations.
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --dpkgopt=force-unsafe-io \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='chroot "$1" python3 -m venv /usr/local' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        bookworm "$OUT/base.tar"
    podman rmi --force "$STANDIN" >/dev/null 2>&1 || true
    podman import --quiet \
        --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python3"]' \
        "$OUT/base.tar" "$STANDIN" >/dev/null
    rm "$OUT/base.tar"
    PYTHON_IMAGE=$STANDIN
    step "PYTHON_IMAGE stand-in (mmdebstrap, import)"
fi

wait "$wheelhouse"
step "wheelhouse ($(ls "$OUT/wheelhouse" | wc -l) wheels)"

# ---- 3. the image --------------------------------------------------------------------------
podman rmi --force "$image" localhost/keyturn:latest >/dev/null 2>&1 || true
# --format docker keeps the HEALTHCHECK (OCI image configuration has none).
buildah bud --quiet --network none --format docker \
    --file deploy/Dockerfile --ignorefile deploy/Dockerfile.dockerignore \
    --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" \
    --build-context wheelhouse="$OUT/wheelhouse" \
    --tag "$image" --tag localhost/keyturn:latest \
    . >/dev/null
step "buildah bud $image"

# ---- 4. the SBOM ---------------------------------------------------------------------------
# The image's site-packages in a venv of this host's Python, which cyclonedx-py reads.
"$PYTHON" -m venv --without-pip "$OUT/sbom-env"
site=$(echo "$OUT"/sbom-env/lib/python3*/site-packages)
rootfs=$(podman image mount "$image")
cp -a "$rootfs/usr/local/lib/python3.11/site-packages/." "$site/"
podman image unmount "$image" >/dev/null
"$TOOLS/bin/python" -m cyclonedx_py environment --output-reproducible \
    --output-file "$OUT/keyturn-$version.cdx.json" "$OUT/sbom-env"
rm -rf "$OUT/sbom-env"
step "SBOM $OUT/keyturn-$version.cdx.json"

# ---- 5. what is in it ----------------------------------------------------------------------
in_image() { podman run --rm --no-healthcheck --network none --env PIP_NO_CACHE_DIR=1 "$@"; }
{
    echo "image: $image ($(podman image inspect --format '{{.Id}}' "$image" | cut -c1-12))"
    echo "size: $(podman image inspect --format '{{.Size}}' "$image") bytes"
    echo "debian packages: $(in_image --entrypoint dpkg-query "$image" -W -f '.\n' | wc -l)"
    echo "python packages (pip list in the image):"
    in_image --entrypoint pip "$image" list --format freeze | sed 's/^/  /'
    echo "build steps, done at:"
    cat "$OUT/steps.txt"
} > "$OUT/report.txt"
cat "$OUT/report.txt"
