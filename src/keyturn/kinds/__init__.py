"""One module (or package) per credential kind, each declaring its `Kind` (`kinds.base`): its
configuration model, what it publishes, its tasks and rotation target, how status words it.
The registry (`kinds.registry`) lists them once; code outside this package asks
`kind_of(credential)` and never compares a kind's name. Kinds use the job machinery
(`keyturn.jobs`); nothing there imports a kind. docs/architecture.md lists the kinds and the
files touched to add one.
"""

from keyturn.kinds.base import AnyKind, Kind
from keyturn.kinds.registry import KINDS, REGISTERED, build_job, build_jobs, kind_of

__all__ = ["KINDS", "REGISTERED", "AnyKind", "Kind", "build_job", "build_jobs", "kind_of"]
