"""Fakes for unit tests of keyturn's modules: same interfaces, no sockets, no threads.

What starts processes or servers (the sandbox, a dev OpenBao, the daemon as a process) is in
keyturn-devkit (`keyturn_devkit.dev`, `keyturn_devkit.harness`), never in keyturn's wheel.
"""

from keyturn.testing.vault import FakeVaultStore

__all__ = ["FakeVaultStore"]
