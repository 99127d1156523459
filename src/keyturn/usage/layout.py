"""Which Vault paths the audit stream is read for, and whose they are.

`published` (a `publish_to`, read by apps: the consumers counted), `state` (keyturn's records
under `state_prefix`) and `input` (the `vault:` references keyturn resolves); nobody else
should read the last two. Every other path is none of keyturn's business.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

Target = Literal["published", "state", "input"]


@dataclass(frozen=True, slots=True)
class Watched:
    """One credential as the usage monitor sees it. `consumers`: the identities allowed to read
    `publish_to` (labels as `consumer_label` builds them, `fnmatch` patterns, or entity ids);
    None when no allow list is set (new readers are then learned)."""

    name: str
    provider: str
    publish_to: str
    consumers: tuple[str, ...] | None = None


class Layout:
    """Published paths, the private state prefix and the input paths of one configuration.

    `mount` holds the published paths and the state records (`vault.mount`); `inputs` are
    (credential, mount, path) of each `vault:` reference. `kv_versions` names a mount that
    is KV version 1 (every mount is taken as version 2 otherwise, which keyturn requires for
    its own mount). `namespace`: the Vault namespace keyturn works in ("" for the root).
    """

    def __init__(
        self,
        credentials: Iterable[Watched],
        *,
        mount: str = "secret",
        state_prefix: str = "keyturn/state",
        inputs: Iterable[tuple[str, str, str]] = (),
        kv_versions: Mapping[str, int] | None = None,
        namespace: str = "",
    ) -> None:
        self.mount = mount.strip("/")
        self.state_prefix = state_prefix.strip("/")
        self.namespace = namespace.strip("/") + "/" if namespace.strip("/") else ""
        self.credentials: dict[str, Watched] = {}
        self._published: dict[tuple[str, str], Watched] = {}
        self._inputs: dict[tuple[str, str], str] = {}
        for watched in credentials:
            self.credentials[watched.name] = watched
            self._published[(self.mount, watched.publish_to.strip("/"))] = watched
        for credential, input_mount, path in inputs:
            # A path shared by several credentials is named after the first.
            self._inputs.setdefault((input_mount.strip("/"), path.strip("/")), credential)
        mounts = {self.mount} | {m for m, _ in self._inputs}
        versions = dict(kv_versions or {})
        self.mounts: dict[str, int] = {m: versions.get(m, 2) for m in sorted(mounts)}

    def classify(self, mount: str, path: str) -> tuple[Target, str] | None:
        """(what the path is, the credential it belongs to), or None when keyturn does not
        watch it. `mount` has no slashes; `path` is relative to the mount (KV v2's `data/`
        already removed)."""
        watched = self._published.get((mount, path))
        if watched is not None:
            return "published", watched.name
        credential = self._inputs.get((mount, path))
        if credential is not None:
            return "input", credential
        if mount == self.mount:
            prefix = self.state_prefix
            if path == prefix or path.startswith(prefix + "/"):
                return "state", path[len(prefix) + 1 :]
        return None

    def provider(self, credential: str) -> str | None:
        """The provider of a configured credential (None for a name not configured, e.g. a
        state record left by a credential since removed)."""
        watched = self.credentials.get(credential)
        return watched.provider if watched is not None else None
