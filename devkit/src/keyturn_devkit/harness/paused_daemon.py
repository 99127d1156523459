"""`python -m keyturn_devkit.harness.paused_daemon POINT -c FILE`: `keyturn run`, stopped dead
at one journal point of the first rotation that reaches it (for the crash tests, which then kill
it).

The product has no test hook: the daemon takes a `checkpoint` (a no-op in production, see
`keyturn.jobs.rotation.CHECKPOINTS`); this entry point injects one that logs `test.paused` and
sleeps, once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from keyturn.commands import add_config_argument, run
from keyturn.jobs.rotation import CHECKPOINTS, Checkpoint
from keyturn.logs import get_logger


def pausing_at(point: str, seconds: float = 3600.0) -> Checkpoint:
    """A checkpoint that stops the rotation reaching `point` for `seconds`, the first time."""
    reached: list[str] = []

    async def checkpoint(credential: str, at: str) -> None:
        if at != point or reached:
            return
        reached.append(credential)
        get_logger("keyturn.testing").warning("test.paused", credential=credential, point=at)
        await asyncio.sleep(seconds)

    return checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keyturn_devkit.harness.paused_daemon")
    parser.add_argument("point", choices=CHECKPOINTS)
    add_config_argument(parser)
    args = parser.parse_args(argv)
    return run.run(args, checkpoint=pausing_at(args.point))


if __name__ == "__main__":
    sys.exit(main())
