"""The credential kinds' registry: every kind the configuration admits is registered once, and
what each declares is what its published data holds."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from keyturn.config import CredentialKind
from keyturn.jobs.job import Task
from keyturn.kinds import KINDS, REGISTERED, kind_of
from keyturn.kinds.api_key import RepublishKey
from keyturn.kinds.oauth_client.refresh import TokenRefresh
from keyturn.kinds.signing_key.keys import generate
from keyturn.observability import catalog
from keyturn.secret import Secret

SRC = Path(__file__).parents[2] / "src" / "keyturn"


def test_every_configured_kind_is_registered_once() -> None:
    names = [kind.name for kind in REGISTERED]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(get_args(CredentialKind))
    assert frozenset(names) == catalog.KINDS


def test_a_kind_names_fields_its_published_data_holds() -> None:
    samples = {
        "oauth_client": (Secret("tok"), 100.0, 400.0, 300.0),
        "api_key": (Secret("key"), "k1", 100.0, 400.0),
        "signing_key": (generate("k", "ES256"), "billing", 100.0, 400.0, Secret("issued")),
    }
    for kind in REGISTERED:
        fields = kind.published_fields(*samples[kind.name])
        named = {kind.value_field, kind.expiry_field, kind.plan_field}
        assert named <= fields.keys(), kind.name
        secret = {key for key, value in fields.items() if isinstance(value, Secret)}
        assert kind.secret_fields == secret, kind.name


def test_what_run_now_forces_is_one_of_the_kinds_tasks() -> None:
    """The task a run-now forces is a task its job runs (`Task.name`)."""
    tasks: dict[str, type[Task]] = {
        "oauth_client": TokenRefresh,
        "api_key": RepublishKey,
        "signing_key": RepublishKey,
    }
    for kind in REGISTERED:
        assert kind.run_now_forces == tasks[kind.name].name


def test_an_expiring_value_is_ready_until_it_expires_and_a_key_once_published() -> None:
    token, key = KINDS["oauth_client"], KINDS["api_key"]
    assert token.value_ready(100.0, 200.0, now=150.0)
    assert not token.value_ready(100.0, 200.0, now=200.0)
    assert key.value_ready(100.0, 200.0, now=500.0)  # past its rotation date, still works
    assert not key.value_ready(None, None, now=500.0)
    assert token.expiry_word(200.0, 100.0) == "expires"
    assert key.expiry_word(200.0, 300.0) == "rotation due"


def test_kind_of_a_credential_is_its_registered_kind() -> None:
    class Credential:
        kind = "api_key"

    assert kind_of(Credential()) is KINDS["api_key"]  # type: ignore[arg-type]


def test_the_job_machinery_imports_no_kind() -> None:
    """Dependencies point one way: kinds use `keyturn.jobs`, never the other way round."""
    for path in sorted((SRC / "jobs").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            assert not any(n.startswith("keyturn.kinds") for n in names), path.name
