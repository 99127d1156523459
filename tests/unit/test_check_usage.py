"""`keyturn check` with `[usage]`: an audit file keyturn cannot read, a position file it cannot
write, a socket address it cannot use, each one line (real files in a temporary directory)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from keyturn.commands.check import usage_problems
from keyturn.config import Config, parse_config
from keyturn_devkit.harness.configs import VAULT

BASE = VAULT


def config(usage: str) -> Config:
    return parse_config(BASE + usage, "k.toml", {"VAULT_TOKEN": "x"})


def file_source(audit: Path, position: Path) -> Config:
    return config(f'[usage]\nsource = "file"\nfile = "{audit}"\nposition_file = "{position}"\n')


def test_without_usage_there_is_nothing_to_check() -> None:
    assert usage_problems(config("")) == []


def test_a_readable_file_and_a_writable_position_directory_are_fine(tmp_path: Path) -> None:
    audit = tmp_path / "audit.log"
    audit.write_text('{"type":"request"}\n')
    assert usage_problems(file_source(audit, tmp_path / "position.json")) == []


def test_a_missing_file_and_position_directory_are_named(tmp_path: Path) -> None:
    audit, position = tmp_path / "audit.log", tmp_path / "state" / "position.json"
    assert usage_problems(file_source(audit, position)) == [
        f"usage.file: {audit}: no such file (is Vault's file audit device writing there?)",
        f"usage.position_file: directory {position.parent} does not exist (create it, or "
        "systemd's StateDirectory=keyturn does)",
    ]


UNUSABLE = """
import sys
from pathlib import Path
from keyturn.commands.check import usage_problems
from keyturn.config import parse_config
audit, position = sys.argv[1], sys.argv[2]
usage = f'source = "file"\\nfile = "{audit}"\\nposition_file = "{position}"\\n'
text = sys.argv[3] + "[usage]\\n" + usage
for line in usage_problems(parse_config(text, "k.toml", {"VAULT_TOKEN": "x"})):
    print(line)
"""


def as_unprivileged() -> list[str]:
    """A prefix that makes a process obey file permissions: root (as in CI) gives up the
    capabilities that let it read and write anything."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) is needed to run this test as root"
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def test_an_unreadable_file_and_an_unwritable_directory_are_named(tmp_path: Path) -> None:
    audit = tmp_path / "audit.log"
    audit.write_text("x\n")
    audit.chmod(0o000)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        result = subprocess.run(
            [
                *as_unprivileged(),
                sys.executable,
                "-c",
                UNUSABLE,
                str(audit),
                str(locked / "position.json"),
                BASE,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert result.stdout.splitlines() == [
            f"usage.file: {audit}: permission denied (keyturn's user needs read access, see "
            "docs/usage.md)",
            f"usage.position_file: keyturn cannot write in {locked}",
        ]
    finally:
        locked.chmod(0o700)


def test_a_socket_address_is_checked() -> None:
    good = config('[usage]\nsource = "socket"\nsocket = "127.0.0.1:9090"\n')
    assert usage_problems(good) == []
