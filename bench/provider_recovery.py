"""A provider outage that outlasts the tokens: N OAuth credentials behind a provider that is
down for a minute and comes back, against a real OpenBao and the real sandbox.

    python bench/provider_recovery.py [--credentials 1000] [--outage 60] [--rate-limit 50|none]
        [--lifetime S] [--margin 5] [--before S] [--concurrency 64] [--workdir DIR]

Everything runs on loopback: `bao server -dev` (in-memory storage) and `keyturn sandbox`, as
subprocesses, and the daemon as a real `python -m keyturn run -c keyturn.toml`. Setup registers
N OAuth apps through the sandbox's admin API and stores their inputs in Vault, as
`bench/daemon_scale.py` does (its `setup` and `service_tables`); the provider has `rate_limit =
--rate-limit` (`none`: no rate_limit, so keyturn's knocking while it is down is bounded by
`keyturn.providers.recovery.DEFAULT_RATE` and nothing bounds the wake), each credential the
refresh policy `{ margin = --margin }` (the rest default) and the default backoff
(`after_expiry` 5 s). The sandbox issues tokens of `--lifetime` seconds (default: 3/4 of the
outage, at most 45 s, so that every token expires during the outage while the refreshes before
it stay under the rate limit: N over the mean planned interval, printed).

1. the daemon starts; once every credential's `publish_to` path exists in Vault it runs
   `--before` seconds (default: one lifetime) so that the refreshes before the outage are its
   steady state;
2. `PUT /admin/faults {"token": {"outage_seconds": --outage}}`: every token request gets 503
   with a Retry-After of the outage's remaining seconds until the sandbox's clock passes its
   end (the sandbox ends it itself); every token expires during it;
3. the daemon's /metrics (every second: `keyturn_credential_ready`,
   `keyturn_credential_issued_timestamp_seconds`) tell when every credential holds a token
   issued after the outage began; the run goes on 10 s more, then stops the daemon (SIGTERM).
   No wait is unbounded: the cold start gets 600 s, the recovery max(120, 60 + 4 N / rate) s.

It prints (figures on stdout, progress on stderr):

- token requests per second from the sandbox's own access log (one JSON line per request, with
  `route`, `status` and a timestamp), in four phases: before the outage, during it (and its
  part after the last token expired, when every credential waits), the first 10 s after it,
  and after that until the end of the run; for each the count by status, the mean per second
  and the peak in any 1-second window (sliding, not whole clock seconds), each against the
  rate limit as a ratio. The bucket (`keyturn.ratelimit.TokenBucket`) holds one second's worth,
  so any 1-second window may see up to twice the rate after an idle moment; its mean is the
  rate. Without a rate_limit the phases during the outage are compared with DEFAULT_RATE.
  Then the requests in each whole second of the outage and of the 30 s after it;
- the tries during the outage per credential (every credential waited), next to the crowd
  stretch's period N / rate;
- seconds from the outage's end until the first new token (sandbox log), and until the first,
  half and all credentials were published again (each new version's `created_time` in Vault);
  the daemon's `provider.back` log line (when, how many credentials it woke);
- how long each credential's published token stayed expired: from the `expires_at` of the
  version apps read when the outage ended (a version published during the outage holds a token
  issued before it) until the `created_time` of the next version (max, p95, mean), and the
  part of it after the outage's end (keyturn's doing: before the end nothing could be had);
  their sums are the expired reads of an app reading each credential once a second. (The
  `provider.back` line and the wake it reports are the daemon's `wake_when_providers_answer`;
  a daemon without it logs none, and its credentials come back at their own cadence.)

How late the daemon's scheduled runs started against their planned time
(`keyturn_schedule_lateness_seconds`, scraped when each phase begins and ends): every run holds
one of `max_concurrency` slots while it waits in the provider's bucket, so a bucket kept full
by waiting credentials makes every other run wait for a slot, other providers' too; after the
outage the woken runs count from the wake. Token requests keyturn counted itself
(`keyturn_token_requests_total`, by outcome) are shown beside the sandbox's count as a
cross-check.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from keyturn.policy import RefreshPolicy, refresh_window
from keyturn.providers.recovery import DEFAULT_RATE, Recovery
from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.ports import free_port_pair
from keyturn_devkit.dev.sandbox import SandboxProcess


def _daemon_scale() -> ModuleType:
    """bench/daemon_scale.py, a script beside this one (bench/ is not a package)."""
    name = "daemon_scale"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses and annotations look their module up
    spec.loader.exec_module(module)
    return module


ds = _daemon_scale()
log = ds.log

PUBLISHED = ds.PUBLISHED
COLD_DEADLINE = 600.0  # seconds the cold start may take
AFTER = 10.0  # the "first seconds after the outage" phase, and the run's tail once all is back
POLL = 1.0  # seconds between /metrics scrapes
TOKEN_ROUTE = "/oauth/token"
LATENESS = "keyturn_schedule_lateness_seconds"

Row = tuple[str, str]


# -- pure helpers (tests/unit/test_bench_provider_recovery.py) ---------------------------------

_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


def parse_time(text: str) -> float:
    """Epoch seconds of an RFC 3339 time with any number of fractional digits (Vault writes
    nanoseconds, which `datetime.fromisoformat` of Python 3.11 refuses)."""
    match = _RFC3339.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    zone = "+00:00" if match[3] == "Z" else match[3]
    whole = datetime.fromisoformat(match[1] + zone).timestamp()
    return whole + (float("0." + match[2]) if match[2] else 0.0)


def default_lifetime(outage: float) -> int:
    """Token lifetime: 3/4 of the outage (every token current at its start expires before its
    end), at most 45 s (so the refreshes before the outage stay under 50/s for 1,000
    credentials), at least 4 s."""
    return max(4, min(45, math.floor(0.75 * outage)))


def refresh_interval(lifetime: float, policy: RefreshPolicy) -> float:
    """The mean planned interval between a credential's refreshes (the middle of the window)."""
    earliest, latest = refresh_window(0.0, lifetime, policy)
    return (earliest + latest) / 2


def token_requests(log_text: str) -> list[tuple[float, int]]:
    """(epoch seconds, status) of every token-endpoint request in the sandbox's access log,
    in time order; other lines (other routes, plain text) are skipped."""
    found = []
    for line in log_text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(entry, dict)
            and entry.get("route") == TOKEN_ROUTE
            and "timestamp" in entry
            and isinstance(entry.get("status"), int)
        ):
            found.append((parse_time(str(entry["timestamp"])), int(entry["status"])))
    found.sort()
    return found


def peak_per_second(times: Sequence[float], start: float, end: float, width: float = 1.0) -> int:
    """The most of `times` (sorted) in any window of `width` seconds inside [start, end)."""
    inside = [t for t in times if start <= t < end]
    best = first = 0
    for last, at in enumerate(inside):
        while inside[first] <= at - width:
            first += 1
        best = max(best, last - first + 1)
    return best


def per_second(times: Iterable[float], start: float, seconds: int) -> list[int]:
    """Counts of `times` in each whole second from `start`: [start, start+1), ..."""
    counts = [0] * max(0, seconds)
    for at in times:
        index = math.floor(at - start)
        if 0 <= index < len(counts):
            counts[index] += 1
    return counts


@dataclass(frozen=True, slots=True)
class PhaseFigures:
    seconds: float
    statuses: dict[int, int]  # status -> requests
    mean: float  # requests per second
    peak: int  # most requests in any 1-second window

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


def phase(requests: Sequence[tuple[float, int]], start: float, end: float) -> PhaseFigures:
    """The token requests in [start, end): by status, per second on average and at the peak."""
    inside = [(at, status) for at, status in requests if start <= at < end]
    seconds = max(0.0, end - start)
    times = [at for at, _ in inside]
    return PhaseFigures(
        seconds=seconds,
        statuses=dict(sorted(Counter(status for _, status in inside).items())),
        mean=len(inside) / seconds if seconds > 0 else 0.0,
        peak=peak_per_second(times, start, end),
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile (0 <= q <= 1) of `values`; nan when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def reached(times: Sequence[float], since: float, count: int, share: float) -> float | None:
    """Seconds from `since` until `share` of `count` things had happened (the times at which
    each did); None if fewer did."""
    needed = max(1, math.ceil(share * count))
    ordered = sorted(times)
    if len(ordered) < needed:
        return None
    return ordered[needed - 1] - since


@dataclass(frozen=True, slots=True)
class Expired:
    """How long apps read an expired token: one credential's old token's expiry and the time
    its next version was published."""

    expired_at: float
    republished_at: float

    def seconds(self) -> float:
        return max(0.0, self.republished_at - self.expired_at)

    def after(self, when: float) -> float:
        """The part of it after `when` (the outage's end)."""
        return max(0.0, self.republished_at - max(self.expired_at, when))


def gauges(exposition: str, name: str) -> dict[str, float]:
    """A per-credential gauge from Prometheus text: credential -> value."""
    values: dict[str, float] = {}
    prefix = name + "{"
    for line in exposition.splitlines():
        if not line.startswith(prefix):
            continue
        labels, _, value = line[len(prefix) :].rpartition("}")
        found = dict(ds._LABEL.findall(labels))
        if "credential" in found:
            values[found["credential"]] = float(value.split()[0])
    return values


def counter_by(exposition: str, name: str, label: str) -> dict[str, float]:
    """A counter's samples summed by one label."""
    values: dict[str, float] = {}
    prefix = name + "{"
    for line in exposition.splitlines():
        if not line.startswith(prefix):
            continue
        labels, _, value = line[len(prefix) :].rpartition("}")
        key = dict(ds._LABEL.findall(labels)).get(label, "?")
        values[key] = values.get(key, 0.0) + float(value.split()[0])
    return values


def histogram(exposition: str, name: str) -> dict[float, float]:
    """An unlabelled histogram's cumulative bucket counts by upper bound (`le`, inf for +Inf)."""
    buckets: dict[float, float] = {}
    prefix = name + "_bucket{"
    for line in exposition.splitlines():
        if not line.startswith(prefix):
            continue
        labels, _, value = line[len(prefix) :].rpartition("}")
        le = dict(ds._LABEL.findall(labels)).get("le")
        if le is not None:
            buckets[float(le)] = float(value.split()[0])
    return buckets


def lateness_text(before: Mapping[float, float], after: Mapping[float, float]) -> str:
    """The runs that started between two scrapes of keyturn_schedule_lateness_seconds: how
    many, the share on time (<= 0.1 s late), how many more than 1 s and 5 s late, and the
    bucket bound of their p99."""
    delta = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    runs = delta.get(math.inf, 0.0)
    if runs <= 0:
        return "no runs"

    def over(bound: float) -> float:
        return runs - delta.get(bound, runs)

    p99 = next((le for le, count in delta.items() if count >= 0.99 * runs), math.inf)
    return (
        f"{runs:g} runs, {100 * (runs - over(0.1)) / runs:.0f} % within 0.1 s, "
        f"{over(1.0):g} later than 1 s, {over(5.0):g} later than 5 s; p99 <= {p99:g} s"
    )


def rate_text(value: float, rate: float | None, against: str) -> str:
    return f"{value:.1f}/s" + (f" ({value / rate:.2f} x {against})" if rate else "")


# -- the daemon ---------------------------------------------------------------------------------


class KeyturnRun:
    """`python -m keyturn run -c CONFIG`, its output in `log_path`, /metrics on `port`."""

    def __init__(self, config: Path, log_path: Path) -> None:
        self.port = free_port_pair()
        self.log_path = log_path
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KEYTURN_", "VAULT_"))}
        env["KEYTURN_METRICS_LISTEN"] = f"127.0.0.1:{self.port}"
        with log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "keyturn", "run", "-c", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        self.started = time.time()

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 60.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def events(self, name: str) -> list[dict[str, Any]]:
        """Its JSON log lines whose `event` is `name`, each with `at` (epoch seconds)."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("event") == name and "timestamp" in entry:
                found.append({**entry, "at": parse_time(str(entry["timestamp"]))})
        return found


def write_config(
    args: argparse.Namespace, workdir: Path, vault_address: str, token_file: Path, base_url: str
) -> Path:
    header = f"""# Written by bench/provider_recovery.py
[keyturn]
instance_id = "bench"
log_level = "info"
state_prefix = "keyturn/state"
max_concurrency = {args.concurrency}
"""
    rate = f"rate_limit = {args.rate_limit:g}\n" if args.rate_limit else ""
    path = workdir / "keyturn.toml"
    path.write_text(
        header
        + ds.service_tables(
            vault_address,
            token_file,
            base_url,
            args.credentials,
            PUBLISHED,
            provider_extra=rate,
            credential_extra=f'refresh = {{ margin = "{args.margin:g}s" }}\n',
        )
    )
    return path


async def scrape(http: httpx.AsyncClient, url: str) -> str:
    response = await http.get(url)
    response.raise_for_status()
    return response.text


async def wait_published(kv: Any, count: int, daemon: KeyturnRun, timeout: float) -> float:
    """Epoch seconds when `count` paths exist under PUBLISHED (one KV LIST a second)."""
    deadline = time.monotonic() + timeout
    last = 0.0
    while time.monotonic() < deadline:
        seen = await kv.count(PUBLISHED)
        if seen >= count:
            return time.time()
        if not daemon.alive():
            raise RuntimeError("the daemon exited during the cold start; see keyturn.log")
        if time.monotonic() - last > 10:
            log(f"  published {seen}/{count} after {time.time() - daemon.started:.0f}s")
            last = time.monotonic()
        await asyncio.sleep(0.5)
    raise RuntimeError(f"not all {count} credentials published within {timeout:g}s")


async def versions(kv: Any, n: int, outage_end: float) -> list[Expired | None]:
    """Per credential: when its first version created after the outage's end was created,
    and the expiry of the version before it (None if there is none). No token is issued during
    the outage, so a version created during it holds a token issued before it: the old one."""
    found: list[Expired | None] = [None] * n

    async def one(i: int) -> None:
        path = f"{PUBLISHED}/c{i}"
        response = await kv.http.get(f"/v1/secret/metadata/{path}")
        response.raise_for_status()
        created = {
            int(v): parse_time(meta["created_time"])
            for v, meta in response.json()["data"]["versions"].items()
        }
        old = [v for v, at in created.items() if at < outage_end]
        new = [v for v, at in created.items() if at >= outage_end]
        if not old or not new:
            return
        response = await kv.http.get(f"/v1/secret/data/{path}", params={"version": max(old)})
        response.raise_for_status()
        expires_at = parse_time(response.json()["data"]["data"]["expires_at"])
        found[i] = Expired(expires_at, created[min(new)])

    await ds.for_each(n, 32, one)
    return found


# -- the run ------------------------------------------------------------------------------------


async def bench(
    args: argparse.Namespace, workdir: Path, vault: OpenBaoDevServer, sandbox: SandboxProcess
) -> list[Row]:
    n = args.credentials
    rate = args.rate_limit  # None: no rate_limit
    knock_rate = Recovery(rate).rate  # the stretch: half the rate_limit, or DEFAULT_RATE
    policy = RefreshPolicy(margin=args.margin)
    interval = refresh_interval(args.lifetime, policy)
    earliest, latest = refresh_window(0.0, args.lifetime, policy)
    kv = ds.Vault(vault.address, vault.root_token, 32)
    admin = httpx.AsyncClient(
        base_url=sandbox.base_url,
        headers={"Authorization": f"Bearer {sandbox.admin_token}"},
        timeout=60,
    )
    http = httpx.AsyncClient(timeout=30)
    rows: list[Row] = [
        ("credentials", f"{n}"),
        (
            "machine at the start",
            f"load average (1 min) {ds.load_average():.2f}, {os.cpu_count()} cores",
        ),
        ("outage", f"{args.outage:g} s of 503 (Retry-After: what is left of it) on /oauth/token"),
        (
            "token lifetime (sandbox)",
            f"{args.lifetime} s; refresh {earliest:.1f}-{latest:.1f} s after issue "
            f"(margin {args.margin:g} s): about {n / interval:.1f} refreshes/s before the "
            "outage",
        ),
        (
            "provider rate_limit",
            f"{rate:g}/s"
            if rate
            else f"none (knocking while down: DEFAULT_RATE {DEFAULT_RATE:g}/s)",
        ),
        (
            "crowd stretch once all wait",
            f"{n / knock_rate:.1f} s between one credential's tries "
            f"(N / {knock_rate:g}; after_expiry 5 s when fewer than {5 * knock_rate:g} wait)",
        ),
        ("max_concurrency", f"{args.concurrency}"),
    ]
    if args.lifetime >= args.outage:
        log("WARNING: the lifetime is not shorter than the outage: some tokens will not expire")
    daemon: KeyturnRun | None = None
    try:
        log(f"setup: registering {n} OAuth apps and storing their inputs in Vault")
        await ds.setup(args, kv, admin)
        token_file = workdir / "vault-token"
        token_file.write_text(vault.root_token)
        token_file.chmod(0o600)
        config = write_config(args, workdir, vault.address, token_file, sandbox.base_url)

        log("keyturn run: cold start")
        daemon = KeyturnRun(config, workdir / "keyturn.log")
        published = await wait_published(kv, n, daemon, COLD_DEADLINE)
        rows.append(("cold start: spawn -> all published", f"{published - daemon.started:.1f} s"))
        log(f"all {n} published; {args.before:g}s of steady refreshes before the outage")
        late = [histogram(await scrape(http, daemon.metrics_url), LATENESS)]
        await asyncio.sleep(args.before)

        late.append(histogram(await scrape(http, daemon.metrics_url), LATENESS))
        sent = time.time()
        response = await admin.put("/admin/faults", json={"token": {"outage_seconds": args.outage}})
        response.raise_for_status()
        answered = time.time()
        outage_start = (sent + answered) / 2  # the sandbox's now, within half the round trip
        outage_end = outage_start + args.outage
        log(f"outage: {args.outage:g}s")
        ready_at_end: int | None = None
        back_all: float | None = None
        deadline = outage_end + max(120.0, 60.0 + 4 * n / knock_rate)
        last_log = 0.0
        while time.time() < deadline:
            if not daemon.alive():
                raise RuntimeError("the daemon exited; see keyturn.log")
            text = await scrape(http, daemon.metrics_url)
            now = time.time()
            ready = sum(v == 1 for v in gauges(text, "keyturn_credential_ready").values())
            issued = gauges(text, "keyturn_credential_issued_timestamp_seconds")
            again = sum(at >= outage_start for at in issued.values())
            if ready_at_end is None and now >= outage_end:
                ready_at_end = ready  # the first scrape after the outage ended
                late.append(histogram(text, LATENESS))
            if now - last_log >= 5:
                phase_name = "outage" if now < outage_end else "after"
                log(
                    f"  {phase_name} +{now - outage_start:.0f}s: ready {ready}/{n}, "
                    f"new tokens {again}/{n}"
                )
                last_log = now
            if now >= outage_end and again >= n:
                back_all = now
                break
            await asyncio.sleep(POLL)
        if back_all is None:
            log("WARNING: not every credential got a new token before the deadline")
        stop_at = time.time() + AFTER
        await asyncio.sleep(max(0.0, stop_at - time.time()))
        final = await scrape(http, daemon.metrics_url)
        run_end = time.time()
        daemon.stop()
        load_end = ds.load_average()

        requests = token_requests(sandbox.log_text())
        rows += traffic_rows(
            requests, published, outage_start, outage_end, run_end, args.lifetime, rate, n
        )
        late.append(histogram(final, LATENESS))
        for (name, a), b in zip(
            (
                ("before", late[0]),
                ("during", late[1]),
                ("after (woken runs: since the wake)", late[2]),
            ),
            late[1:],
            strict=False,
        ):
            rows.append((f"scheduled runs' lateness, {name}", lateness_text(a, b)))
        outcomes = counter_by(final, "keyturn_token_requests_total", "outcome")
        in_window = [(at, s) for at, s in requests if daemon.started <= at <= run_end]
        rows.append(
            (
                "token requests, keyturn's count (whole run)",
                ", ".join(f"{k} {v:g}" for k, v in sorted(outcomes.items()))
                + f"; the sandbox logged {len(in_window)}",
            )
        )
        retry_after = counter_by(final, "keyturn_retry_after_total", "outcome")
        if retry_after:
            rows.append(
                (
                    "Retry-After (keyturn_retry_after_total)",
                    ", ".join(f"{k} {v:g}" for k, v in sorted(retry_after.items())),
                )
            )

        log("reading every credential's versions from Vault")
        spans = await versions(kv, n, outage_end)
        rows += recovery_rows(
            spans,
            requests,
            daemon.events("provider.back"),
            outage_start,
            outage_end,
            n,
            ready_at_end,
            back_all,
        )
        rows.append(("machine at the end", f"load average (1 min) {load_end:.2f}"))
        return rows
    finally:
        if daemon is not None:
            daemon.stop()
        await http.aclose()
        await admin.aclose()
        await kv.aclose()


def traffic_rows(
    requests: Sequence[tuple[float, int]],
    published: float,
    outage_start: float,
    outage_end: float,
    run_end: float,
    lifetime: float,
    rate: float | None,
    n: int,
) -> list[Row]:
    """The token requests per phase against the rate limit (DEFAULT_RATE while down without)."""
    rows: list[Row] = []
    tries: Row = ("tries during the outage per credential", "n/a")
    down_rate, down_against = (rate, "rate_limit") if rate else (DEFAULT_RATE, "DEFAULT_RATE")
    all_waiting = outage_start + lifetime  # every token current at the start has expired
    phases = [
        ("before the outage", published, outage_start, rate, "rate_limit"),
        ("during the outage", outage_start, outage_end, down_rate, down_against),
        ("during the outage, all waiting", all_waiting, outage_end, down_rate, down_against),
        (f"first {AFTER:g} s after it", outage_end, outage_end + AFTER, rate, "rate_limit"),
        ("after that", outage_end + AFTER, run_end, rate, "rate_limit"),
    ]
    for name, start, end, against, label in phases:
        if end <= start:
            continue
        figures = phase(requests, start, end)
        statuses = ", ".join(f"{s}: {c}" for s, c in figures.statuses.items()) or "none"
        rows.append(
            (
                f"token requests {name}",
                f"{figures.seconds:.1f} s, {figures.total} ({statuses}); mean "
                f"{rate_text(figures.mean, against, label)}; peak in any 1 s "
                f"{figures.peak}"
                + (f" ({figures.peak / against:.2f} x {label})" if against else ""),
            )
        )
        if name == "during the outage":
            tries = (
                "tries during the outage per credential",
                f"{figures.total / n:.2f} (every credential waited; {down_rate:g}/s for the "
                f"whole outage would be {down_rate * figures.seconds / n:.2f})",
            )
    rows.append(tries)
    if rate:
        # Over the whole run: the bucket's bound is rate per second on average and burst
        # (one second's worth) + rate in any 1-s window.
        overall = phase(requests, published, run_end)
        above = overall.peak > rate
        rows.append(
            (
                "peak against the rate_limit",
                f"{overall.peak} in the busiest 1 s window of the run ({overall.peak / rate:.2f} "
                f"x rate_limit; the bucket allows up to {2 * rate:g}: a full burst of "
                f"{rate:g} plus {rate:g} refilled)" + ("; ABOVE the rate_limit" if above else ""),
            )
        )
    times = [at for at, _ in requests]
    rows.append(
        (
            "per second during the outage",
            " ".join(
                str(c)
                for c in per_second(times, outage_start, math.ceil(outage_end - outage_start))
            ),
        )
    )
    rows.append(
        (
            "per second from the outage's end",
            " ".join(str(c) for c in per_second(times, outage_end, 30)) + " (first 30 s)",
        )
    )
    return rows


def recovery_rows(
    spans: Sequence[Expired | None],
    requests: Sequence[tuple[float, int]],
    back_events: Sequence[Mapping[str, Any]],
    outage_start: float,
    outage_end: float,
    n: int,
    ready_at_end: int | None,
    back_all: float | None,
) -> list[Row]:
    rows: list[Row] = []
    first_token = next((at for at, status in requests if at >= outage_end and status == 200), None)
    rows.append(
        (
            "outage end -> first token issued (sandbox log)",
            f"{first_token - outage_end:.2f} s" if first_token is not None else "none",
        )
    )
    back = [e for e in back_events if e["at"] >= outage_start]
    if back:
        woken = ", ".join(
            f"+{e['at'] - outage_end:.2f} s woke {e.get('credentials_woken')}" for e in back
        )
        rows.append(("daemon's provider.back (after the end)", woken))
    else:
        rows.append(("daemon's provider.back", "not logged"))
    known = [s for s in spans if s is not None]
    published = [s.republished_at for s in known]
    marks = []
    for label, share in (("first", 1 / n), ("half", 0.5), ("all", 1.0)):
        value = reached(published, outage_end, n, share)
        marks.append(f"{label} {value:.2f} s" if value is not None else f"{label} never")
    rows.append(("outage end -> published again (Vault created_time)", ", ".join(marks)))
    if len(known) < n:
        rows.append(("credentials without a new version", f"{n - len(known)} of {n}"))
    expired_before_end = sum(s.expired_at < outage_end for s in known)
    rows.append(
        (
            "tokens expired during the outage",
            f"{expired_before_end} of {n} (Vault expires_at); not ready at the first scrape "
            f"after its end: {n - ready_at_end if ready_at_end is not None else '?'}",
        )
    )
    if back_all is not None:
        rows.append(("outage end -> all new tokens (/metrics)", f"{back_all - outage_end:.1f} s"))
    if known:
        total = [s.seconds() for s in known]
        after = [s.after(outage_end) for s in known]
        rows.append(
            (
                "expired per credential",
                f"max {max(total):.1f} s, p95 {percentile(total, 0.95):.1f} s, mean "
                f"{sum(total) / len(total):.1f} s (from its old token's expires_at until the "
                "new version)",
            )
        )
        rows.append(
            (
                "  of which after the outage's end",
                f"max {max(after):.1f} s, p95 {percentile(after, 0.95):.1f} s, mean "
                f"{sum(after) / len(after):.2f} s",
            )
        )
        rows.append(
            (
                "expired reads, one read/s per credential",
                f"{sum(total):.0f} in all, {sum(after):.0f} after the outage's end",
            )
        )
    return rows


def report(rows: list[Row]) -> None:
    width = max(len(k) for k, _ in rows)
    print(f"\nkeyturn provider recovery: {' '.join(sys.argv[1:]) or '(defaults)'}")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    sys.stdout.flush()


# -- entry --------------------------------------------------------------------------------------


def rate_limit(text: str) -> float | None:
    """`--rate-limit`: requests per second, or none/0 for no rate_limit."""
    if text.strip().lower() in ("none", "0", ""):
        return None
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("expected a positive rate or none")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--credentials", type=int, default=1000)
    parser.add_argument("--outage", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument(
        "--rate-limit",
        type=rate_limit,
        default=50.0,
        help="the provider's rate_limit, requests/s (default 50; none: no rate_limit)",
    )
    parser.add_argument(
        "--lifetime",
        type=int,
        default=None,
        help="token lifetime in seconds (default: 3/4 of the outage, at most 45)",
    )
    parser.add_argument(
        "--margin", type=float, default=5.0, help="the credentials' refresh margin (s)"
    )
    parser.add_argument(
        "--before",
        type=float,
        default=None,
        help="seconds of steady refreshes between the cold start and the outage (default: "
        "one lifetime)",
    )
    parser.add_argument("--concurrency", type=int, default=64, help="keyturn max_concurrency")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary dir")
    args = parser.parse_args()
    if args.credentials < 1 or args.outage <= 0:
        parser.error("--credentials and --outage must be positive")
    if args.lifetime is None:
        args.lifetime = default_lifetime(args.outage)
    if args.before is None:
        args.before = float(args.lifetime)
    # SIGTERM unwinds like Ctrl-C, so OpenBao, the sandbox and the daemon are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="keyturn-recovery-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"workdir {workdir} (keyturn.log, sandbox/sandbox.log)")
    sandbox_config = {"access_token_lifetime": args.lifetime, "access_log": True}
    with (
        OpenBaoDevServer(log_file=workdir / "bao.log") as vault,
        SandboxProcess(sandbox_config, workdir / "sandbox", log_level="info") as sandbox,
    ):
        rows = asyncio.run(bench(args, workdir, vault, sandbox))
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
