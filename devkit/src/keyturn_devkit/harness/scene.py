"""Fault scenes over real parts, for the integration tests: a deployment (its own sandbox, a
namespace in a real OpenBao), the `keyturn run` daemons started on it, and an app sampler that
reads every published path and calls the service with what it read (`AppSampler`); `Findings`
gathers soft checks and measurements so that one broken promise does not hide the others.

Each scene's helpers read what really happened: the versions in Vault, keyturn's JSON log, and
the sandbox's own view of refresh-token families (reuse, revocations) and of token requests.
"""

from __future__ import annotations

import json
import re
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import hvac
import hvac.exceptions

from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.apps import AppRead, AppSampler
from keyturn_devkit.harness.deployment import DaemonProcess, Deployment, prepare_deployment

LIFETIME = 20  # seconds: the sandbox's access-token lifetime, unless a scene says otherwise
REVOKE_PATH = "/oauth/revoke"
SMALL_MARGIN = {"refresh": {"margin": "3s", "min_interval": "500ms"}}


def parse_time(text: str) -> float:
    """RFC 3339 with any number of fractional digits (Vault writes nanoseconds)."""
    match = re.fullmatch(r"(.+?T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    head, fraction, zone = match.groups()
    parsed = datetime.fromisoformat(head + ("+00:00" if zone == "Z" else zone))
    return parsed.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)


def sleep_until(wall: float, limit: float = 60.0) -> None:
    time.sleep(max(0.0, min(limit, wall - time.time())))


def wait_for(what: str, condition: Callable[[], Any], timeout: float, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"never {what} within {timeout}s")


@dataclass
class Findings:
    """Soft checks: every check runs, measurements are printed, failures are asserted at once."""

    title: str
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def measure(self, label: str, value: object) -> None:
        self.lines.append(f"  {label}: {value}")

    def check(self, ok: object, message: str) -> None:
        if not ok:
            self.failures.append(message)

    def done(self) -> None:
        report = "\n".join([f"[{self.title}]", *self.lines])
        print(report)
        if self.failures:
            raise AssertionError(report + "\nFAILED CHECKS:\n- " + "\n- ".join(self.failures))


@dataclass(frozen=True, slots=True)
class Version:
    """One version of a published path, as Vault holds it."""

    version: int
    created: float
    expires_at: float
    access_token: str


@dataclass
class Scene:
    """One deployment (its own sandbox, a namespace in Vault), its daemons and an app sampler."""

    deployment: Deployment
    workdir: Path
    sampler: AppSampler
    daemons: list[DaemonProcess] = field(default_factory=list)

    @property
    def admin(self) -> Any:
        return self.deployment.sandbox.admin

    def start_daemon(
        self, config_path: Path | None = None, env: dict[str, str] | None = None
    ) -> DaemonProcess:
        workdir = self.workdir / f"daemon-{len(self.daemons)}"
        workdir.mkdir(parents=True)
        daemon = DaemonProcess(config_path or self.deployment.config_path, workdir, env=env)
        self.daemons.append(daemon)
        return daemon.start()

    def close(self) -> None:
        self.sampler.stop()
        for daemon in self.daemons:
            daemon.stop(signal.SIGTERM, timeout=10)

    # -- Vault, read as root (never through a test's proxy) ------------------------------------

    def vault(self) -> hvac.Client:
        return self.deployment.vault_client()

    def state(self, name: str) -> dict[str, str]:
        try:
            entry = self.vault().secrets.kv.v2.read_secret_version(
                path=f"{self.deployment.state_prefix}/{name}", raise_on_deleted_version=True
            )
        except hvac.exceptions.InvalidPath:
            return {}
        return dict(entry["data"]["data"])

    def wait_state(
        self, name: str, condition: Callable[[dict[str, str]], bool], timeout: float
    ) -> dict[str, str]:
        def matched() -> dict[str, str] | None:
            state = self.state(name)
            return state if condition(state) else None

        return dict(wait_for(f"{name}'s state matched", matched, timeout))

    def versions(self, name: str) -> list[Version]:
        """Every version of the published path still kept (KV v2 keeps the last 10)."""
        client = self.vault()
        path = self.deployment.publish_to[name]
        metadata = client.secrets.kv.v2.read_secret_metadata(path=path)["data"]["versions"]
        found = []
        for number, meta in sorted(metadata.items(), key=lambda item: int(item[0])):
            data = client.secrets.kv.v2.read_secret_version(
                path=path, version=int(number), raise_on_deleted_version=True
            )["data"]["data"]
            found.append(
                Version(
                    int(number),
                    parse_time(meta["created_time"]),
                    parse_time(data["expires_at"]),
                    data["access_token"],
                )
            )
        return found

    # -- keyturn's logs -------------------------------------------------------------------------

    def events(self, daemon: DaemonProcess | None = None) -> list[dict[str, Any]]:
        found = []
        for one in [daemon] if daemon is not None else self.daemons:
            for line in one.log_text().splitlines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(event, dict):
                    found.append(event)
        return found

    def named(self, event: str, daemon: DaemonProcess | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events(daemon) if e.get("event") == event]

    # -- the sandbox's view of refresh tokens ---------------------------------------------------

    def token_requests(self) -> list[tuple[float, str | None, int | None]]:
        """Every request the sandbox logged at its token endpoint, in order: (when, grant_type,
        status); a connection the sandbox dropped is logged with its status as sent, if any."""
        found = []
        for line in self.deployment.sandbox.log_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and event.get("route") == "/oauth/token":
                found.append(
                    (parse_time(event["timestamp"]), event.get("grant_type"), event.get("status"))
                )
        return found

    def grants(self) -> dict[str, int]:
        """Token requests the sandbox logged, as "grant_type status" -> count."""
        counts = Counter(f"{grant} {status}" for _at, grant, status in self.token_requests())
        return dict(counts)

    def families(self, name: str) -> dict[str, Any]:
        """Reuse count, revoked families by reason, refresh tokens by status, access tokens."""
        client_id = self.deployment.clients[name]["client_id"]
        usage = self.admin.usage()["oauth_clients"][client_id]
        tokens = self.admin.list_tokens(client_id)
        revoked: dict[str, set[str]] = {}
        for token in tokens:
            if token.get("revoke_reason"):
                revoked.setdefault(token["revoke_reason"], set()).add(token["family_id"])
        return {
            "reuses": usage["refresh_token_reuses"],
            "revoked_families": {reason: len(ids) for reason, ids in revoked.items()},
            "refresh_tokens": dict(Counter(t["status"] for t in tokens if t["kind"] == "refresh")),
            "access_tokens": sum(t["kind"] == "access" for t in tokens),
        }

    def revoked_while_published(self, name: str) -> list[str]:
        """Published versions whose access token the service revoked while apps could still
        read that version (from keyturn's `refresh_token.revoked` log time to the next
        version's creation): the exact windows in which apps were handed a revoked token."""
        versions = self.versions(name)
        windows = []
        revocations = [
            parse_time(e["timestamp"])
            for e in self.named("refresh_token.revoked")
            if e.get("credential") == name
        ]
        for current, following in zip(versions, [*versions[1:], None], strict=True):
            record = self.admin.introspect_token(current.access_token)
            if record.get("revoke_reason") is None:
                continue
            end = following.created if following is not None else time.time()
            for at in revocations:
                if current.created <= at < end:
                    windows.append(
                        f"v{current.version}'s access token revoked ({record['revoke_reason']}) "
                        f"{end - at:.2f}s before v{current.version + 1} was published"
                    )
        return windows


def apps_view(findings: Findings, sampler: AppSampler, since: float = 0.0) -> None:
    """Measure and check what apps read: no expired token, nothing the service refused."""
    expired = sampler.expired(since=since)
    refused = sampler.refused(since=since)
    findings.measure("apps", sampler.summary())
    findings.measure("expired reads", len(expired))
    findings.measure("refused reads", len(refused))
    findings.check(expired == [], f"apps read expired tokens: {first_reads(expired)}")
    findings.check(refused == [], f"the service refused tokens apps read: {first_reads(refused)}")


def no_reuse(findings: Findings, scene: Scene, name: str) -> dict[str, Any]:
    families = scene.families(name)
    findings.measure("sandbox refresh-token families", families)
    findings.check(families["reuses"] == 0, f"refresh tokens presented twice: {families}")
    findings.check(
        "refresh token reuse" not in families["revoked_families"],
        f"families revoked by reuse detection: {families}",
    )
    suspicious = scene.named("suspicious")
    findings.measure("suspicious events", [e.get("detector") for e in suspicious])
    findings.check(suspicious == [], f"suspicious events: {suspicious}")
    return families


def first_reads(reads: list[AppRead], count: int = 5) -> str:
    shown = [str(r) for r in reads[:count]]
    more = f" (+{len(reads) - count} more)" if len(reads) > count else ""
    return "; ".join(shown) + more


def used_refresh_tokens(scene: Scene, name: str) -> int:
    client_id = scene.deployment.clients[name]["client_id"]
    tokens = scene.admin.list_tokens(client_id)
    return sum(t["kind"] == "refresh" and t["status"] == "used" for t in tokens)


class SceneMaker:
    """Makes scenes for one test (each its own sandbox, under its own Vault namespace) and
    closes them all at its end (`close`). `vault` is the dev server scenes use unless one is
    given; `sandboxes(config)` starts a sandbox for a scene."""

    def __init__(
        self,
        vault: OpenBaoDevServer,
        sandboxes: Callable[[dict[str, Any]], SandboxProcess],
        workdir: Path,
    ) -> None:
        self._vault = vault
        self._sandboxes = sandboxes
        self._workdir = workdir
        self.made: list[Scene] = []

    def __call__(
        self,
        names: list[str],
        *,
        lifetime: int = LIFETIME,
        vault: OpenBaoDevServer | None = None,
        vault_address: str | None = None,
        provider: dict[str, Any] | None = None,
        credential: dict[str, Any] | None = None,
        keyturn: dict[str, Any] | None = None,
        sandbox: dict[str, Any] | None = None,
    ) -> Scene:
        server = vault or self._vault
        started = self._sandboxes({"access_token_lifetime": lifetime, **(sandbox or {})})
        workdir = self._workdir / f"scene-{len(self.made)}"
        deployment = prepare_deployment(
            server,
            started,
            workdir,
            names,
            namespace=f"f{uuid.uuid4().hex[:8]}",
            keyturn=keyturn,
            provider={"revoke_path": REVOKE_PATH, **(provider or {})},
            credential=credential or SMALL_MARGIN,
        )
        if vault_address is not None:  # keyturn talks to Vault through the test's proxy
            text = deployment.config_path.read_text()
            old = f'address = "{server.address}"'
            assert old in text
            deployment.config_path.write_text(text.replace(old, f'address = "{vault_address}"'))
        sampler = AppSampler(
            server.address, server.root_token, started.base_url, deployment.publish_to
        )
        scene = Scene(deployment, workdir, sampler)
        self.made.append(scene)
        return scene

    def close(self) -> None:
        for scene in self.made:
            scene.close()
