"""keyturn's audit-log pipeline at scale: a synthetic Vault audit log replayed through it.

    python bench/usage_replay.py [--lines 1000000] [--credentials 10000] [--consumers 50]
        [--workdir DIR] [--keep]

1. Writes a synthetic audit log of `--lines` lines in OpenBao's real shape (the entries of
   `keyturn_devkit.dev.audit`, which follow ones recorded from OpenBao 2.7): each of
   `--credentials` published paths read by `--consumers` AppRole identities of its own (every
   read is a request and a response line, each response ~1.7 kB), plus keyturn's own writes
   of new versions (2 %), logins on another mount (3 %) and 20 reads of keyturn's state by an
   intruder, one hour of traffic in all.
2. Times a bare loop of `json.loads` over every line of that file (what any JSON-reading
   tail costs at least), in a child process.
3. Times keyturn's pipeline over the same file, in another child process: `FileAuditSource`
   (reading, line splitting, the prefilter and parser), `UsageMonitor` (tracker and all four
   detectors; every credential has a `consumers` allow list, the learning period is over, so
   every check runs) with a FakeClock, from the file's start to its end.
4. Prints both rates, keyturn's margin over the required 5,000 lines per second, the peak
   RSS of each child (`VmHWM`, the child alone), and what the pipeline found (reads counted,
   consumers tracked, alerts: the 20 intruder reads must all be reported, once each per
   repeat period: 1 alert).

Everything is generated and measured in one run; nothing is pass/fail but the alert check.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from keyturn_devkit.dev.audit import Reader, line, read_entries, write_entries

T0 = 1_800_000_000.0
REQUIRED = 5_000  # audit lines per second keyturn must keep up with on one core


def published(credential: int) -> str:
    return f"apps/c{credential}/acme"


def consumer_role(credential: int, consumer: int) -> str:
    return f"app-{credential}-{consumer}"


MARKERS = {
    "time": "@TIME@",
    "id": "@ID@",
    "token": "@TOKEN@",
    "role": "@ROLE@",
    "entity": "@ENTITY@",
    "address": "@ADDRESS@",
    "path": "@PATH@",
    "version": "@VERSION@",
}
KEYTURN = Reader(role="keyturn", entity_id="e-keyturn", remote_address="10.255.0.1")


def templates() -> dict[str, str]:
    """Each kind of line as a `str.format` template with the MARKERS' names as fields (so a
    line costs one `format`, not a dict and a `json.dumps`); HMAC'd values share `token`."""
    reader = Reader(role="@ROLE@", entity_id="@ENTITY@", remote_address="@ADDRESS@")
    pairs = {
        "read": read_entries(reader, "@PATH@", at=T0, version=987654321),
        "write": write_entries(KEYTURN, "@PATH@", at=T0, version=987654321),
    }
    out: dict[str, str] = {}
    for kind, (request, response) in pairs.items():
        for half, entry in (("request", request), ("response", response)):
            text = line(entry).decode()
            text = re.sub("hmac-sha256:[0-9a-f]{64}", "hmac-sha256:@TOKEN@", text)
            text = text.replace(entry["time"], "@TIME@").replace(entry["request"]["id"], "@ID@")
            text = text.replace("987654321", "@VERSION@")
            text = text.replace("{", "{{").replace("}", "}}")
            for name, marker in MARKERS.items():
                text = text.replace(marker, "{" + name + "}")
            out[f"{kind}_{half}"] = text
    return out


def generate(path: Path, lines: int, credentials: int, consumers: int) -> dict[str, int]:
    """Writes the synthetic log; returns how many of each kind of line it holds."""
    shapes = templates()
    login = line(
        {
            "time": "2026-11-24T01:27:08Z",
            "type": "response",
            "auth": {"display_name": "approle", "metadata": {"role_name": "x"}},
            "request": {
                "operation": "update",
                "mount_point": "auth/approle/",
                "mount_type": "approle",
                "path": "auth/approle/login",
            },
        }
    ).decode()
    versions = [1] * credentials
    counts: Counter[str] = Counter()
    span = 3600.0
    pairs = lines // 2
    intruder = {pairs // 21 * (k + 1) for k in range(20)}
    buffer: list[str] = []
    with path.open("w") as out:
        for i in range(pairs):
            at = T0 + span * i / pairs
            whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(at)))
            stamp = f"{whole}.{int((at % 1) * 1e9):09d}Z"
            common = {"time": stamp, "id": f"{i:032x}", "token": f"{i:064x}"}
            credential = i % credentials
            if i in intruder:  # always credential c0's state: one alert, then repeats
                fields = {
                    **common,
                    "role": "intruder",
                    "entity": "e-intruder",
                    "address": "192.0.2.66",
                    "path": "keyturn/state/c0",
                    "version": "1",
                }
                kind = "intruder"
            elif i % 50 == 7:
                versions[credential] += 1
                fields = {
                    **common,
                    "path": published(credential),
                    "version": str(versions[credential]),
                }
                buffer.append(shapes["write_request"].format(**fields))
                buffer.append(shapes["write_response"].format(**fields))
                counts["keyturn_write"] += 2
                continue
            elif i % 33 == 5:
                buffer.append(login)
                buffer.append(login)
                counts["other_mount"] += 2
                continue
            else:
                consumer = (i // credentials) % consumers
                fields = {
                    **common,
                    "role": consumer_role(credential, consumer),
                    "entity": f"e-{credential}-{consumer}",
                    "address": f"10.{credential % 250}.{consumer}.{credential % 200 + 1}",
                    "path": published(credential),
                    "version": str(versions[credential]),
                }
                kind = "read"
            buffer.append(shapes["read_request"].format(**fields))
            buffer.append(shapes["read_response"].format(**fields))
            counts[kind] += 2
            if len(buffer) >= 4096:
                out.writelines(buffer)
                buffer.clear()
        out.writelines(buffer)
    return dict(counts)


# -- the children ------------------------------------------------------------------------------


def peak_rss_mib() -> float:
    for text in Path("/proc/self/status").read_text().splitlines():
        if text.startswith("VmHWM:"):
            return int(text.split()[1]) / 1024
    return float("nan")


def rss_mib() -> float:
    for text in Path("/proc/self/status").read_text().splitlines():
        if text.startswith("VmRSS:"):
            return int(text.split()[1]) / 1024
    return float("nan")


def child_json(path: Path) -> dict[str, Any]:
    loads = json.loads
    before = rss_mib()
    started = time.perf_counter()
    count = 0
    with path.open("rb") as handle:
        for text in handle:
            loads(text)
            count += 1
    seconds = time.perf_counter() - started
    return {"lines": count, "seconds": seconds, "rss_before": before, "peak": peak_rss_mib()}


def child_replay(path: Path, credentials: int, consumers: int) -> dict[str, Any]:
    from keyturn.clock import FakeClock  # noqa: PLC0415 - the child's own imports
    from keyturn.events import Event, Suspicious  # noqa: PLC0415
    from keyturn.usage.audit import AuditParser, Identity  # noqa: PLC0415
    from keyturn.usage.detectors import DetectorSettings  # noqa: PLC0415
    from keyturn.usage.layout import Layout, Watched  # noqa: PLC0415
    from keyturn.usage.monitor import UsageMonitor  # noqa: PLC0415
    from keyturn.usage.sources import FileAuditSource  # noqa: PLC0415

    layout = Layout(
        [
            Watched(f"c{k}", "acme", published(k), (f"approle/app-{k}-*",))
            for k in range(credentials)
        ]
    )
    alerts: list[Suspicious] = []

    def observer(event: Event) -> None:
        if isinstance(event, Suspicious):
            alerts.append(event)

    clock = FakeClock(T0 + 3600)
    monitor = UsageMonitor(
        layout,
        own=Identity(frozenset({"approle/keyturn"}), frozenset({"e-keyturn"})),
        observer=observer,
        clock=clock,
        settings=DetectorSettings(learning=0),
        max_consumers=max(100, consumers),
    )
    source = FileAuditSource(
        path, AuditParser(layout), monitor, clock=clock, start_at="start", chunk_size=1 << 18
    )
    before = rss_mib()
    started = time.perf_counter()
    while source.poll(budget=1 << 22):
        pass
    seconds = time.perf_counter() - started
    tracker = monitor.tracker
    reads = sum(u.reads for name in tracker.credentials() for u in tracker.usage_of(name))
    tracked = sum(tracker.consumer_count(name) for name in tracker.credentials())
    return {
        "lines": source.lines,
        "seconds": seconds,
        "rss_before": before,
        "peak": peak_rss_mib(),
        "reads": reads,
        "consumers": tracked,
        "skipped": dict(source.skipped),
        "alerts": Counter(f"{a.detector}/{a.severity}" for a in alerts),
        "suppressed": monitor.detectors.suppressed,
    }


def run_child(*args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SystemExit(f"child {args[0]} failed")
    return dict(json.loads(result.stdout.splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--credentials", type=int, default=10_000)
    parser.add_argument("--consumers", type=int, default=50)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the generated log")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, file = args.child[0], Path(args.child[1])
        if kind == "json":
            result = child_json(file)
        else:
            result = child_replay(file, args.credentials, args.consumers)
        print(json.dumps(result))
        return 0

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="keyturn-usage-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "audit.log"
    try:
        started = time.perf_counter()
        counts = generate(log, args.lines, args.credentials, args.consumers)
        size = log.stat().st_size
        total = sum(counts.values())
        print(
            f"generated {total:,} lines ({size / 2**20:,.0f} MiB) in "
            f"{time.perf_counter() - started:.1f}s: {counts}",
            file=sys.stderr,
        )
        baseline = run_child("json", str(log))
        replay = run_child(
            "replay",
            str(log),
            "--credentials",
            str(args.credentials),
            "--consumers",
            str(args.consumers),
        )
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not args.keep:
            log.unlink(missing_ok=True)

    json_rate = baseline["lines"] / baseline["seconds"]
    rate = replay["lines"] / replay["seconds"]
    print(
        f"audit log: {total:,} lines, {args.credentials:,} credentials x {args.consumers} consumers"
    )
    print(
        f"json.loads loop: {json_rate:>10,.0f} lines/s  ({baseline['seconds']:.1f}s)  "
        f"peak RSS {baseline['peak']:.0f} MiB"
    )
    print(
        f"keyturn usage:   {rate:>10,.0f} lines/s  ({replay['seconds']:.1f}s)  "
        f"peak RSS {replay['peak']:.0f} MiB (before the replay: {replay['rss_before']:.0f} MiB)"
    )
    print(
        f"keyturn / json.loads: {rate / json_rate:.2f}x; "
        f"margin over {REQUIRED:,} lines/s: {rate / REQUIRED:.1f}x"
    )
    print(
        f"reads counted: {replay['reads']:,} (generated {counts.get('read', 0) // 2:,}); "
        f"consumers tracked: {replay['consumers']:,}; skipped: {replay['skipped']}"
    )
    print(f"alerts: {dict(replay['alerts'])}; repeats suppressed: {replay['suppressed']}")
    expected_reads = counts.get("read", 0) // 2
    ok = (
        replay["lines"] == total
        and replay["reads"] == expected_reads
        and replay["alerts"] == {"private_state_read/critical": 1}
        and replay["suppressed"] == counts.get("intruder", 0) // 2 - 1
    )
    print("checks:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
