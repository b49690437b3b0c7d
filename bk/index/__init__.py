"""LMDB index: entry locations, ledger states, bookie state flags and journal log marks."""
from bk.index.index import Index, IndexWriter
from bk.index.state import NEEDS_INTEGRITY_CHECK, UNCLEAN_SHUTDOWN, LedgerState, LogMark

__all__ = ["Index", "IndexWriter", "LedgerState", "LogMark", "UNCLEAN_SHUTDOWN", "NEEDS_INTEGRITY_CHECK"]
