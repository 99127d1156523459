"""`[metrics] web_config` and `open_paths` at load, and `keyturn check`'s warning about an
open /usage. The certificates themselves, the server and a real Prometheus:
tests/integration/test_metrics_tls.py."""

from __future__ import annotations

from pathlib import Path

import bcrypt
import pytest
import yaml

from keyturn.commands.check import metrics_notes
from keyturn.config import Config, parse_config
from keyturn.config.webconfig import parse_web_config
from keyturn.errors import ConfigError
from keyturn_devkit.harness.configs import VAULT

BASE = VAULT
USAGE = '[usage]\nsource = "socket"\nsocket = "127.0.0.1:9090"\n'
HASH = bcrypt.hashpw(b"a password", bcrypt.gensalt(rounds=4)).decode()


def config(text: str, environ: dict[str, str] | None = None) -> Config:
    return parse_config(
        BASE + text, "/etc/keyturn/keyturn.toml", {"VAULT_TOKEN": "x", **(environ or {})}
    )


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as error:
        config(text, environ)
    return error.value.problems


def web_yml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def test_unknown_and_unimplemented_keys_are_refused_with_the_file_and_key_path(
    tmp_path: Path,
) -> None:
    path = web_yml(
        tmp_path,
        "tls_server_config:\n  cert_fil: a.pem\n  key_file: a.key\n  cipher_suites: [x]\n"
        "http_server_config:\n  http2: false\nbasic_auth_user:\n  a: b\n",
    )
    found = problems(f'[metrics]\nweb_config = "{path}"\n')
    prefix = f"/etc/keyturn/keyturn.toml: metrics.web_config: {path}: "
    assert found == [
        prefix + "http_server_config: not supported by keyturn; expected only "
        "tls_server_config, basic_auth_users",
        prefix + 'basic_auth_user: unknown key; did you mean "basic_auth_users"?',
        prefix + 'tls_server_config.cert_fil: unknown key; did you mean "cert_file"?',
        prefix + "tls_server_config.cipher_suites: not supported by keyturn; expected only "
        "cert_file, key_file, client_auth_type, client_ca_file, min_version, max_version",
        prefix + "tls_server_config.cert_file: missing; expected a file's path",
    ]


@pytest.mark.parametrize(
    ("tls", "expected"),
    [
        (
            "client_auth_type: RequireAnyClientCert",
            'tls_server_config.client_auth_type: got "RequireAnyClientCert" (it accepts a '
            "certificate without verifying it, which keyturn does not); expected NoClientCert, "
            "VerifyClientCertIfGiven, RequireAndVerifyClientCert",
        ),
        (
            "client_auth_type: RequireAndVerifyClientCert",
            "tls_server_config.client_ca_file: missing; RequireAndVerifyClientCert needs the "
            "CA that signs clients",
        ),
        (
            "client_ca_file: ca.pem",
            "tls_server_config.client_ca_file: given with client_auth_type NoClientCert; "
            "expected client_auth_type VerifyClientCertIfGiven or RequireAndVerifyClientCert "
            "with it",
        ),
        (
            "min_version: TLS11",
            'tls_server_config.min_version: got "TLS11"; expected TLS12 or TLS13',
        ),
        (
            "min_version: TLS13\n  max_version: TLS12",
            "tls_server_config.max_version: lower than min_version; expected at least it",
        ),
    ],
)
def test_tls_settings_keyturn_cannot_honour_are_refused(tls: str, expected: str) -> None:
    data = f"tls_server_config:\n  cert_file: a.pem\n  key_file: a.key\n  {tls}\n"
    web, found = parse_web_config(yaml.safe_load(data), Path("/etc/keyturn/web.yml"))
    assert web is None
    assert found == [expected]


def test_a_hash_that_is_not_bcrypt_is_refused_without_showing_it(tmp_path: Path) -> None:
    secret = "plain-text-password-by-mistake"
    path = web_yml(tmp_path, f"basic_auth_users:\n  prometheus: {secret}\n")
    (found,) = problems(f'[metrics]\nweb_config = "{path}"\n')
    assert "basic_auth_users.prometheus: not a bcrypt hash (its value is not shown)" in found
    assert secret not in found


def test_a_missing_or_broken_file_is_one_problem(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yml"
    assert problems(f'[metrics]\nweb_config = "{missing}"\n') == [
        f"/etc/keyturn/keyturn.toml: metrics.web_config: {missing}: cannot read it: No such "
        "file or directory"
    ]
    broken = web_yml(tmp_path, f"basic_auth_users:\n  p: '{HASH}\n  q: [\n")
    (found,) = problems(f'[metrics]\nweb_config = "{broken}"\n')
    assert found.startswith(
        f"/etc/keyturn/keyturn.toml: metrics.web_config: {broken}: not valid YAML at line"
    )
    assert HASH not in found


def test_basic_auth_alone_loads_and_hides_its_hashes(tmp_path: Path) -> None:
    path = web_yml(tmp_path, f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    loaded = config(f'[metrics]\nweb_config = "{path}"\nopen_paths = ["/healthz"]\n')
    web = loaded.metrics.web_config
    assert web is not None
    assert web.tls is None
    assert web.users == {"prometheus": HASH.encode()}
    assert web.authenticates
    assert loaded.metrics.open_paths == {"/healthz"}
    assert HASH not in repr(loaded.metrics)


def test_open_paths_are_the_probes_only_and_can_be_overridden() -> None:
    (found,) = problems('[metrics]\nopen_paths = ["/usage"]\n')
    assert found == (
        '/etc/keyturn/keyturn.toml: metrics.open_paths: got "/usage" in the array; expected an '
        'array of "/healthz" and "/readyz", e.g. ["/healthz"]'
    )
    loaded = config("", {"KEYTURN_METRICS_OPEN_PATHS": "/healthz,/readyz"})
    assert loaded.metrics.open_paths == {"/healthz", "/readyz"}


def test_check_warns_when_usage_is_open_to_the_network(tmp_path: Path) -> None:
    assert metrics_notes(config(USAGE)) == []  # loopback by default
    assert metrics_notes(config('[metrics]\nlisten = "0.0.0.0:9797"\n')) == []  # no [usage]
    (warning,) = metrics_notes(config(f'[metrics]\nlisten = "0.0.0.0:9797"\n{USAGE}'))
    assert warning.startswith("warning: metrics.listen: /usage on 0.0.0.0:9797, not a loopback")
    path = web_yml(tmp_path, f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    guarded = f'[metrics]\nlisten = "0.0.0.0:9797"\nweb_config = "{path}"\n{USAGE}'
    assert metrics_notes(config(guarded)) == []
