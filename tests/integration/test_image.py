"""keyturn's image, built from deploy/Dockerfile by buildah and booted by podman.

The module builds the image once, from nothing, with scripts/build-image.sh (a stand-in for
PYTHON_IMAGE made with mmdebstrap, the dependencies' wheels handed to a build without network),
then boots it against the session's OpenBao and a sandbox on this host's loopback (host
network), with a read-only root file system and the image's own non-root user. podman runs
with scripts/containers.conf (runc, cgroupfs, no default ulimits): what this machine and CI need.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from packaging.utils import canonicalize_name

import keyturn
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.ports import free_port_pair
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.deployment import prepare_deployment

# The build takes minutes (mmdebstrap downloads and installs Debian's packages); the module's
# first test waits for it.
pytestmark = [
    pytest.mark.openbao,
    pytest.mark.sandbox,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = f"localhost/keyturn:{keyturn.__version__}"
KEYTURN_UID = 10001
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "scripts" / "containers.conf")}


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        env=PODMAN_ENV,
        timeout=timeout,
        check=False,
    )


def run_image(*args: str) -> subprocess.CompletedProcess[str]:
    """`podman run --rm` of the image (no HEALTHCHECK: podman would time it with systemd); no
    network unless `args` give one."""
    network = [] if "--network" in args else ["--network", "none"]
    return podman("run", "--rm", "--no-healthcheck", *network, *args)


@pytest.fixture(scope="module")
def image() -> str:
    build = subprocess.run(
        ["bash", "scripts/build-image.sh"],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return IMAGE


def test_the_image_is_tagged_with_the_version_and_prints_it(image: str) -> None:
    ids = [
        podman("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
        for tag in (image, "localhost/keyturn:latest")
    ]
    assert ids[0] and ids[0] == ids[1]
    result = run_image(image, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"keyturn {keyturn.__version__}"


def test_the_sbom_lists_the_python_packages_in_the_image(image: str) -> None:
    listed = run_image(
        "--env", "PIP_NO_CACHE_DIR=1", "--entrypoint", "pip", image, "list", "--format", "json"
    )
    assert listed.returncode == 0, listed.stderr
    in_image = {(canonicalize_name(p["name"]), p["version"]) for p in json.loads(listed.stdout)}
    assert ("keyturn", keyturn.__version__) in in_image
    sbom_path = ROOT / "build" / "image" / f"keyturn-{keyturn.__version__}.cdx.json"
    sbom = json.loads(sbom_path.read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    assert {(canonicalize_name(c["name"]), c["version"]) for c in sbom["components"]} == in_image


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"keyturn-test-{uuid.uuid4().hex[:8]}"
    yield name
    podman("rm", "--force", "--time", "0", name)


def test_check_then_run_publish_a_token_from_a_read_only_non_root_container(
    image: str,
    openbao: OpenBaoDevServer,
    sandbox_factory: Callable[..., SandboxProcess],
    tmp_path: Path,
    container_name: str,
) -> None:
    workdir = tmp_path / "deployment"
    deployment = prepare_deployment(
        openbao, sandbox_factory(), workdir, ["imaged"], namespace=f"i{uuid.uuid4().hex[:8]}"
    )
    port = free_port_pair()
    config = deployment.config_path
    config.write_text(config.read_text().replace('"127.0.0.1:0"', f'"127.0.0.1:{port}"'))
    # The container's user reads the configuration and the Vault token mounted from here.
    workdir.chmod(0o755)
    os.chown(workdir / "vault-token", KEYTURN_UID, KEYTURN_UID)
    mount = ["--network", "host", "--read-only", "--volume", f"{workdir}:{workdir}:ro"]

    checked = run_image(*mount, image, "check", "-c", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr

    started = podman(
        "run",
        "--detach",
        "--no-healthcheck",
        "--name",
        container_name,
        *mount,
        image,
        "run",
        "-c",
        str(config),
    )
    assert started.returncode == 0, started.stderr
    deadline = time.monotonic() + 60
    ready = 0
    while time.monotonic() < deadline and ready != 200:
        try:
            ready = HTTP.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code
        except httpx.TransportError:
            time.sleep(0.5)
        else:
            time.sleep(0 if ready == 200 else 0.5)
    logs = podman("logs", container_name).stderr
    assert ready == 200, logs[-3000:]

    published = deployment.vault_client().secrets.kv.v2.read_secret_version(
        path=deployment.publish_to["imaged"], raise_on_deleted_version=True
    )["data"]["data"]
    assert published["access_token"]
    assert podman("exec", container_name, "id", "-u").stdout.strip() == str(KEYTURN_UID)
    write = podman("exec", container_name, "touch", "/usr/local/written")
    assert write.returncode != 0
    assert "Read-only file system" in write.stderr

    assert podman("stop", "--time", "30", container_name).returncode == 0
    state = podman("inspect", "--format", "{{.State.ExitCode}}", container_name).stdout.strip()
    assert state == "0"  # SIGTERM: the runs finish, then keyturn exits 0
    logs = podman("logs", container_name)
    assert published["access_token"] not in logs.stdout + logs.stderr
