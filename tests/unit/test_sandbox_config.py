"""Sandbox settings: the TOML file, runtime updates, errors that name the key, and the TOML
writer SandboxProcess uses (checked by reading its output back with tomllib)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from keyturn.errors import ConfigError
from keyturn_devkit.dev.sandbox import to_toml
from keyturn_devkit.sandbox.config import RateLimit, Settings, apply_settings, load_settings


def test_a_file_sets_every_key_it_names_and_defaults_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "sandbox.toml"
    path.write_text(
        "access_token_lifetime = 1\n"
        "issue_refresh_token_for_client_credentials = false\n"
        'default_scope = "users:read"\n'
        "[rate_limits]\n"
        "token = { requests = 3, per_seconds = 0.5 }\n"
    )
    settings = load_settings(path)
    assert settings.access_token_lifetime == 1
    assert settings.issue_refresh_token_for_client_credentials is False
    assert settings.default_scope == "users:read"
    assert dict(settings.rate_limits) == {"token": RateLimit(3, 0.5)}
    assert settings.refresh_token_lifetime == Settings().refresh_token_lifetime


def test_every_bad_key_is_reported_with_file_key_and_expectation(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        "access_token_lifetime = 0\n"
        'include_expires_in = "yes"\n'
        "max_body_bytes = true\n"
        "colour = 3\n"
        "[rate_limits]\n"
        "tokens = { requests = 1, per_seconds = 1 }\n"
        "users = { requests = 0, per_seconds = 1 }\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    problems = caught.value.problems
    assert len(problems) == 6
    assert all(line.startswith(f"{path}: ") for line in problems)
    text = "\n".join(problems)
    for fragment in (
        "access_token_lifetime: expected an integer from 1",
        "include_expires_in: expected true or false",
        "max_body_bytes: expected an integer",
        "colour: unknown setting",
        "rate_limits.tokens: expected an endpoint",
        "rate_limits.users.requests: expected an integer from 1",
    ):
        assert fragment in text


@pytest.mark.parametrize(
    ("content", "message"),
    [("access_token_lifetime = \n", "not valid TOML"), (None, "cannot read")],
)
def test_unreadable_or_invalid_files_name_the_file(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "sandbox.toml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message) as caught:
        load_settings(path)
    assert str(path) in str(caught.value)


def test_runtime_updates_merge_rate_limits_and_null_removes_one() -> None:
    base = apply_settings(
        Settings(), {"rate_limits": {"token": {"requests": 1, "per_seconds": 1}}}, "t"
    )
    merged = apply_settings(
        base,
        {"rate_limits": {"users": {"requests": 2, "per_seconds": 1}}, "scope_override": "x"},
        "t",
    )
    assert set(merged.rate_limits) == {"token", "users"}
    assert merged.scope_override == "x"
    removed = apply_settings(merged, {"rate_limits": {"token": None}, "scope_override": None}, "t")
    assert set(removed.rate_limits) == {"users"}
    assert removed.scope_override is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("default_scope", 'users:read "quoted"'),
        ("default_scope", "double  space"),
        ("token_type", ""),
        ("access_token_lifetime", None),
        ("client_secret_overlap", -1),
        ("rate_limits", {"token": {"requests": 1}}),
    ],
)
def test_invalid_values_are_refused_and_leave_settings_unchanged(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        apply_settings(Settings(), {key: value}, "settings")


def test_settings_serialize_to_json_types() -> None:
    data = apply_settings(
        Settings(), {"rate_limits": {"*": {"requests": 5, "per_seconds": 2}}}, "t"
    ).to_json()
    assert data["rate_limits"] == {"*": {"requests": 5, "per_seconds": 2.0}}
    assert data["access_token_lifetime"] == 3600


def test_to_toml_output_reads_back_as_the_same_data() -> None:
    config = {
        "access_token_lifetime": 1,
        "include_expires_in": False,
        "ratio": 0.25,
        "default_scope": 'users:read "x" \\ é\n',
        "scope_override": None,
        "names": ["a", "b"],
        "rate_limits": {"token": {"requests": 2, "per_seconds": 1.5}, "users": None},
    }
    parsed = tomllib.loads(to_toml(config))
    expected = {k: v for k, v in config.items() if v is not None}
    expected["rate_limits"] = {"token": {"requests": 2, "per_seconds": 1.5}}
    assert parsed == expected


def test_to_toml_refuses_values_toml_cannot_hold() -> None:
    with pytest.raises(ValueError, match="ratio"):
        to_toml({"ratio": float("nan")})
    with pytest.raises(ValueError, match="when"):
        to_toml({"when": object()})
