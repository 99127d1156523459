"""Half of all connections to the service dropped, grants and probes alike, for a minute and a
half with 30-second tokens (three lifetimes): no credential stays expired for more than 10 s
at a time.

A token the service issued is never thrown away because its probe's connection was dropped
(the probe is sent again alone, the token kept, or published unverified when the old one would
expire first), and an expired credential retries every `after_expiry`, so each stretch of
expiry ends within seconds of the service answering once. A module of its own, so that the
minute and a half runs beside the other modules.
"""

from __future__ import annotations

import itertools
import time
from datetime import datetime

import pytest

from keyturn_devkit.harness.apps import AppRead
from keyturn_devkit.harness.scene import Findings, SceneMaker

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

NAMES = ["drop-a", "drop-b", "drop-c"]
LIFETIME = 30
FAULTS_FOR = 90.0
LONGEST_EXPIRED = 10.0
# keyturn's retry cadence once a token has expired (backoff.after_expiry, drawn within ±20 %),
# and room for a busy machine between an attempt and the next read of the sampler.
AFTER_EXPIRY = 5.0 * 1.2
SLACK = 2.0


def asked_all_along(start: float, seconds: float, failed_at: list[float]) -> bool:
    """Whether keyturn asked for a token at least every after_expiry throughout an expired
    stretch, every one of those requests dropped by the service: with one request in two
    dropped, a stretch outlasts LONGEST_EXPIRED about once in a hundred runs by the dice
    alone (a dozen drops in a row), and the promise is keyturn's cadence, not the dice."""
    end = start + seconds
    asked = sorted(at for at in failed_at if start <= at <= end)
    return all(b - a <= AFTER_EXPIRY + SLACK for a, b in itertools.pairwise([start, *asked, end]))


def expired_stretches(reads: list[AppRead]) -> list[tuple[float, float]]:
    """(start, seconds) of each run of consecutive expired reads of one credential; a stretch
    lasts from its token's expiry to the first read that was not expired."""
    stretches, start = [], None
    for read in sorted(reads, key=lambda r: r.at):
        if read.version is None:
            continue
        if read.expired and start is None:
            start = read.expires_at if read.expires_at is not None else read.at
        elif not read.expired and start is not None:
            stretches.append((start, read.at - start))
            start = None
    if start is not None and reads:
        stretches.append((start, reads[-1].at - start))
    return stretches


@pytest.mark.timeout(FAULTS_FOR + 120)
def test_half_the_connections_dropped_never_leaves_a_credential_expired_for_long(
    scenes: SceneMaker,
) -> None:
    findings = Findings("half the connections dropped")
    scene = scenes(
        NAMES,
        lifetime=LIFETIME,
        credential={"refresh": {"margin": "5s", "min_interval": "500ms"}},
    )
    scene.start_daemon()
    sampler = scene.sampler.start(limit=FAULTS_FOR + 60)
    for name in NAMES:
        sampler.wait_version(name, 1, timeout=20)
    scene.admin.set_faults({"*": {"error_rate": 0.5, "drop_connection": True}})
    began = time.time()
    time.sleep(FAULTS_FOR)
    scene.admin.clear_faults()
    cleared = time.time()
    time.sleep(15.0)
    sampler.stop()

    versions = {name: len(scene.versions(name)) for name in NAMES}
    findings.measure("faults", f"{cleared - began:.0f}s of 50 % dropped connections")
    findings.measure("versions kept per credential (Vault keeps 10)", versions)
    findings.measure("token requests", scene.grants())
    findings.measure("apps", sampler.summary())
    unverified = scene.named("credential.published_unverified")
    findings.measure("published unverified", len(unverified))
    failures = scene.named("credential.failed")
    dice = 0  # stretches longer than LONGEST_EXPIRED while keyturn asked all along
    for name in NAMES:
        stretches = expired_stretches(sampler.snapshot(name))
        findings.measure(f"{name}: expired stretches", [round(s, 1) for _a, s in stretches])
        failed_at = [
            datetime.fromisoformat(e["timestamp"]).timestamp()
            for e in failures
            if e.get("credential") == name
        ]
        excused = []
        for start, seconds in stretches:
            if seconds <= LONGEST_EXPIRED:
                continue
            asked = asked_all_along(start, seconds, failed_at)
            findings.check(
                asked,
                f"{name} stayed expired for {seconds:.1f}s (at most {LONGEST_EXPIRED:g}s "
                f"allowed), and did not ask for a token every {AFTER_EXPIRY:g}s meanwhile",
            )
            if asked:
                dice += 1
                excused.append((start, start + seconds))
        after = [r for r in sampler.snapshot(name, since=cleared + 10.0) if r.expired]
        findings.check(after == [], f"{name}: expired reads after the faults cleared")
        refused = [
            r
            for r in sampler.snapshot(name)
            if r.status in (401, 403) and not any(a <= r.at <= b for a, b in excused)
        ]
        findings.check(refused == [], f"{name}: the service refused a published token: {refused}")
    findings.measure("stretches over the limit with every request dropped (the dice)", dice)
    findings.check(dice <= 1, f"{dice} stretches over {LONGEST_EXPIRED:g}s: more than the dice")
    findings.done()
