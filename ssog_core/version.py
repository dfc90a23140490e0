"""The package version (its own module, so that the checkpoint format can record it without importing the package
root, which imports the checkpoint format)."""

__version__ = "0.1.0"
