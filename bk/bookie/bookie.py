"""Bookie: the async facade the server calls; the only bridge between the event
loop and the storage threads (journal writers, flush thread, read workers).

Rules kept here (REPLICATION.md, "Rules a bookie must keep"):
- An add is acknowledged only after the journal group holding it is fsynced
  (journal on), or once it is in the write cache (journal off, BP-46 mode).
- A fence is journaled and durable before `fence_ledger` returns; a fencing of
  an unknown ledger creates it, fenced.
- Fence and add are serialized per ledger: both run their checks on the loop
  thread and go through the same journal, so an add accepted before a fence is
  journaled (and acknowledged) before the fence; an add that had to wait for
  write-cache space checks the fence again when it resumes.
- Master keys are set once by the first add/fence/LAC write and compared in
  constant time; a mismatch is EUA and changes nothing.
- Explicit negatives (ENOLEDGER/ENOENTRY) are never answered for a ledger in
  limbo: those become EUNKNOWNLEDGERSTATE.
- Disk faults (docs/DISK-FAULTS.md): a failed fsync, write or index commit (journal,
  entry log, checkpoint) turns the bookie read-only for good (`storage_failure`, until
  a restart): the affected adds were never acknowledged, and nothing new is taken on
  a disk that lies. A full disk (a write found no space) turns it read-only until the
  disk checker sees room again (`disk_full`). The unclean-shutdown flag is cleared at
  stop only after a final checkpoint succeeded.
"""
from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from collections import deque
from hmac import compare_digest
from operator import itemgetter

from bk import metrics
from bk._native import load
from bk.config import BookieConfig
from bk.errors import (BadRequestError, BookieError, BookieReadOnlyError, ConfigError, CorruptedStorageError, DiskFullError,
                       LedgerFencedError, LedgerLimboError, NoSuchEntryError, NoSuchLedgerError, StorageError,
                       TooManyRequestsError, UnauthorizedAccessError)
from bk.fileio import ensure_dir
from bk.index import NEEDS_INTEGRITY_CHECK, UNCLEAN_SHUTDOWN
from bk.journal import EXPLICIT_LAC, FENCE, MASTER_KEY, Journal, LogMark, meta_body
from bk.proto.constants import FLAG_RECOVERY_ADD
from bk.proto.layout import FLAG_DEFERRED_SYNC, PROTOCOL_VERSION_V3
from bk.proto.layout import ENTRY_IDS_LAC, IDS, LAC_HEADER_LENGTH

from .deferred_sync import DeferredSyncTracker
from .gc import GarbageCollector
from .ledger_storage import LedgerStorage
from .read_ring import RingReads, make_ring, ring_unavailable
from .read_threads import ReadThreads

log = logging.getLogger(__name__)

_ENTRY_HEADER = ENTRY_IDS_LAC  # ledger id, entry id, piggybacked LAC
# fields of an AddRequest-shaped tuple: flags, master_key, ledger_id, entry_id, body, version
_ENTRY_ID, _BODY = itemgetter(3), itemgetter(4)
_scan_add_run = load("codec").scan_add_run


def _complete_future(fut: asyncio.Future, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)


def _run_done(run, err) -> None:
    """Journal completion of an add_entries_cb run: every accepted request at once."""
    cb, ctx, reqs = run
    cb(ctx, reqs, err)


def _one_done(one, err) -> None:
    """add_entry_cb completion of one request of an add_entries_cb run."""
    cb, ctx, req = one
    cb(ctx, [req], err)


def _learn_explicit_lac(desc, lac_buf) -> None:
    """An explicit LAC (`ledger_id(8) lac(8) digest`, key-checked: it is the writer's) raises the LAC
    the bookie knows, as a piggybacked one does: long polls and READ -1 answers' maxLAC see it."""
    if len(lac_buf) >= LAC_HEADER_LENGTH:
        ledger_id, lac = IDS.unpack_from(lac_buf)
        if ledger_id == desc.ledger_id and lac > desc.lac:  # the decoders check both ids; callers may not
            desc.lac = lac


def _ignore(ctx, err) -> None:
    if err is not None:
        log.error("journal meta-record failed: %s", err)


class Bookie:
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
        self._write_data = config.journal_write_data
        self._forget_fence = config.test_break == "forget-fence"  # BROKEN ON PURPOSE: chaos self-tests only
        self._full_wait_s = config.write_cache_full_wait_ms / 1000.0
        self._room_queue: deque = deque()  # add_entry_cb arguments of adds waiting for write-cache room
        self._room_task: asyncio.Task | None = None  # retries them (_retry_when_room)
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
            self.journals = [Journal(d, cfg, loop=self._loop, index=i) for i, d in enumerate(cfg.journal_dirs)]
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

    def _journal(self, ledger_id: int) -> Journal:
        journals = self.journals
        return journals[ledger_id % len(journals)] if len(journals) > 1 else journals[0]

    # ------------------------------------------------------------ adds
    def add_entry_cb(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                     recovery: bool, cb, ctx, _deadline: float = 0.0) -> None:
        """Add an entry; `cb(ctx, err)` runs once on the loop (maybe synchronously).

        This is the bookie's hottest Python path: keep it to one header unpack,
        one dict lookup, one key compare and one cache put before the journal.
        """
        try:
            try:
                body_ledger, body_entry, lac = _ENTRY_HEADER.unpack_from(entry)
            except struct.error:
                raise BadRequestError("entry shorter than its 24-byte header",
                                      ledger_id=ledger_id, entry_id=entry_id) from None
            if body_ledger != ledger_id or body_entry != entry_id:
                raise BadRequestError("entry body does not match its ledger/entry id",
                                      ledger_id=ledger_id, entry_id=entry_id)
            if entry_id < 0:
                raise BadRequestError("negative entry id on an add", ledger_id=ledger_id, entry_id=entry_id)
            if self.read_only and not recovery:  # recovery adds still land (re-replication, recovery)
                raise BookieReadOnlyError(ledger_id=ledger_id, entry_id=entry_id)
            storage = self.storage
            desc = storage.get_ledger(ledger_id)
            if desc is None:
                desc = storage.create_ledger(ledger_id)
            stored_key = desc.master_key
            if stored_key is None:
                self._store_key(desc, master_key)
            elif not compare_digest(stored_key, master_key):
                raise UnauthorizedAccessError(ledger_id=ledger_id)
            if desc.fenced and not recovery:
                raise LedgerFencedError(ledger_id=ledger_id)
            if not storage.put(ledger_id, entry_id, entry):
                if not _deadline:
                    _deadline = time.monotonic() + self._full_wait_s
                    metrics.THROTTLED_WRITE_REQUESTS.inc()
                elif time.monotonic() >= _deadline:
                    metrics.REJECTED_WRITE_REQUESTS.inc()
                    raise TooManyRequestsError("write cache full: the bookie cannot flush fast enough",
                                               ledger_id=ledger_id, entry_id=entry_id)
                self._wait_for_room((ledger_id, entry_id, entry, master_key, recovery, cb, ctx, _deadline))
                return
            if lac > desc.lac:
                desc.lac = lac
        except BookieError as err:
            cb(ctx, err)
            return
        if self._write_data:
            journals = self.journals
            (journals[0] if len(journals) == 1 else journals[ledger_id % len(journals)]).log(entry, cb, ctx)
        else:
            cb(ctx, None)

    def add_entries_cb(self, reqs: list, cb, ctx) -> None:
        """Add a run of ADD requests of one connection (arrival order): the batch twin of
        add_entry_cb, doing the per-ledger work once per run instead of once per entry.

        `reqs` are AddRequest-shaped tuples `(flags, master_key, ledger_id, entry_id,
        body, version)`; a body that is not `bytes` is added alone (add_entry_cb).
        Every request is completed exactly once, on the loop, through
        `cb(ctx, done, err)` where `done` lists requests sharing the outcome `err`:
        - requests a check refuses: at once (with the rest of their segment, see
          below), with the error add_entry_cb gives (same checks in the same
          order); nothing of them is stored;
        - the accepted ones: one call per journal once the last of them is durable
          (one log_many), or at once (journal off); in arrival order per ledger;
        - from the first request whose write-cache put finds both halves full on,
          the rest of the run goes through add_entry_cb one by one (wait for room,
          then ETOOMANYREQUESTS), completed alone.

        Invariants kept: a ledger's first key is journaled (by _store_key, at the
        first request that presents it) before any entry of the run is queued; every
        entry is in the write cache before its journal record is queued (all puts
        come before the log_many calls); fence and key state cannot change during
        the run (it is synchronous on the loop), so they are read once per ledger
        and a key object already compared equal for a ledger needs no new compare.
        """
        if self.read_only:  # rare: keep add_entry_cb's order of checks per request
            self._add_one_by_one(reqs, cb, ctx)
            return
        storage = self.storage
        # ledger_id -> [desc, accepted requests, highest lac, key object known good, deferred sync]
        groups: dict = {}
        # The kernel checks every entry header (ids, length) and splits the run into
        # segments of one ledger, one key object and one recovery flag (with their top
        # LAC): what is left per segment is the ledger's key and fence check.
        for start, end, top_lac in _scan_add_run(reqs):
            if top_lac is None:  # a bad request (add_entry_cb answers its EBADREQ) or a non-bytes body
                self._add_one_by_one(reqs[start:end], cb, ctx)
                continue
            flags, key, ledger_id = reqs[start][:3]
            # v3 writeFlags DEFERRED_SYNC on every request of the segment (a mixed one is made durable)
            deferred = bool(flags & FLAG_DEFERRED_SYNC) and all(
                r[0] & FLAG_DEFERRED_SYNC and len(r) > 5 and r[5] == PROTOCOL_VERSION_V3 for r in reqs[start:end])
            group = groups.get(ledger_id)
            if group is None:
                desc = storage.get_ledger(ledger_id)
                if desc is None:
                    desc = storage.create_ledger(ledger_id)
                group = groups[ledger_id] = [desc, [], -1, None, deferred]
            elif not deferred:
                group[4] = False
            desc = group[0]
            try:
                if key is not group[3]:
                    stored_key = desc.master_key
                    if stored_key is None:
                        self._store_key(desc, key)
                    elif not compare_digest(stored_key, key):
                        raise UnauthorizedAccessError(ledger_id=ledger_id)
                    group[3] = key
                if desc.fenced and not flags & FLAG_RECOVERY_ADD:
                    raise LedgerFencedError(ledger_id=ledger_id)
            except BookieError as err:
                cb(ctx, reqs[start:end], err)
                continue
            group[1] += reqs[start:end]
            if top_lac > group[2]:
                group[2] = top_lac
        if groups:
            self._store_and_log(groups, cb, ctx)

    def _store_and_log(self, groups: dict, cb, ctx) -> None:
        """add_entries_cb's second half: write-cache puts per ledger, then one journal
        call per journal (or the completion at once, journal off), then the fallback."""
        storage = self.storage
        journals = self.journals
        runs: dict = {}  # (journal index, deferred sync) -> [bodies, requests, ledger ids]
        rest: list = []  # requests left to add_entry_cb once a put found the cache full
        for ledger_id, (desc, accepted, top_lac, _key, deferred) in groups.items():
            if not accepted:
                continue
            if rest:
                rest += accepted
                continue
            bodies = list(map(_BODY, accepted))
            stored = storage.put_many(ledger_id, list(map(_ENTRY_ID, accepted)), bodies)
            if stored < len(accepted):
                rest += accepted[stored:]
                accepted, bodies = accepted[:stored], bodies[:stored]
                if not accepted:
                    continue
                top_lac = max(_ENTRY_HEADER.unpack_from(b)[2] for b in bodies)
            if top_lac > desc.lac:
                desc.lac = top_lac
            index = ledger_id % len(journals) if len(journals) > 1 else 0  # as _journal()
            run = runs.get((index, deferred))
            if run is None:
                runs[index, deferred] = [bodies, accepted, [ledger_id]]
            else:
                run[0] += bodies
                run[1] += accepted
                run[2].append(ledger_id)
        for (index, deferred), (bodies, accepted, ledger_ids) in runs.items():
            if not self._write_data:
                cb(ctx, accepted, None)
                continue
            try:
                if deferred:  # acknowledged once queued, before the fsync; FORCE_LEDGER waits for it
                    tracker = self.deferred_sync
                    journals[index].log_many(bodies, tracker.done, tracker.logged(index, ledger_ids))
                    cb(ctx, accepted, None)
                else:
                    journals[index].log_many(bodies, _run_done, (cb, ctx, accepted))
            except BookieError as err:  # nothing of the run was queued
                cb(ctx, accepted, err)
        if rest:
            self._add_one_by_one(rest, cb, ctx)

    async def force_ledger(self, ledger_id: int) -> None:
        """FORCE_LEDGER: once every deferred-sync add of the ledger acknowledged before the call is
        durable in the journal (bk/bookie/deferred_sync.py). Other adds are acknowledged only once
        durable, so there is nothing to wait for (nor without the journal: journal_write_data false
        makes no add durable before a checkpoint, forced or not - as BookKeeper's forceLedger)."""
        await self.deferred_sync.wait(ledger_id)

    def _add_one_by_one(self, reqs: list, cb, ctx) -> None:
        for req in reqs:
            flags, key, ledger_id, entry_id, body = req[:5]
            self.add_entry_cb(ledger_id, entry_id, body, key, bool(flags & FLAG_RECOVERY_ADD),
                              _one_done, (cb, ctx, req))

    def _store_key(self, desc, master_key: bytes) -> None:
        """First key for a ledger: remember it and journal it (before any entry of it)."""
        desc.check_key(master_key)  # length check
        self.storage.update_ledger(desc, master_key=bytes(master_key))
        self._journal(desc.ledger_id).log(meta_body(desc.ledger_id, MASTER_KEY, master_key), _ignore, None)

    def _wait_for_room(self, args: tuple) -> None:
        """An add that found both write-cache halves full waits in a queue as its arguments
        only: a task each cost ~3 KiB, so a flood of small adds (20,000 waiting per
        connection) held far more than their bytes (docs/OVERLOAD.md)."""
        self._room_queue.append(args)
        if self._room_task is None:
            self._room_task = self._loop.create_task(self._retry_when_room())

    async def _retry_when_room(self) -> None:
        """Once a flush frees a half, or the oldest waiting add's deadline passed, every
        waiting add is tried once more in arrival order through add_entry_cb: everything
        is checked again (fence included: the ledger may have been fenced while the add
        waited, and then it must not be acknowledged); one that still finds no room
        queues itself again, or is refused with ETOOMANYREQUESTS past its deadline."""
        queue = self._room_queue
        try:
            while queue:
                await self.storage.wait_for_room(max(0.0, queue[0][-1] - time.monotonic()))
                for _ in range(len(queue)):
                    self.add_entry_cb(*queue.popleft())
        finally:
            self._room_task = None

    async def add_entry(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                        recovery: bool = False) -> None:
        fut = self._loop.create_future()
        self.add_entry_cb(ledger_id, entry_id, entry, master_key, recovery, _complete_future, fut)
        await fut

    # ------------------------------------------------------------ fencing, LAC, limbo
    def _key_checked(self, ledger_id: int, master_key: bytes, create: bool):
        storage = self.storage
        desc = storage.get_ledger(ledger_id)
        if desc is None:
            if not create:
                raise NoSuchLedgerError(ledger_id=ledger_id)
            desc = storage.create_ledger(ledger_id)
        if desc.check_key(master_key):
            self._store_key(desc, master_key)
        return desc

    async def fence_ledger(self, ledger_id: int, master_key: bytes) -> None:
        """Fence (idempotent); returns once the fence is durable."""
        desc = self._key_checked(ledger_id, master_key, create=True)
        if self._forget_fence:
            return  # config.test_break = "forget-fence": answer the fence, keep accepting adds
        if desc.fenced:
            if desc.fence_pending is not None:
                await asyncio.shield(desc.fence_pending)
            return
        self.storage.update_ledger(desc, fenced=True)
        fut = self._loop.create_future()
        desc.fence_pending = fut
        self._journal(ledger_id).log(meta_body(ledger_id, FENCE, b""), _complete_future, fut)
        try:
            await asyncio.shield(fut)
        finally:
            if desc.fence_pending is fut and fut.done():
                desc.fence_pending = None

    async def write_lac(self, ledger_id: int, master_key: bytes, lac_buf: bytes) -> None:
        if self.read_only:  # refused like an add (BookKeeper)
            raise BookieReadOnlyError(ledger_id=ledger_id)
        desc = self._key_checked(ledger_id, master_key, create=True)
        self.storage.update_ledger(desc, explicit_lac=bytes(lac_buf))
        _learn_explicit_lac(desc, lac_buf)  # wakes the long polls waiting on it (BookKeeper's setExplicitLac)
        fut = self._loop.create_future()
        self._journal(ledger_id).log(meta_body(ledger_id, EXPLICIT_LAC, lac_buf), _complete_future, fut)
        await fut

    def read_lac(self, ledger_id: int) -> bytes | None:
        """The explicit LAC buffer last written, or None. In limbo the bookie may have lost a
        later one, so even a stored LAC is no answer: EUNKNOWNLEDGERSTATE."""
        desc = self._existing(ledger_id)
        if desc.limbo:
            raise LedgerLimboError(ledger_id=ledger_id)
        return desc.explicit_lac

    def last_add_confirmed(self, ledger_id: int) -> int:
        """The highest LAC piggybacked on any entry this bookie received (-1 if none)."""
        desc = self._existing(ledger_id)
        if desc.limbo:
            raise LedgerLimboError(ledger_id=ledger_id)
        return desc.lac

    def wait_for_lac_update(self, ledger_id: int, previous_lac: int, watcher):
        """BookKeeper's waitForLastAddConfirmedUpdate: `watcher(lac)` is called once, from the add
        path, when the ledger's LAC passes previous_lac (LedgerDescriptor.wait_for_lac_update).
        Returns the descriptor it waits on (cancel there), or None when the LAC already passed.
        Raises as last_add_confirmed does (ENOLEDGER; EUNKNOWNLEDGERSTATE in limbo)."""
        desc = self._existing(ledger_id)
        if desc.limbo:
            raise LedgerLimboError(ledger_id=ledger_id)
        return desc if desc.wait_for_lac_update(previous_lac, watcher) else None

    # ------------------------------------------------------------ BP-46 integrity check
    @property
    def needs_integrity_check(self) -> bool:
        """Set by phase one, cleared once phase two found every ledger whole (survives restarts)."""
        return self.storage.get_flag(NEEDS_INTEGRITY_CHECK)

    async def mark_for_integrity_check(self, ledgers, unfenced=()) -> int:
        """Phase one's local half (REPLICATION.md, "Running without the journal").

        `ledgers`: (ledger_id, master_key or None) of every ledger whose metadata names this
        bookie. Each is created if this bookie has no record of it (with the key the metadata
        yields, or with none: the first key a client presents is then stored), and is fenced
        and put in limbo; those in `unfenced` (open ledgers whose last ensemble left this
        bookie: their writer is alive elsewhere, bk.server.integrity) only in limbo, so they
        answer no false negative and their writer is not fenced out. Limbo without a fence
        keeps the rule that an EUNKNOWNLEDGERSTATE answer to a fencing read proves the fence:
        a fencing read fences before it reads. The needs-integrity-check flag goes first, then everything is made
        durable by one checkpoint (not one per ledger: a cluster may hold 100,000). Until that
        checkpoint returns the caller must not serve: a crash before it leaves the
        unclean-shutdown flag set, so the next boot runs phase one again."""
        await asyncio.to_thread(self.storage.set_flag_now, NEEDS_INTEGRITY_CHECK, True)
        storage = self.storage
        unfenced = set(unfenced)
        count = 0
        for ledger_id, key in ledgers:
            desc = storage.get_ledger(ledger_id) or storage.create_ledger(ledger_id)
            marks = dict(limbo=True) if ledger_id in unfenced else dict(fenced=True, limbo=True)
            if desc.master_key is None and key is not None:
                desc.check_key(key)  # length check
                marks["master_key"] = bytes(key)
            storage.update_ledger(desc, **marks)
            count += 1
        await asyncio.to_thread(storage.checkpoint)
        self.phase_one_due = False  # durable: a clean stop may clear the unclean-shutdown flag now
        return count

    async def stored_entry_ids(self, ledger_id: int) -> list[int]:
        """Every entry id of the ledger this bookie stores, ascending. Costs what is stored, never
        the span of the ids (one entry at id 2**62 is one id). The write cache is read before
        and after the index (on the loop, its owner): an entry that moves from the cache to the
        index meanwhile is seen in one of the three."""
        storage = self.storage
        ids = set(storage.cached_entry_ids(ledger_id))
        ids.update(await asyncio.to_thread(storage.index.entry_ids, ledger_id))
        ids.update(storage.cached_entry_ids(ledger_id))
        return sorted(ids)

    def missing_entries(self, ledger_id: int, entry_ids) -> list[int]:
        """Those of `entry_ids` this bookie does not store, or stored in an entry log that is
        gone (blocking: call from a thread)."""
        return self.storage.missing_entries(ledger_id, entry_ids)

    @property
    def log_check(self):
        """What the start found of the entry logs the index names (bk.bookie.log_check)."""
        return self.storage.log_check

    async def clear_limbo(self, ledger_ids) -> None:
        """Phase two found these ledgers whole: answer explicit negatives for them again.
        Durable on return. The copied entries are in the write cache (visible to reads) before
        limbo clears in memory, and the cleared state is persisted by the same checkpoint that
        writes them (or a later one), so a cleared limbo never stands in front of an entry a
        crash could still take. A read that began while in limbo looks again (read_entry)."""
        storage = self.storage
        for ledger_id in ledger_ids:
            desc = storage.get_ledger(ledger_id)
            if desc is not None and desc.limbo:
                storage.update_ledger(desc, limbo=False)
        await asyncio.to_thread(storage.checkpoint)

    async def finish_integrity_check(self) -> None:
        """Every ledger is whole: clear the bookie-wide flag (after a checkpoint)."""
        await asyncio.to_thread(self.storage.checkpoint)
        await asyncio.to_thread(self.storage.set_flag_now, NEEDS_INTEGRITY_CHECK, False)

    def limbo_ledgers(self) -> list[int]:
        storage = self.storage
        return [lid for lid in storage.ledger_ids() if (d := storage.get_ledger(lid)) is not None and d.limbo]

    # ------------------------------------------------------------ reads
    def _existing(self, ledger_id: int):
        desc = self.storage.get_ledger(ledger_id)
        if desc is None:
            raise NoSuchLedgerError(ledger_id=ledger_id)
        return desc

    def ledger_exists(self, ledger_id: int) -> bool:
        return self.storage.get_ledger(ledger_id) is not None

    def is_fenced(self, ledger_id: int) -> bool:
        desc = self.storage.get_ledger(ledger_id)
        return desc is not None and desc.fenced

    def is_limbo(self, ledger_id: int) -> bool:
        desc = self.storage.get_ledger(ledger_id)
        return desc is not None and desc.limbo

    def last_entry_id(self, ledger_id: int) -> int | None:
        self._existing(ledger_id)
        return self.storage.last_entry_id(ledger_id)

    def read_cached(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The entry if a cache holds it (no I/O), else None: the server's fast path."""
        if self.storage.get_ledger(ledger_id) is None:
            return None
        return self.storage.get_cached(ledger_id, entry_id)

    def _read_failed(self, ledger_id: int, entry_id: int, e: StorageError) -> None:
        if isinstance(e, CorruptedStorageError):
            metrics.READ_ENTRY_CORRUPTED.inc()
        else:
            metrics.STORAGE_ERRORS.inc()
        log.error("bookie %s: ledger %d entry %d cannot be read: %s", self.bookie_id, ledger_id, entry_id, e)

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored entry: bytes, or a read-only view of a read-ahead's buffer (never written
        again); entry_id -1 = the last entry this bookie has."""
        desc = self._existing(ledger_id)
        storage = self.storage
        if entry_id < 0:
            if entry_id != -1:
                raise BadRequestError("negative entry id on a read", ledger_id=ledger_id, entry_id=entry_id)
            if desc.limbo:  # the true last entry may be one this bookie lost
                raise LedgerLimboError(ledger_id=ledger_id)
            last = storage.last_entry_id(ledger_id)
            if last is None:
                raise NoSuchEntryError(ledger_id=ledger_id, entry_id=-1)
            entry_id = last
        while True:
            # Limbo is read before the lookup: the BP-46 repair stores its copies and then
            # clears limbo while a lookup may be running in a read thread, so a miss only
            # proves "no such entry" if limbo was already clear when the lookup began
            # (seed 10023 of the journal-off random test answered ENOENTRY without this).
            limbo_before = desc.limbo
            try:
                if self._ring is not None:  # its steps look in the caches first, here on the loop
                    ahead = self.read_ahead_for(ledger_id, entry_id)
                    if ahead is not None:  # a read-ahead in flight brings it: wait, not read it twice
                        await asyncio.wait((ahead,))
                        entry = storage.get_cached(ledger_id, entry_id)
                        if entry is not None:
                            return entry
                    entry = await self._ring.run(storage.read_steps(ledger_id, entry_id), storage.read_ahead_span)
                else:
                    entry = storage.get_cached(ledger_id, entry_id)
                    if entry is None:
                        entry = await self._read_threads.submit(storage.read_from_storage, ledger_id, entry_id)
            except StorageError as e:  # EIO, never ENOENTRY: the reader asks another replica
                self._read_failed(ledger_id, entry_id, e)
                raise
            if entry is not None:
                return entry
            if desc.limbo:
                raise LedgerLimboError(ledger_id=ledger_id, entry_id=entry_id)
            if not limbo_before:
                raise NoSuchEntryError(ledger_id=ledger_id, entry_id=entry_id)
            # limbo was cleared during the lookup: what the repair stored is visible now

    def read_ahead_for(self, ledger_id: int, entry_id: int) -> asyncio.Future | None:
        """The future of a read-ahead in flight that will bring entry_id into the read cache, or
        None. A reader waiting on one is a scan: the read of what follows the run starts now
        (RingReads.follow, once per run). Only with the ring (read_io): the read threads' path
        reads its entry itself."""
        ring = self._ring
        run = ring.read_aheads.covering(ledger_id, entry_id) if ring is not None else None
        if run is None:
            return None
        if not run[3]:
            ring.follow(run, self.storage.read_steps(ledger_id, run[1] + 1), self.storage.read_ahead_span)
        return run[2]

    async def read_span(self, ledger_id: int, entry_id: int, max_count: int, max_bytes: int):
        """Entries entry_id.. that only the entry logs hold, back to back in one log, as a span of
        it (LedgerStorage.read_span), or None: then read_entry reads them (caches, limbo, "no
        such entry" are its to decide)."""
        self._existing(ledger_id)
        try:
            return await self._read_threads.submit(self.storage.read_span, ledger_id, entry_id, max_count, max_bytes,
                                                   discard=_release_span)
        except StorageError as e:  # EIO, never ENOENTRY: the reader asks another replica
            self._read_failed(ledger_id, entry_id, e)
            raise

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
        return {**self.storage.stats(), "read_only": self.read_only}


def _release_span(span) -> None:
    """A span read for a BATCH_READ whose request was cancelled meanwhile: its buffer and fd
    reference go back (ReadThreads' discard)."""
    span.release()
