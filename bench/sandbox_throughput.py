"""Token-endpoint throughput of the sandbox next to OpenBao's KV v2 write rate, same client.

    python bench/sandbox_throughput.py [--requests 3000] [--concurrency 32] [--max-seconds 10]

Both servers run on loopback (a real `bao server -dev` and a real `keyturn sandbox`); ONE
`httpx.AsyncClient` drives both with the same concurrency and request budget, so the figures
compare the servers, not the clients. keyturn's load tests write every token to Vault, so the
sandbox is never their bottleneck as long as it issues tokens at least as fast as OpenBao
stores them.

On a small machine the client itself is the limit: httpx at concurrency 32 spends ~2 ms of
CPU per request, several times what either server spends, so both same-client rates come out
close, and noisy when other work shares the machine. Each phase therefore also reports the CPU
time the client and the server spent per request (from /proc, Linux). The sandbox is
single-threaded, so 1 s divided by its CPU per request is a (conservative) rate it can
sustain; the exit code is 1 when that falls short of OpenBao's measured write rate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from keyturn_devkit.dev.openbao import OpenBaoDevServer
from keyturn_devkit.dev.sandbox import SandboxProcess

Call = Callable[[int], Awaitable[httpx.Response]]
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process (and its reaped children), 0 if unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / TICKS


@dataclass
class Result:
    name: str
    requests: int
    seconds: float
    statuses: Counter[int]
    client_cpu: float
    server_cpu: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        per = 1e6 / self.requests if self.requests else 0.0
        return (
            f"{self.name:<26} {self.requests:>6} req in {self.seconds:5.2f} s = "
            f"{self.rate:7.0f} req/s | CPU per request: client {self.client_cpu * per:5.0f} us, "
            f"server {self.server_cpu * per:5.0f} us | statuses {dict(self.statuses)}"
        )


async def measure(
    name: str, call: Call, server_pid: int | None, args: argparse.Namespace
) -> Result:
    """`args.requests` calls from `args.concurrency` workers, stopping after `max_seconds`."""
    for i in range(50):  # warm-up: connections opened, code paths hot
        await call(-1 - i)
    issued = 0
    statuses: Counter[int] = Counter()
    server_before, client_before = cpu_seconds(server_pid), time.process_time()
    started = time.perf_counter()
    deadline = started + args.max_seconds

    async def worker() -> None:
        nonlocal issued
        while issued < args.requests and time.perf_counter() < deadline:
            issued += 1
            response = await call(issued)
            statuses[response.status_code] += 1

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return Result(
        name,
        sum(statuses.values()),
        time.perf_counter() - started,
        statuses,
        time.process_time() - client_before,
        cpu_seconds(server_pid) - server_before,
    )


async def run(args: argparse.Namespace, bao: OpenBaoDevServer, sandbox: SandboxProcess) -> int:
    token_url = f"{sandbox.base_url}/oauth/token"
    token_body = {"grant_type": "client_credentials", **sandbox.bootstrap["oauth_client"]}
    vault_headers = {"X-Vault-Token": bao.root_token}
    bao_pid = bao._process.pid if bao._process else None  # a benchmark's peek
    n = args.concurrency
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:

        async def token(_n: int) -> httpx.Response:
            return await client.post(token_url, json=token_body)

        async def kv_write(i: int) -> httpx.Response:
            return await client.post(
                f"{bao.address}/v1/secret/data/bench/{i % 1000}",
                json={"data": {"access_token": f"value-{i}"}},
                headers=vault_headers,
            )

        results: list[Result] = []
        for _ in range(args.rounds):  # interleaved, so drift on the machine hits both alike
            results.append(await measure("OpenBao KV v2 write", kv_write, bao_pid, args))
            results.append(await measure("sandbox POST /oauth/token", token, sandbox.pid, args))
    for result in results:
        print(result.line())
    bao_runs = [r for r in results if r.name.startswith("OpenBao")]
    sandbox_runs = [r for r in results if r.name.startswith("sandbox")]
    bao_rate = statistics.median(r.rate for r in bao_runs)
    sandbox_rate = statistics.median(r.rate for r in sandbox_runs)
    bao_cpu = statistics.median(r.server_cpu / r.requests for r in bao_runs) * 1e6
    sandbox_cpu = statistics.median(r.server_cpu / r.requests for r in sandbox_runs) * 1e6
    print(f"\nmedian of {args.rounds} rounds, concurrency {n}, one httpx.AsyncClient:")
    row = "  {:<22} {:7.0f} req/s   server CPU {:5.0f} us/req"
    print(row.format("sandbox token endpoint", sandbox_rate, sandbox_cpu))
    print(row.format("OpenBao KV v2 write", bao_rate, bao_cpu))
    print(f"  ratio sandbox/OpenBao   {sandbox_rate / bao_rate:7.2f}")
    capacity = 1e6 / sandbox_cpu if sandbox_cpu else float("inf")
    print(f"  sandbox can sustain   ~{capacity:7.0f} req/s on one core (1 s / its CPU per request)")
    if capacity >= bao_rate:
        print("  verdict: OK, the sandbox sustains more than OpenBao's write rate")
        return 0
    print("  verdict: TOO SLOW, the sandbox would be the bottleneck")
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sandbox-log-level", default="info")
    args = parser.parse_args()
    with OpenBaoDevServer() as bao, SandboxProcess(log_level=args.sandbox_log_level) as sandbox:
        return asyncio.run(run(args, bao, sandbox))


if __name__ == "__main__":
    sys.exit(main())
