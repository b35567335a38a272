"""The package version, in a module of its own so any module can import it without
importing the package's public API (and with it the engine)."""

__version__ = "0.1.0"
