"""Append-only entry logs: EntryLogger (writer + readers), LogScan, the byte formats."""
from bk.entrylog.files import SCAN_BAD_SIZE, SCAN_CLEAN, SCAN_TRUNCATED, LogScan
from bk.entrylog.format import HEADER_BYTES, make_location, split_location
from bk.entrylog.logger import DiskUsage, EntryLogger

__all__ = [
    "EntryLogger", "LogScan", "DiskUsage", "HEADER_BYTES", "make_location", "split_location",
    "SCAN_CLEAN", "SCAN_TRUNCATED", "SCAN_BAD_SIZE",
]
