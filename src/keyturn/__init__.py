"""keyturn: keeps the OAuth tokens and API keys of a third-party API fresh and safe in Vault."""

# The one place the version is written: pyproject.toml reads it (`tool.setuptools.dynamic`), so
# no command pays for importlib.metadata to learn it.
__version__ = "0.2.0"

__all__ = ["__version__"]
