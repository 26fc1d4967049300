"""The release of this package: one place every layer may read it from without importing the package's
public facade (`pystatestore/__init__`)."""

__version__ = "0.5.0"
