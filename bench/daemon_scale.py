"""keyturn at scale: N OAuth credentials against a real OpenBao and the real sandbox.

    python bench/daemon_scale.py [--credentials 10000] [--lifetime S] [--steady 60]
        [--steady-delay S] [--no-refresh-tokens]
        [--idle S] [--idle-delay S] [--concurrency 64] [--vault-concurrency 16]
        [--provider-connections C] [--probe] [--cold-starts 3] [--cold-only] [--workdir DIR]

Everything runs on loopback: `bao server -dev` (in-memory storage) and `keyturn sandbox`, as
subprocesses. Setup registers N OAuth apps through the sandbox's admin API and stores each
one's client_id/client_secret in Vault at `secret/keyturn/inputs/c<i>`; the configuration
has one `[[credentials]]` per app, publishing to `secret/bench/apps/c<i>`, no probe unless
`--probe`, Vault auth by `token_file`, log level "warning". The sandbox issues a refresh token
with each grant, unless `--no-refresh-tokens` (every refresh is then a `client_credentials`
grant). One run prints (figures on
stdout, progress on stderr), after the machine's load average when it starts:

1. cold start: seconds from spawning the daemon (config parsing, Vault login and all) until
   every credential's `publish_to` path exists in Vault (one KV `LIST` per second, every
   0.1 s after 95 %), next to a minimal concurrent script doing the same N token requests
   and N KV v2 writes in the same run (httpx `AsyncClient` for `POST /oauth/token`, hvac on
   a thread pool for the write; no scheduling, no state, no checks), as a ratio. keyturn
   cold-starts `--cold-starts` times (default 3; each earlier one with its own state and
   publish prefixes, stopped once all is published), and the script runs before each cold
   start and once after the last (while the restarted daemon idles before its first refresh,
   or after the steady phase): each cold start's ratio is against the mean of the rounds
   before and after it, and the ratio shown is their median, each one shown. The last cold
   start's daemon goes on to the phases below.
   CPU time per credential of the daemon or script, OpenBao and the sandbox (from /proc)
   shows where the work goes;
2. peak RSS of the daemon process (`VmHWM` from /proc: the daemon alone, not this harness);
3. the cost of one change-detection sweep on the cold-started daemon once every first run is
   done (so every credential has a published version to compare): the child builds the
   watcher the daemon registers (`keyturn.daemon.published_watcher` over the daemon's own
   runtime and scheduler) and runs its `sweep` once: wall seconds, the daemon's CPU seconds,
   Vault calls per credential;
4. restart while every token is still valid: the daemon is stopped (SIGTERM) and started
   again; seconds from spawn until every credential is planned (it has an outcome, from a run
   or from what the daemon knew at start, or a run planned after the scheduler started), and
   how many runs it made by then; the sandbox's token-endpoint count (`GET /admin/usage`)
   before and after must not move (0, the one failing check);
5. idle, with `--idle S` (default 0: skipped): after the restart, once the daemon has made no
   Vault call for 2 s (at most 60 s: a start-up sweep, say) and `--idle-delay` seconds
   (default 0), the daemon's CPU over S seconds as a percentage of one core, with the Vault
   calls, token requests and scheduled runs it made meanwhile; a warning line if a refresh
   is due inside the window (the token lifetime is too short for S). The issue's figure is
   `--idle 300` with one-hour tokens (`--lifetime 3600`); the steady phase is then skipped
   (the first refresh is more than 600 s away), and says so;
6. steady state on the restarted daemon: p50/p99/max lateness of scheduled runs (start of
   each run minus its planned time, `CredentialScheduler.lateness`) in a window of
   `--steady` seconds that opens when the first refresh is due (the earliest `next_due` the
   credentials' records hold: a planned run may be something else, e.g. a check), and the
   Vault writes and reads per refresh: the daemon's calls on the credentials' own paths (their
   state records and published paths; a write with custom metadata is two calls, as it is to
   Vault) divided by the token requests in the window (one per refresh), next to the minimal
   script's one write and no read per credential. The heartbeat and the saved plan
   (`<state_prefix>/_members`, `_plan/…`) are shown apart: they cost the same however many
   credentials refresh. A credential's first refresh after the restart also reads its record,
   its published path's metadata and its inputs, once per process; `--steady-delay S` opens
   the window S seconds later, e.g. past that first generation (more than 0.76 x lifetime) for
   the figures of a refresh in steady state.

Vault calls are the daemon's own count, `keyturn_vault_operations_total{operation,result}` on
its /metrics, scraped at the start and end of each phase (a new process starts at 0): per
credential for the cold start, the sweep and the restart; per scheduled run (a refresh, unless
a check is due too) and per credential in the steady window; as counts in the idle window.
Each is split by operation (results other than `success` after it). Token requests per phase
are the sandbox's counts. Each phase also prints the 1-minute load average and the "other
processes" on the machine (its busy time from /proc/stat minus the daemon's, OpenBao's, the
sandbox's and this script's), in cores.

The daemon is this script with `--child CONFIG`, which opens it with `open_daemon` as
`keyturn run` does and reports progress and the lateness samples as JSON lines on stdout,
so its RSS and CPU are its own (the child's progress checks cost next to nothing: one
credential's status every 0.1 s until every credential is planned, every second after that
until every credential has an outcome, then nothing). The token lifetime is set (through the
sandbox's admin API) after the first baseline round to 10 times its duration, at least 200 s,
so that the first refresh (at 0.56 of the lifetime, the earliest the default refresh policy
plans) comes after the cold start and the restart on any machine; `--lifetime` fixes it
instead. Speed is reported as ratios measured in one run, never as pass/fail timings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import queue
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import hvac
import requests
from requests.adapters import HTTPAdapter

from keyturn.providers.http import LANE_CONNECTIONS
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess

INPUTS = "keyturn/inputs"  # where each credential's client_id/client_secret live
PUBLISHED = "bench/apps"  # keyturn publishes here
BASELINE = "bench/baseline"  # the minimal script writes here
TICKS = os.sysconf("SC_CLK_TCK")
DEADLINE_SLACK = 600.0  # no phase waits longer than this (bounded loops)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- small helpers --------------------------------------------------------------------------


async def for_each(count: int, concurrency: int, body: Callable[[int], Awaitable[None]]) -> None:
    """`body(i)` for i in range(count), `concurrency` at a time."""
    indices = iter(range(count))

    async def worker() -> None:
        for i in indices:  # one shared iterator: each index is taken exactly once
            await body(i)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))


def proc_status(pid: int, field: str) -> int:
    """A `kB` field of /proc/PID/status (VmHWM, VmRSS), in bytes; 0 if unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def machine_busy() -> float:
    """CPU seconds all processes on the machine spent so far (/proc/stat, all cores)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields)
    return (user + nice + system + irq + softirq + steal) / TICKS


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def load_average() -> float:
    """The machine's 1-minute load average (/proc/loadavg): how busy the shared cores were."""
    return float(Path("/proc/loadavg").read_text().split()[0])


# -- Vault calls, from the daemon's /metrics ---------------------------------------------------

VAULT_COUNTER = "keyturn_vault_operations_total"
# Shown even at 0, so runs before and after a change line up; any other operation when used.
ALWAYS_SHOWN = ("read", "write", "list", "read_metadata")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Calls = dict[tuple[str, str], float]  # (operation, result) -> calls so far


def vault_calls(exposition: str) -> Calls:
    """The daemon's Vault calls so far by (operation, result), from its Prometheus text."""
    calls: Calls = {}
    prefix = VAULT_COUNTER + "{"
    for line in exposition.splitlines():
        if not line.startswith(prefix):
            continue
        labels, _, value = line[len(prefix) :].rpartition("}")
        found = dict(_LABEL.findall(labels))
        key = (found.get("operation", "?"), found.get("result", "?"))
        calls[key] = calls.get(key, 0.0) + float(value.split()[0])
    return calls


def figure(value: float) -> str:
    """A count or a ratio, short: 5, 0.5, 2.33, 0.001."""
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value)}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"


def calls_split(before: Mapping[tuple[str, str], float], after: Calls, per: float) -> str:
    """Vault calls between two scrapes divided by `per`: the total, then by operation, then
    any results other than success (e.g. `not_found`, `cas_conflict`)."""
    if per <= 0:
        return "n/a (nothing to divide by)"
    by_operation: dict[str, float] = {}
    by_result: dict[str, float] = {}
    for key in after.keys() | before.keys():
        delta = after.get(key, 0.0) - before.get(key, 0.0)
        operation, result = key
        by_operation[operation] = by_operation.get(operation, 0.0) + delta
        by_result[result] = by_result.get(result, 0.0) + delta
    shown = [
        *ALWAYS_SHOWN,
        *sorted(op for op, v in by_operation.items() if v and op not in ALWAYS_SHOWN),
    ]
    text = (
        f"{figure(sum(by_operation.values()) / per)} ("
        + ", ".join(f"{op} {figure(by_operation.get(op, 0.0) / per)}" for op in shown)
        + ")"
    )
    others = [
        f"{r} {figure(v / per)}" for r, v in sorted(by_result.items()) if v and r != "success"
    ]
    return text + (f"; results other than success: {', '.join(others)}" if others else "")


async def scrape_vault_calls(url: str) -> Calls:
    """One GET /metrics of the running daemon, reduced to its Vault call counts."""
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        response = await client.get("/metrics")
        response.raise_for_status()
    return vault_calls(response.text)


class Vault:
    """Just enough of Vault's HTTP API for setup and observation (root token, httpx)."""

    def __init__(self, address: str, token: str, concurrency: int) -> None:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.http = httpx.AsyncClient(
            base_url=address, headers={"X-Vault-Token": token}, limits=limits, timeout=30
        )

    async def write(self, path: str, data: dict[str, str]) -> None:
        response = await self.http.post(f"/v1/secret/data/{path}", json={"data": data})
        response.raise_for_status()

    async def count(self, prefix: str) -> int:
        """Paths directly under `prefix` (one LIST on the metadata endpoint)."""
        response = await self.http.request("LIST", f"/v1/secret/metadata/{prefix}")
        if response.status_code == 404:
            return 0
        response.raise_for_status()
        return len(response.json()["data"]["keys"])

    async def aclose(self) -> None:
        await self.http.aclose()


async def token_requests(http: httpx.AsyncClient) -> int:
    """Every answer the sandbox's token endpoint gave so far (any status)."""
    response = await http.get("/admin/usage")
    response.raise_for_status()
    return sum(response.json()["endpoints"].get("token", {}).values())


# -- setup ----------------------------------------------------------------------------------


async def setup(
    args: argparse.Namespace, vault: Vault, admin: httpx.AsyncClient
) -> list[dict[str, str]]:
    """Register N OAuth apps in the sandbox and store their inputs in Vault."""
    apps: list[dict[str, str]] = [{} for _ in range(args.credentials)]

    async def one(i: int) -> None:
        body = {"name": f"bench-{i}", "redirect_uri": "http://127.0.0.1/callback"}
        response = await admin.post("/admin/oauth-apps", json=body)
        response.raise_for_status()
        created = response.json()
        apps[i] = {"client_id": created["client_id"], "client_secret": created["client_secret"]}
        await vault.write(f"{INPUTS}/c{i}", apps[i])

    await for_each(args.credentials, 32, one)
    return apps


def write_config(
    args: argparse.Namespace,
    workdir: Path,
    vault_address: str,
    token_file: Path,
    base_url: str,
    *,
    name: str = "keyturn.toml",
    publish: str = PUBLISHED,
    state_prefix: str = "keyturn/state",
) -> Path:
    probe = 'probe = "/v1/projects"\n' if args.probe else ""
    connections = (
        f"max_connections = {args.provider_connections}\n" if args.provider_connections else ""
    )
    header = f"""# Written by bench/daemon_scale.py
[keyturn]
instance_id = "bench"
log_level = "warning"
state_prefix = "{state_prefix}"
max_concurrency = {args.concurrency}
vault_concurrency = {args.vault_concurrency}
"""
    path = workdir / name
    path.write_text(
        header
        + service_tables(
            vault_address,
            token_file,
            base_url,
            args.credentials,
            publish,
            provider_extra=connections,
            credential_extra=probe,
        )
    )
    return path


def service_tables(
    vault_address: str,
    token_file: Path,
    base_url: str,
    count: int,
    publish: str,
    *,
    provider_extra: str = "",
    credential_extra: str = "",
) -> str:
    """[vault], [metrics], the sandbox's [[providers]] and one [[credentials]] per registered
    app (inputs at `secret/INPUTS/c<i>`, published under `publish`): what every benchmark's
    keyturn.toml holds after its [keyturn] table."""
    parts = [
        f"""
[vault]
address = "{vault_address}"
auth = {{ method = "token_file", path = "{token_file}" }}
mount = "secret"
renew_margin = "60s"

[metrics]
listen = "127.0.0.1:0"

[[providers]]
name = "sandbox"
base_url = "{base_url}"
allow_insecure_http = true
token_request = "json"
client_auth = "body"
timeout = "30s"
{provider_extra}"""
    ]
    for i in range(count):
        parts.append(
            f"""
[[credentials]]
name = "c{i}"
provider = "sandbox"
kind = "oauth_client"
client_id = "vault:secret/{INPUTS}/c{i}#client_id"
client_secret = "vault:secret/{INPUTS}/c{i}#client_secret"
publish_to = "{publish}/c{i}"
{credential_extra}"""
        )
    return "".join(parts)


# -- the minimal script -----------------------------------------------------------------------


async def baseline(
    args: argparse.Namespace,
    apps: list[dict[str, str]],
    base_url: str,
    vault: OpenBaoDevServer,
    connections: int | None = None,
) -> tuple[float, float]:
    """Seconds and harness CPU seconds for N token requests + N KV v2 writes, no checks; the
    httpx pool holds `connections` (default: one per concurrent request)."""
    session = requests.Session()  # hvac's own, with as many pooled connections as threads
    adapter = HTTPAdapter(pool_maxsize=args.vault_concurrency)
    session.mount("http://", adapter)
    client = hvac.Client(url=vault.address, token=vault.root_token, session=session)
    pool = ThreadPoolExecutor(max_workers=args.vault_concurrency)
    loop = asyncio.get_running_loop()
    pooled = connections or args.concurrency
    limits = httpx.Limits(max_connections=pooled, max_keepalive_connections=pooled)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30) as http:

        async def one(i: int) -> None:
            response = await http.post(
                "/oauth/token", json={"grant_type": "client_credentials", **apps[i]}
            )
            token = response.json()
            expires_at = time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + token["expires_in"])
            )
            secret = {
                "access_token": token["access_token"],
                "token_type": token["token_type"],
                "expires_at": expires_at,
                "authorization": f"Bearer {token['access_token']}",
            }
            await loop.run_in_executor(
                pool,
                lambda: client.secrets.kv.v2.create_or_update_secret(
                    path=f"{BASELINE}/c{i}", secret=secret, mount_point="secret"
                ),
            )

        cpu, started = time.process_time(), time.perf_counter()
        await for_each(args.credentials, args.concurrency, one)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    pool.shutdown()
    session.close()
    return elapsed, cpu


# -- the daemon, as a child process -----------------------------------------------------------


class Daemon:
    """`--child CONFIG` in a subprocess; its stdout is a stream of JSON events."""

    def __init__(self, script: Path, config: Path, log_path: Path) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        with log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, str(script), "--child", str(config)],
                stdout=subprocess.PIPE,
                stderr=log_file,
                stdin=subprocess.DEVNULL,
            )
        self.started = time.perf_counter()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.put(json.loads(line))
        self.events.put({"event": "exit"})

    def wait_for(self, name: str, timeout: float = DEADLINE_SLACK) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"daemon: no {name!r} within {timeout:g}s") from None
            if event["event"] == name:
                return event
            if event["event"] in ("exit", "failed"):
                raise RuntimeError(f"daemon ended before {name!r}: {event}")

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> dict[str, Any]:
        """SIGTERM, then the final report (lateness samples, exit code)."""
        self.process.send_signal(signal.SIGTERM)
        report = self.wait_for("stopped", timeout=120)
        self.process.wait(timeout=60)
        return report


async def wait_published(
    vault: Vault, count: int, daemon: Daemon, timeout: float, prefix: str = PUBLISHED
) -> float:
    """Seconds from the daemon's spawn until `count` paths exist under `prefix`.

    One LIST per second (a LIST of 10,000 keys is not free for OpenBao), every 0.1 s once
    95 % are there, so the figure is within ~0.1 s without loading Vault during the run.
    """
    deadline = time.monotonic() + timeout
    last_report = 0.0
    while time.monotonic() < deadline:
        seen = await vault.count(prefix)
        now = time.perf_counter()
        if seen >= count:
            return now - daemon.started
        if daemon.process.poll() is not None:
            raise RuntimeError("the daemon exited during the cold start; see keyturn.log")
        if now - last_report > 15:
            log(f"  published {seen}/{count} after {now - daemon.started:.0f}s")
            last_report = now
        await asyncio.sleep(0.1 if seen >= 0.95 * count else 1.0)
    raise RuntimeError(f"not all {count} credentials published within {timeout:g}s")


# -- the run ------------------------------------------------------------------------------


def since(seconds: float) -> str:
    """When something was due, relative to a window's opening."""
    return f"{seconds:.0f} s after it opened" if seconds >= 0 else f"{-seconds:.0f} s before it"


def ms_per(seconds: float, count: int) -> str:
    return f"{seconds * 1000 / count:.1f}"


async def bench(
    args: argparse.Namespace,
    workdir: Path,
    script: Path,
    vault: OpenBaoDevServer,
    sandbox: SandboxProcess,
) -> int:
    n = args.credentials
    kv = Vault(vault.address, vault.root_token, 32)
    admin = httpx.AsyncClient(
        base_url=sandbox.base_url,
        headers={"Authorization": f"Bearer {sandbox.admin_token}"},
        timeout=60,
    )
    bao_pid = vault._process.pid if vault._process else 0  # a benchmark's peek
    sandbox_pid = sandbox.pid or 0

    def servers_cpu() -> tuple[float, float, float, float]:
        """OpenBao's, the sandbox's, this script's and the whole machine's CPU seconds."""
        return (
            cpu_seconds(bao_pid),
            cpu_seconds(sandbox_pid),
            time.process_time(),
            machine_busy(),
        )

    def machine(
        before: tuple[float, float, float, float],
        after: tuple[float, float, float, float],
        daemon_cpu: float,
        seconds: float,
    ) -> str:
        """The rest of the machine over a phase: every process but the daemon, OpenBao, the
        sandbox and this script, in cores; and the load average now."""
        spent = [b - a for a, b in zip(before, after, strict=True)]
        others = spent[3] - daemon_cpu - spent[0] - spent[1] - spent[2]
        return (
            f"other processes {max(0.0, others / seconds):.2f} cores, "
            f"load average (1 min) {load_average():.2f}"
        )

    daemons: list[Daemon] = []
    rows: list[tuple[str, str]] = [
        ("credentials", f"{n}"),
        (
            "machine at the start",
            f"load average (1 min) {load_average():.2f}, {os.cpu_count()} cores",
        ),
        ("max_concurrency / vault_concurrency", f"{args.concurrency} / {args.vault_concurrency}"),
        ("provider max_connections", f"{args.provider_connections or '100 (default)'}"),
        ("probe before publish", "yes" if args.probe else "no"),
        ("refresh tokens issued", "no" if args.no_refresh_tokens else "yes"),
    ]

    def spawn(config: Path) -> Daemon:
        daemons.append(Daemon(script, config, workdir / "keyturn.log"))
        return daemons[-1]

    try:
        log(f"setup: registering {n} OAuth apps and storing their inputs in Vault")
        started = time.perf_counter()
        apps = await setup(args, kv, admin)
        log(f"setup done in {time.perf_counter() - started:.1f}s")
        token_file = workdir / "vault-token"
        token_file.write_text(vault.root_token)
        token_file.chmod(0o600)
        config = write_config(args, workdir, vault.address, token_file, sandbox.base_url)

        async def baseline_round() -> Round:
            log(f"baseline round {len(rounds) + 1}: {n} token requests + {n} KV v2 writes")
            bao0, sb0, _, all0 = servers_cpu()
            seconds, cpu = await baseline(args, apps, sandbox.base_url, vault)
            bao1, sb1, _, all1 = servers_cpu()
            log(f"baseline done in {seconds:.1f}s")
            others = (all1 - all0) - cpu - (bao1 - bao0) - (sb1 - sb0)
            rounds.append((seconds, cpu, bao1 - bao0, sb1 - sb0, others, load_average()))
            return rounds[-1]

        rounds: list[Round] = []
        base_seconds = (await baseline_round())[0]
        log(f"the script again with {SMALL_POOL} pooled connections (not in the ratio)")
        small_pool = await baseline(args, apps, sandbox.base_url, vault, connections=SMALL_POOL)
        rows.append(
            (
                f"script with {SMALL_POOL} pooled connections",
                f"{small_pool[0]:.2f} s (CPU ms/credential: script {ms_per(small_pool[1], n)}); "
                "not the issue's baseline: see docs/performance.md",
            )
        )
        lifetime = f"{args.lifetime} s"
        if args.auto_lifetime:
            # Long enough that the cold start and the restart end before the first refresh is
            # due (0.56 of the lifetime): keyturn's cold start has taken 2.3-3.3x the
            # baseline, the restart another 0.2x of that; 10x leaves room for noise.
            args.lifetime = max(200, math.ceil(10 * base_seconds))
            response = await admin.put(
                "/admin/settings", json={"access_token_lifetime": args.lifetime}
            )
            response.raise_for_status()
            lifetime = f"{args.lifetime} s (10 x baseline round 1, at least 200 s)"
        rows.insert(1, ("token lifetime (sandbox)", lifetime))

        # The cold starts before the last one, each followed by a baseline round: every cold
        # start sits between two rounds of the script (see `baseline_rows`).
        colds: list[float] = []
        for r in range(1, args.cold_starts):
            log(f"keyturn cold start {r} of {args.cold_starts} (its own prefixes)")
            before = servers_cpu()
            daemon = spawn(
                write_config(
                    args,
                    workdir,
                    vault.address,
                    token_file,
                    sandbox.base_url,
                    name=f"keyturn-cold{r}.toml",
                    publish=f"{PUBLISHED}-cold{r}",
                    state_prefix=f"keyturn/state-cold{r}",
                )
            )
            metrics = daemon.wait_for("started")["metrics_url"]
            seconds = await wait_published(kv, n, daemon, DEADLINE_SLACK, f"{PUBLISHED}-cold{r}")
            after, daemon_cpu = servers_cpu(), cpu_seconds(daemon.pid)
            daemon.wait_for("first_runs_done")
            calls = await scrape_vault_calls(metrics)
            daemon.stop()
            colds.append(seconds)
            log(f"cold start {r}: all {n} published {seconds:.1f}s after spawn")
            rows.append(
                (
                    f"{EARLIER_COLD_START}{r} of {args.cold_starts}",
                    f"{seconds:.2f} s; CPU ms/credential: daemon {ms_per(daemon_cpu, n)}, "
                    f"OpenBao {ms_per(after[0] - before[0], n)}, sandbox "
                    f"{ms_per(after[1] - before[1], n)}; "
                    f"{machine(before, after, daemon_cpu, seconds)}; Vault calls per "
                    f"credential {calls_split({}, calls, n)}",
                )
            )
            await baseline_round()

        async def idle_phase(again: dict[str, Any], metrics_url: str) -> None:
            """The restarted daemon with every token valid: its CPU, Vault calls and token
            requests over `--idle` seconds, once its Vault calls have stopped (a start-up
            sweep, say) and after `--idle-delay`."""
            settle_started, still = time.perf_counter(), False
            previous = await scrape_vault_calls(metrics_url)
            first = previous
            while not still and time.perf_counter() - settle_started < SETTLE_MAX:
                await asyncio.sleep(SETTLE_STILL)
                current = await scrape_vault_calls(metrics_url)
                still, previous = current == previous, current
            settle_calls = sum(previous.values()) - sum(first.values())
            settled = time.perf_counter() - settle_started
            if args.idle_delay > 0:
                log(f"idle: waiting {args.idle_delay:g}s first (--idle-delay)")
                await asyncio.sleep(args.idle_delay)
            log(f"idle: {args.idle:g}s with every token valid")
            now = time.time()
            refresh_in, run_in = again["refresh_due_min"] - now, again["next_due_min"] - now
            tokens_before = await token_requests(admin)
            calls_before = await scrape_vault_calls(metrics_url)
            daemon.signal(signal.SIGUSR1)
            mark_a = daemon.wait_for("mark")
            cpu_before, daemon_cpu = servers_cpu(), cpu_seconds(daemon.pid)
            idle_started = time.perf_counter()
            await asyncio.sleep(args.idle)
            idle_seconds = time.perf_counter() - idle_started
            daemon_cpu = cpu_seconds(daemon.pid) - daemon_cpu
            cpu_after = servers_cpu()
            daemon.signal(signal.SIGUSR1)
            mark_b = daemon.wait_for("mark")
            calls_after = await scrape_vault_calls(metrics_url)
            idle_tokens = await token_requests(admin) - tokens_before
            runs = mark_b["count"] - mark_a["count"]
            rows.append(
                (
                    "idle: settle before the window",
                    f"{settled:.1f} s until no Vault call for {SETTLE_STILL:g} s "
                    f"({figure(settle_calls)} calls meanwhile)"
                    if still
                    else f"Vault calls did not stop within {SETTLE_MAX:g} s "
                    f"({figure(settle_calls)} calls); the window opened anyway",
                )
            )
            if refresh_in < args.idle:
                rows.append(
                    (
                        "idle: WARNING",
                        f"the first refresh was due {refresh_in:.0f} s after the window opened, "
                        f"inside the {args.idle:g} s window: the figures below include "
                        "refreshes (use a longer --lifetime or a shorter --idle)",
                    )
                )
            rows.extend(
                [
                    (
                        "idle: window",
                        f"{idle_seconds:.0f} s, {settled + args.idle_delay:.0f} s after every "
                        f"credential was planned; first refresh due {since(refresh_in)}, first "
                        f"planned run {since(run_in)}; {runs} scheduled runs in it",
                    ),
                    (
                        "idle: daemon CPU",
                        f"{100 * daemon_cpu / idle_seconds:.2f} % of one core "
                        f"({daemon_cpu:.2f} s); "
                        f"{machine(cpu_before, cpu_after, daemon_cpu, idle_seconds)}",
                    ),
                    (
                        "idle: Vault calls, token requests",
                        f"{calls_split(calls_before, calls_after, 1)}; "
                        f"{idle_tokens} token requests",
                    ),
                ]
            )
            if (
                any(
                    calls_after.get(key, 0.0) > calls_before.get(key, 0.0)
                    for key in calls_after
                    if key[0] == "read_metadata"
                )
                and not runs
            ):
                rows.append(
                    (
                        "idle: note",
                        "a change-detection sweep ran in the window (every watch_interval, "
                        "300 s by default): its reads are in the figures above",
                    )
                )

        log("keyturn cold start" + (f" {args.cold_starts} of {args.cold_starts}" if colds else ""))
        tokens_before = await token_requests(admin)
        cpu_before = servers_cpu()
        bao2, sb2, me2, all2 = cpu_before
        daemon = spawn(config)
        started_event = daemon.wait_for("started")
        cold = await wait_published(kv, n, daemon, DEADLINE_SLACK)
        colds.append(cold)
        bao3, sb3, me3, all3 = servers_cpu()
        cold_cpu = cpu_seconds(daemon.pid)
        cold_others = (all3 - all2) - cold_cpu - (bao3 - bao2) - (sb3 - sb2) - (me3 - me2)
        cold_load = load_average()
        rows.append(
            (
                f"ratio keyturn / script with {SMALL_POOL} pooled connections",
                f"{cold / small_pool[0]:.2f}",
            )
        )
        first = daemon.wait_for("first_runs_done")
        metrics_url = started_event["metrics_url"]
        # A new process counts from 0; after every first run has ended (the last writes after
        # publishing included).
        cold_calls = await scrape_vault_calls(metrics_url)
        cold_rss = proc_status(daemon.pid, "VmHWM")
        scrape_seconds, scrape_httpx, scrape_bytes, scrape_lines = await scrape_metrics(metrics_url)
        cold_tokens = await token_requests(admin) - tokens_before
        log(f"all {n} published {cold:.1f}s after spawn; first runs: {first['actions']}")
        rows += [
            (
                "keyturn: spawn -> all published",
                f"{cold:.2f} s ({n / cold:.0f} credentials/s; daemon up after "
                f"{started_event['since_spawn']:.2f} s)",
            ),
            (
                "CPU ms/credential, keyturn",
                f"daemon {ms_per(cold_cpu, n)}, OpenBao {ms_per(bao3 - bao2, n)}, "
                f"sandbox {ms_per(sb3 - sb2, n)}; other processes on the machine "
                f"{max(0.0, cold_others / cold):.2f} cores; load average (1 min) {cold_load:.2f}",
            ),
            (
                "token requests during cold start",
                f"{cold_tokens} ({figure(cold_tokens / n)} per credential)",
            ),
            (
                "cold start: Vault calls per credential",
                f"spawn -> every first run done: {calls_split({}, cold_calls, n)}",
            ),
            ("peak RSS (VmHWM), cold start", f"{cold_rss / 2**20:.0f} MiB"),
            (
                "/metrics scrape after the cold start",
                f"{scrape_seconds * 1000:.0f} ms (median of {SCRAPES}, read from a socket; "
                f"{scrape_httpx * 1000:.0f} ms through httpx; "
                f"{scrape_bytes / 1e6:.1f} MB, {scrape_lines} lines)",
            ),
        ]

        log("one change-detection sweep on the cold-started daemon")
        calls_before = await scrape_vault_calls(metrics_url)
        cpu_before, daemon_cpu, t0 = servers_cpu(), cpu_seconds(daemon.pid), time.perf_counter()
        daemon.signal(signal.SIGUSR2)
        swept = daemon.wait_for("sweep_done")
        cpu_after, elapsed = servers_cpu(), time.perf_counter() - t0
        daemon_cpu = cpu_seconds(daemon.pid) - daemon_cpu
        calls_after = await scrape_vault_calls(metrics_url)
        if "error" in swept:
            rows.append(("change-detection sweep", f"not measured: {swept['error']}"))
        else:
            rows += [
                (
                    "change-detection sweep (one, all paths)",
                    f"{swept['seconds']:.2f} s, daemon CPU {swept['cpu']:.2f} s "
                    f"({ms_per(swept['cpu'], n)} ms/credential); "
                    f"{machine(cpu_before, cpu_after, daemon_cpu, elapsed)}",
                ),
                (
                    "sweep: Vault calls per credential",
                    calls_split(calls_before, calls_after, n),
                ),
            ]
        daemon.stop()
        if args.cold_only:
            await baseline_round()
            return report(baseline_rows(rows, rounds, colds, n), 0)

        log("restart while every token is still valid")
        tokens_before = await token_requests(admin)
        cpu_before = servers_cpu()
        daemon = spawn(config)
        restart_started = daemon.wait_for("started")
        metrics_url = restart_started["metrics_url"]
        again = daemon.wait_for("all_planned")
        restart_seconds = time.perf_counter() - daemon.started
        restart_cpu, cpu_after = cpu_seconds(daemon.pid), servers_cpu()
        restart_calls = await scrape_vault_calls(metrics_url)
        restart_tokens = await token_requests(admin) - tokens_before
        log(
            f"restart: every credential planned in {restart_seconds:.1f}s; "
            f"{again['first_runs']} first runs done: {again['actions']}"
        )
        rows += [
            (
                "restart: spawn -> every credential planned",
                f"{restart_seconds:.2f} s (daemon up after {restart_started['since_spawn']:.2f} s; "
                f"{again['runs']} runs made by then for {n} credentials)",
            ),
            (
                "restart: spawn -> all first runs done",
                f"{restart_seconds:.2f} s (daemon up after {restart_started['since_spawn']:.2f} s)"
                if again["runs"] >= n
                else f"not waited for: {again['runs']} of {n} credentials had run when every "
                "one was planned; the rest are planned from what the daemon knew at start and "
                "run when due",
            ),
            (
                "restart: first-run outcomes",
                ", ".join(f"{k} {v}" for k, v in sorted(again["actions"].items())) or "none",
            ),
            ("restart: token requests (must be 0)", f"{restart_tokens}"),
            (
                "restart: Vault calls per credential",
                f"spawn -> every credential planned: {calls_split({}, restart_calls, n)}",
            ),
            (
                "restart: CPU",
                f"daemon {restart_cpu:.2f} s ({ms_per(restart_cpu, n)} ms/credential); "
                f"{machine(cpu_before, cpu_after, restart_cpu, restart_seconds)}",
            ),
        ]
        if again["actions"].get("refreshed"):
            log("some tokens were already due at the restart: the lifetime is too short")

        first_refresh = again["refresh_due_min"]  # what the records plan, not a check run
        if args.idle > 0:
            await idle_phase(again, metrics_url)

        wait = first_refresh - time.time()
        if wait > DEADLINE_SLACK:
            rows.append(
                (
                    "steady: skipped",
                    f"the first refresh is due in {wait:.0f} s, more than {DEADLINE_SLACK:.0f} s "
                    "away (token lifetime); a shorter --lifetime measures it",
                )
            )
            steady_rss = proc_status(daemon.pid, "VmHWM")
            daemon.stop()
            if len(rounds) <= len(colds):
                await baseline_round()
            rows.append(("peak RSS (VmHWM), restarted daemon", f"{steady_rss / 2**20:.0f} MiB"))
            return report(baseline_rows(rows, rounds, colds, n), 0 if restart_tokens == 0 else 1)
        if wait > base_seconds + 10:
            # The second baseline round uses the idle time before the first refresh is due
            # (the restarted daemon sits idle); else it runs after the steady phase.
            await baseline_round()
        # The first generation of refreshes replays the cold start spread by the policy's
        # jitter (due at 0.56-0.76 of the lifetime after issue), so its rate ramps up from the
        # first due time. The window opens where, on that ramp, its mean rate is the long-run
        # rate N / (0.66 x lifetime): the load a daemon with this lifetime carries for good.
        offset = max(0.0, 0.3 * cold - args.steady / 2) + args.steady_delay
        wait = max(0.0, first_refresh + offset - time.time())
        log(f"steady state: window opens in {wait:.0f}s and lasts {args.steady:g}s")
        await asyncio.sleep(wait)
        tokens_before = await token_requests(admin)
        daemon.signal(signal.SIGUSR1)
        mark_a = daemon.wait_for("mark")
        # Marks, then scrapes: the runs and the calls are counted over windows of the same
        # length, shifted by one scrape's time.
        calls_before = await scrape_vault_calls(metrics_url)
        cpu_before, daemon_cpu = servers_cpu(), cpu_seconds(daemon.pid)
        await asyncio.sleep(args.steady)
        daemon.signal(signal.SIGUSR1)
        mark_b = daemon.wait_for("mark")
        daemon_cpu = cpu_seconds(daemon.pid) - daemon_cpu
        cpu_after, calls_after = servers_cpu(), await scrape_vault_calls(metrics_url)
        steady_tokens = await token_requests(admin) - tokens_before
        steady_rss = proc_status(daemon.pid, "VmHWM")
        final = daemon.stop()
        if len(rounds) <= len(colds):
            await baseline_round()
        if final["lateness_dropped"]:
            raise RuntimeError("the lateness deque overflowed; shorten the steady phase")
        window = final["lateness"][mark_a["count"] : mark_b["count"]]
        rows += [
            (
                "steady: window",
                f"{args.steady:g} s, from {offset:.0f} s after the first due refresh: "
                f"{len(window)} scheduled runs, {steady_tokens} token requests",
            ),
            (
                "steady: refresh rate in the window",
                f"{len(window) / args.steady:.1f}/s (long-run rate N/(0.66 x lifetime): "
                f"{n / (0.66 * args.lifetime):.1f}/s; cold start: {n / cold:.1f}/s)",
            ),
            (
                "steady: lateness p50 / p99 / max",
                " / ".join(
                    f"{v * 1000:.0f} ms"
                    for v in (
                        percentile(window, 0.50),
                        percentile(window, 0.99),
                        max(window, default=float("nan")),
                    )
                ),
            ),
            (
                "steady: Vault writes and reads per refresh",
                per_refresh(mark_a.get("calls", {}), mark_b.get("calls", {}), steady_tokens),
            ),
            (
                "steady: Vault calls per scheduled run",
                calls_split(calls_before, calls_after, len(window)),
            ),
            ("steady: Vault calls per credential", calls_split(calls_before, calls_after, n)),
            (
                "steady: CPU",
                f"daemon {100 * daemon_cpu / args.steady:.1f} % of one core "
                f"({ms_per(daemon_cpu, max(1, len(window)))} ms/refresh); "
                f"{machine(cpu_before, cpu_after, daemon_cpu, args.steady)}",
            ),
            ("peak RSS (VmHWM), restarted daemon", f"{steady_rss / 2**20:.0f} MiB"),
        ]
        return report(baseline_rows(rows, rounds, colds, n), 0 if restart_tokens == 0 else 1)
    finally:
        for process in (d.process for d in daemons):
            if process.poll() is None:
                process.kill()
                process.wait()
        await kv.aclose()
        await admin.aclose()


# One baseline round: seconds, then CPU seconds of the script, OpenBao, the sandbox and every
# other process on the machine (noise: other load on the same cores), and the load average at
# its end.
Round = tuple[float, float, float, float, float, float]


def baseline_rows(
    rows: list[tuple[str, str]],
    rounds: list[Round],
    colds: list[float],
    n: int,
) -> list[tuple[str, str]]:
    """The baseline's rows (one per round) and the ratio, placed before keyturn's last cold
    start. Cold start i (from 1) ran between baseline rounds i and i + 1: its ratio is against
    the mean of those two, so that the machine's drift over a run (the script's rounds have
    differed by 40 %) weighs on both sides alike; the ratio is the median over cold starts."""
    ours = [
        (
            f"baseline round {i}: token requests + KV writes",
            f"{seconds:.2f} s ({n / seconds:.0f} credentials/s; CPU ms/credential: script "
            f"{ms_per(cpu, n)}, OpenBao {ms_per(bao, n)}, sandbox {ms_per(sb, n)}; "
            f"other processes {max(0.0, others / seconds):.2f} cores; load average (1 min) "
            f"{load:.2f})",
        )
        for i, (seconds, cpu, bao, sb, others, load) in enumerate(rounds, 1)
    ]
    ratios = [
        cold / statistics.mean(r[0] for r in rounds[i : i + 2]) for i, cold in enumerate(colds)
    ]
    each = ", ".join(f"{r:.2f}" for r in ratios)
    if len(colds) == 1:
        detail = "against the mean of the rounds before and after it; per round: " + ", ".join(
            f"{colds[0] / r[0]:.2f}" for r in rounds[:2]
        )
    else:
        detail = (
            f"median of {len(colds)} cold starts, each against the mean of the baseline rounds "
            f"before and after it: {each}"
        )
    ratio = ("ratio keyturn / baseline", f"{statistics.median(ratios):.2f} ({detail})")
    earlier = [row for row in rows if row[0].startswith(EARLIER_COLD_START)]
    rest = [row for row in rows if not row[0].startswith(EARLIER_COLD_START)]
    at = next(i for i, (k, _) in enumerate(rest) if k.startswith("keyturn:"))
    return [*rest[:at], *ours, *earlier, rest[at], ratio, *rest[at + 1 :]]


EARLIER_COLD_START = "keyturn cold start "  # the rows of the cold starts before the last


SCRAPES = 5
# The baseline script run once more with this many pooled connections (keyturn's lane size):
# httpcore's cost per request grows with its pool, and the ratio's script keeps one connection
# per concurrent request, as a user of httpx would.
SMALL_POOL = LANE_CONNECTIONS
SETTLE_STILL = 2.0  # the idle window opens once the daemon made no Vault call for this long
SETTLE_MAX = 60.0  # ... or after this, whatever it does


async def scrape_metrics(url: str) -> tuple[float, float, int, int]:
    """GET /metrics of the running daemon `SCRAPES` times: the median time of a whole
    response read from a plain socket (as Prometheus' Go scraper reads it: the time is the
    daemon's), the median through httpx (whose own parsing of 8 MB adds tens of ms of this
    process's CPU), and the body's size in bytes and lines."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = (
        f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/plain\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    plain, through_httpx, body = [], [], b""
    for _ in range(SCRAPES):
        started = time.perf_counter()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        chunks = []
        while chunk := await reader.read(1 << 20):
            chunks.append(chunk)
        plain.append(time.perf_counter() - started)
        writer.close()
        await writer.wait_closed()
        head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"/metrics answered {head.splitlines()[0]!r}")
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        for _ in range(SCRAPES):
            started = time.perf_counter()
            response = await client.get("/metrics")
            through_httpx.append(time.perf_counter() - started)
            response.raise_for_status()
    return statistics.median(plain), statistics.median(through_httpx), len(body), body.count(b"\n")


def report(rows: list[tuple[str, str]], code: int) -> int:
    width = max(len(k) for k, _ in rows)
    print(f"\nkeyturn daemon at scale: {' '.join(sys.argv[1:]) or '(defaults)'}")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    if code:
        print("FAIL: the restart made token requests while every token was still valid")
    sys.stdout.flush()
    return code


# -- child: the daemon itself -----------------------------------------------------------------


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def child(config_path: Path) -> int:
    spawned = time.time()
    from keyturn.config import load_config  # noqa: PLC0415 - the child's own imports
    from keyturn.daemon import open_daemon  # noqa: PLC0415
    from keyturn.logs import configure_logging  # noqa: PLC0415

    configure_logging("warning")  # stderr: the parent's keyturn.log
    config = load_config(config_path)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        started = False
        tasks: set[asyncio.Task[None]] = set()
        try:
            async with open_daemon(config) as daemon:
                started = True
                opened = time.time()  # the scheduler planned every first run before this
                emit(
                    {
                        "event": "started",
                        "since_spawn": opened - spawned,
                        "metrics_url": daemon.server.url,
                    }
                )
                scheduler = daemon.scheduler
                calls = count_store_calls(daemon.runtime.store, config.keyturn.state_prefix)
                loop.add_signal_handler(
                    signal.SIGUSR1,
                    lambda: emit(
                        {"event": "mark", "count": len(scheduler.lateness), "calls": dict(calls)}
                    ),
                )

                def sweep() -> None:
                    task = asyncio.ensure_future(sweep_once(daemon))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)

                loop.add_signal_handler(signal.SIGUSR2, sweep)

                def planned(view: Any) -> bool:
                    """Its first run has ended, or it has a run planned after the start (a
                    daemon that plans from what Vault holds need not run it at once)."""
                    return view.last_outcome is not None or (
                        view.next_due is not None and view.next_due > opened
                    )

                def summary(event: str) -> None:
                    statuses = scheduler.statuses()
                    actions = Counter(s.last_outcome.action for s in statuses if s.last_outcome)
                    dues = [s.next_due for s in statuses if s.next_due is not None]
                    # The refresh each record plans (drawn at its last success): a planned run
                    # may be something else (a restored credential's check, a retry).
                    refreshes = [
                        s.state.token.next_due
                        for s in statuses
                        if s.state is not None and s.state.token.next_due is not None
                    ]
                    emit(
                        {
                            "event": event,
                            "since_spawn": time.time() - spawned,
                            "actions": dict(actions),
                            "first_runs": sum(actions.values()),
                            "runs": len(scheduler.lateness),  # scheduled runs started so far
                            "next_due_min": min(dues),
                            "next_due_max": max(dues),
                            "refresh_due_min": min(refreshes, default=min(dues)),
                        }
                    )

                # Walk the credentials in order, only as far as the first not yet planned (then
                # not yet run): each poll costs next to nothing (scheduler.statuses() for
                # 10,000 credentials every 0.1 s would be the benchmark's own 15 % of a core).
                names = [view.name for view in scheduler.statuses()]
                planned_count = done = 0
                while not stop.is_set():
                    all_planned = planned_count == len(names)
                    while planned_count < len(names):
                        view = scheduler.status_of(names[planned_count])
                        if view is not None and not planned(view):
                            break
                        planned_count += 1
                    while done < len(names):
                        view = scheduler.status_of(names[done])
                        if view is not None and view.last_outcome is None:
                            break
                        done += 1
                    if not all_planned and planned_count == len(names):
                        summary("all_planned")
                    if done == len(names):
                        summary("first_runs_done")
                        break
                    with contextlib.suppress(TimeoutError):
                        # Once all are planned, runs still to come may be far off: poll slowly.
                        delay = 1.0 if planned_count == len(names) else 0.1
                        await asyncio.wait_for(stop.wait(), timeout=delay)
                await stop.wait()  # leaving the block drains in-flight runs, as `keyturn run`
        except Exception as error:
            if started:
                raise
            emit({"event": "failed", "error": repr(error)})
            return 1
        emit(
            {
                "event": "stopped",
                "code": 0,
                "lateness": list(scheduler.lateness),
                "lateness_dropped": len(scheduler.lateness) == scheduler.lateness.maxlen,
                "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
        )
        return 0

    return asyncio.run(main())


# What the child counts of the daemon's store calls, by (what, where): `what` is `write`,
# `write_metadata` (a write's custom metadata: a second call to Vault), `read`,
# `read_metadata`, `read_field` (a credential's inputs), `list`; `where` is `credential` (a
# state record, a published path, an input) or `shared` (the heartbeat, the saved plan,
# listings).
COUNTED = {
    "write": "write",
    "read": "read",
    "read_metadata": "read_metadata",
    "read_fields": "read_field",
    "list_keys": "list",
    "list_metadata": "list",
}


def count_store_calls(store: Any, state_prefix: str) -> Counter[str]:
    """Wrap the daemon's store (the object every job holds) so each call is counted as
    `what/where` (see COUNTED) when it is made; the counts are the returned Counter."""
    counts: Counter[str] = Counter()
    shared = state_prefix.strip("/") + "/_"

    def where(path: str) -> str:
        return "shared" if path.startswith(shared) else "credential"

    for method, what in COUNTED.items():
        original = getattr(store, method, None)
        if original is None:
            continue

        def counted(
            path: str, *args: Any, _original: Any = original, _what: str = what, **kwargs: Any
        ) -> Any:
            place = "shared" if _what == "list" else where(path)
            counts[f"{_what}/{place}"] += 1
            if _what == "write" and kwargs.get("custom_metadata") is not None:
                counts[f"write_metadata/{place}"] += 1
            return _original(path, *args, **kwargs)

        try:
            setattr(store, method, counted)
        except AttributeError:  # a store that takes no attributes: nothing is counted
            return counts
    return counts


def per_refresh(before: Mapping[str, int], after: Mapping[str, int], refreshes: int) -> str:
    """Vault writes and reads on the credentials' own paths per refresh, between two marks
    of the child, and the shared records' calls over the same window."""
    if refreshes <= 0 or not after:
        return "n/a (no refresh in the window, or no count from the daemon)"

    def delta(key: str) -> int:
        return after.get(key, 0) - before.get(key, 0)

    data, metadata = delta("write/credential"), delta("write_metadata/credential")
    reads = delta("read/credential") + delta("read_field/credential")
    metas = delta("read_metadata/credential")
    shared_writes = delta("write/shared") + delta("write_metadata/shared")
    shared_reads = delta("read/shared") + delta("read_metadata/shared") + delta("list/shared")
    return (
        f"writes {figure((data + metadata) / refreshes)} (data {figure(data / refreshes)}, "
        f"custom metadata {figure(metadata / refreshes)}), reads "
        f"{figure((reads + metas) / refreshes)} (read and read_field {figure(reads / refreshes)}, "
        f"read_metadata {figure(metas / refreshes)}) over {refreshes} refreshes; the minimal "
        f"script: 1 write, 0 reads per credential; heartbeat and saved plan in the window: "
        f"{shared_writes} writes, {shared_reads} reads"
    )


async def sweep_once(daemon: Any) -> None:
    """One change-detection sweep, as the daemon's periodic "watch" job runs it: the watcher
    `open_daemon` registers, built the same way over this daemon's runtime and scheduler (the
    registered one is not reachable from outside). Reports its wall and CPU seconds."""
    try:
        from keyturn.daemon import published_watcher  # noqa: PLC0415

        watcher = published_watcher(daemon.runtime, daemon.scheduler)
        cpu, started = time.process_time(), time.perf_counter()
        await watcher.sweep()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    except Exception as error:  # a changed watcher API: reported, the run goes on
        emit({"event": "sweep_done", "error": repr(error)})
        return
    emit({"event": "sweep_done", "seconds": seconds, "cpu": cpu})


# -- entry ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--credentials", type=int, default=10_000)
    parser.add_argument(
        "--lifetime",
        type=int,
        default=None,
        help="access token lifetime in seconds (default: 10 x the first baseline round, >= 200)",
    )
    parser.add_argument("--steady", type=float, default=60.0, help="steady window (s)")
    parser.add_argument(
        "--steady-delay",
        type=float,
        default=0.0,
        help="open the steady window this much later (s; past 0.76 x lifetime: the second "
        "generation of refreshes after the restart, with no first-run reads)",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=0.0,
        help="idle window after the restart (s; 0: skipped; the issue's figure: 300, with "
        "--lifetime 3600)",
    )
    parser.add_argument(
        "--idle-delay",
        type=float,
        default=0.0,
        help="seconds between the restart (every credential planned, Vault calls stopped) and "
        "the idle window",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="keyturn max_concurrency and the baseline's concurrent token requests",
    )
    parser.add_argument(
        "--vault-concurrency",
        type=int,
        default=16,
        help="keyturn vault_concurrency and the baseline's hvac threads",
    )
    parser.add_argument(
        "--provider-connections",
        type=int,
        default=None,
        help="the provider's max_connections in keyturn's config (default: keyturn's, 100)",
    )
    parser.add_argument(
        "--cold-starts",
        type=int,
        default=3,
        help="keyturn cold starts, each between two baseline rounds; the ratio is the median "
        "of theirs (default 3; the last one's daemon goes on to the other phases)",
    )
    parser.add_argument(
        "--cold-only", action="store_true", help="stop after the cold starts (for tuning)"
    )
    parser.add_argument("--probe", action="store_true", help="probe each token before publish")
    parser.add_argument(
        "--no-refresh-tokens",
        action="store_true",
        help="the sandbox issues no refresh token: every refresh is a client_credentials grant",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary dir")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child)
    if args.cold_starts < 1:
        parser.error("--cold-starts must be at least 1")
    # SIGTERM unwinds like Ctrl-C, so OpenBao, the sandbox and the daemon are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.auto_lifetime = args.lifetime is None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="keyturn-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"workdir {workdir} (keyturn.log, sandbox/)")
    sandbox_config = {
        "access_token_lifetime": args.lifetime or 3600,
        "access_log": False,
        "issue_refresh_token_for_client_credentials": not args.no_refresh_tokens,
    }
    with (
        OpenBaoDevServer(log_file=workdir / "bao.log") as vault,
        SandboxProcess(sandbox_config, workdir / "sandbox", log_level="warning") as sandbox,
    ):
        return asyncio.run(bench(args, workdir, Path(__file__).resolve(), vault, sandbox))


if __name__ == "__main__":
    sys.exit(main())
