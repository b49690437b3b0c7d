"""The bookie's storage engine facade: Bookie, LedgerStorage and their caches."""
from bk.index import NEEDS_INTEGRITY_CHECK, UNCLEAN_SHUTDOWN

from .adds import Add, AddRun
from .bookie import Bookie
from .ledger_descriptor import LedgerDescriptor
from .ledger_storage import LedgerStorage
from .write_cache import ReadCache, WriteCache

__all__ = ["Add", "AddRun", "Bookie", "LedgerStorage", "LedgerDescriptor", "WriteCache", "ReadCache",
           "UNCLEAN_SHUTDOWN", "NEEDS_INTEGRITY_CHECK"]
