"""The promise at its edge, over real parts: back within seconds once the service answers, a
Retry-After never obeyed past the token's life, and a good token never thrown away because
its probe got no answer.

Each test runs `keyturn run` against a real OpenBao dev server and the sandbox over loopback
HTTP (`keyturn_devkit.harness.scene`), provokes the fault at the sandbox, and watches what
apps read. These scenarios have seconds of slack. Measurements are printed (run with `-s`).
"""

from __future__ import annotations

import itertools
import time

import pytest

from keyturn.policy import AFTER_EXPIRY_JITTER, BackoffPolicy
from keyturn_devkit.harness.scene import (
    Findings,
    Scene,
    SceneMaker,
    apps_view,
    first_reads,
    no_reuse,
    sleep_until,
)

pytestmark = [pytest.mark.openbao, pytest.mark.sandbox, pytest.mark.slow]

CADENCE = BackoffPolicy().after_expiry  # the default, as a user gets it
MARGIN = {"refresh": {"margin": "3s", "min_interval": "500ms"}}


def _wait_published(scene: Scene, name: str, version: int, timeout: float) -> float:
    """When the version `version` of `name` was created in Vault (waits for it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [v for v in scene.versions(name) if v.version == version]
        if found:
            return found[0].created
        time.sleep(0.2)
    raise TimeoutError(f"{name} v{version} never published within {timeout}s")


def test_an_outage_past_expiry_ends_within_seconds_of_the_service_answering(
    scenes: SceneMaker,
) -> None:
    """The token endpoint answers every request 503 with `Retry-After: 60` from just before
    the planned refresh until 14 s after the published token expired: once the token has
    expired keyturn tries again every `after_expiry` (no more often; before, denser as expiry
    nears) whatever Retry-After asks, and a new token is published within seconds of the
    service answering."""
    findings = Findings("outage past expiry")
    scene = scenes(["late"], lifetime=20, credential=MARGIN)
    scene.start_daemon()
    sampler = scene.sampler.start(limit=90)
    first = sampler.wait_version("late", 1, timeout=20)
    assert first.expires_at is not None
    expires = first.expires_at
    planned = float(scene.state("late")["next_due"])
    sleep_until(planned - 1.0)
    began = time.time()
    end = expires + 14.0
    scene.admin.set_faults({"token": {"error_rate": 1.0, "error_status": 503, "retry_after": 60}})
    sleep_until(end)
    scene.admin.clear_faults()
    end = time.time()
    created = _wait_published(scene, "late", first.version + 1, timeout=30)
    sampler.stop()

    back_after = created - end
    findings.measure("outage", f"{end - began:.1f}s, ending 14 s after expiry")
    findings.measure("new token published after the service answered", f"{back_after:.2f}s")
    findings.check(back_after < 15, f"published {back_after:.2f}s after the outage ended")
    findings.check(back_after < CADENCE * (1 + AFTER_EXPIRY_JITTER) + 3, "slower than the cadence")
    # The tries after expiry, during the outage.
    tries = [at for at, _grant, status in scene.token_requests() if status == 503]
    late = [at for at in tries if at >= expires]
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(late)]
    findings.measure("503 answers", len(tries))
    findings.measure("gaps between tries after expiry", gaps)
    findings.check(len(late) >= 2, f"too few tries after expiry: {late}")
    low = CADENCE * (1 - AFTER_EXPIRY_JITTER) - 0.5
    high = CADENCE * (1 + AFTER_EXPIRY_JITTER) + 1.5
    findings.check(all(low <= g <= high for g in gaps), f"not the {CADENCE:g}s cadence: {gaps}")
    expired = sampler.expired(since=end + 1.0 + CADENCE * (1 + AFTER_EXPIRY_JITTER) + 1.0)
    findings.check(expired == [], f"expired reads long after the return: {first_reads(expired)}")
    retry_after = scene.named("provider.retry_after_overridden")
    findings.measure("Retry-After overridden (log lines)", len(retry_after))
    findings.check(len(retry_after) >= 1, "a Retry-After past the deadline was not overridden")
    findings.done()


def test_a_retry_after_of_ten_minutes_near_a_refresh_does_not_outlast_the_token(
    scenes: SceneMaker,
) -> None:
    """One 503 with `Retry-After: 600`, 1 s before the planned refresh; the service is fine
    again 6 s later, well before expiry: the credential is refreshed before expiry, and apps
    never read an expired token."""
    findings = Findings("Retry-After 600")
    scene = scenes(["patient"], lifetime=30, credential=MARGIN)
    scene.start_daemon()
    sampler = scene.sampler.start(limit=90)
    first = sampler.wait_version("patient", 1, timeout=20)
    assert first.expires_at is not None
    planned = float(scene.state("patient")["next_due"])
    sleep_until(planned - 1.0)
    scene.admin.set_faults({"token": {"error_rate": 1.0, "error_status": 503, "retry_after": 600}})
    time.sleep(6.0)
    scene.admin.clear_faults()
    cleared = time.time()
    created = _wait_published(
        scene, "patient", first.version + 1, timeout=first.expires_at - time.time() + 10
    )
    time.sleep(1.0)
    sampler.stop()
    findings.measure("published after the faults cleared", f"{created - cleared:.2f}s")
    findings.measure("published before expiry", f"{first.expires_at - created:.2f}s")
    findings.check(created < first.expires_at, "the new token came after the old one expired")
    shortened = scene.named("provider.retry_after_shortened")
    findings.check(len(shortened) >= 1, "the Retry-After was not shortened")
    apps_view(findings, sampler)
    no_reuse(findings, scene, "patient")
    findings.done()


def test_a_grant_whose_probe_gets_no_answer_is_published_unverified_before_expiry(
    scenes: SceneMaker,
) -> None:
    """Provoked exactly: the token endpoint is down until past the last planned refresh, and
    every probe connection is dropped. The grant that then succeeds is probed alone three
    times, gets no answer, and is published unverified before the old token expires; once the
    probes are answered again it is verified."""
    findings = Findings("probe without an answer")
    probe = "/v1/projects"
    scene = scenes(["unheard"], lifetime=20, credential={**MARGIN, "probe": probe})
    scene.start_daemon()
    sampler = scene.sampler.start(limit=90)
    sampler.probe = "/v1/users"  # the apps call another route: only keyturn's probe is dropped
    first = sampler.wait_version("unheard", 1, timeout=20)
    assert first.expires_at is not None
    expires = first.expires_at
    deadline = expires - 3.0  # the last planned refresh (margin 3 s)
    time.sleep(0.5)
    scene.admin.set_faults(
        {
            "token": {"outage_seconds": round(deadline + 0.5 - time.time(), 3)},
            "projects": {"error_rate": 1.0, "drop_connection": True},
        }
    )
    left = expires - time.time()
    created = _wait_published(scene, "unheard", first.version + 1, timeout=left + 8)
    unverified = scene.named("credential.published_unverified")
    findings.measure("published before the old token expired", f"{expires - created:.2f}s")
    findings.check(created < expires, "the grant was published after the old token expired")
    findings.check(len(unverified) == 1, f"published_unverified log lines: {unverified}")
    marked = scene.wait_state("unheard", lambda state: "verify_at" in state, timeout=5)
    findings.check("verify_at" in marked, "the record does not mark the token unverified")
    scene.admin.clear_faults()
    sampler.stop()
    apps_view(findings, sampler)
    findings.done()
