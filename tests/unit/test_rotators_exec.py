"""The exec rotator with real subprocesses: small Python scripts written to tmp_path and run
with sys.executable. The scripts themselves check what they were given (argv, environment,
stdin) and fail loudly otherwise, so a leak makes the rotation fail."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from keyturn.config.schema import ExecRotatorConfig
from keyturn.errors import RotationError
from keyturn.rotators.base import RotationRequest
from keyturn.rotators.exec import ExecRotator, child_environment

KEY = "ktsb_key_THE-NEW-KEY-VALUE-never-shown"
VAULT_TOKEN = "hvs.the-vault-token-never-shown"
SECRETS = {
    "VAULT_TOKEN": VAULT_TOKEN,
    "BAO_TOKEN": "bao-token-never-shown",
    "KEYTURN_VAULT_AUTH_TOKEN": "override-never-shown",
    "keyturn_lowercase": "lowercase-never-shown",
}
ENVIRON = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KEEP_ME": "visible", **SECRETS}
REQUEST = RotationRequest("reporting-key", "api_key", "r1", "keyturn-reporting-key-r1")
OAUTH = RotationRequest("reporting", "oauth_client", "r2", "keyturn-reporting-r2", "client_1")

# Prepended to every script: check that nothing secret reached argv or the environment, and
# record what came on stdin.
PRELUDE = """\
import json, os, sys
SECRETS = {secrets!r}
assert sys.argv[1:] == [], sys.argv
for name, value in os.environ.items():
    assert not name.upper().startswith(("KEYTURN_", "VAULT_", "BAO_")), name
    assert value not in SECRETS, name
assert os.environ.get("KEEP_ME") == "visible"
"""


def rotator(tmp_path: Path, body: str, timeout: float = 10.0) -> ExecRotator:
    script = tmp_path / "rotate.py"
    prelude = PRELUDE.format(secrets=sorted(SECRETS.values()))
    script.write_text(prelude + textwrap.dedent(body))
    config = ExecRotatorConfig("script", (sys.executable, str(script)), timeout)
    return ExecRotator(config, environ=ENVIRON)


RECORD = """\
params = json.loads(sys.stdin.read())
with open(os.path.join(os.path.dirname(__file__), "params.json"), "a") as f:
    f.write(json.dumps(params) + "\\n")
"""


def recorded(tmp_path: Path) -> list[dict[str, object]]:
    lines = (tmp_path / "params.json").read_text().splitlines()
    return [json.loads(line) for line in lines]


async def test_create_gets_its_parameters_on_stdin_and_prints_the_key(tmp_path: Path) -> None:
    script = rotator(
        tmp_path,
        RECORD + f'print(json.dumps({{"key": "{KEY}", "key_id": "key_7"}}))\n',
    )
    new = await script.create(REQUEST)
    assert new.value.reveal() == KEY
    assert new.key_id == "key_7"
    assert recorded(tmp_path) == [
        {
            "action": "create",
            "credential": "reporting-key",
            "kind": "api_key",
            "rotation_id": "r1",
            "key_name": "keyturn-reporting-key-r1",
            "client_id": None,
        }
    ]


async def test_revoke_and_find_get_their_parameters(tmp_path: Path) -> None:
    script = rotator(
        tmp_path,
        RECORD
        + """\
if params["action"] == "find":
    print(json.dumps({"key_ids": ["key_1", "key_2"]}))
elif params["action"] == "revoke":
    print("revoked", params["key_id"], file=sys.stderr)  # stdout may stay empty
""",
    )
    await script.revoke(OAUTH, "sec_9")
    assert await script.find(OAUTH) == ["key_1", "key_2"]
    revoke, find = recorded(tmp_path)
    assert revoke == {
        "action": "revoke",
        "credential": "reporting",
        "kind": "oauth_client",
        "rotation_id": "r2",
        "key_name": "keyturn-reporting-r2",
        "client_id": "client_1",
        "key_id": "sec_9",
    }
    assert find["action"] == "find"
    assert "key_id" not in find


@pytest.mark.parametrize(
    ("output", "expected"),
    [('{"supported": false}', None), ('{"key_ids": []}', []), ('{"key_ids": ["a"]}', ["a"])],
)
async def test_find_answers(tmp_path: Path, output: str, expected: list[str] | None) -> None:
    script = rotator(tmp_path, f"print({output!r})\n")
    assert await script.find(REQUEST) == expected


async def test_a_key_id_is_optional_and_may_be_an_integer(tmp_path: Path) -> None:
    assert (
        await rotator(tmp_path, f'print(\'{{"key": "{KEY}"}}\')').create(REQUEST)
    ).key_id is None
    numeric = rotator(tmp_path, f'print(\'{{"key": "{KEY}", "key_id": 12}}\')')
    assert (await numeric.create(REQUEST)).key_id == "12"


async def test_a_command_that_ignores_its_stdin_is_fine(tmp_path: Path) -> None:
    script = rotator(tmp_path, f'os.close(0)\nprint(\'{{"key": "{KEY}"}}\')\n')
    assert (await script.create(REQUEST)).value.reveal() == KEY


async def test_a_non_zero_exit_gives_the_code_and_the_last_stderr_line_without_the_key(
    tmp_path: Path,
) -> None:
    script = rotator(
        tmp_path,
        f"""\
print(json.dumps({{"key": "{KEY}"}}))
print("starting", file=sys.stderr)
print("failed to store {KEY} at the vendor: quota" + "!" * 300, file=sys.stderr)
print("", file=sys.stderr)
sys.exit(3)
""",
    )
    with pytest.raises(RotationError) as caught:
        await script.create(REQUEST)
    text = str(caught.value)
    assert text.startswith(
        "reporting-key: rotator script: create: exited with code 3: "
        "failed to store [redacted] at the vendor: quota!!!"
    ), text
    assert text.endswith("...")
    assert len(text.split("exited with code 3: ", 1)[1]) == 200
    assert KEY not in text
    assert caught.value.credential == "reporting-key"


async def test_a_key_printed_as_plain_text_is_cut_from_stderr_too(tmp_path: Path) -> None:
    script = rotator(
        tmp_path, f'print("{KEY}")\nprint("oops {KEY}", file=sys.stderr)\nsys.exit(1)\n'
    )
    with pytest.raises(RotationError, match=r"exited with code 1: oops \[redacted\]$") as caught:
        await script.create(REQUEST)
    assert KEY not in str(caught.value)


async def test_an_exit_without_stderr(tmp_path: Path) -> None:
    with pytest.raises(RotationError, match=r"revoke: exited with code 2$"):
        await rotator(tmp_path, "sys.exit(2)\n").revoke(REQUEST, "k")


async def test_a_command_killed_by_a_signal(tmp_path: Path) -> None:
    script = rotator(tmp_path, "import signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    with pytest.raises(RotationError, match="create: killed by SIGTERM"):
        await script.create(REQUEST)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for a reaper does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_dead(pid: int) -> bool:
    for _ in range(100):
        if not alive(pid):
            return True
        await asyncio.sleep(0.02)
    return False


SLOW = """\
import subprocess, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(os.path.join(os.path.dirname(__file__), "pids"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
time.sleep(60)
"""


async def test_a_time_out_kills_the_whole_process_group(tmp_path: Path) -> None:
    script = rotator(tmp_path, SLOW, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(RotationError) as caught:
        await script.create(REQUEST)
    assert time.monotonic() - started < 5
    assert str(caught.value) == "reporting-key: rotator script: create: timed out after 0.5s"
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    for pid in pids:  # the command and the grandchild it started
        assert await wait_dead(pid), pid


async def test_a_cancelled_rotation_leaves_no_process_behind(tmp_path: Path) -> None:
    script = rotator(tmp_path, SLOW, timeout=30)
    task = asyncio.create_task(script.create(REQUEST))
    for _ in range(200):
        if (tmp_path / "pids").exists() and (tmp_path / "pids").read_text():
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for pid in (int(p) for p in (tmp_path / "pids").read_text().split()):
        assert await wait_dead(pid), pid


GARBAGE = [
    ("not JSON", f'print("here is your key: {KEY}")', "create: stdout is not one JSON object"),
    ("empty", "pass", "create: stdout is not one JSON object"),
    ("two objects", f'print(\'{{"key": "{KEY}"}}{{}}\')', "create: stdout is not one JSON object"),
    ("an array", f"print('[\"{KEY}\"]')", "create: stdout is an array; expected one JSON object"),
    (
        "no key",
        'print(\'{"key_id": "k"}\')',
        'create: stdout "key" is missing; expected the new key',
    ),
    ("a numeric key", "print('{\"key\": 5}')", 'create: stdout "key" is a number; expected'),
    ("an empty key", 'print(\'{"key": ""}\')', 'create: stdout "key" is an empty string'),
    (
        "a bad key_id",
        f'print(\'{{"key": "{KEY}", "key_id": ["k"]}}\')',
        'create: stdout "key_id" is an array; expected a non-empty string or no key_id',
    ),
    (
        "too much",
        f'sys.stdout.write(\'{{"key": "{KEY}", "pad": "\' + "x" * 70000 + \'"}}\')',
        "create: printed more than 65536 bytes on stdout",
    ),
    (
        "not UTF-8",
        'sys.stdout.buffer.write(b\'{"key": "\\xff\\xfe"}\')',
        "create: stdout is not UTF-8 text",
    ),
]


@pytest.mark.parametrize(("case", "body", "message"), GARBAGE, ids=[g[0] for g in GARBAGE])
async def test_malformed_stdout_is_named_without_the_key(
    tmp_path: Path, case: str, body: str, message: str
) -> None:
    with pytest.raises(RotationError) as caught:
        await rotator(tmp_path, body + "\n").create(REQUEST)
    text = str(caught.value)
    assert text == f"reporting-key: rotator script: {message}" or text.startswith(
        f"reporting-key: rotator script: {message}"
    ), text
    assert KEY not in text and KEY not in repr(caught.value)
    assert caught.value.__cause__ is None or KEY not in str(caught.value.__cause__)


@pytest.mark.parametrize(
    "output",
    ['{"key_ids": "a"}', '{"key_ids": [1]}', '{"key_ids": [""]}', "{}", '{"supported": true}'],
)
async def test_malformed_find_answers(tmp_path: Path, output: str) -> None:
    with pytest.raises(RotationError, match='find: stdout needs "key_ids"'):
        await rotator(tmp_path, f"print({output!r})\n").find(REQUEST)


async def test_a_missing_program_is_a_rotation_error(tmp_path: Path) -> None:
    config = ExecRotatorConfig("script", (str(tmp_path / "absent"), "--x"))
    with pytest.raises(RotationError, match=r"create: cannot run .*/absent: No such file"):
        await ExecRotator(config, environ=ENVIRON).create(REQUEST)


def test_the_child_environment_drops_keyturn_and_vault_variables() -> None:
    environ = {"HOME": "/root", "VAULT_ADDR": "x", "BAO_ADDR": "y", "KEYTURN_CONFIG": "z"}
    environ |= {"Vault_Namespace": "n", "MY_VAULT_THING": "kept"}
    assert child_environment(environ) == {"HOME": "/root", "MY_VAULT_THING": "kept"}


async def test_register_gets_the_public_jwk_on_stdin_and_prints_the_providers_id(
    tmp_path: Path,
) -> None:
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": "abc", "kid": "k1", "alg": "EdDSA", "use": "sig"}
    signing = RotationRequest(
        "billing-key", "signing_key", "k1", "keyturn-billing-key-k1", public_key=jwk
    )
    script = rotator(tmp_path, RECORD + 'print(json.dumps({"key_id": 42}))\n')
    assert await script.register(signing) == "42"
    [params] = recorded(tmp_path)
    assert params["action"] == "register" and params["public_jwk"] == jwk
    assert params["key_name"] == "keyturn-billing-key-k1"
    silent = rotator(tmp_path, RECORD + 'print(json.dumps({"ok": True}))\n')
    with pytest.raises(RotationError, match='register: stdout "key_id" is missing'):
        await silent.register(signing)
