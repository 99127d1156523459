"""The CLI imports a command's module only when that command runs: the daemon's process never
loads the sandbox, the dev-server runners or the test harnesses (keyturn-devkit). Without that
package the daemon's commands run as ever, and `keyturn sandbox` / `keyturn demo` say in one
line what to install."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from keyturn.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith(
    ("keyturn_devkit", "keyturn.testing")))))
"""

# keyturn's CLI where keyturn-devkit cannot be imported: a finder ahead of all others fails
# every import of it as Python does for a package that is not installed.
WITHOUT_DEVKIT = """
import sys

class NoDevkit:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] == "keyturn_devkit":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoDevkit)
from keyturn.cli import main
sys.exit(main(sys.argv[1:]))
"""


def loaded(*argv: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=True
    )
    return list(json.loads(result.stdout.splitlines()[-1]))


def without_devkit(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_DEVKIT, *argv], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(
    "argv", [("run", "--help"), ("--log-format", "json", "check", "--help"), ("--help",)]
)
def test_the_daemons_commands_load_no_sandbox_dev_or_harness_module(argv: tuple[str, ...]) -> None:
    assert loaded(*argv) == []


def test_the_sandbox_command_loads_the_sandbox() -> None:
    assert "keyturn_devkit.sandbox.command" in loaded("sandbox", "--help")


@pytest.mark.parametrize("command", ["sandbox", "demo"])
def test_a_devkit_command_without_the_devkit_says_what_to_install(command: str) -> None:
    result = without_devkit(command, "--port", "0")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"keyturn {command} needs the keyturn-devkit package: pip install -e ./devkit "
        "(from a clone of keyturn), or make demo\n"
    )


@pytest.mark.parametrize("argv", [("run", "--help"), ("--help",)])
def test_the_daemons_commands_run_without_the_devkit(argv: tuple[str, ...]) -> None:
    result = without_devkit(*argv)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("usage: keyturn")
