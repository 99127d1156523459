"""Fakes for unit tests of keyturn's modules: same interfaces, no sockets, no threads."""

from keyturn.testing.vault import FakeVaultStore

__all__ = ["FakeVaultStore"]
