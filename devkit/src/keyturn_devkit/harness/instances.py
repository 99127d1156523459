"""Several keyturn instances sharing one deployment, each reaching the cluster by its own node.

    deployment = prepare_deployment(cluster, sandbox, tmp_path, names)
    fleet = Instances(deployment.config_path, tmp_path, ["k0", "k1", "k2"], cluster.addresses)
    with fleet:                                   # started side by side; SIGTERM at the end
        fleet["k1"].stop(signal.SIGKILL)
        read_published(cluster.leader().address, cluster.root_token, deployment.publish_to)

Every instance runs the same keyturn.toml, as the replicas of one Kubernetes StatefulSet do;
what differs between them is set by `KEYTURN_…` overrides, as a pod's environment would: its
own `instance_id`, its `[vault] address` (one node, in turn) and `nodes` (every other node),
so each instance talks to the cluster through a different node and knows all of them.

`read_published` reads the KV metadata of the published paths: who wrote each last (the
custom metadata `writer`) and when Vault created each version it still keeps, which dates a
publish on Vault's clock, with no poller in the way.
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from keyturn.clock import parse_rfc3339
from keyturn_devkit.dev.loopback import HTTP
from keyturn_devkit.dev.process import ManagedServer
from keyturn_devkit.harness.deployment import DaemonProcess


def instance_environment(instance_id: str, address: str, nodes: Sequence[str]) -> dict[str, str]:
    """The overrides that make an instance itself (the rest is the shared file)."""
    return {
        "KEYTURN_KEYTURN_INSTANCE_ID": instance_id,
        "KEYTURN_VAULT_ADDRESS": address,
        **({"KEYTURN_VAULT_NODES": ",".join(nodes)} if nodes else {}),
    }


@dataclass
class Instance:
    """One `keyturn run` of the fleet: its id, the node it is pointed at, the others."""

    instance_id: str
    address: str
    nodes: tuple[str, ...]
    daemon: DaemonProcess
    running: bool = False
    exit_codes: list[int] = field(default_factory=list)

    def start(self) -> Instance:
        """Start it (again) and wait until it logs daemon.started."""
        self.daemon.start()
        self.running = True
        return self

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send `signum` and wait until it has exited (SIGKILL after `timeout`); the exit code."""
        code = self.daemon.stop(signum, timeout=timeout)
        self.running = False
        self.exit_codes.append(code)
        return code

    def log_text(self) -> str:
        return self.daemon.log_text()

    def events(self, name: str) -> list[dict[str, Any]]:
        """The JSON log lines of every run of this instance whose `event` is `name`."""
        found = []
        for line in self.log_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("event") == name:
                found.append(entry)
        return found


class Instances(ManagedServer):
    """`ids` instances of the deployment whose keyturn.toml is `config_path`; instance i is
    pointed at `addresses[i % len(addresses)]` and given every other address as `nodes`. Each
    logs under `<workdir>/<id>/`. `env` goes to every instance, `env_of[id]` to that one alone
    (e.g. libfaketime for a host whose clock is off). `start()` starts them side by side,
    `stop()` ends those still running with SIGTERM and returns their exit codes."""

    def __init__(
        self,
        config_path: Path,
        workdir: Path,
        ids: Sequence[str],
        addresses: Sequence[str],
        env: Mapping[str, str] | None = None,
        env_of: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        if not ids or not addresses:
            raise ValueError("expected at least one instance id and one node address")
        self.members: list[Instance] = []
        for i, instance_id in enumerate(ids):
            address = addresses[i % len(addresses)]
            nodes = tuple(a for a in addresses if a != address)
            directory = workdir / instance_id
            directory.mkdir(parents=True, exist_ok=True)
            overrides = {
                **(env or {}),
                **(env_of or {}).get(instance_id, {}),
                **instance_environment(instance_id, address, nodes),
            }
            daemon = DaemonProcess(config_path, directory, overrides)
            self.members.append(Instance(instance_id, address, nodes, daemon))

    def __getitem__(self, instance_id: str) -> Instance:
        for instance in self.members:
            if instance.instance_id == instance_id:
                return instance
        raise KeyError(instance_id)

    def __iter__(self) -> Iterator[Instance]:
        return iter(self.members)

    @property
    def ids(self) -> list[str]:
        return [instance.instance_id for instance in self.members]

    def start(self) -> Self:
        """Start every instance at once (each waits for its own daemon.started); if one does
        not start, stop those that did and raise its error."""
        errors: dict[str, BaseException] = {}

        def start_one(instance: Instance) -> None:
            try:
                instance.start()
            except BaseException as error:  # handed to the caller below
                errors[instance.instance_id] = error

        self._each(start_one, self.members)
        if errors:
            self.stop()
            first = sorted(errors)[0]
            raise RuntimeError(f"{sorted(errors)} did not start") from errors[first]
        return self

    def stop(self, timeout: float = 30) -> dict[str, int]:
        """SIGTERM every running instance at once and wait for each; exit codes by id."""
        codes: dict[str, int] = {}

        def stop_one(instance: Instance) -> None:
            codes[instance.instance_id] = instance.stop(signal.SIGTERM, timeout=timeout)

        self._each(stop_one, [i for i in self.members if i.running])
        return codes

    def events(self, name: str) -> dict[str, list[dict[str, Any]]]:
        return {instance.instance_id: instance.events(name) for instance in self.members}

    @staticmethod
    def _each(action: Callable[[Instance], None], instances: Sequence[Instance]) -> None:
        threads = [
            threading.Thread(target=action, args=(i,), name=f"instance-{i.instance_id}")
            for i in instances
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


# -- what Vault shows ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishedPath:
    """A published path's KV metadata: its current version, who wrote it, and when Vault
    created each version it still keeps (epoch seconds, Vault's clock)."""

    name: str
    version: int
    writer: str | None
    created: Mapping[int, float]

    def first_after(self, moment: float) -> float | None:
        """When the first version created after `moment` was created (None: none yet)."""
        return min((at for at in self.created.values() if at > moment), default=None)

    def longest_gap(self) -> float:
        """The longest time between two consecutive versions Vault still keeps."""
        times = sorted(self.created.values())
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def read_published(
    address: str, token: str, paths: Mapping[str, str], mount: str = "secret"
) -> dict[str, PublishedPath]:
    """The metadata of every published path (credential name -> KV path) that exists."""
    found: dict[str, PublishedPath] = {}
    for name, path in paths.items():
        answer = HTTP.get(
            f"{address}/v1/{mount}/metadata/{path}", headers={"X-Vault-Token": token}, timeout=5
        )
        if answer.status_code == 404:
            continue
        answer.raise_for_status()
        data = answer.json()["data"]
        created = {
            int(version): parse_rfc3339(entry["created_time"])
            for version, entry in (data.get("versions") or {}).items()
        }
        writer = (data.get("custom_metadata") or {}).get("writer")
        found[name] = PublishedPath(name, int(data["current_version"]), writer, created)
    return found


def read_record(address: str, token: str, path: str, mount: str = "secret") -> dict[str, str]:
    """The fields of one KV entry (e.g. a credential's private record); {} if there is none."""
    answer = HTTP.get(
        f"{address}/v1/{mount}/data/{path}", headers={"X-Vault-Token": token}, timeout=5
    )
    if answer.status_code == 404:
        return {}
    answer.raise_for_status()
    data = answer.json()["data"]["data"] or {}
    return {str(key): str(value) for key, value in data.items()}
