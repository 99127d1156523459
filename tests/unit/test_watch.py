"""Detector 1 over FakeVaultStore: out-of-band writes, deletions and foreign metadata."""

from __future__ import annotations

import asyncio

import pytest

from keyturn.clock import FakeClock
from keyturn.errors import VaultUnavailable
from keyturn.events import Event, Suspicious
from keyturn.jobs.job import Outcome
from keyturn.scheduler import JobView
from keyturn.state import CredentialState, TokenRecord
from keyturn.testing.vault import FakeVaultStore
from keyturn.watch import PublishedWatcher, WatchTarget, listed_folders

PATH = "apps/reporting/acme"
OURS = {"managed-by": "keyturn", "credential": "reporting", "writer": "i-1", "expires_at": "x"}


@pytest.fixture
def store() -> FakeVaultStore:
    return FakeVaultStore(clock=FakeClock())


def make(
    store: FakeVaultStore,
    known: dict[str, int],
    response: str = "republish",
    journal: dict[str, int] | None = None,
    in_progress: bool = False,
    targets: list[WatchTarget] | None = None,
    list_page: int = 500,
):
    seen: list[Suspicious] = []
    republished: list[str] = []

    class Jobs:
        """The scheduler's view: the version each job's last run left in its record."""

        def status_of(self, name: str) -> JobView | None:
            if name not in known:
                return None
            state = CredentialState(token=TokenRecord(published_version=known[name]))
            return JobView(name, "oauth_client", None, Outcome("fresh", 0.0, state), False)

    def observer(event: Event) -> None:
        if isinstance(event, Suspicious):
            seen.append(event)

    async def republish(name: str) -> None:
        republished.append(name)

    async def journal_version(name: str) -> tuple[int | None, bool]:
        return (journal if journal is not None else known).get(name), in_progress

    watcher = PublishedWatcher(
        lambda: targets or [WatchTarget("reporting", "acme", PATH)],
        store=store,
        observer=observer,
        jobs=Jobs(),
        journal_version=journal_version,
        republish=republish,
        response=response,  # type: ignore[arg-type]
        interval=300,
        list_page=list_page,
    )
    return watcher, seen, republished


async def ours(store: FakeVaultStore) -> int:
    return await store.write(PATH, {"access_token": "t"}, cas=None, custom_metadata=OURS)


async def test_an_untouched_path_is_quiet(store: FakeVaultStore) -> None:
    version = await ours(store)
    watcher, seen, republished = make(store, {"reporting": version})
    assert await watcher.sweep() == 300
    assert seen == []
    assert republished == []


async def test_a_write_by_someone_else_is_reported_once_and_republished(
    store: FakeVaultStore,
) -> None:
    version = await ours(store)
    store.external_write(PATH, {"access_token": "planted"})
    watcher, seen, republished = make(store, {"reporting": version})
    await watcher.sweep()
    await watcher.sweep()  # same finding: not reported again
    assert len(seen) == 1
    [event] = seen
    assert (event.credential, event.provider, event.detector, event.severity) == (
        "reporting",
        "acme",
        "published_secret_changed",
        "warning",
    )
    assert "version 2 is current; keyturn last wrote 1" in event.detail
    assert republished == ["reporting"]  # once per finding, not on every sweep


async def test_alert_only_leaves_the_value_alone(store: FakeVaultStore) -> None:
    version = await ours(store)
    store.external_write(PATH, {"access_token": "planted"})
    watcher, seen, republished = make(store, {"reporting": version}, response="alert")
    await watcher.sweep()
    assert len(seen) == 1
    assert "response: alert" in seen[0].detail
    assert republished == []


async def test_a_deleted_version_is_critical(store: FakeVaultStore) -> None:
    version = await ours(store)
    store.delete_versions(PATH)
    watcher, seen, _ = make(store, {"reporting": version})
    await watcher.sweep()
    assert seen[0].severity == "critical"
    assert f"version {version} was deleted" in seen[0].detail


async def test_a_destroyed_path_is_reported(store: FakeVaultStore) -> None:
    version = await ours(store)
    await store.delete_all(PATH)
    watcher, seen, _ = make(store, {"reporting": version})
    await watcher.sweep()
    assert "deleted (metadata and all versions)" in seen[0].detail


async def test_foreign_metadata_is_reported(store: FakeVaultStore) -> None:
    version = await store.write(
        PATH, {"access_token": "t"}, cas=None, custom_metadata={"managed-by": "someone"}
    )
    watcher, seen, _ = make(store, {"reporting": version})
    await watcher.sweep()
    assert "custom_metadata no longer says keyturn wrote it" in seen[0].detail


async def test_nothing_is_compared_before_keyturn_published(store: FakeVaultStore) -> None:
    store.external_write(PATH, {"access_token": "not-ours"})
    watcher, seen, _ = make(store, {})
    await watcher.sweep()
    assert seen == []


async def test_a_write_another_keyturn_instance_journaled_is_not_reported(
    store: FakeVaultStore,
) -> None:
    first = await ours(store)
    second = await ours(store)  # another instance refreshed and recorded it in the journal
    watcher, seen, republished = make(store, {"reporting": first}, journal={"reporting": second})
    await watcher.sweep()
    assert seen == []
    assert republished == []


async def test_a_run_in_progress_is_judged_at_the_next_sweep(store: FakeVaultStore) -> None:
    first = await ours(store)
    await ours(store)  # published by a run that has not recorded it in the journal yet
    watcher, seen, _ = make(store, {"reporting": first}, in_progress=True)
    await watcher.sweep()
    assert seen == []


async def test_a_listing_read_before_keyturns_own_publish_is_not_reported(
    store: FakeVaultStore,
) -> None:
    """A folder's page is read, then keyturn publishes and records a newer version before the
    sweep gets to this path: the page is stale, not the path."""
    await ours(store)
    listed = await store.read_metadata(PATH)
    version = await ours(store)  # keyturn's own publish, recorded before this path's turn
    watcher, seen, republished = make(store, {"reporting": version})
    assert await watcher.check(WatchTarget("reporting", "acme", PATH), listed) == []
    assert seen == []
    assert republished == []


async def test_a_path_recreated_below_keyturns_version_is_reported_from_a_listing(
    store: FakeVaultStore,
) -> None:
    """Deleted and written again by someone else, the path starts over at version 1: what a
    fresh read shows, so a listing that shows it too is not taken for a stale one."""
    await ours(store)
    version = await ours(store)
    await store.delete_all(PATH)
    store.external_write(PATH, {"access_token": "planted"})
    listed = await store.read_metadata(PATH)
    watcher, seen, republished = make(store, {"reporting": version})
    found = await watcher.check(WatchTarget("reporting", "acme", PATH), listed)
    assert found == [
        f"version 1 is current; keyturn last wrote {version}",
        "custom_metadata no longer says keyturn wrote it",
    ]
    assert len(seen) == 1
    assert republished == ["reporting"]


async def test_a_sweep_reads_a_few_paths_at_a_time_and_checks_every_one() -> None:
    class CountingStore(FakeVaultStore):
        """Counts the metadata reads in flight at once (each yields to the loop once)."""

        def __init__(self) -> None:
            super().__init__(clock=FakeClock())
            self.in_flight = self.most = 0
            self.read_paths: list[str] = []

        async def read_metadata(self, path: str, *, consistent: bool = False):  # type: ignore[no-untyped-def]
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            await asyncio.sleep(0)
            self.read_paths.append(path)
            try:
                return await super().read_metadata(path, consistent=consistent)
            finally:
                self.in_flight -= 1

    store = CountingStore()
    names = [f"c{i}" for i in range(10)]
    known = {}
    for name in names:
        known[name] = await store.write(
            f"apps/{name}/acme",
            {"access_token": "t"},
            cas=None,
            custom_metadata={**OURS, "credential": name},
        )

    class Jobs:
        def status_of(self, name: str) -> JobView | None:
            state = CredentialState(token=TokenRecord(published_version=known[name]))
            return JobView(name, "oauth_client", None, Outcome("fresh", 0.0, state), False)

    seen: list[Event] = []

    async def journal_version(name: str) -> tuple[int | None, bool]:
        return known[name], False

    async def republish(name: str) -> None:
        raise AssertionError("nothing was changed")

    watcher = PublishedWatcher(
        lambda: [WatchTarget(name, "acme", f"apps/{name}/acme") for name in names],
        store=store,
        observer=seen.append,
        jobs=Jobs(),
        journal_version=journal_version,
        republish=republish,
        response="republish",
        interval=300,
        concurrency=3,
    )
    assert await watcher.sweep() == 300
    assert store.most == 3
    assert sorted(store.read_paths) == sorted(f"apps/{name}/acme" for name in names)
    assert not [e for e in seen if isinstance(e, Suspicious)]


# -- one folder, many published paths: listed, not read one by one -----------------------------


async def billing_folder(store: FakeVaultStore, count: int) -> tuple[list[WatchTarget], dict]:
    """`count` credentials published in apps/billing/, and a foreign secret after them."""
    targets, known = [], {}
    for i in range(count):
        name = f"c{i:02}"
        path = f"apps/billing/{name}"
        metadata = {**OURS, "credential": name}
        known[name] = await store.write(
            path, {"access_token": "t"}, cas=None, custom_metadata=metadata
        )
        targets.append(WatchTarget(name, "acme", path))
    store.external_write("apps/billing/zz-not-keyturn", {"x": "y"})
    return targets, known


def calls(store: FakeVaultStore) -> list[tuple[str, str]]:
    return [(kind, path) for kind, path, _ in store.reads]


async def test_a_folder_of_published_paths_is_listed_in_pages_not_read_path_by_path(
    store: FakeVaultStore,
) -> None:
    targets, known = await billing_folder(store, 12)
    store.external_write("apps/billing/c03", {"access_token": "planted"})
    await store.delete_all("apps/billing/c07")
    watcher, seen, republished = make(store, known, targets=targets, list_page=5)
    store.reads.clear()
    await watcher.sweep()
    # 11 paths left in 12 names: pages of 5, 5 and the rest; c07, missing from the listing,
    # is read to be sure it is gone; the foreign key past c11 ends the listing.
    assert calls(store) == [
        ("list_metadata", "apps/billing"),
        ("list_metadata", "apps/billing"),
        ("list_metadata", "apps/billing"),
        ("read_metadata", "apps/billing/c07"),
    ]
    assert all(consistent for _, _, consistent in store.reads)
    assert {(e.credential, e.severity) for e in seen} == {("c03", "warning"), ("c07", "critical")}
    assert "version 2 is current; keyturn last wrote 1" in next(
        e.detail for e in seen if e.credential == "c03"
    )
    assert "deleted" in next(e.detail for e in seen if e.credential == "c07")
    assert sorted(republished) == ["c03", "c07"]


async def test_without_detailed_listing_every_path_is_read(store: FakeVaultStore) -> None:
    targets, known = await billing_folder(store, 6)
    store.external_write("apps/billing/c02", {"access_token": "planted"})
    store.detailed_listing = False  # HashiCorp Vault: the LIST answers 404
    watcher, seen, _ = make(store, known, targets=targets)
    store.reads.clear()
    await watcher.sweep()
    assert calls(store) == [("list_metadata", "apps/billing")] + [
        ("read_metadata", f"apps/billing/c{i:02}") for i in range(6)
    ]
    assert [e.credential for e in seen] == ["c02"]


async def test_a_folder_the_policy_will_not_list_is_read_and_not_listed_again(
    store: FakeVaultStore,
) -> None:
    targets, known = await billing_folder(store, 3)
    limited = store.with_policy(
        {"secret/data/apps/*": ["read"], "secret/metadata/apps/*": ["read"]}
    )
    watcher, seen, _ = make(limited, known, targets=targets)
    await watcher.sweep()
    await watcher.sweep()
    reads = [kind for kind, _ in calls(limited)]
    assert reads.count("list_metadata") == 1  # refused once: not asked again
    assert reads.count("read_metadata") == 6  # every path, in each sweep
    assert seen == []


def test_only_folders_holding_two_published_paths_or_more_are_listed() -> None:
    assert listed_folders(["apps/a/x", "apps/a/y", "apps/b/z", "top"]) == {
        "apps/a": ["apps/a/x", "apps/a/y"]
    }


async def test_a_listing_vault_fails_is_made_up_by_reading_each_path(store: FakeVaultStore) -> None:
    targets, known = await billing_folder(store, 3)
    store.external_write("apps/billing/c01", {"access_token": "planted"})
    watcher, seen, _ = make(store, known, targets=targets)
    store.reads.clear()
    store.fail_next(VaultUnavailable("vault list metadata: HTTP 503, vault unavailable"))
    await watcher.sweep()
    assert [kind for kind, _ in calls(store)] == ["read_metadata"] * 3  # the failed LIST: none
    assert [e.credential for e in seen] == ["c01"]
    store.reads.clear()
    await watcher.sweep()  # a failure, unlike a refusal, does not stop the next sweep listing
    assert [kind for kind, _ in calls(store)] == ["list_metadata"]
