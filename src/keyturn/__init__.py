"""keyturn: keeps the OAuth tokens and API keys of a third-party API fresh and safe in Vault."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("keyturn")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = ["__version__"]
