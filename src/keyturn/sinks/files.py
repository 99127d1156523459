"""A sink's file on disk: compared with what it should hold, replaced atomically (a reader sees
the old file or the new one, never a mix or an empty file), and the temporary files a crash
left beside it removed. Blocking: the manager runs these on its own thread pool."""

from __future__ import annotations

import contextlib
import hmac
import os
import stat
import tempfile
from pathlib import Path

TEMP_SUFFIX = ".keyturn-tmp"


def file_is_current(path: Path, content: bytes, mode: int) -> bool:
    """Whether `path` is a regular file (not a link) with exactly this mode and content."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) != mode:
            return False
        if info.st_size != len(content):
            return False
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path, flags)
        try:
            data = b""
            while len(data) <= len(content):
                chunk = os.read(fd, len(content) + 1 - len(data))
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
    except OSError:
        return False  # unreadable, gone, or replaced meanwhile: write it anew
    return hmac.compare_digest(data, content)


def write_atomically(path: Path, content: bytes, mode: int) -> None:
    """Replace `path` with `content`: a temporary file in the same directory, created with
    mode 0600 and set to `mode` before any byte is written, fsync, rename over `path`, fsync of
    the directory. Raises OSError; the temporary file never outlives a failure."""
    directory = path.parent
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=directory)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)


def remove_leftovers(path: Path) -> int:
    """Delete temporary files a crash left beside `path` (ours only: `.<name>.*.keyturn-tmp`)."""
    removed = 0
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            name = entry.name
            if name.startswith(f".{path.name}.") and name.endswith(TEMP_SUFFIX):
                with contextlib.suppress(OSError):
                    entry.unlink()
                    removed += 1
    return removed


def write_file(path: Path, content: bytes, mode: int) -> str | None:
    """`write_atomically`, with what went wrong as one line (None: written). Runs on a sink
    thread, so even the checks made to explain a failure never touch the event loop."""
    try:
        write_atomically(path, content, mode)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        if isinstance(error, FileNotFoundError) and not path.parent.is_dir():
            return f"cannot write the file: its directory {path.parent} does not exist ({reason})"
        if isinstance(error, PermissionError):
            where = path.parent
            return (
                f"cannot write the file: {reason} (keyturn must be able to create files in {where})"
            )
        return f"cannot write the file: {reason}"
    return None
