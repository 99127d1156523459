"""Local sinks: files on keyturn's own host kept equal to what keyturn publishes, each with an
optional `on_publish` command run after its file is written, all off the refresh path. How
they work: docs/architecture.md#local-sinks; how they are configured: docs/configuration.md.

`render` checks a published record and renders a file from it, `files` writes it atomically,
`hook` runs the command, `manager` holds the per-credential workers and the observer that
wakes them.
"""

from keyturn.sinks.files import file_is_current, remove_leftovers, write_atomically, write_file
from keyturn.sinks.hook import HookRun, hook_params, run_hook
from keyturn.sinks.manager import (
    COUNTED_RESULTS,
    SinkManager,
    SinkObserver,
    SinkReport,
    SinkResult,
)
from keyturn.sinks.render import PublishedRecord, SinkError, parse_record, render

__all__ = [
    "COUNTED_RESULTS",
    "HookRun",
    "PublishedRecord",
    "SinkError",
    "SinkManager",
    "SinkObserver",
    "SinkReport",
    "SinkResult",
    "file_is_current",
    "hook_params",
    "parse_record",
    "remove_leftovers",
    "render",
    "run_hook",
    "write_atomically",
    "write_file",
]
