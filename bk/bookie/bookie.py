"""Bookie: the async facade the server calls; the only bridge between the event
loop and the storage threads (journal writers, flush thread, read workers).

Bookie is one object made of four parts, one module each (REPLICATION.md, "Rules a bookie
must keep", says which rule each keeps; the modules' docstrings repeat theirs):
- bk.bookie.adds: adds (AddRun, the write cache, the journal, waiting for room);
- bk.bookie.reads: entries, LACs, long polls (no explicit negative in limbo);
- bk.bookie.limbo: fences, explicit LAC writes, BP-46 limbo and the integrity check;
- this module: start (journal replay), stop, read-only state and disk faults.
Admission of every add, fence and LAC write (master key, fence) is the ledger's own:
LedgerDescriptor.check_access / check_writable (bk.bookie.ledger_descriptor).

Rules kept here:
- Disk faults (docs/DISK-FAULTS.md): a failed fsync, write or index commit (journal,
  entry log, checkpoint) turns the bookie read-only for good (`storage_failure`, until
  a restart): the affected adds were never acknowledged, and nothing new is taken on
  a disk that lies. A full disk (a write found no space) turns it read-only until the
  disk checker sees room again (`disk_full`). The unclean-shutdown flag is cleared at
  stop only after a final checkpoint succeeded.
- Replay restores every journaled entry, key, fence and explicit LAC before the bookie
  serves, and is persisted by a checkpoint before the old journal files may go.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque

from bk import metrics
from bk.config import BookieConfig
from bk.errors import ConfigError, CorruptedStorageError, DiskFullError, StorageError
from bk.fileio import ensure_dir
from bk.index import UNCLEAN_SHUTDOWN
from bk.journal import EXPLICIT_LAC, FENCE, MASTER_KEY, Journal, LogMark

from .adds import AddPath
from .deferred_sync import DeferredSyncTracker
from .gc import GarbageCollector
from .ledger_storage import LedgerStorage
from .limbo import LimboPath, _learn_explicit_lac
from .read_ring import ReadAheadsInFlight, RingReads, make_ring, ring_unavailable
from .read_threads import ReadThreads
from .reads import ReadPath

log = logging.getLogger(__name__)


class Bookie(AddPath, ReadPath, LimboPath):
    # The journal type the bookie writes through. Tests may give one Bookie another
    # (bk.testing.breaks: a journal broken on purpose, for the chaos runner's self-test).
    journal_class = Journal

    def __init__(self, config: BookieConfig):
        self.config = config
        self.bookie_id = config.bookie_id
        self.storage: LedgerStorage | None = None
        self.journals: list[Journal] = []
        self.deferred_sync = DeferredSyncTracker()  # what FORCE_LEDGER waits for (bk/bookie/deferred_sync.py)
        self.read_only = config.force_read_only
        self._read_only_wanted = config.force_read_only  # by the operator or the disk checker
        self._read_only_why = "force_read_only is set" if config.force_read_only else None
        self.disk_full: str | None = None  # a write found no space: why (cleared when space is back)
        self.storage_failure: str | None = None  # an fsync/write/commit failed: why (until restart)
        self.on_state_change = None  # called on the loop when read_only changes (the server re-registers)
        self.gc: GarbageCollector | None = None  # started with the storage (bk.bookie.gc)
        self.was_unclean_shutdown = False
        # BP-46: the last stop was unclean and the data-integrity check is on, so phase one
        # (mark_for_integrity_check) must complete before the unclean-shutdown flag may be
        # cleared: a start that fails or is stopped before that (metadata store down, SIGTERM)
        # leaves the flag set, or the next start would serve as if nothing had been lost.
        self.phase_one_due = False
        # True once a stop cleared the unclean-shutdown flag: its final checkpoint made
        # everything durable. A stop abandoned at its deadline (a hung fsync) never sets it,
        # and `bk bookie` exits non-zero (bk.cli.stopping.EXIT_UNCLEAN).
        self.stopped_clean = False
        self.replayed_records = 0
        self.cut_journal_tails: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._read_threads: ReadThreads | None = None
        self._ring: RingReads | None = None  # single-entry reads through io_uring (read_io)
        self._read_aheads = ReadAheadsInFlight()  # the ring's, once it runs (Bookie.read_ahead_for)
        self._write_data = config.journal_write_data
        self._full_wait_s = config.write_cache_full_wait_ms / 1000.0
        self._room_queue: deque = deque()  # add_entry_cb arguments of adds waiting for write-cache room
        self._room_task: asyncio.Task | None = None  # retries them (_retry_when_room)
        # this bookie's bookie_throttled/rejected_write_requests (the metrics are per process)
        self.adds_throttled = 0
        self.adds_rejected = 0
        self._running = False

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Open storage, replay the journals, start the writer/flush threads."""
        self._loop = asyncio.get_running_loop()
        if self.config.read_io == "ring" and (why := ring_unavailable()) is not None:
            raise ConfigError(f"read_io is 'ring' but {why}")  # before anything is opened
        await asyncio.to_thread(self._open_and_replay)
        storage = self.storage
        try:
            for i, journal in enumerate(self.journals):
                journal.on_error = lambda exc, i=i: self._storage_error_from_thread(f"journal {i}", exc)
                journal.start()
            storage.on_error = lambda exc: self._storage_error_from_thread("checkpoint", exc)
            storage.set_checkpoint_hooks(
                lambda: [j.last_mark() for j in self.journals],
                lambda marks: [j.gc(m) for j, m in zip(self.journals, marks)],
                lambda timeout_s: all(j.wait_written(timeout_s) for j in self.journals),
            )
            storage.start(self._loop)
            # Persist what replay restored, so the old journal files can go.
            await asyncio.to_thread(storage.checkpoint)
        except BaseException:
            await asyncio.to_thread(self._close_after_failed_start)
            raise
        self._read_threads = ReadThreads(self._loop, self.config.num_read_worker_threads)
        self._ring = make_ring(self._loop, self._read_threads, self.config.read_io)
        if self._ring is not None:
            self._read_aheads = self._ring.read_aheads
        self.gc = GarbageCollector(storage, self.config)
        self.gc.start(self._loop)
        self._running = True

    def _open_and_replay(self) -> None:
        cfg = self.config
        for d in (*cfg.journal_dirs, *cfg.ledger_dirs):
            ensure_dir(os.path.join(d, "current"))
        ensure_dir(cfg.resolved_index_dir)
        self.storage = storage = LedgerStorage(cfg)
        try:
            try:
                self.was_unclean_shutdown = storage.get_flag(UNCLEAN_SHUTDOWN)
            except CorruptedStorageError as e:  # BP-46: an error while checking counts as unclean
                log.error("cannot read the unclean-shutdown flag (%s): treating the last stop as unclean", e)
                self.was_unclean_shutdown = True
            if self.was_unclean_shutdown:
                log.warning("bookie %s was not shut down cleanly", self.bookie_id)
            self.phase_one_due = self.was_unclean_shutdown and cfg.data_integrity_checking
            storage.set_flag_now(UNCLEAN_SHUTDOWN, True)
            self.journals = [self.journal_class(d, cfg, loop=self._loop, index=i) for i, d in enumerate(cfg.journal_dirs)]
            start_marks = [storage.index.get_log_mark(i) or LogMark(0, 0) for i in range(len(self.journals))]
            # Until replay is persisted, a checkpoint may only record the marks we
            # started from: replaying again from them is harmless, skipping is not.
            storage.set_checkpoint_hooks(lambda: list(start_marks), lambda marks: None)
            t0 = time.monotonic()
            for journal, mark in zip(self.journals, start_marks):
                result = journal.replay(mark, self._replay_record)
                self.replayed_records += result.records
                if result.cut_tail:
                    self.cut_journal_tails.append(result.cut_tail)
            if self.replayed_records:
                log.info("replayed %d journal records in %.2fs", self.replayed_records, time.monotonic() - t0)
        except BaseException:
            storage.entry_logger.close()
            storage.close_index()
            raise

    def _close_after_failed_start(self) -> None:
        """Let go of what a failed start opened (the index's LMDB environment above all: a
        process may hold it open once, so a retried start in the same process failed on it).
        The unclean-shutdown flag stays set: nothing says this start's state is durable."""
        for journal in self.journals:
            try:
                journal.stop()
            except Exception as e:  # the start's own error is the one that counts
                log.error("stopping a journal after a failed start: %s", e)
        storage = self.storage
        try:
            storage.stop()
        except Exception as e:
            log.error("stopping the storage after a failed start: %s", e)
        storage.close_index()

    def _replay_record(self, ledger_id: int, entry_id: int, body) -> None:
        storage = self.storage
        desc = storage.get_ledger(ledger_id) or storage.create_ledger(ledger_id)
        if entry_id >= 0:
            entry = bytes(body)
            if not storage.put(ledger_id, entry_id, entry):
                storage.checkpoint()
                storage.put(ledger_id, entry_id, entry)
            desc.learn_lac(entry)
        elif entry_id == MASTER_KEY:
            if desc.master_key is None:
                storage.update_ledger(desc, master_key=bytes(body[16:]))
        elif entry_id == FENCE:
            storage.update_ledger(desc, fenced=True)
        elif entry_id == EXPLICIT_LAC:
            storage.update_ledger(desc, explicit_lac=bytes(body[16:]))
            _learn_explicit_lac(desc, body[16:])
        else:
            log.warning("skipping unknown journal meta-record %d for ledger %d", entry_id, ledger_id)

    async def stop(self) -> None:
        """Drain the journals, checkpoint, clear the unclean-shutdown flag."""
        if not self._running:
            return
        self._running = False
        if self._ring is not None:  # its reads hold entry-log files: done before they close
            self._ring.close()
        await asyncio.to_thread(self._stop_blocking)
        self.stop_reads()

    def stop_reads(self) -> None:
        """Answer the reads under way, then stop the ring and the read threads (blocking)."""
        if self._ring is not None:
            self._ring.close()
        if self._read_threads is not None:
            self._read_threads.shutdown()

    def _stop_blocking(self) -> None:
        if self.gc is not None:
            self.gc.stop()
        for journal in self.journals:
            journal.stop()
        storage = self.storage
        try:
            storage.stop()
        except StorageError as e:
            # Entries may be acknowledged (journal off) or journaled that are not in a durable
            # entry log: the flag stays set, so the next start replays the journal from the
            # persisted marks and, with the journal off, runs the BP-46 integrity check.
            log.error("bookie %s: the final checkpoint failed (%s); leaving the unclean-shutdown flag set",
                      self.bookie_id, e)
        else:
            if self.phase_one_due:
                log.warning("stopping before the data-integrity check's phase one completed: the"
                            " unclean-shutdown flag stays set, so the next start runs it again")
            else:
                try:
                    storage.set_flag_now(UNCLEAN_SHUTDOWN, False)
                    self.stopped_clean = True
                except StorageError as e:  # the flag stays set: the next start takes it as a crash
                    log.error("bookie %s: cannot clear the unclean-shutdown flag (%s)", self.bookie_id, e)
        storage.close_index()

    async def __aenter__(self) -> "Bookie":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # ------------------------------------------------------------ admin
    async def delete_ledger(self, ledger_id: int) -> bool:
        """Forget a ledger locally; durable (checkpointed) on return."""
        existed = self.storage.delete_ledger(ledger_id)
        await asyncio.to_thread(self.storage.checkpoint_deletions)
        return existed

    async def checkpoint(self) -> None:
        await asyncio.to_thread(self.storage.checkpoint)

    def set_read_only(self, read_only: bool, why: str = "set by the operator") -> None:
        """The operator's or the disk checker's wish. Writable again also ends a full disk
        (the checker saw room); it never ends a storage failure (see the module docstring)."""
        self._read_only_wanted = read_only or self.config.force_read_only
        self._read_only_why = (why if read_only else "force_read_only is set") if self._read_only_wanted else None
        if not read_only:
            self.disk_full = None
        self._update_read_only()

    def _update_read_only(self, notify: bool = True) -> None:
        read_only = self._read_only_wanted or self.disk_full is not None or self.storage_failure is not None
        if read_only != self.read_only:
            self.read_only = read_only
            log.warning("bookie %s is now %s", self.bookie_id,
                        f"read-only: {self.read_only_reason}" if read_only else "writable")
            if notify and self.on_state_change is not None:  # on the loop only
                self.on_state_change()

    @property
    def read_only_reason(self) -> str | None:
        """Why the bookie is read-only (None when writable); a storage failure first."""
        if self.storage_failure is not None:
            return f"storage failure: {self.storage_failure}"
        if self.disk_full is not None:
            return f"disk full: {self.disk_full}"
        return self._read_only_why if self.read_only else None

    def _storage_error_from_thread(self, where: str, exc: StorageError) -> None:
        """The journal writer or the flush thread reports a failed write/fsync/commit."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self._storage_error(where, exc, notify=False)
            return
        try:
            loop.call_soon_threadsafe(self._storage_error, where, exc)
        except RuntimeError:  # the loop closed meanwhile: nobody left to tell
            self._storage_error(where, exc, notify=False)

    def _storage_error(self, where: str, exc: StorageError, notify: bool = True) -> None:
        metrics.STORAGE_ERRORS.inc()
        if isinstance(exc, DiskFullError):
            if self.disk_full is None:
                log.error("bookie %s: %s found the disk full (%s); read-only until the disk checker sees room",
                          self.bookie_id, where, exc)
            self.disk_full = f"{where}: {exc}"
        elif self.storage_failure is None:
            log.error("bookie %s: %s failed (%s); read-only until restarted (docs/DISK-FAULTS.md)",
                      self.bookie_id, where, exc)
            self.storage_failure = f"{where}: {exc}"
        self._update_read_only(notify)

    def stats(self) -> dict:
        return {**self.storage.stats(), "read_only": self.read_only, "adds_throttled": self.adds_throttled,
                "adds_rejected": self.adds_rejected}


