"""One OpenBao server set up the way a production one is: Raft storage and HTTPS.

`bao server -dev` serves plain HTTP, keeps everything in memory and arrives unsealed with KV
v2 mounted. The set-up docs (docs/vault.md) are for a real server, so the tests that follow
them need one: `storage "raft"` (this OpenBao build has no `storage "file"`), a TCP listener
with a certificate signed by a CA of its own (made here with `openssl`), `bao operator init`
with one key share, and an unseal. Nothing is mounted or enabled: that is what the docs say to
do.

    with OpenBaoTLSServer() as vault:
        vault.address          # https://127.0.0.1:<port>
        vault.ca_cert          # the CA that signed its certificate (what [vault] ca_cert names)
        vault.root_token       # from the init
        vault.cli_env()        # BAO_ADDR, BAO_CACERT, BAO_TOKEN for the `bao` CLI

`make_throwaway_pki(directory)` alone makes a throwaway CA and a server certificate for
127.0.0.1 and localhost, valid for two days. The keys are throwaway too: never use them for
anything but a test.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from keyturn_devkit.dev.openbao import bao_binary
from keyturn_devkit.dev.ports import free_port_pair
from keyturn_devkit.dev.process import ManagedServer, spawn_logged, terminate

_HEALTH = "/v1/sys/health?standbyok=true&sealedcode=200&uninitcode=200"


@dataclass(frozen=True)
class ThrowawayPKI:
    """A throwaway CA and one server certificate it signed (PEM files)."""

    ca_cert: Path
    cert: Path
    key: Path


class PKIError(RuntimeError):
    """`openssl` failed (the message has its stderr; no key material is ever in it)."""


def _openssl(args: Sequence[str], cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise PKIError("openssl is not installed (Debian: apt-get install openssl)")
    result = subprocess.run(  # fixed argv: paths and options only, never key material
        [openssl, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise PKIError(f"openssl {args[0]} failed: {result.stderr.strip()[-500:]}")


def make_throwaway_pki(
    directory: Path,
    *,
    ips: Sequence[str] = ("127.0.0.1",),
    dns_names: Sequence[str] = ("localhost",),
    days: int = 2,
) -> ThrowawayPKI:
    """A CA (`ca.pem`) and a server certificate (`server.pem`, key `server.key`, mode 0600) for
    `ips` and `dns_names`, in `directory`. EC P-256 keys, extensions as strict verifiers
    (Go's, Python's) want them: key usages, SAN, subject and authority key identifiers."""
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"IP:{ip}" for ip in ips] + [f"DNS:{name}" for name in dns_names]
    (directory / "ca.cnf").write_text(
        "[req]\ndistinguished_name = dn\nx509_extensions = ca\nprompt = no\n"
        "[dn]\nCN = keyturn throwaway test CA\n"
        "[ca]\nbasicConstraints = critical, CA:TRUE, pathlen:0\n"
        "keyUsage = critical, keyCertSign, cRLSign\n"
        "subjectKeyIdentifier = hash\n"
    )
    (directory / "server.ext").write_text(
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature\n"
        "extendedKeyUsage = serverAuth\n"
        f"subjectAltName = {', '.join(names)}\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid, issuer\n"
    )
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    old_umask = os.umask(0o077)  # the keys are created readable by their owner only
    try:
        _openssl(
            ["req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem",
             "-days", str(days), "-config", "ca.cnf"],
            directory,
        )  # fmt: skip
        _openssl(
            ["req", *curve, "-keyout", "server.key", "-out", "server.csr",
             "-subj", f"/CN={dns_names[0] if dns_names else ips[0]}"],
            directory,
        )  # fmt: skip
        _openssl(
            ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", str(days),
             "-extfile", "server.ext"],
            directory,
        )  # fmt: skip
    finally:
        os.umask(old_umask)
    return ThrowawayPKI(directory / "ca.pem", directory / "server.pem", directory / "server.key")


class OpenBaoTLSServer(ManagedServer):
    """One `bao server` on Raft storage behind HTTPS on 127.0.0.1; see the module docstring.

    `start()` initialises and unseals it (unless `initialise=False`: then it is left sealed
    and uninitialised, as `bao server` comes up). `stop()` ends it and removes its files,
    unless `keep_files`.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        initialise: bool = True,
        keep_files: bool = False,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="keyturn-bao-tls-"))
        self._initialise = initialise
        self._keep = keep_files
        self.port = 0
        self.root_token = ""
        self.unseal_key = ""
        self.pki: ThrowawayPKI | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"OpenBaoTLSServer({self.address if self.port else 'not started'})"

    @property
    def address(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_cert(self) -> Path:
        if self.pki is None:
            raise RuntimeError("the server is not started")
        return self.pki.ca_cert

    @property
    def log_path(self) -> Path:
        return self.workdir / "bao.log"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def cli_env(
        self, token: str | None = None, *, base: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """An environment for the `bao` CLI against this server: `base` (default: this
        process's environment) without any VAULT_*/BAO_* variable, plus BAO_ADDR, BAO_CACERT,
        HOME (so no ~/.vault-token of the caller's is used) and BAO_TOKEN (the root token
        unless `token` is given; "" for none)."""
        env = {
            key: value
            for key, value in (os.environ if base is None else base).items()
            if not key.startswith(("VAULT_", "BAO_"))
        }
        env.update(BAO_ADDR=self.address, BAO_CACERT=str(self.ca_cert), HOME=str(self.workdir))
        chosen = self.root_token if token is None else token
        if chosen:
            env["BAO_TOKEN"] = chosen
        return env

    def client(self, timeout: float = 10.0) -> httpx.Client:
        """An httpx client for this server's API that trusts its CA (no token)."""
        trust = ssl.create_default_context(cafile=str(self.ca_cert))
        return httpx.Client(base_url=self.address, verify=trust, timeout=timeout)

    # -- life cycle -------------------------------------------------------------------------

    def start(self, timeout: float = 30.0, attempts: int = 3) -> OpenBaoTLSServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = make_throwaway_pki(self.workdir / "tls")
        for attempt in range(1, attempts + 1):
            deadline = time.monotonic() + timeout
            self.port = free_port_pair()  # API on P, cluster on P+1
            data = self.workdir / "raft"
            shutil.rmtree(data, ignore_errors=True)
            data.mkdir(mode=0o700)
            self._write_config(data)
            self._spawn()
            try:
                self._wait(lambda: self._health() is not None, deadline, "the server to answer")
                if self._initialise:
                    self._init_and_unseal(deadline)
                return self
            except _Exited:
                self.stop(cleanup=False)
                if attempt == attempts:  # most likely a port taken meanwhile, every time
                    raise RuntimeError(f"OpenBao did not start; see {self.log_path}") from None
            except BaseException:
                self.stop(cleanup=False)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self, *, cleanup: bool = True) -> None:
        terminate(self._process)
        self._process = None
        if cleanup and not self._keep and self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- plumbing ---------------------------------------------------------------------------

    def _write_config(self, data: Path) -> None:
        assert self.pki is not None
        config = (
            'storage "raft" {\n'
            f'  path = "{data}"\n'
            '  node_id = "node0"\n'
            # 1 (production tuning): the single node elects itself in about a second.
            "  performance_multiplier = 1\n"
            "}\n"
            'listener "tcp" {\n'
            f'  address = "127.0.0.1:{self.port}"\n'
            f'  cluster_address = "127.0.0.1:{self.port + 1}"\n'
            f'  tls_cert_file = "{self.pki.cert}"\n'
            f'  tls_key_file = "{self.pki.key}"\n'
            '  tls_min_version = "tls12"\n'
            "}\n"
            f'api_addr = "{self.address}"\n'
            f'cluster_addr = "https://127.0.0.1:{self.port + 1}"\n'
            'cluster_name = "keyturn-test-tls"\n'
            "disable_mlock = true\n"
            'log_level = "info"\n'
        )
        (self.workdir / "config.hcl").write_text(config)

    def _spawn(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "BAO_"))}
        env["HOME"] = str(self.workdir)
        self._process = spawn_logged(
            [bao_binary(), "server", f"-config={self.workdir / 'config.hcl'}"],
            self.log_path,
            env=env,
            cwd=self.workdir,
        )

    def _health(self) -> dict[str, Any] | None:
        if not self.running:
            raise _Exited
        try:
            with self.client(timeout=2.0) as http:
                body = http.get(_HEALTH).json()
        except (httpx.HTTPError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    def _init_and_unseal(self, deadline: float) -> None:
        with self.client(timeout=30.0) as http:
            answer = http.put("/v1/sys/init", json={"secret_shares": 1, "secret_threshold": 1})
            if answer.status_code != 200:
                raise RuntimeError(f"sys/init: HTTP {answer.status_code}: {answer.text[:200]}")
            body = answer.json()
            self.root_token = str(body["root_token"])
            self.unseal_key = str(body["keys_base64"][0])
            unsealed = http.put("/v1/sys/unseal", json={"key": self.unseal_key})
            if unsealed.status_code != 200:
                raise RuntimeError(f"sys/unseal: HTTP {unsealed.status_code}")

        def active() -> bool:
            health = self._health() or {}
            return health.get("sealed") is False and health.get("standby") is False

        self._wait(active, deadline, "the server to be unsealed and active")

        def accepts_the_root_token() -> bool:  # the active node has finished setting up
            with self.client(timeout=2.0) as http:
                try:
                    answer = http.get(
                        "/v1/auth/token/lookup-self", headers={"X-Vault-Token": self.root_token}
                    )
                except httpx.HTTPError:
                    return False
            return answer.status_code == 200

        self._wait(accepts_the_root_token, deadline, "the root token to be accepted")

    @staticmethod
    def _wait(
        condition: Callable[[], bool], deadline: float, what: str, interval: float = 0.1
    ) -> None:
        while not condition():
            if time.monotonic() >= deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(interval)


class _Exited(Exception):
    """The server process ended while we waited for it."""
