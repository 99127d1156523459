"""`python -m keyturn_devkit.sandbox` is `keyturn sandbox`, without importing the other commands.

`SandboxProcess` starts the sandbox this way: it starts faster, and it starts even while some
other command's module cannot be imported.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from keyturn_devkit.sandbox import command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="keyturn sandbox", description="run the reference service on loopback"
    )
    command.add_arguments(parser)
    try:
        return command.run(parser.parse_args(argv))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
