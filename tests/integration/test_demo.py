"""`keyturn demo`, as `make demo` runs it: three apps get the value three ways (the client
library, a Vault read, a file sink) and every call they make is accepted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

CELL = re.compile(r"(app\d) \(([^)]+)\): v(\d+) expires in\s+(-?[\d.]+)s (accepted|HTTP \d+)")


def test_the_demo_apps_get_every_value_three_ways(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "keyturn", "demo", "--workdir", str(tmp_path), "--duration", "14"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"^  dashboard: +http://127\.0\.0\.1:\d+/dashboard ", result.stdout, re.M)
    cells = [CELL.findall(line) for line in result.stdout.splitlines() if "expires in" in line]
    assert len(cells) >= 10, result.stdout
    seen = [cell for line in cells for cell in line]
    assert {(app, how) for app, how, *_ in seen} == {
        ("app1", "keyturn_client"),
        ("app2", "Vault read"),
        ("app3", "file sink"),
    }
    assert all(verdict == "accepted" for *_, verdict in seen), result.stdout
    assert all(float(left) > 0 for *_, left, _verdict in seen), result.stdout
    versions = {
        app: max(int(v) for a, _how, v, *_ in seen if a == app) for app in ("app1", "app2", "app3")
    }
    assert all(version >= 3 for version in versions.values()), versions  # refreshes went through
    assert (tmp_path / "app3.json").stat().st_mode & 0o777 == 0o600
