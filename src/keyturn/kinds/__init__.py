"""One module (or package) per credential kind, each declaring its `Kind`
(`keyturn.kinds.base`): its configuration model; what it publishes and which field is its value,
its expiry and its plan; its tasks and its rotation target; how `keyturn status` words it. The
registry (`keyturn.kinds.registry`) lists them once; code outside this package asks
`kind_of(credential)` or `KINDS[name]` and never compares a kind's name.

- `api_key` (`keyturn.kinds.api_key`): rotation, and `republish` (forced only).
- `oauth_client` (`keyturn.kinds.oauth_client`, a package): the token refresh
  (`oauth_client.refresh.TokenRefresh`), then a client-secret rotation when `rotation` is
  configured, then `verify` (`oauth_client.refresh.ProbeAgain`) with a probe.

Dependencies point one way: kinds use the job machinery (`keyturn.jobs`); nothing in
`keyturn.jobs` imports a kind.
"""

from keyturn.kinds.base import AnyKind, Kind
from keyturn.kinds.registry import KINDS, REGISTERED, build_job, build_jobs, kind_of

__all__ = ["KINDS", "REGISTERED", "AnyKind", "Kind", "build_job", "build_jobs", "kind_of"]
