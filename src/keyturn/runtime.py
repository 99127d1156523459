"""Wires a `Config` into live parts: the Vault store, the shared context, and the jobs (see
`keyturn.jobs.build`). Every command that touches Vault or the service (run, refresh, rotate,
import-key, import-refresh-token) opens a `Runtime`, so they all see the same layout and rules.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from keyturn.clock import Clock, SystemClock
from keyturn.config import Config
from keyturn.errors import KeyturnError
from keyturn.events import LoggingObserver, Observer, Observers
from keyturn.jobs.build import JobSet, lease_seconds
from keyturn.jobs.job import Checkpoint, ConsumerHooks, CredentialJob, JobDeps, no_checkpoint
from keyturn.jobs.rotation import KeyRotation
from keyturn.kinds import build_jobs
from keyturn.logs import get_logger
from keyturn.references import ReferenceResolver
from keyturn.vault.client import OnOperation
from keyturn.vault.hvac_store import VaultStore
from keyturn.vault.open import open_vault_store

log = get_logger("keyturn.runtime")


@dataclass(frozen=True, slots=True)
class Context:
    """What every job shares for the life of the process (a reload keeps it)."""

    store: VaultStore
    observers: Observers
    clock: Clock
    rng: random.Random
    environ: Mapping[str, str]
    instance_id: str | None = None  # None: the configuration's `instance_id`
    # Called at each journal point of a rotation (a no-op; crash tests inject one that stops).
    checkpoint: Checkpoint = no_checkpoint
    consumers: ConsumerHooks | None = None  # the usage monitor, in a daemon with [usage]

    @property
    def resolver(self) -> ReferenceResolver:
        return ReferenceResolver(self.environ, self.store)

    def instance(self, config: Config) -> str:
        """This process's instance id: the context's, else the configuration's."""
        return self.instance_id or config.keyturn.instance_id

    def job_deps(self, config: Config) -> JobDeps:
        """What the jobs of `config` share: this context, with the configuration's state
        prefix, instance id and lease length."""
        return JobDeps(
            store=self.store,
            observer=self.observers,
            clock=self.clock,
            rng=self.rng,
            instance_id=self.instance(config),
            state_prefix=config.keyturn.state_prefix,
            lease_seconds=lease_seconds(config.providers),
            checkpoint=self.checkpoint,
            consumers=self.consumers,
        )

    async def build_jobs(self, config: Config) -> JobSet:
        return await build_jobs(config, self.job_deps(config), self.resolver)


class Runtime:
    """The live process: the shared context and the JobSet in force. Built whole; the only
    change after construction is a reload putting a new JobSet in force (`replace_jobs`)."""

    __slots__ = ("_current", "context")

    def __init__(self, context: Context, jobs: JobSet) -> None:
        self.context = context
        self._current = jobs

    @property
    def current(self) -> JobSet:
        return self._current

    def replace_jobs(self, jobs: JobSet) -> JobSet:
        """Put `jobs` in force; returns the JobSet it replaces (to close once its runs end)."""
        previous, self._current = self._current, jobs
        return previous

    @property
    def config(self) -> Config:
        return self._current.config

    @property
    def store(self) -> VaultStore:
        return self.context.store

    @property
    def observers(self) -> Observers:
        return self.context.observers

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
async def running(config: Config, context: Context) -> AsyncIterator[Runtime]:
    """The jobs of `config` built over `context`; the JobSet in force is closed on exit."""
    runtime = Runtime(context, await context.build_jobs(config))
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
    checkpoint: Checkpoint = no_checkpoint,
) -> AsyncIterator[Runtime]:
    """Log in to Vault and build the jobs; everything is closed on exit. (The daemon builds
    its observers over the store first: see `keyturn.daemon.open_daemon`.)"""
    clock = clock or SystemClock()
    environ = os.environ if environ is None else environ
    async with vault_store(config, clock=clock, environ=environ) as store:
        context = Context(
            store=store,
            observers=Observers(LoggingObserver(), *observers),
            clock=clock,
            rng=rng or random.Random(),  # jitter, not cryptography
            environ=environ,
            instance_id=instance_id,
            checkpoint=checkpoint,
        )
        async with running(config, context) as runtime:
            yield runtime
