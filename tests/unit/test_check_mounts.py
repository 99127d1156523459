"""The KV v2 mount check without a Vault: how Vault's answers are read, how a 403 is settled,
and when the daemon refuses to start. (Against a real OpenBao: test_vault_first_run.py.)"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from keyturn.commands.check import required_capabilities, sink_problems, vault_references
from keyturn.config import load_config
from keyturn.errors import (
    KeyturnError,
    VaultMountError,
    VaultPermissionDenied,
    VaultUnavailable,
)
from keyturn.vault.mounts import MountInfo, describe, inspect_mount, require_kv_v2

KV2 = {"type": "kv", "options": {"version": "2"}, "path": "secret/"}


class FakeMounts:
    """Answers `mount_config` and `capabilities` as Vault would for the given mounts and
    grants; a mount not in `mounts` is answered 403 (Vault does not say it is missing)."""

    def __init__(
        self,
        mounts: Mapping[str, Mapping[str, Any]],
        grants: Mapping[str, frozenset[str]] | None = None,
        failure: KeyturnError | None = None,
    ) -> None:
        self.mounts = mounts
        self.grants = grants or {}
        self.failure = failure
        self.asked: list[Sequence[str]] = []

    async def mount_config(self, mount: str) -> Mapping[str, Any]:
        if self.failure is not None:
            raise self.failure
        if mount not in self.mounts:
            raise VaultPermissionDenied("vault read mount configuration: HTTP 403")
        return self.mounts[mount]

    async def capabilities(self, paths: Sequence[str]) -> Mapping[str, frozenset[str]]:
        self.asked.append(paths)
        return {path: self.grants.get(path, frozenset({"deny"})) for path in paths}


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (KV2, "kv-v2"),
        ({"type": "kv", "options": {"version": "1"}, "path": "secret/"}, "kv-v1"),
        ({"type": "kv", "options": None, "path": "secret/"}, "kv-v1"),
        ({"type": "generic", "path": "secret/"}, "kv-v1"),
        ({"type": "transit", "options": None, "path": "secret/"}, "other"),
        ({"type": "kv", "options": {"version": "2"}, "path": "other/"}, "missing"),
        ({"type": "kv", "options": {"version": 2}}, "kv-v2"),  # no path: older servers
    ],
)
def test_vaults_answer_is_classified(answer: dict[str, Any], kind: str) -> None:
    assert describe("secret", answer).kind == kind


def test_each_problem_names_the_mount_its_user_and_the_fix() -> None:
    assert MountInfo("secret", "kv-v2").problem("vault.mount") is None
    missing = MountInfo("team/kv", "missing", nearest="team").problem("vault.mount")
    assert missing == (
        "team/kv/ (vault.mount): no secrets engine is mounted there (it is a path inside team/); "
        "keyturn needs KV v2: bao secrets enable -path=team/kv kv-v2 (or: vault secrets enable "
        "-path=team/kv kv-v2)"
    )
    v1 = MountInfo("kv", "kv-v1").problem("credentials['a'].client_secret = vault:kv/x#y")
    assert v1 is not None
    assert v1.startswith("kv/ (credentials['a'].client_secret = vault:kv/x#y) is a KV version 1")
    assert "bao kv enable-versioning kv/" in v1
    other = MountInfo("secret", "other", engine="transit").problem("vault.mount")
    assert other == (
        "secret/ (vault.mount) is a transit secrets engine, not KV v2; point vault.mount at a "
        "KV v2 mount"
    )
    hidden = MountInfo("secret", "hidden").problem("vault.mount")
    assert hidden is not None
    assert "permission denied" in hidden
    assert "cannot be checked" in hidden


async def test_a_403_is_a_missing_mount_only_for_a_token_that_holds_something_under_it() -> None:
    under = ["nokv/data/keyturn/state/a", "nokv/metadata/apps/a"]
    holding = FakeMounts({}, grants={"nokv/data/keyturn/state/a": frozenset({"read"})})
    assert (await inspect_mount(holding, "nokv", under=under)).kind == "missing"
    assert holding.asked == [under]
    root = FakeMounts({}, grants={"nokv/metadata/apps/a": frozenset({"root"})})
    assert (await inspect_mount(root, "nokv", under=under)).kind == "missing"
    nothing = FakeMounts({})
    assert (await inspect_mount(nothing, "nokv", under=under)).kind == "hidden"
    assert (await inspect_mount(FakeMounts({}), "nokv", under=[])).kind == "hidden"


async def test_other_vault_errors_are_raised_not_guessed() -> None:
    down = FakeMounts({}, failure=VaultUnavailable("vault read mount configuration: timed out"))
    with pytest.raises(VaultUnavailable):
        await inspect_mount(down, "secret", under=["secret/data/x"])


CONFIG = """
[keyturn]
state_prefix = "kt/state"
[vault]
address = "http://127.0.0.1:8200"
auth = { method = "token", token = "env:T" }
mount = "kvx"
[[providers]]
name = "p"
base_url = "https://api.example.com"
[[credentials]]
name = "c"
provider = "p"
kind = "oauth_client"
client_id = "id"
client_secret = "env:S"
publish_to = "apps/c"
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "keyturn.toml"
    path.write_text(CONFIG)
    return path


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ({"type": "kv", "options": {"version": "1"}, "path": "kvx/"}, " is a KV version 1 mount"),
        ({"type": "transit", "path": "kvx/"}, " is a transit secrets engine"),
        (None, ": no secrets engine is mounted there"),
    ],
)
async def test_the_daemon_refuses_a_mount_that_is_not_kv_v2(
    config_file: Path, answer: dict[str, Any] | None, words: str
) -> None:
    config = load_config(config_file, {})
    grants = {"kvx/data/kt/state/c": frozenset({"create", "read", "update"})}
    store = FakeMounts({"kvx": answer} if answer else {}, grants=grants)
    with pytest.raises(VaultMountError) as refused:
        await require_kv_v2(store, config)
    assert str(refused.value).startswith(f"kvx/ (vault.mount){words}")
    assert str(refused.value).endswith("; nothing was written")
    # Only a 403 needs the token's capabilities (under the mount: the first state record).
    assert store.asked == ([] if answer else [["kvx/data/kt/state/c"]])


@pytest.mark.parametrize(
    "store",
    [
        FakeMounts({"kvx": {**KV2, "path": "kvx/"}}),
        FakeMounts({}),  # the token holds nothing there: it could not write there either
        FakeMounts({}, failure=VaultUnavailable("vault read mount configuration: timed out")),
    ],
    ids=["kv-v2", "hidden", "vault-down"],
)
async def test_the_daemon_starts_on_kv_v2_and_when_it_cannot_tell(
    config_file: Path, store: FakeMounts
) -> None:
    config = load_config(config_file, {})
    with capture_logs() as logs:
        await require_kv_v2(store, config)
    warned = [log for log in logs if log["event"] == "vault.mount_unchecked"]
    assert len(warned) == (0 if store.mounts else 1)


def test_a_refresh_token_input_in_vault_needs_read_and_a_kv_v2_mount(tmp_path: Path) -> None:
    """The `refresh_token` input is a reference like the others: check wants read on it and
    inspects its mount."""
    path = tmp_path / "keyturn.toml"
    path.write_text(CONFIG + 'refresh_token = "vault:inputs/c#refresh_token"\n')
    config = load_config(path, {})
    assert ("credentials['c'].refresh_token", config.credentials[0].refresh_token) in (
        vault_references(config)
    )
    assert "read" in required_capabilities(config)["inputs/data/c"]


def test_a_sink_directory_that_is_missing_is_a_problem(tmp_path: Path) -> None:
    here = tmp_path / "run"
    here.mkdir()
    path = tmp_path / "keyturn.toml"
    path.write_text(
        CONFIG
        + f'[[credentials.sinks]]\npath = "{here}/c.json"\nformat = "json"\n'
        + f'[[credentials.sinks]]\npath = "{tmp_path}/missing/c.env"\nformat = "env"\n'
    )
    problems = sink_problems(load_config(path, {}))
    assert problems == [
        f"credentials['c'].sinks[1].path: directory {tmp_path}/missing does not exist (create it)"
    ]
