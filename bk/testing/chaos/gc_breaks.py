"""Broken GC on purpose, for the GC chaos mode's self-test (bk.testing.chaos.gc_chaos).

Each break re-introduces one defect of issue 27 that the engine no longer has, by
injection into one running Bookie (nothing in bk/bookie knows about it; config.test_break
is not involved): `apply(bookie, name)` after every start of the engine.

- gc-trust-partial-scan: a scan of an entry log that stops at a damaged record is
  taken for the whole log, as before f1dfa9a. The log's usage (`log_metadata`) loses
  its `damage`, so whole-log deletion trusts the ledgers seen before the damage; and
  every scan reports a clean end, so compaction copies what it saw and deletes the log
  without asking the index what lay past the damage.
- gc-dead-from-memory: "this ledger is dead" is asked of memory alone
  (`storage.get_ledger(lid) is None`), for compaction and whole-log deletion alike,
  as compaction did before f1dfa9a: a delete whose index commit failed leaves a ledger
  gone from memory whose entries the index still names.
- gc-metadata-error-as-deleted: a metadata read that fails (a connection loss, a
  timeout, a store error) is taken for "no such ledger", as in apache/bookkeeper#4607:
  the policy's ledger manager (bk.server.gc_policy.ScanAndCompareGarbageCollector's)
  answers NoSuchLedgerMetadataError for any failed read, so a live ledger the listing
  omitted is deleted when its re-read fails (gc_metadata's `lost` passes).
"""
from __future__ import annotations

from bk.entrylog import SCAN_CLEAN
from bk.errors import BKError, NoSuchLedgerMetadataError

GC_BREAKS = ("gc-trust-partial-scan", "gc-dead-from-memory", "gc-metadata-error-as-deleted")


class _CleanLookingScan:
    """A LogScan whose end always reads as clean (what it saw is taken as the whole log)."""

    def __init__(self, scan):
        self._scan = scan

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._scan)

    @property
    def status(self):
        return None if self._scan.status is None else SCAN_CLEAN

    @property
    def stop_offset(self):
        return self._scan.stop_offset


def _trust_partial_scan(bookie) -> None:
    el = bookie.storage.entry_logger
    real_scan, real_metadata = el.scan, el.log_metadata

    def scan(log_id: int, with_entries: bool = False):
        return _CleanLookingScan(real_scan(log_id, with_entries=with_entries))

    def log_metadata(log_id: int):
        meta = real_metadata(log_id)
        meta.damage, meta.damage_offset = "", None
        return meta
    el.scan, el.log_metadata = scan, log_metadata


def _dead_from_memory(bookie) -> None:
    storage = bookie.storage
    bookie.gc._is_dead = lambda ledger_id: storage.get_ledger(ledger_id) is None


def _metadata_error_as_deleted(bookie) -> None:
    policy = bookie.gc.policy
    manager = getattr(policy, "ledger_manager", None)
    if manager is None:
        raise ValueError("gc-metadata-error-as-deleted needs the scan-and-compare policy (it reads metadata)")
    if getattr(manager, "error_as_deleted", False):  # the policy outlives restarts: break it once
        return
    real_read = manager.read_ledger_metadata

    async def read_ledger_metadata(ledger_id: int):
        try:
            return await real_read(ledger_id)
        except NoSuchLedgerMetadataError:
            raise
        except (BKError, OSError) as e:
            raise NoSuchLedgerMetadataError(f"ledger {ledger_id}: metadata read failed ({e}): taken for gone") from e
    manager.read_ledger_metadata, manager.error_as_deleted = read_ledger_metadata, True


_APPLY = {"gc-trust-partial-scan": _trust_partial_scan, "gc-dead-from-memory": _dead_from_memory,
          "gc-metadata-error-as-deleted": _metadata_error_as_deleted}


def apply(bookie, name: str) -> None:
    """Break this started Bookie's GC as `name` says ("" = leave it correct)."""
    if not name:
        return
    if name not in GC_BREAKS:
        raise ValueError(f"unknown GC break {name!r}; one of {GC_BREAKS}")
    _APPLY[name](bookie)
