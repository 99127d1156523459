"""A release: `python -m build` makes the sdist and the wheel of keyturn and of keyturn-client
(each wheel built from its sdist), `twine check` passes on all four, and each wheel installs
into a fresh venv that holds nothing else, its dependencies taken from a wheelhouse of
requirements/runtime.txt (`--no-index --find-links`, pip's configuration ignored), and works
there as a user would run it.
"""

from __future__ import annotations

import email
import email.message
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import keyturn_client
import pytest
from packaging.utils import canonicalize_name

import keyturn

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
VERSION = keyturn.__version__
# twine in the release tools' venv (the Makefile says why).
TWINE = ROOT / "build" / "tools" / "bin" / "twine"
SOURCES = {"keyturn": ROOT, "keyturn_client": ROOT / "clients" / "python"}
# pip with no configuration file and no PIP_* variable: nothing but what a command names.
BARE_ENV = {
    **{key: value for key, value in os.environ.items() if not key.startswith("PIP_")},
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}


def run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=BARE_ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdists and wheels, built without build isolation (the venv's pinned setuptools)."""
    out = tmp_path_factory.mktemp("dist")
    for source in SOURCES.values():
        built = subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """keyturn's dependencies at their pinned versions, checked against their hashes."""
    out = tmp_path_factory.mktemp("wheelhouse")
    downloaded = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(out),
         "--only-binary", ":all:", "--require-hashes", "-r", "requirements/runtime.txt"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert downloaded.returncode == 0, downloaded.stderr[-2000:]
    return out


def fresh_venv(path: Path, wheelhouse: Path, *requirements: str) -> Path:
    """A venv of this Python with nothing in it (not even pip: this venv's pip installs into
    it), then `requirements` from the wheelhouse; its bin directory."""
    created = run(sys.executable, "-m", "venv", "--without-pip", path)
    assert created.returncode == 0, created.stderr
    into = [sys.executable, "-m", "pip", "--python", str(path / "bin" / "python")]
    added = run(*into, "install", "--quiet", "--no-index", "--find-links", wheelhouse,
                *requirements)  # fmt: skip
    assert added.returncode == 0, added.stderr[-2000:]
    checked = run(*into, "check")
    assert checked.returncode == 0, checked.stdout
    return path / "bin"


def installed(bin_dir: Path) -> set[str]:
    listed = run(sys.executable, "-m", "pip", "--python", bin_dir / "python", "list",
                 "--format", "freeze")  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    return {canonicalize_name(line.split("==")[0]) for line in listed.stdout.splitlines()}


def pinned_runtime() -> set[str]:
    text = (ROOT / "requirements" / "runtime.txt").read_text()
    return {canonicalize_name(m) for m in re.findall(r"^([A-Za-z0-9._-]+)==", text, re.M)}


def wheel_metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_string(wheel.read(meta).decode())


def test_one_version_names_both_distributions_and_heads_the_changelog(dist: Path) -> None:
    assert keyturn_client.__version__ == VERSION  # released together
    assert sorted(p.name for p in dist.iterdir()) == [
        f"keyturn-{VERSION}-py3-none-any.whl",
        f"keyturn-{VERSION}.tar.gz",
        f"keyturn_client-{VERSION}-py3-none-any.whl",
        f"keyturn_client-{VERSION}.tar.gz",
    ]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    first = re.search(r"^## (\S+)", changelog, re.M)
    assert first is not None
    assert first.group(1) == VERSION


def test_twine_check_passes_on_every_file(dist: Path) -> None:
    assert TWINE.exists(), f"{TWINE} is missing: `make test` (or `make build/tools/.installed`)"
    files = sorted(dist.iterdir())
    checked = run(TWINE, "check", "--strict", *files)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == len(files), checked.stdout


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_metadata_is_complete(dist: Path, name: str) -> None:
    with zipfile.ZipFile(dist / f"{name}-{VERSION}-py3-none-any.whl") as wheel:
        meta = wheel_metadata(wheel)
        license_text = wheel.read(f"{name}-{VERSION}.dist-info/licenses/LICENSE").decode()
    assert license_text == (ROOT / "LICENSE").read_text()  # the client's copy is the same
    assert meta["Version"] == VERSION
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["License-File"] == "LICENSE"
    assert meta["Requires-Python"] == ">=3.11"
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Source", "Documentation", "Changelog", "Issues"} <= set(urls)
    assert meta["Description-Content-Type"] == "text/markdown"
    with tarfile.open(dist / f"{name}-{VERSION}.tar.gz") as sdist:
        members = {m.split("/", 1)[1] for m in sdist.getnames() if "/" in m}
    assert {"LICENSE", "README.md", "pyproject.toml"} <= members


def test_keyturns_wheel_alone_in_a_fresh_venv_runs_its_cli(
    dist: Path, wheelhouse: Path, tmp_path: Path
) -> None:
    bin_dir = fresh_venv(
        tmp_path / "venv", wheelhouse, str(dist / f"keyturn-{VERSION}-py3-none-any.whl")
    )
    # Its dependencies, as pinned, and nothing else.
    assert installed(bin_dir) == pinned_runtime() | {"keyturn"}
    version = run(bin_dir / "keyturn", "--version")
    assert version.stdout.strip() == f"keyturn {VERSION}", version.stderr
    # The example names files of a systemd service this machine does not have: one line says
    # which, and nothing crashes.
    checked = run(bin_dir / "keyturn", "check", "-c", "deploy/keyturn.example.toml")
    assert checked.returncode == 1
    assert "Traceback" not in checked.stdout + checked.stderr
    assert checked.stderr.strip().splitlines() == [
        "vault: file:/run/credentials/keyturn.service/role_id: cannot read the file: "
        "No such file or directory"
    ]


def test_the_clients_wheel_alone_in_a_fresh_venv_imports(
    dist: Path, wheelhouse: Path, tmp_path: Path
) -> None:
    wheel = dist / f"keyturn_client-{VERSION}-py3-none-any.whl"
    bin_dir = fresh_venv(
        tmp_path / "venv", wheelhouse, f"keyturn-client[httpx,requests] @ {wheel.as_uri()}"
    )
    assert "keyturn" not in installed(bin_dir)  # the library needs no daemon
    imported = run(
        bin_dir / "python",
        "-c",
        "import keyturn_client, keyturn_client.httpx, keyturn_client.requests; "
        "print(keyturn_client.__version__, keyturn_client.Credential.__name__)",
        cwd=tmp_path,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.split() == [VERSION, "Credential"]
