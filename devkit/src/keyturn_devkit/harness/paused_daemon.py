"""`python -m keyturn_devkit.harness.paused_daemon POINT -c FILE`: `keyturn run`, stopped dead
at one journal point of the first rotation that reaches it (for the crash tests, which then kill
it).

The product has no test hook: a rotation calls the checkpoint in force at each journal point
(`keyturn.jobs.rotation.CHECKPOINT`, a context variable whose default does nothing; see
`CHECKPOINTS`); this entry point sets one that logs `test.paused` and sleeps, once, before it
calls `keyturn run` (`asyncio.run` and the tasks under it start from a copy of this context).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from keyturn.commands import add_config_argument, run
from keyturn.jobs.rotation import CHECKPOINT, CHECKPOINTS, Checkpoint
from keyturn.kinds.signing_key import REGISTERED
from keyturn.logs import get_logger

# The journal's points, and those a kind adds between two of them (a signing key's public
# half registered at the server, not yet proven).
POINTS = (*CHECKPOINTS, REGISTERED)


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
    parser.add_argument("point", choices=POINTS)
    add_config_argument(parser)
    args = parser.parse_args(argv)
    CHECKPOINT.set(pausing_at(args.point))
    return run.run(args)


if __name__ == "__main__":
    sys.exit(main())
