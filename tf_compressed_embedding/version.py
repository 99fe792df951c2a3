"""The package version, read by pyproject.toml (the one place it is written)."""
__version__ = "0.1.0"
