"""`[metrics] web_config`: the Prometheus exporter toolkit's web configuration file (YAML),
the part keyturn implements; the rest is refused at load (docs/configuration.md). The
certificate, key and CA are loaded once at load, so an unusable file is a load problem.
"""

from __future__ import annotations

import difflib
import re
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from keyturn.errors import ConfigError

ClientAuthType = Literal["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"]
VERIFYING: frozenset[str] = frozenset({"VerifyClientCertIfGiven", "RequireAndVerifyClientCert"})
CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}

TOP_KEYS = ("tls_server_config", "basic_auth_users")
TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
)
# The toolkit's keys keyturn does not implement: refused, never silently ignored.
UNSUPPORTED_TOP = ("http_server_config", "rate_limit")
UNSUPPORTED_TLS = (
    "cert",
    "key",
    "client_ca",
    "client_allowed_sans",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
# `$2a$`, `$2b$` or `$2y$`, a two-digit cost, 22 characters of salt and 31 of hash.
BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}")


@dataclass(frozen=True, slots=True)
class TlsServerConfig:
    """`tls_server_config`, its paths absolute."""

    cert_file: Path
    key_file: Path
    client_auth_type: ClientAuthType = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion | None = None

    @property
    def verifies_clients(self) -> bool:
        return self.client_auth_type in VERIFYING

    @property
    def files(self) -> tuple[Path, ...]:
        """The files a server's TLS context is made of: watched for changes."""
        ca = () if self.client_ca_file is None else (self.client_ca_file,)
        return (self.cert_file, self.key_file, *ca)

    def context(self) -> ssl.SSLContext:
        """A new server context from the files as they are now (ssl.SSLError, OSError)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = self.min_version
        if self.max_version is not None:
            context.maximum_version = self.max_version
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file is not None:
            context.load_verify_locations(cafile=self.client_ca_file)
        context.verify_mode = {
            "NoClientCert": ssl.CERT_NONE,
            "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
            "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
        }[self.client_auth_type]
        return context


@dataclass(frozen=True, slots=True)
class WebConfig:
    """The file, read: `tls` (None: plain HTTP) and `users` (user -> bcrypt hash)."""

    path: Path
    tls: TlsServerConfig | None = None
    users: Mapping[str, bytes] = field(
        default_factory=lambda: MappingProxyType({}), repr=False, hash=False
    )

    @property
    def authenticates(self) -> bool:
        """Whether a request can prove who sent it: a password, or a verified certificate."""
        return bool(self.users) or (self.tls is not None and self.tls.verifies_clients)


def _keys(
    table: Mapping[Any, Any], where: str, known: tuple[str, ...], unsupported: tuple[str, ...]
) -> Iterator[str]:
    for key in table:
        path = f"{where}{key}"
        if key in unsupported:
            yield f"{path}: not supported by keyturn; expected only {', '.join(known)}"
        elif key not in known:
            close = difflib.get_close_matches(str(key), known + unsupported, n=1, cutoff=0.6)
            hint = f'; did you mean "{close[0]}"?' if close else f"; expected {', '.join(known)}"
            yield f"{path}: unknown key{hint}"


def _path(value: object, base: Path, where: str, problems: list[str]) -> Path | None:
    if not isinstance(value, str) or not value or "\x00" in value:
        problems.append(f"{where}: expected a file's path (relative: to this file's directory)")
        return None
    return base / value


def _version(value: object, where: str, problems: list[str]) -> ssl.TLSVersion | None:
    if value in VERSIONS:
        return VERSIONS[str(value)]
    shown = f'"{value}"' if isinstance(value, str) else type(value).__name__
    problems.append(f"{where}: got {shown}; expected TLS12 or TLS13")
    return None


def _tls(table: object, base: Path, problems: list[str]) -> TlsServerConfig | None:
    where = "tls_server_config"
    if not isinstance(table, dict):
        problems.append(f"{where}: expected a mapping of {', '.join(TLS_KEYS)}")
        return None
    found = list(_keys(table, f"{where}.", TLS_KEYS, UNSUPPORTED_TLS))
    paths: dict[str, Path | None] = {}
    for key in ("cert_file", "key_file", "client_ca_file"):
        if key in table:
            paths[key] = _path(table[key], base, f"{where}.{key}", found)
        elif key != "client_ca_file":
            found.append(f"{where}.{key}: missing; expected a file's path")
    auth = table.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH_TYPES:
        shown = f'"{auth}"' if isinstance(auth, str) else type(auth).__name__
        why = (
            " (it accepts a certificate without verifying it, which keyturn does not)"
            if auth in ("RequestClientCert", "RequireAnyClientCert")
            else ""
        )
        found.append(
            f"{where}.client_auth_type: got {shown}{why}; expected {', '.join(CLIENT_AUTH_TYPES)}"
        )
    elif auth in VERIFYING and "client_ca_file" not in table:
        found.append(f"{where}.client_ca_file: missing; {auth} needs the CA that signs clients")
    elif auth == "NoClientCert" and "client_ca_file" in table:
        found.append(
            f"{where}.client_ca_file: given with client_auth_type NoClientCert; expected "
            "client_auth_type VerifyClientCertIfGiven or RequireAndVerifyClientCert with it"
        )
    minimum = _version(table.get("min_version", "TLS12"), f"{where}.min_version", found)
    maximum = None
    if "max_version" in table:
        maximum = _version(table["max_version"], f"{where}.max_version", found)
    if minimum is not None and maximum is not None and maximum < minimum:
        found.append(f"{where}.max_version: lower than min_version; expected at least it")
    problems += found
    if found:
        return None
    tls = TlsServerConfig(
        cert_file=paths["cert_file"],  # type: ignore[arg-type]  # present: checked above
        key_file=paths["key_file"],  # type: ignore[arg-type]
        client_auth_type=auth,
        client_ca_file=paths.get("client_ca_file"),
        min_version=minimum or ssl.TLSVersion.TLSv1_2,
        max_version=maximum,
    )
    try:
        tls.context()
    except (OSError, ssl.SSLError) as exc:
        names = ", ".join(str(p) for p in tls.files)
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None)
        problems.append(
            f"{where}: cannot load the certificate, key or CA ({names}): "
            f"{reason or type(exc).__name__}; expected readable PEM files, the key the "
            "certificate's"
        )
        return None
    return tls


def _users(table: object, problems: list[str]) -> Mapping[str, bytes]:
    where = "basic_auth_users"
    if not isinstance(table, dict):
        problems.append(f"{where}: expected a mapping of user names to bcrypt hashes")
        return {}
    users: dict[str, bytes] = {}
    for user, hashed in table.items():
        if not isinstance(user, str) or not user or ":" in user:
            problems.append(f"{where}: a user name that is empty, not a string or has a colon")
        elif not isinstance(hashed, str) or not BCRYPT.fullmatch(hashed):
            problems.append(
                f"{where}.{user}: not a bcrypt hash (its value is not shown); expected "
                '"$2b$<cost>$..." as `htpasswd -nBC 12 "" | tr -d ":"` prints it'
            )
        else:
            users[user] = hashed.encode()
    return MappingProxyType(users)


def parse_web_config(data: object, path: Path) -> tuple[WebConfig | None, list[str]]:
    """The file's parsed YAML, read: the config, or None and one problem per line."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return None, [f"expected a mapping of {', '.join(TOP_KEYS)}"]
    problems = list(_keys(data, "", TOP_KEYS, UNSUPPORTED_TOP))
    base = path.parent
    tls = _tls(data["tls_server_config"], base, problems) if "tls_server_config" in data else None
    users = _users(data["basic_auth_users"], problems) if "basic_auth_users" in data else {}
    if problems:
        return None, problems
    return WebConfig(path=path, tls=tls, users=MappingProxyType(dict(users))), []


def read_web_config(path: Path) -> tuple[WebConfig | None, list[str]]:
    """Read and check the file: (config, []) or (None, problem lines without the file)."""
    import yaml  # noqa: PLC0415 - only a daemon with a web_config needs it

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"cannot read it: {getattr(exc, 'strerror', None) or type(exc).__name__}"]
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return None, [f"not valid YAML{at}"]
    return parse_web_config(data, path)


def load_web_config(path: Path) -> WebConfig:
    """The file, read; ConfigError with one line per problem, each naming the file."""
    config, problems = read_web_config(path)
    if config is None:
        raise ConfigError([f"{path}: {line}" for line in problems])
    return config
