"""bk: Apache BookKeeper's distributed log storage, in Python."""

__version__ = "0.1.0"
