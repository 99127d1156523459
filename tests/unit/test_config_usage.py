"""The `[usage]` table, a credential's `consumers` allow list and `rotation.wait_for_consumers`:
defaults, every key, the rules across keys and tables, overrides, one line per problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyturn.config import parse_config
from keyturn.config.credentials import DEFAULT_MAX_GRACE, RotationPolicy
from keyturn.config.schema import UsageSettings
from keyturn.errors import ConfigError
from keyturn_devkit.harness.configs import VAULT

BASE = VAULT + """
[[providers]]
name = "acme"
base_url = "https://acme.example.com"

[[rotators]]
name = "person"
type = "manual"

[[credentials]]
name = "reporting-key"
provider = "acme"
kind = "api_key"
publish_to = "apps/reporting/key"
probe = "/v1/users"
rotation = { max_age = "30d", rotator = "person"ROTATION }
CREDENTIAL
"""
FILE_SOURCE = '\n[usage]\nsource = "file"\nfile = "/var/log/openbao/audit.log"\n'


def config_text(usage: str = FILE_SOURCE, rotation: str = "", credential: str = "") -> str:
    return BASE.replace("ROTATION", rotation).replace("CREDENTIAL", credential) + usage


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "k.toml", environ or {})
    return caught.value.problems


def test_without_usage_there_is_none_and_nothing_changes() -> None:
    config = parse_config(config_text(usage=""), "k.toml", {})
    assert config.usage is None
    [credential] = config.credentials
    assert credential.consumers is None
    assert credential.rotation == RotationPolicy(max_age=30 * 86400.0, rotator="person")
    assert credential.rotation.wait_for_consumers is False
    assert credential.rotation.longest_grace() == DEFAULT_MAX_GRACE == 86400.0


def test_usage_defaults() -> None:
    usage = parse_config(config_text(), "k.toml", {}).usage
    assert usage == UsageSettings(
        source="file",
        file=Path("/var/log/openbao/audit.log"),
        prefix=None,
        position_file=Path("/var/lib/keyturn/audit-position.json"),
        socket=None,
        allowed_networks=("127.0.0.0/8", "::1/128"),
        learning=86400.0,
        rate_window=300.0,
        rate_factor=10.0,
        rate_floor=100,
        repeat=3600.0,
        max_consumers=100,
        consumer_labels=20,
    )


def test_every_usage_key_can_be_set(tmp_path: Path) -> None:
    text = config_text(
        usage='\n[usage]\nsource = "socket"\nsocket = "[::1]:9090"\n'
        'allowed_networks = ["10.0.4.7/24", "::1/128"]\nposition_file = "pos.json"\n'
        'learning = "2h"\nrate_window = "1m"\nrate_factor = 4\nrate_floor = 20\n'
        'repeat = "10m"\nmax_consumers = 50\nconsumer_labels = 5\n'
    )
    usage = parse_config(text, str(tmp_path / "k.toml"), {}).usage
    assert usage is not None
    assert (usage.source, usage.socket, usage.file) == ("socket", "[::1]:9090", None)
    assert usage.allowed_networks == ("10.0.4.0/24", "::1/128")
    assert usage.position_file == tmp_path / "pos.json"
    assert (usage.learning, usage.rate_window, usage.rate_factor) == (7200.0, 60.0, 4.0)
    assert (usage.rate_floor, usage.repeat) == (20, 600.0)
    assert (usage.max_consumers, usage.consumer_labels) == (50, 5)
    unix = config_text(usage='\n[usage]\nsource = "socket"\nsocket = "unix:/run/keyturn/a.sock"\n')
    assert parse_config(unix, "k.toml", {}).usage is not None


@pytest.mark.parametrize(
    ("usage", "line"),
    [
        (
            "\n[usage]\n",
            'k.toml: usage.source: missing; expected one of "file", "socket"',
        ),
        (
            '\n[usage]\nsource = "file"\n',
            'k.toml: usage.file: missing for source = "file"; expected the audit file\'s path',
        ),
        (
            '\n[usage]\nsource = "socket"\n',
            'k.toml: usage.socket: missing for source = "socket"; expected the address to '
            "listen on",
        ),
        (
            FILE_SOURCE + 'socket = "127.0.0.1:9090"\n',
            'k.toml: usage.socket: is set for source = "file"; expected it only with source = '
            '"socket"',
        ),
        (
            '\n[usage]\nsource = "socket"\nsocket = "127.0.0.1:9090"\nprefix = "audit:"\n',
            'k.toml: usage.prefix: is set for source = "socket"; expected it only with source = '
            '"file"',
        ),
        (
            '\n[usage]\nsource = "socket"\nsocket = "unix:relative.sock"\n',
            'k.toml: usage.socket: got "unix:relative.sock"; expected where keyturn listens for '
            'Vault\'s socket audit device: "host:port" (e.g. "127.0.0.1:9090" or "[::1]:9090") '
            'or "unix:/absolute/path"',
        ),
        (
            FILE_SOURCE + 'allowed_networks = ["10.0.0.0/33"]\n',
            'k.toml: usage.allowed_networks: got "10.0.0.0/33" in the array; expected a '
            'non-empty array of networks, e.g. ["127.0.0.0/8", "10.0.4.0/24", "::1/128"] (in the '
            'environment a JSON array or "a,b")',
        ),
        (
            FILE_SOURCE + "consumer_labels = 200\n",
            "k.toml: usage.consumer_labels: is more than max_consumers (100); expected at most "
            "max_consumers (only consumers kept by name can have a label)",
        ),
        (
            FILE_SOURCE + "rate_factor = 0.5\n",
            "k.toml: usage.rate_factor: got 0.5, which is out of range; expected a number "
            "between 1 and 1000",
        ),
        (
            FILE_SOURCE + "sorce = 1\n",
            'k.toml: usage.sorce: unknown key; did you mean "source"?',
        ),
    ],
)
def test_a_bad_usage_table_is_one_line(usage: str, line: str) -> None:
    assert problems(config_text(usage=usage)) == [line]


def test_an_allow_list_of_names_patterns_and_entity_ids() -> None:
    consumers = '["approle/reporting", "kubernetes-prod-*", "6f5c0a59-1e7e", "approle/reporting"]'
    config = parse_config(config_text(credential=f"consumers = {consumers}"), "k.toml", {})
    assert config.credentials[0].consumers == (
        "approle/reporting",
        "kubernetes-prod-*",
        "6f5c0a59-1e7e",
    )


@pytest.mark.parametrize("value", ["[]", '[""]', '["a\\u0007b"]', f'["{"x" * 129}"]', '"one"'])
def test_a_bad_allow_list_is_refused(value: str) -> None:
    [line] = problems(config_text(credential=f"consumers = {value}"))
    assert line.startswith('k.toml: credentials["reporting-key"].consumers: got ')
    assert line.endswith('(each at most 128 characters; in the environment a JSON array or "a,b")')


def test_wait_for_consumers_with_its_window_and_max_grace() -> None:
    rotation = (
        ', grace = "1h", wait_for_consumers = true, consumer_window = "12h", max_grace = "2d"'
    )
    config = parse_config(config_text(rotation=rotation), "k.toml", {})
    policy = config.credentials[0].rotation
    assert policy is not None
    assert (policy.wait_for_consumers, policy.consumer_window, policy.max_grace) == (
        True,
        43200.0,
        172800.0,
    )
    assert policy.longest_grace() == 172800.0
    # Without max_grace: a day, never less than grace.
    assert RotationPolicy(max_age=9e6, rotator="r", grace=3 * 86400.0).longest_grace() == 259200.0


@pytest.mark.parametrize(
    ("rotation", "usage", "line"),
    [
        (
            ", wait_for_consumers = true",
            "",
            'k.toml: credentials["reporting-key"].rotation.wait_for_consumers: is true without '
            "[usage]; expected a [usage] table as well (keyturn learns who reads from Vault's "
            "audit log)",
        ),
        (
            ', grace = "2h", max_grace = "1h"',
            FILE_SOURCE,
            'k.toml: credentials["reporting-key"].rotation.max_grace: is shorter than grace '
            "(7200s); expected max_grace >= grace (the old key is never revoked before grace has "
            "passed)",
        ),
        (
            ', max_age = "12h", wait_for_consumers = true',
            FILE_SOURCE,
            'k.toml: credentials["reporting-key"].rotation.wait_for_consumers: waits up to '
            "max_grace's default (86400s), which is not shorter than max_age (43200s); expected "
            "a max_grace shorter than max_age",
        ),
        (
            ', wait_for_consumers = true, max_grace = "30d"',
            FILE_SOURCE,
            'k.toml: credentials["reporting-key"].rotation.max_grace: is not shorter than max_age '
            "(2.592e+06s); expected a max_grace shorter than max_age, so that at most two keys "
            "are live at once",
        ),
    ],
)
def test_a_bad_wait_is_one_line(rotation: str, usage: str, line: str) -> None:
    text = BASE.replace('max_age = "30d", ', "") if "max_age" in rotation else BASE
    text = text.replace("ROTATION", rotation).replace("CREDENTIAL", "") + usage
    assert problems(text) == [line]


def test_an_allow_list_needs_usage() -> None:
    assert problems(config_text(usage="", credential='consumers = ["approle/a"]')) == [
        'k.toml: credentials["reporting-key"].consumers: is set without [usage]; expected a '
        "[usage] table as well (keyturn learns who reads from Vault's audit log)"
    ]


def test_a_client_secret_is_never_read_by_consumers() -> None:
    text = (
        BASE.replace("ROTATION", "").replace("CREDENTIAL", "")
        + FILE_SOURCE
        + """
[[rotators]]
name = "script"
type = "exec"
command = ["rotate"]

[[credentials]]
name = "reporting"
provider = "acme"
kind = "oauth_client"
client_id = "app"
client_secret = "env:SECRET"
publish_to = "apps/reporting/token"
rotation = { max_age = "30d", rotator = "script", wait_for_consumers = true }
"""
    )
    assert problems(text) == [
        'k.toml: credentials["reporting"].rotation.wait_for_consumers: is true for an '
        "oauth_client, whose client secret is never published, so no consumer reads it; "
        "expected wait_for_consumers only for an api_key"
    ]


def test_overrides_set_usage_consumers_and_the_wait() -> None:
    environ = {
        "KEYTURN_USAGE_FILE": "/srv/audit.log",
        "KEYTURN_USAGE_ALLOWED_NETWORKS": "10.0.0.0/8,::1/128",
        "KEYTURN_CREDENTIALS_REPORTING_KEY_CONSUMERS": '["approle/a", "approle/b"]',
        "KEYTURN_CREDENTIALS_REPORTING_KEY_ROTATION_WAIT_FOR_CONSUMERS": "true",
        "KEYTURN_CREDENTIALS_REPORTING_KEY_ROTATION_MAX_GRACE": "3h",
    }
    config = parse_config(config_text(), "k.toml", environ)
    assert config.usage is not None
    assert config.usage.file == Path("/srv/audit.log")
    assert config.usage.allowed_networks == ("10.0.0.0/8", "::1/128")
    [credential] = config.credentials
    assert credential.consumers == ("approle/a", "approle/b")
    assert credential.rotation is not None
    assert (credential.rotation.wait_for_consumers, credential.rotation.max_grace) == (
        True,
        10800.0,
    )
