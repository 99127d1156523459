"""OpenBao Agent (`bao agent`, a real Vault Agent) as a subprocess, and the rule that sets how
often a consumer must copy what keyturn publishes.

    with BaoAgent(config_path, workdir) as agent:
        agent.wait_for_file(rendered, timeout=10)

The rule (deploy/consumers/README.md): keyturn replaces a token no later than
`at + jitter` of its lifetime (the latest refresh its `[credentials.refresh]` policy plans,
`keyturn.policy.refresh_window`), so the new value is in Vault at least `replacement_window()`
before the published `expires_at` of the value it replaces. A consumer that copies the value
somewhere else (a rendered file, a Kubernetes Secret) may lag Vault by at most half of that
window, `max_consumer_lag()`; the other half is left for keyturn being late (a refresh that
failed and is retried). With keyturn's defaults that is 0.12 x the lifetime: 7 minutes for 1 h
tokens, 2 s for 21 s tokens (with `margin = "1s"`; the default 60 s margin moves the refresh of
tokens shorter than it to their midpoint).
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from keyturn.policy import RefreshPolicy, refresh_window
from keyturn_devkit.dev.openbao import bao_binary
from keyturn_devkit.dev.process import ManagedServer, spawn_logged, terminate

# `expires_at` is published in whole seconds, rounded down: up to 1 s less than the token has.
EXPIRES_AT_ROUNDING = 1.0


def replacement_window(lifetime: float, policy: RefreshPolicy | None = None) -> float:
    """The shortest time (seconds) that keyturn's new value is in Vault before the published
    `expires_at` of the value it replaced, for tokens of `lifetime` seconds."""
    _, latest = refresh_window(0.0, lifetime, policy or RefreshPolicy())
    return max(0.0, lifetime - latest - EXPIRES_AT_ROUNDING)


def max_consumer_lag(lifetime: float, policy: RefreshPolicy | None = None) -> float:
    """How long (seconds) a consumer's copy may lag Vault: half the replacement window."""
    return replacement_window(lifetime, policy) / 2


# The shortest `static_secret_render_interval` that behaves as its value says.
AGENT_MIN_INTERVAL = 2


def agent_render_interval(lifetime: float, policy: RefreshPolicy | None = None) -> int:
    """The longest `static_secret_render_interval` (whole seconds) the rule allows.

    The agent (openbao-template) counts the interval in whole seconds, truncated, and reads a
    KV v2 secret again after 85 to 95 % of it. It also takes a read made in the same wall-clock
    second as the one before for "no new data" (its change index is the Unix time in seconds),
    so with `1s` about one read in ten is dropped and a change can wait up to 1.9 s; under 1 s
    it reads in a loop. From 2 s on, reads are more than a second apart and the file lags Vault
    by at most 0.95 x the interval. So a lag budget under 2 s (tokens shorter than 21 s with
    keyturn's defaults) cannot be met by an agent; ValueError says so.
    """
    seconds = math.floor(max_consumer_lag(lifetime, policy))
    if seconds < AGENT_MIN_INTERVAL:
        raise ValueError(
            f"tokens of {lifetime:g}s leave a lag budget under {AGENT_MIN_INTERVAL}s: "
            "too short for an agent"
        )
    return seconds


class BaoAgent(ManagedServer):
    """`bao agent -config=FILE` on this machine; its output in `<workdir>/agent.log`."""

    def __init__(
        self, config_path: Path, workdir: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.config_path = config_path
        self.workdir = workdir
        self.log_path = workdir / "agent.log"
        self._env = {**os.environ, "HOME": str(workdir), **(env or {})}
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> BaoAgent:
        self._process = spawn_logged(
            [bao_binary(), "agent", f"-config={self.config_path}"],
            self.log_path,
            env=self._env,
            cwd=self.workdir,
        )
        return self

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def wait_for_file(self, path: Path, timeout: float) -> None:
        """Wait until the agent has rendered `path`; RuntimeError if the agent exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                return
            if not self.running:
                raise RuntimeError(f"bao agent exited:\n{self.log_text()}")
            time.sleep(0.05)
        raise TimeoutError(f"{path} not rendered within {timeout}s:\n{self.log_text()}")

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (SIGKILL after `timeout`); the exit code, None when it was not running."""
        process, self._process = self._process, None
        return terminate(process, timeout=timeout)

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""
