"""The CLI imports a command's module only when that command runs: the daemon's process never
loads the sandbox, the dev-server runners or the test harnesses."""

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
    ("keyturn.sandbox", "keyturn.dev", "keyturn.testing", "keyturn.demo")))))
"""


def loaded(*argv: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=True
    )
    return list(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "argv", [("run", "--help"), ("--log-format", "json", "check", "--help"), ("--help",)]
)
def test_the_daemons_commands_load_no_sandbox_dev_or_harness_module(argv: tuple[str, ...]) -> None:
    assert loaded(*argv) == []


def test_the_sandbox_command_loads_the_sandbox() -> None:
    assert "keyturn.sandbox.command" in loaded("sandbox", "--help")
