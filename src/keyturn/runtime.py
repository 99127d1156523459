"""Wires a `Config` into live parts: the Vault store, what every job shares (`JobDeps`), and
the jobs (see `keyturn.kinds.build_jobs`). Every command that touches Vault or the service
(run, refresh, rotate, import-key, import-refresh-token) opens a `Runtime`, so they all see the
same layout and rules.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace

from keyturn.clock import Clock, SystemClock
from keyturn.config import Config
from keyturn.errors import KeyturnError
from keyturn.events import LoggingObserver, Observer, Observers
from keyturn.jobs.build import JobSet, lease_seconds
from keyturn.jobs.job import CredentialJob, JobDeps
from keyturn.jobs.rotation import KeyRotation
from keyturn.kinds import build_jobs
from keyturn.logs import get_logger
from keyturn.vault.client import OnOperation
from keyturn.vault.hvac_store import VaultStore
from keyturn.vault.open import open_vault_store

log = get_logger("keyturn.runtime")


class Runtime:
    """The live process: the Vault store, what its jobs share (`deps`, over that store) and
    the JobSet in force. Built whole; the only change after construction is a reload putting
    a new JobSet in force (`replace_jobs`, with the `deps` it was built over)."""

    __slots__ = ("_current", "deps", "store")

    def __init__(self, store: VaultStore, deps: JobDeps, jobs: JobSet) -> None:
        assert deps.store is store
        self.store = store  # deps.store, as the Vault store it is (health, token upkeep)
        self.deps = deps
        self._current = jobs

    @property
    def current(self) -> JobSet:
        return self._current

    def deps_for(self, config: Config) -> JobDeps:
        """What the jobs of `config` (a reload's) share: this process's, with its lease length
        (the state prefix and instance id are the configuration's at start: a reload that
        changes them is refused)."""
        return replace(self.deps, lease_seconds=lease_seconds(config.providers))

    async def build_jobs(self, config: Config) -> tuple[JobSet, JobDeps]:
        """The jobs of `config` (a reload's), and the `deps` they share."""
        deps = self.deps_for(config)
        return await build_jobs(config, deps, deps.resolver), deps

    def replace_jobs(self, jobs: JobSet, deps: JobDeps | None = None) -> JobSet:
        """Put `jobs` (built over `deps`) in force; returns the JobSet it replaces (to close
        once its runs end)."""
        previous, self._current = self._current, jobs
        if deps is not None:
            self.deps = deps
        return previous

    @property
    def config(self) -> Config:
        return self._current.config

    @property
    def observers(self) -> Observer:
        return self.deps.observer

    @property
    def clock(self) -> Clock:
        return self.deps.clock

    @property
    def instance_id(self) -> str:
        return self.deps.instance_id

    @property
    def jobs(self) -> dict[str, CredentialJob]:
        return self._current.jobs

    async def list_records(self) -> int | None:
        """One KV LIST of the state prefix before the first runs: a credential with no record
        starts without reading a 404 (see `CredentialJob.assume_absent`). Returns how many
        jobs were told so; None when the LIST is refused or fails (a policy without `list` on
        the prefix): each first run then reads its record, as before."""
        prefix = self.config.keyturn.state_prefix
        try:
            present = set(await self.store.list_keys(prefix, consistent=True))
        except KeyturnError as error:
            log.info("state.list_unavailable", prefix=prefix, error=str(error))
            return None
        absent = [job for name, job in self.jobs.items() if name not in present]
        for job in absent:
            job.assume_absent()
        return len(absent)

    def rotation(self, name: str) -> KeyRotation | None:
        """The rotation task of credential `name`, if it has one."""
        task = self.jobs[name].task("rotation")
        return task if isinstance(task, KeyRotation) else None


@asynccontextmanager
async def vault_store(
    config: Config,
    *,
    clock: Clock,
    environ: Mapping[str, str],
    on_vault_operation: OnOperation | None = None,
) -> AsyncIterator[VaultStore]:
    """A store logged in to Vault (see `open_vault_store`), closed on exit."""
    store = await open_vault_store(
        config, clock=clock, environ=environ, on_operation=on_vault_operation
    )
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def running(config: Config, store: VaultStore, deps: JobDeps) -> AsyncIterator[Runtime]:
    """The jobs of `config` built over `deps` (whose store is `store`); the JobSet in force is
    closed on exit."""
    runtime = Runtime(store, deps, await build_jobs(config, deps, deps.resolver))
    try:
        yield runtime
    finally:
        await runtime.current.aclose()


@asynccontextmanager
async def open_runtime(
    config: Config,
    *,
    clock: Clock | None = None,
    environ: Mapping[str, str] | None = None,
    instance_id: str | None = None,
    observers: Sequence[Observer] = (),
    rng: random.Random | None = None,
) -> AsyncIterator[Runtime]:
    """Log in to Vault and build the jobs; everything is closed on exit. (The daemon builds
    its observers over the store first: see `keyturn.daemon.open_daemon`.)"""
    clock = clock or SystemClock()
    environ = os.environ if environ is None else environ
    async with vault_store(config, clock=clock, environ=environ) as store:
        deps = JobDeps.start(
            config,
            store=store,
            observer=Observers(LoggingObserver(), *observers),
            clock=clock,
            rng=rng or random.Random(),  # jitter, not cryptography
            environ=environ,
            instance_id=instance_id,
        )
        async with running(config, store, deps) as runtime:
            yield runtime
