"""The bookie's journal: checksummed records, group commit, replay, rotation, gc.

See docs/STORAGE.md ("Journal files") for the byte format and the API contract.
"""
from bk.journal.journal import Journal
from bk.journal.records import (
    EXPLICIT_LAC,
    FENCE,
    MASTER_KEY,
    META_IDS,
    LogMark,
    file_path,
    list_files,
    meta_body,
    parse_ids,
)
from bk.journal.replay import ReplayResult

__all__ = [
    "Journal",
    "LogMark",
    "ReplayResult",
    "MASTER_KEY",
    "FENCE",
    "EXPLICIT_LAC",
    "META_IDS",
    "meta_body",
    "parse_ids",
    "file_path",
    "list_files",
]
