"""Three keyturn instances share one deployment on a 3-node OpenBao cluster on Raft storage.

Each instance is a real `keyturn run` with its own `instance_id` (k0, k1, k2), pointed at its
own node (`[vault] address`) and told the other two (`nodes`); they run the same keyturn.toml
(`keyturn_devkit.harness.instances`). Meanwhile apps read every published path through a
standby node and call the sandbox with what they read (`AppSampler`).

0. Start the three at once, with 10-second tokens: no app reads an expired token (the first
   instance up owns everything until the others have joined, then hands most of it over).
1. SIGKILL one instance: every credential it published last is published again by another
   instance within takeover_after plus one refresh window; no app reads an expired token, and
   no refresh token is presented twice (the sandbox revokes a token family on reuse). With
   the default takeover_after and refresh policy and 30-second tokens, the instances beat to
   the takeover the tokens need (5 s) and SIGKILL costs no expired read either.
2. Stop the Raft leader: after the election keyturn goes on publishing; no app reads an
   expired token; every private record still holds a refresh token, the one the sandbox has
   active, of the same family as before.
3. A rolling restart (SIGTERM one instance, wait for its exit, start it again with the same id,
   the next one): no app reads an expired token, and the sandbox sees no token request at all,
   every token being valid for longer than the restart takes.

The figures (takeover time per credential, election time, app reads) are printed (run with
-s); the only time asserted is the takeover bound.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from keyturn.clock import parse_rfc3339
from keyturn.members import owner
from keyturn_devkit.dev.raft import OpenBaoRaftCluster
from keyturn_devkit.dev.sandbox import SandboxProcess
from keyturn_devkit.harness.apps import AppSampler
from keyturn_devkit.harness.deployment import Deployment, prepare_deployment
from keyturn_devkit.harness.faketime import FakeWallClock
from keyturn_devkit.harness.instances import Instances, read_published, read_record

pytestmark = [pytest.mark.openbao, pytest.mark.slow, pytest.mark.sandbox]

CREDENTIALS = [f"c{i}" for i in range(6)]
# Rendezvous hashing (keyturn.members.owner) gives each of these ids a share of these names:
# k0 {c2}, k1 {c0, c1, c4}, k2 {c3, c5}.
INSTANCE_IDS = ["k0", "k1", "k2"]
TAKEOVER_AFTER = 3.0

# Every refresh 0.3 ± 0.1 of the lifetime after the issue, so a token has at least 0.6 of
# its lifetime left when due: more than a takeover needs (takeover_after, and up to one beat,
# takeover_after / 3, to notice) for lifetimes from 10 s. Several cycles per test.
REFRESH = {"at": 0.3, "jitter": 0.1, "margin": "2s", "min_interval": "500ms"}
# Test 0: 10-second tokens, shorter than a lease taken on a first run (one step: the
# provider's timeout, 3 s here, plus keyturn.jobs.build.LEASE_SLACK, 10 s).
START_LIFETIME = 10
# Tests 1 and 2: 20-second tokens, and the event comes once the start is over (every
# instance joined, every first-run lease ended, every credential refreshed by its owner).
LIFETIME = 20
REFRESH_WINDOW = (0.3 + 0.1) * LIFETIME  # the longest time from a publish to the next
SETTLED = 2 * REFRESH_WINDOW
# Test 3: 120-second tokens with the default refresh point (0.66 ± 0.1): none is due before
# 67 s after its issue, longer than starting the fleet and restarting it take.
LONG_LIFETIME = 120
LONG_REFRESH = {"margin": "5s", "min_interval": "500ms"}
EARLIEST_LONG_REFRESH = (0.66 - 0.1) * LONG_LIFETIME
BACKOFF = {"initial": "200ms", "max": "1s"}
# Test 4: how far k2's wall clock runs ahead of everyone's.
SKEW = 5.0
# Test 1b: 30-second tokens under the default refresh policy (margin 60 s: the latest refresh
# is at the midpoint, 15 s before expiry) and the default takeover_after (30 s): the tokens
# need a takeover within a third of those 15 s.
DEFAULT_LIFETIME = 30
NEEDED_TAKEOVER = 5.0


def sandbox_for(tmp_path: Path, lifetime: int) -> SandboxProcess:
    return SandboxProcess(config={"access_token_lifetime": lifetime}, workdir=tmp_path / "sb")


@pytest.fixture
def sandbox_start(tmp_path: Path) -> Iterator[SandboxProcess]:
    with sandbox_for(tmp_path, START_LIFETIME) as sandbox:
        yield sandbox


@pytest.fixture
def sandbox_short(tmp_path: Path) -> Iterator[SandboxProcess]:
    with sandbox_for(tmp_path, LIFETIME) as sandbox:
        yield sandbox


@pytest.fixture
def sandbox_default(tmp_path: Path) -> Iterator[SandboxProcess]:
    with sandbox_for(tmp_path, DEFAULT_LIFETIME) as sandbox:
        yield sandbox


@pytest.fixture
def sandbox_long(tmp_path: Path) -> Iterator[SandboxProcess]:
    with sandbox_for(tmp_path, LONG_LIFETIME) as sandbox:
        yield sandbox


def deploy(
    cluster: OpenBaoRaftCluster,
    sandbox: SandboxProcess,
    workdir: Path,
    refresh: dict[str, Any] | None,
    takeover_after: float | None = TAKEOVER_AFTER,
) -> Deployment:
    """Six credentials under a namespace of their own (their own `_members` record too).
    `refresh` None and `takeover_after` None leave keyturn's defaults."""
    keyturn = {} if takeover_after is None else {"takeover_after": f"{takeover_after:g}s"}
    credential = {"backoff": BACKOFF} | ({} if refresh is None else {"refresh": refresh})
    return prepare_deployment(
        cluster,  # type: ignore[arg-type]  # stands in for a dev server: address, root_token
        sandbox,
        workdir,
        CREDENTIALS,
        namespace=f"i{uuid.uuid4().hex[:8]}",
        keyturn=keyturn,
        credential=credential,
    )


def apps_for(
    cluster: OpenBaoRaftCluster, sandbox: SandboxProcess, deployment: Deployment
) -> AppSampler:
    """Apps reading through a standby node (the leader in test 2 is another node)."""
    node = cluster.standbys()[0]
    return AppSampler(
        node.address, cluster.root_token, sandbox.base_url, deployment.publish_to, interval=0.25
    )


def wait_all_published(apps: AppSampler) -> None:
    for name in CREDENTIALS:
        apps.wait_version(name, 1, timeout=30)


def published_after(
    cluster: OpenBaoRaftCluster,
    deployment: Deployment,
    names: Sequence[str],
    moment: float,
    timeout: float,
) -> dict[str, float]:
    """Seconds from `moment` to the first version of each of `names` that Vault created after
    it (read from the published paths' metadata until every name has one, bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = read_published(cluster.leader().address, cluster.root_token, deployment.publish_to)
        firsts = {name: seen[name].first_after(moment) for name in names if name in seen}
        found = {name: at - moment for name, at in firsts.items() if at is not None}
        if len(found) == len(names):
            return found
        if time.monotonic() >= deadline:
            missing = sorted(set(names) - set(found))
            pytest.fail(f"not published again within {timeout:g}s: {missing}")
        time.sleep(0.2)


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def tokens_of(sandbox: SandboxProcess, deployment: Deployment) -> dict[str, list[dict[str, Any]]]:
    return {
        name: sandbox.admin.list_tokens(client["client_id"])
        for name, client in deployment.clients.items()
    }


def revoked_families(tokens: dict[str, list[dict[str, Any]]]) -> dict[str, set[tuple[str, str]]]:
    """Per credential, the families the sandbox revoked and why."""
    revoked = {
        name: {
            (t["family_id"], str(t["revoke_reason"])) for t in issued if t["status"] == "revoked"
        }
        for name, issued in tokens.items()
    }
    return {name: found for name, found in revoked.items() if found}


def families(issued: list[dict[str, Any]]) -> set[str]:
    return {t["family_id"] for t in issued}


def used_after(issued: list[dict[str, Any]], moment: float) -> int:
    """How many refresh tokens were exchanged after `moment`."""
    return sum(
        t["kind"] == "refresh" and t["used_at"] is not None and parse_rfc3339(t["used_at"]) > moment
        for t in issued
    )


def token_requests(sandbox: SandboxProcess, deployment: Deployment) -> dict[str, int]:
    """Per credential, the requests the sandbox authenticated the client for: token
    requests (any grant) and revocations (`usage.request_count` counts the apps' calls too)."""
    return {
        name: int(sandbox.admin.get_oauth_app(client["client_id"])["usage"]["oauth_requests"])
        for name, client in deployment.clients.items()
    }


def refresh_token_reuses(sandbox: SandboxProcess, deployment: Deployment) -> int:
    return sum(
        int(sandbox.admin.get_oauth_app(client["client_id"])["usage"]["refresh_token_reuses"])
        for client in deployment.clients.values()
    )


def print_apps(what: str, apps: AppSampler) -> None:
    print(f"{what}: apps {apps.summary()}")
    for read in [*apps.expired(), *apps.refused()][:10]:
        print(f"  {read}")


# -- 0. three instances start at once ------------------------------------------------------


def test_instances_started_together_serve_every_app(
    healthy_cluster: OpenBaoRaftCluster, sandbox_start: SandboxProcess, tmp_path: Path
) -> None:
    """The three start side by side: the first one up owns every credential and runs its
    first refreshes, the others join and take their shares. No app reads an expired token,
    even when the tokens live shorter than a first run's lease."""
    cluster = healthy_cluster
    deployment = deploy(cluster, sandbox_start, tmp_path, REFRESH)
    fleet = Instances(deployment.config_path, tmp_path, INSTANCE_IDS, cluster.addresses)
    apps = apps_for(cluster, sandbox_start, deployment)
    fleet.start()
    try:
        apps.start(limit=90)
        wait_all_published(apps)
        time.sleep(2 * START_LIFETIME)
        config = str(deployment.config_path)
        listed = subprocess.run(
            [sys.executable, "-m", "keyturn", "status", "-c", config, "--instances", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        apps.stop()
        codes = fleet.stop()
    published = read_published(cluster.leader().address, cluster.root_token, deployment.publish_to)
    tokens = tokens_of(sandbox_start, deployment)
    started = {
        i: [e.get("instances") for e in fleet[i].events("daemon.started")] for i in fleet.ids
    }
    print(
        f"\nstarted together (members each saw at start: {started}); versions "
        + ", ".join(f"{n} v{p.version} by {p.writer}" for n, p in sorted(published.items()))
        + "; longest time between two publishes: "
        + ", ".join(f"{n} {p.longest_gap():.1f}s" for n, p in sorted(published.items()))
    )
    print_apps("started together", apps)
    print(f"keyturn status --instances --json:\n{listed.stdout}")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    # Every instance live, each running the share rendezvous hashing gives it.
    assert {(r["instance"], r["live"], r["credentials"]) for r in rows} == {
        ("k0", True, 1),
        ("k1", True, 3),
        ("k2", True, 2),
    }
    assert codes == dict.fromkeys(INSTANCE_IDS, 0)
    assert apps.expired() == [] and apps.refused() == []
    assert refresh_token_reuses(sandbox_start, deployment) == 0
    assert revoked_families(tokens) == {}
    # One grant per credential although three instances found no record at start: a
    # client_credentials grant goes out only under the lease, so no family is left unheld.
    assert {name: len(families(issued)) for name, issued in tokens.items()} == dict.fromkeys(
        CREDENTIALS, 1
    )
    assert all(p.version >= 3 for p in published.values()), published  # several cycles


# -- 1. an instance is killed --------------------------------------------------------------


def test_a_killed_instances_credentials_are_taken_over(
    healthy_cluster: OpenBaoRaftCluster, sandbox_short: SandboxProcess, tmp_path: Path
) -> None:
    """SIGKILL the instance that published the most credentials last (it cannot leave the
    members record): another instance publishes each of them again within takeover_after plus
    one refresh window, measured from the kill to the version's `created_time` in Vault."""
    cluster = healthy_cluster
    deployment = deploy(cluster, sandbox_short, tmp_path, REFRESH)
    fleet = Instances(deployment.config_path, tmp_path, INSTANCE_IDS, cluster.addresses)
    apps = apps_for(cluster, sandbox_short, deployment)
    fleet.start()
    try:
        apps.start(limit=90)
        wait_all_published(apps)
        time.sleep(SETTLED)
        before = read_published(cluster.leader().address, cluster.root_token, deployment.publish_to)
        writers = Counter(p.writer for p in before.values() if p.writer in INSTANCE_IDS)
        victim = min(writers, key=lambda writer: (-writers[writer], writer))
        owned = sorted(name for name, p in before.items() if p.writer == victim)
        killed_at = time.time()
        fleet[victim].stop(signal.SIGKILL)
        bound = TAKEOVER_AFTER + REFRESH_WINDOW
        takeover = published_after(cluster, deployment, owned, killed_at, timeout=bound + 20)
        sleep_until(killed_at + bound)  # apps go on reading until the bound
    finally:
        apps.stop()
        codes = fleet.stop()
    after = read_published(cluster.leader().address, cluster.root_token, deployment.publish_to)
    tokens = tokens_of(sandbox_short, deployment)
    reuses = refresh_token_reuses(sandbox_short, deployment)
    revoked = revoked_families(tokens)
    survivors = [i for i in INSTANCE_IDS if i != victim]
    gone = {i: [e.get("instance") for e in fleet[i].events("members.gone")] for i in survivors}
    print(
        f"\nkilled {victim}, which had published {owned} last (writers {dict(writers)}); "
        f"takeover after the kill: "
        + ", ".join(f"{name} {seconds:.2f}s" for name, seconds in sorted(takeover.items()))
        + f" (bound {bound:g}s); writers now {Counter(p.writer for p in after.values())}"
    )
    print_apps("after a SIGKILL", apps)
    print(
        f"refresh tokens presented twice: {reuses}; families revoked: {revoked}; "
        f"members.gone logged by the survivors: {gone}; exit codes {codes}"
    )
    assert codes == dict.fromkeys(survivors, 0)
    assert apps.expired() == [] and apps.refused() == []
    assert reuses == 0
    assert not any(reason == "refresh token reuse" for f in revoked.values() for _, reason in f)
    assert all(after[name].writer in survivors for name in owned), after
    assert all(seconds <= bound for seconds in takeover.values()), takeover


def advertised_takeovers(cluster: OpenBaoRaftCluster, deployment: Deployment) -> dict[str, Any]:
    """The takeover each instance's entry in the `_members` record advertises (None: none)."""
    record = read_record(
        cluster.leader().address, cluster.root_token, f"{deployment.state_prefix}/_members"
    )
    return {name: json.loads(entry).get("takeover") for name, entry in record.items()}


def test_the_default_takeover_keeps_up_with_30_second_tokens(
    healthy_cluster: OpenBaoRaftCluster, sandbox_default: SandboxProcess, tmp_path: Path
) -> None:
    """Nothing about takeovers configured: takeover_after and the refresh policy are the
    defaults, the tokens live 30 s. Each instance derives from its tokens the takeover they
    need (5 s: a third of the 15 s left after the latest planned refresh) and all three beat to
    it. SIGKILL the instance that owns the most credentials: its credentials are published
    again by the survivors, and over a whole token lifetime after the kill (plus 10 s) no app
    reads an expired token; `keyturn check` says that takeover_after is a cap."""
    cluster = healthy_cluster
    deployment = deploy(cluster, sandbox_default, tmp_path, refresh=None, takeover_after=None)
    fleet = Instances(deployment.config_path, tmp_path, INSTANCE_IDS, cluster.addresses)
    apps = apps_for(cluster, sandbox_default, deployment)
    began = time.monotonic()
    fleet.start()
    try:
        apps.start(limit=90)
        wait_all_published(apps)
        # Settled: every instance has run its share and beats to the takeover its tokens need
        # (at its second beat, 10 s after its start at the default cadence); then on.
        deadline = time.monotonic() + 25
        advertised = advertised_takeovers(cluster, deployment)
        while time.monotonic() < deadline and not (
            set(advertised) == set(INSTANCE_IDS)
            and all(t is not None and t <= NEEDED_TAKEOVER for t in advertised.values())
        ):
            time.sleep(0.25)
            advertised = advertised_takeovers(cluster, deployment)
        shares = Counter(owner(name, INSTANCE_IDS) for name in CREDENTIALS)
        victim = min(shares, key=lambda instance: (-shares[instance], instance))
        owned = sorted(name for name in CREDENTIALS if owner(name, INSTANCE_IDS) == victim)
        killed_at, settled_after = time.time(), time.monotonic() - began
        fleet[victim].stop(signal.SIGKILL)
        horizon = DEFAULT_LIFETIME + 10
        takeover = published_after(cluster, deployment, owned, killed_at, timeout=horizon)
        sleep_until(killed_at + horizon)  # apps go on reading a whole token lifetime and more
        check = subprocess.run(
            [sys.executable, "-m", "keyturn", "check", "-c", str(deployment.config_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        apps.stop()
        codes = fleet.stop()
    after = read_published(cluster.leader().address, cluster.root_token, deployment.publish_to)
    survivors = [i for i in INSTANCE_IDS if i != victim]
    print(
        f"\ndefault takeover: advertised {advertised} {settled_after:.1f}s after the start; "
        f"killed {victim}, which owned {owned}; published again after the kill: "
        + ", ".join(f"{name} {seconds:.2f}s" for name, seconds in sorted(takeover.items()))
        + f"; writers now {Counter(p.writer for p in after.values())}; exit codes {codes}; "
        f"the whole test {time.monotonic() - began:.1f}s"
    )
    print_apps("default takeover, after a SIGKILL", apps)
    print(f"keyturn check:\n{check.stdout}{check.stderr}")
    assert apps.expired() == [] and apps.refused() == []
    assert owned and all(after[name].writer in survivors for name in owned), after
    assert codes == dict.fromkeys(survivors, 0)
    assert advertised == dict.fromkeys(INSTANCE_IDS, pytest.approx(NEEDED_TAKEOVER, abs=0.5))
    assert refresh_token_reuses(sandbox_default, deployment) == 0
    assert check.returncode == 0, check.stderr
    assert "keyturn.takeover_after: 30s is a cap" in check.stdout
    # The tokens' own issued_at and expires_at set the figure: about NEEDED_TAKEOVER / 3.
    beat = re.search(r"beat every (\d+\.\d)s instead of every 10\.0s", check.stdout)
    assert beat, check.stdout
    assert float(beat.group(1)) == pytest.approx(NEEDED_TAKEOVER / 3, abs=0.2)


# -- 2. the Raft leader stops --------------------------------------------------------------


def test_keyturn_goes_on_when_the_raft_leader_stops(
    healthy_cluster: OpenBaoRaftCluster, sandbox_short: SandboxProcess, tmp_path: Path
) -> None:
    """The active node stops (and stays down until the end): after the election every
    credential is refreshed and published again, from the refresh token its record holds."""
    cluster = healthy_cluster
    deployment = deploy(cluster, sandbox_short, tmp_path, REFRESH)
    fleet = Instances(deployment.config_path, tmp_path, INSTANCE_IDS, cluster.addresses)
    apps = apps_for(cluster, sandbox_short, deployment)
    old_leader = cluster.leader()
    try:
        fleet.start()
        try:
            apps.start(limit=90)
            wait_all_published(apps)
            time.sleep(SETTLED)
            families_before = {
                n: families(t) for n, t in tokens_of(sandbox_short, deployment).items()
            }
            stopped_at = time.time()
            cluster.stop_node(old_leader.index)
            new_leader = cluster.wait_for_leader(timeout=60)
            elected_at = time.time()
            refreshed = published_after(
                cluster, deployment, CREDENTIALS, elected_at, timeout=REFRESH_WINDOW + 30
            )
            sleep_until(elected_at + REFRESH_WINDOW)  # apps go on reading a cycle
            # A refresh whose token request came before the election and whose write waited
            # for it publishes after it; the next one of that credential may come up to a
            # window later: wait for it (the promise: refreshing goes on from the record).
            deadline = elected_at + 2 * REFRESH_WINDOW + 2
            while time.time() < deadline and any(
                used_after(issued, elected_at) < 1
                for issued in tokens_of(sandbox_short, deployment).values()
            ):
                time.sleep(0.5)
        finally:
            apps.stop()
            codes = fleet.stop()
        records = {
            name: read_record(
                new_leader.address, cluster.root_token, f"{deployment.state_prefix}/{name}"
            )
            for name in CREDENTIALS
        }
        published = read_published(new_leader.address, cluster.root_token, deployment.publish_to)
    finally:
        if not old_leader.running:
            cluster.start_node(old_leader.index)
    tokens = tokens_of(sandbox_short, deployment)
    held = {
        name: sandbox_short.admin.introspect_token(record["refresh_token"])
        for name, record in records.items()
        if record.get("refresh_token")
    }
    paused = {
        name: (path.first_after(stopped_at) or math.inf) - stopped_at
        for name, path in published.items()
    }
    used_after_election = {name: used_after(issued, elected_at) for name, issued in tokens.items()}
    print(
        f"\nstopped the active node {old_leader.node_id}; {new_leader.node_id} active after "
        f"{elected_at - stopped_at:.2f}s; first publish after the election: "
        + ", ".join(f"{name} +{seconds:.2f}s" for name, seconds in sorted(refreshed.items()))
    )
    print_apps("across the election", apps)
    print(
        "from the stop to the next publish: "
        + ", ".join(f"{n} {seconds:.2f}s" for n, seconds in sorted(paused.items()))
        + f"; refresh tokens used after the election: {used_after_election}; exit codes {codes}"
    )
    assert codes == dict.fromkeys(INSTANCE_IDS, 0)
    assert apps.expired() == [] and apps.refused() == []
    assert revoked_families(tokens) == {}
    # An election is not a credential failure: the calls went to the new active node.
    assert {i: fleet[i].events("credential.failed") for i in INSTANCE_IDS} == {
        i: [] for i in INSTANCE_IDS
    }
    for name in CREDENTIALS:
        # Nothing lost: the record holds a refresh token, none is in flight, and it is the one
        # the sandbox has active, of the family the credential had before the election.
        assert "refresh_in_flight" not in records[name], name
        assert name in held, f"{name}: no refresh token in the record"
        assert held[name]["active"] is True, (name, held[name].get("status"))
        assert families(tokens[name]) == families_before[name] == {held[name]["family_id"]}
        assert used_after_election[name] >= 1, name


# -- 3. a rolling restart ------------------------------------------------------------------


def test_a_rolling_restart_asks_for_no_token(
    healthy_cluster: OpenBaoRaftCluster, sandbox_long: SandboxProcess, tmp_path: Path
) -> None:
    """Each instance in turn: SIGTERM, its exit, a start with the same id, daemon.started.
    Every token stays valid throughout, so the sandbox must see no request at all."""
    cluster = healthy_cluster
    deployment = deploy(cluster, sandbox_long, tmp_path, LONG_REFRESH)
    fleet = Instances(deployment.config_path, tmp_path, INSTANCE_IDS, cluster.addresses)
    apps = apps_for(cluster, sandbox_long, deployment)
    restarts: list[tuple[str, int, float]] = []
    fleet.start()
    try:
        apps.start(limit=90)
        wait_all_published(apps)
        time.sleep(2 * TAKEOVER_AFTER)  # every instance has joined and planned its share
        tokens_before = tokens_of(sandbox_long, deployment)
        requests_before = token_requests(sandbox_long, deployment)
        began = time.time()
        for instance in fleet:
            started = time.monotonic()
            code = instance.stop(signal.SIGTERM)
            instance.start()
            restarts.append((instance.instance_id, code, time.monotonic() - started))
        time.sleep(2 * TAKEOVER_AFTER)  # the shares settle; restarted instances plan theirs
        ended = time.time()
        requests_after = token_requests(sandbox_long, deployment)
    finally:
        apps.stop()
        codes = fleet.stop()
    tokens = tokens_of(sandbox_long, deployment)
    first_issue = min(parse_rfc3339(t["issued_at"]) for ts in tokens.values() for t in ts)
    started_logged = {i: len(fleet[i].events("daemon.started")) for i in INSTANCE_IDS}
    print(
        "\nrolling restart: "
        + ", ".join(f"{i} exit {code} back in {seconds:.2f}s" for i, code, seconds in restarts)
        + f"; window {ended - began:.1f}s; token requests before {requests_before}, "
        f"after {requests_after}; daemon.started logged {started_logged}"
    )
    print_apps("through a rolling restart", apps)
    if ended >= first_issue + EARLIEST_LONG_REFRESH:
        pytest.fail("the restart window reached the first refresh time: nothing to judge")
    assert [code for _, code, _ in restarts] == [0, 0, 0]
    assert codes == dict.fromkeys(INSTANCE_IDS, 0)
    assert started_logged == dict.fromkeys(INSTANCE_IDS, 2)
    assert apps.expired() == [] and apps.refused() == []
    assert requests_after == requests_before
    assert {n: len(t) for n, t in tokens.items()} == {n: len(t) for n, t in tokens_before.items()}
    assert revoked_families(tokens) == {}


# -- bad input: a shared instance_id, a skewed clock ------------------------------------------


def test_a_second_process_with_the_same_instance_id_stands_down_until_the_first_is_gone(
    healthy_cluster: OpenBaoRaftCluster, sandbox_short: SandboxProcess, tmp_path: Path
) -> None:
    """k0 and k1 run; a second process is started as k0 too. It sees k0's entry move, says so
    (`members.duplicate_instance_id`) and owns nothing; when the first k0 stops, it takes the
    id back and runs k0's share. Apps are served throughout."""
    cluster = healthy_cluster
    deployment = deploy(cluster, sandbox_short, tmp_path, REFRESH)
    fleet = Instances(deployment.config_path, tmp_path / "fleet", ["k0", "k1"], cluster.addresses)
    third_node_first = [*cluster.addresses[2:], *cluster.addresses[:2]]
    namesake = Instances(deployment.config_path, tmp_path / "namesake", ["k0"], third_node_first)
    apps = apps_for(cluster, sandbox_short, deployment)
    fleet.start()
    try:
        apps.start(limit=90)
        wait_all_published(apps)
        namesake.start()
        time.sleep(REFRESH_WINDOW)
        fleet["k0"].stop(signal.SIGTERM)  # the elder leaves: the namesake may have the id
        resumed_by = time.monotonic() + 2 * TAKEOVER_AFTER
        while not namesake["k0"].events("members.resumed") and time.monotonic() < resumed_by:
            time.sleep(0.2)
        time.sleep(LIFETIME)  # a whole token lifetime run by the namesake and k1
    finally:
        apps.stop()
        codes = {**fleet.stop(), **{f"namesake-{k}": c for k, c in namesake.stop().items()}}
    started = namesake["k0"].events("daemon.started")
    duplicate = namesake["k0"].events("members.duplicate_instance_id")
    resumed = namesake["k0"].events("members.resumed")
    after = read_published(cluster.leader().address, cluster.root_token, deployment.publish_to)
    reuses = refresh_token_reuses(sandbox_short, deployment)
    print(
        f"\nnamesake k0: started owning {[e.get('owned') for e in started]}, reported "
        f"{len(duplicate)} time(s), resumed {len(resumed)} time(s); writers now "
        f"{Counter(p.writer for p in after.values())}; refresh tokens presented twice: {reuses}"
    )
    print_apps("with a namesake", apps)
    assert codes == {"k1": 0, "namesake-k0": 0}
    assert [e.get("owned") for e in started] == [0]
    assert duplicate and all(e.get("instance") == "k0" for e in duplicate)
    assert len(resumed) == 1
    assert apps.expired() == [] and apps.refused() == []
    assert reuses == 0 and revoked_families(tokens_of(sandbox_short, deployment)) == {}
    assert {p.writer for p in after.values()} <= {"k0", "k1"}


def test_an_instance_whose_clock_is_off_is_named_and_serves_its_share(
    healthy_cluster: OpenBaoRaftCluster, sandbox_short: SandboxProcess, tmp_path: Path
) -> None:
    """k2's wall clock runs 5 s ahead of everyone's (libfaketime, its process alone): it
    warns `members.clock_skew` naming itself with the skew it measured against Vault's clock,
    and the three still serve every app; when k2 is killed, its share is taken over in time
    (liveness is judged on each instance's own monotonic clock, not k2's wall clock)."""
    cluster = healthy_cluster
    deployment = deploy(cluster, sandbox_short, tmp_path, REFRESH)
    ahead = FakeWallClock(tmp_path / "faketime")
    ahead.step(SKEW)
    nodes, skewed = cluster.addresses, {"k2": ahead.env()}
    fleet = Instances(deployment.config_path, tmp_path, INSTANCE_IDS, nodes, env_of=skewed)
    apps = apps_for(cluster, sandbox_short, deployment)
    fleet.start()
    try:
        apps.start(limit=90)
        wait_all_published(apps)
        time.sleep(SETTLED)
        before = read_published(cluster.leader().address, cluster.root_token, deployment.publish_to)
        owned = sorted(name for name, p in before.items() if p.writer == "k2")
        killed_at = time.time()
        fleet["k2"].stop(signal.SIGKILL)
        # k2 dated each next refresh by its own clock, SKEW ahead (and its tokens' expiry the
        # same way): a survivor runs a taken-over credential when k2's record says, so the
        # bound is a takeover and a refresh window plus the skew. No app reading an expired or
        # refused token, below, is the promise.
        bound = TAKEOVER_AFTER + REFRESH_WINDOW + SKEW
        takeover = published_after(cluster, deployment, owned, killed_at, timeout=bound + 20)
    finally:
        apps.stop()
        codes = fleet.stop()
    skew = fleet["k2"].events("members.clock_skew")
    others = [e for i in ("k0", "k1") for e in fleet[i].events("members.clock_skew")]
    print(
        f"\nk2 5 s ahead: warned {[(e.get('instance'), e.get('skew_seconds')) for e in skew]}; "
        f"k2 had published {owned}; takeover after its kill: "
        + ", ".join(f"{name} {seconds:.2f}s" for name, seconds in sorted(takeover.items()))
    )
    print_apps("with a skewed clock", apps)
    assert codes == {"k0": 0, "k1": 0}
    assert skew and all(e.get("instance") == "k2" for e in skew)
    assert 4.0 <= float(skew[0]["skew_seconds"]) <= 6.0
    assert others == []
    assert owned, "k2 owned a share: {c3, c5} by rendezvous"
    assert all(seconds <= bound for seconds in takeover.values()), takeover
    assert apps.expired() == [] and apps.refused() == []
    assert refresh_token_reuses(sandbox_short, deployment) == 0
