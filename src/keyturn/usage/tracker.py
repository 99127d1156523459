"""Who reads each published credential: reads, last read, last version read, from where.

In memory only and bounded (`max_consumers` by name, the rest folded into `other`;
`max_networks` each). Runs on the event loop's thread; the scrape thread reads
`list(dict.values())` copies, atomic in CPython, so the hot path takes no lock.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from keyturn.clock import Clock
from keyturn.usage.audit import AuditRead, AuditWrite
from keyturn.usage.layout import Layout

OTHER = "other"


class ConsumerUsage:
    """One identity's reads of one credential. `window`, `window_count`, `baseline` and
    `allowed` belong to the detectors (kept here so that one object per consumer is all the
    memory a consumer costs)."""

    __slots__ = (
        "address",
        "allowed",
        "baseline",
        "consumer",
        "first_read",
        "last_read",
        "last_version",
        "networks",
        "reads",
        "window",
        "window_count",
    )

    def __init__(self, consumer: str, now: float) -> None:
        self.consumer = consumer
        self.reads = 0
        self.first_read = now
        self.last_read = now
        self.last_version: int | None = None
        self.address = ""
        self.networks: tuple[str, ...] = ()
        self.window = -1
        self.window_count = 0
        self.baseline = 0.0
        self.allowed: bool | None = None


@dataclass(frozen=True, slots=True)
class ConsumerView:
    """What `keyturn usage` shows for one consumer. `current`: whether its last read got the
    version now published (None when either is unknown)."""

    consumer: str
    reads: int
    first_read: float
    last_read: float
    last_version: int | None
    current: bool | None
    address: str


@dataclass(frozen=True, slots=True)
class CredentialView:
    """One credential's consumers, most recent reader first."""

    credential: str
    current_version: int | None
    consumers: tuple[ConsumerView, ...]


class _Credential:
    __slots__ = ("consumers", "current_version", "other")

    def __init__(self) -> None:
        self.consumers: dict[str, ConsumerUsage] = {}
        self.current_version: int | None = None
        self.other: ConsumerUsage | None = None

    def all(self) -> list[ConsumerUsage]:
        found = list(self.consumers.values())
        other = self.other
        return [*found, other] if other is not None else found


class UsageTracker:
    """Counts the reads of published paths by consumer (keyturn's own reads are not given to
    it). `observed_since`: from when the tracker has seen every read (its start, or the first
    entry it was given if that is older): what `waiting_for` can vouch for."""

    def __init__(
        self,
        layout: Layout,
        *,
        clock: Clock,
        max_consumers: int = 100,
        max_networks: int = 16,
        network_prefix: tuple[int, int] = (24, 64),
    ) -> None:
        self.layout = layout
        self.max_consumers = max_consumers
        self.max_networks = max_networks
        self.observed_since = clock.time()
        self._first = True
        self._prefix4, self._prefix6 = network_prefix
        self._credentials: dict[str, _Credential] = {}
        self._networks: dict[str, str] = {}
        self._single: dict[str, tuple[str, ...]] = {}

    def _credential(self, name: str) -> _Credential:
        found = self._credentials.get(name)
        if found is None:
            found = self._credentials[name] = _Credential()
        return found

    def observe(self, read: AuditRead) -> tuple[ConsumerUsage, bool, bool]:
        """Counts a successful read of a published path: (the consumer's usage, whether the
        identity is new for this credential, whether the read came from a network the
        consumer had not read from before). Identities beyond the cap count as `other`, which
        is never new and keeps no networks."""
        if self._first:
            self._first = False
            self.observed_since = min(self.observed_since, read.time)
        credential = self._credential(read.credential)
        usage = credential.consumers.get(read.consumer)
        new_consumer = new_network = False
        if usage is None:
            if len(credential.consumers) < self.max_consumers:
                usage = ConsumerUsage(read.consumer, read.time)
                credential.consumers[read.consumer] = usage
                new_consumer = True
            else:
                usage = credential.other
                if usage is None:
                    usage = credential.other = ConsumerUsage(OTHER, read.time)
        usage.reads += 1
        if read.time >= usage.last_read:
            usage.last_read = read.time
            if read.version is not None:
                usage.last_version = read.version
        elif usage.last_version is None:
            usage.last_version = read.version
        address = read.remote_address
        if address and address != usage.address and usage is not credential.other:
            usage.address = address
            network = self._network(address)
            if network not in usage.networks:
                if usage.networks:
                    new_network = True
                    usage.networks = (*usage.networks, network)[-self.max_networks :]
                else:  # a consumer's first network is not "new"; one tuple per network
                    usage.networks = self._alone(network)
        return usage, new_consumer, new_network

    def written(self, write: AuditWrite) -> None:
        """A write to a published path that Vault carried out: the version it created is
        what readers get from now on."""
        if write.ok and write.version is not None:
            self.set_current(write.credential, write.version)

    def set_current(self, credential: str, version: int) -> None:
        """The KV version now published for `credential` (keyturn tells it after publishing;
        keyturn's own writes in the audit stream tell it too)."""
        found = self._credential(credential)
        if found.current_version is None or version >= found.current_version:
            found.current_version = version

    def current_version(self, credential: str) -> int | None:
        found = self._credentials.get(credential)
        return found.current_version if found is not None else None

    def consumer_count(self, credential: str) -> int:
        """Distinct identities seen reading `credential` (at most `max_consumers`; `other`
        not counted)."""
        found = self._credentials.get(credential)
        return len(found.consumers) if found is not None else 0

    def usage_of(self, credential: str) -> list[ConsumerUsage]:
        """The live usage records of a credential, in first-read order (`other` last)."""
        found = self._credentials.get(credential)
        return found.all() if found is not None else []

    def forget(self, credential: str) -> None:
        """Drops everything known about a credential (removed from the configuration)."""
        self._credentials.pop(credential, None)

    def credentials(self) -> list[str]:
        return list(self._credentials)

    def consumers(self, credential: str) -> CredentialView:
        """A snapshot for `keyturn usage`."""
        found = self._credentials.get(credential)
        if found is None:
            return CredentialView(credential, None, ())
        current = found.current_version
        views = [
            ConsumerView(
                u.consumer,
                u.reads,
                u.first_read,
                u.last_read,
                u.last_version,
                None if current is None or u.last_version is None else u.last_version >= current,
                u.address,
            )
            for u in found.all()
        ]
        views.sort(key=lambda v: v.last_read, reverse=True)
        return CredentialView(credential, current, tuple(views))

    def snapshot(self, names: Iterable[str] | None = None) -> list[CredentialView]:
        """Every credential read so far (or the ones named, read or not), by name."""
        chosen = sorted(self._credentials) if names is None else list(names)
        return [self.consumers(name) for name in chosen]

    def waiting_for(
        self, credential: str, old_version: int, window: float, now: float
    ) -> tuple[str, ...]:
        """The consumers that read `old_version` (or an older one) within `window` seconds
        before `now` and have not read a newer version since: the ones a rotation waits for
        before it revokes the old key. Only reads since `observed_since` are known: a caller
        for whom `observed_since > now - window` cannot rule out other readers."""
        found = self._credentials.get(credential)
        if found is None:
            return ()
        since = now - window
        return tuple(
            u.consumer
            for u in found.all()
            if u.last_read >= since and (u.last_version is None or u.last_version <= old_version)
        )

    def _network(self, address: str) -> str:
        """The network an address is in (/24 and /64 by default); the address itself when it
        is not an IP address. Cached: apps read from few addresses."""
        network = self._networks.get(address)
        if network is None:
            network = address
            for family, prefix, size in (
                (socket.AF_INET, self._prefix4, 32),
                (socket.AF_INET6, self._prefix6, 128),
            ):
                try:
                    packed = socket.inet_pton(family, address)
                except (OSError, ValueError):
                    continue
                bits = int.from_bytes(packed, "big") >> (size - prefix) << (size - prefix)
                base = socket.inet_ntop(family, bits.to_bytes(size // 8, "big"))
                network = sys.intern(f"{base}/{prefix}")
                break
            if len(self._networks) >= 65536:
                self._networks.clear()
            self._networks[address] = network
        return network

    def _alone(self, network: str) -> tuple[str, ...]:
        """`(network,)`, the same tuple for every consumer in it (memory: most consumers read
        from one network)."""
        found = self._single.get(network)
        if found is None:
            if len(self._single) >= 65536:
                self._single.clear()
            found = self._single[network] = (network,)
        return found
