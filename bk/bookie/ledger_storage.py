"""LedgerStorage: write cache -> entry log -> index, with checkpoints.

Invariants this module keeps:
- Every entry put before `checkpoint()` starts is, when it returns, in an
  fsynced entry log and in a committed index transaction.
- A checkpoint persists, in the same LMDB transaction as the entry locations,
  the journal log marks captured at the moment the write cache half was swapped.
  Adds put an entry into the cache *before* journaling it, so every journal
  record before those marks has its entry in the swapped half (or an earlier
  one): replay from the marks never misses an acknowledged entry.
- Only the owner (event loop) thread mutates the write cache and ledger state,
  and only it swaps halves: the flush thread asks it to (`_on_owner`). So the
  snapshot of dirty ledger state taken at a swap holds every change journaled
  before the captured marks, and the add path needs no lock.
- A failed flush keeps its half (`_pending`) and retries it; nothing is dropped.
  While it cannot flush, adds fill the other half and then get ETOOMANYREQUESTS.
  A retry after a failed fsync writes the half again into a new entry log (the
  entry logger never fsyncs a log whose fsync failed): the proof of durability
  comes from a fresh write and fsync of bytes still held in memory, never from
  a second fsync of the same file (fsyncgate, docs/DISK-FAULTS.md). Every failure
  is reported to `on_error(exc)` (the Bookie turns read-only and says why).

Threads: the owner (event loop) thread puts entries, changes ledger state and
swaps halves; the flush thread runs checkpoints (LMDB write transactions live
there while it runs); read workers call `read_from_storage`. Before `start()`
(replay) the thread that calls is the owner.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from bk import _native, fileio, metrics
from bk.config import BookieConfig
from bk.entrylog import EntryLogger, reads
from bk.entrylog.spans import BufferSpan, FileSpan
from bk.errors import StorageError
from bk.index import Index, LedgerState

from . import flush_pacing as pacing
from .ledger_descriptor import LedgerDescriptor
from .log_check import check_entry_logs, is_dead
from .write_cache import ReadCache, ReadRuns, WriteCache

log = logging.getLogger(__name__)
_entrylog = _native.load("entrylog")

READ_AHEAD_MAX_BYTES = (1 << 20) + (1 << 18)
# A read-ahead that continues a scan asks the kernel to fetch this much after it
# (POSIX_FADV_WILLNEED), so the scan's next read-ahead finds its bytes in the page cache.
READ_AHEAD_HINT_BYTES = 4 << 20
class _PendingFlush:
    __slots__ = ("half", "marks", "dirty")

    def __init__(self, half: WriteCache, marks: list, dirty: dict):
        self.half = half
        self.marks = marks
        self.dirty = dirty  # ledger_id -> LedgerState, or None for a deleted ledger


class LedgerStorage:
    def __init__(self, config: BookieConfig):
        self.config = config
        self._half_bytes = config.write_cache_max_size_bytes // 2
        self.index = Index(config.resolved_index_dir, config)
        try:
            # Before the entry logger opens a log: which logs the index names and whether they
            # still hold it (bk.bookie.log_check), and no new log takes a named id.
            self.log_check = check_entry_logs(self.index, config.ledger_dirs, config.max_frame_size_bytes)
            self._dead_from = self.log_check.dead_from  # log id -> offsets gone from there on
            self.entry_logger = EntryLogger(config.ledger_dirs, config,
                                            first_log_id=self.log_check.highest_log_id + 1)
        except BaseException:
            self.index.close()
            raise
        self.entry_logger.behind = self._checkpoint_behind
        self.read_cache = ReadCache(config.read_cache_max_size_bytes)
        self._read_runs = ReadRuns()
        self._owner_thread: int | None = None
        self._checkpoint_lock = threading.Lock()
        self._active = WriteCache(self._half_bytes)
        self._pending: _PendingFlush | None = None
        self._ledgers: dict[int, LedgerDescriptor] = {
            lid: LedgerDescriptor(lid, st) for lid, st in self.index.ledgers()
        }
        # get_ledger is the hottest lookup (every add): bind the dict's get directly.
        # _ledgers is never rebound, so the bound method stays valid.
        self.get_ledger = self._ledgers.get
        self._dirty: dict[int, LedgerDescriptor | None] = {}
        self._mark_source: Callable[[], list] = lambda: []
        self._after_checkpoint: Callable[[list], None] = lambda marks: None
        self._journals_written: Callable[[float], bool] = lambda timeout_s: True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._room_waiters: list[asyncio.Future] = []
        self._flush_event = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.last_checkpoint_error: BaseException | None = None
        self.on_error: Callable[[StorageError], None] | None = None  # any thread; see the docstring
        self.checkpoints = 0
        self._last_marks: list | None = None

    # ------------------------------------------------------------ lifecycle
    def set_checkpoint_hooks(self, mark_source: Callable[[], list], after: Callable[[list], None],
                             journals_written: Callable[[float], bool] | None = None) -> None:
        """mark_source() -> journal log marks now; after(marks) once they are persisted;
        journals_written(timeout_s) blocks until what the journals had queued is written."""
        self._mark_source = mark_source
        self._after_checkpoint = after
        if journals_written is not None:
            self._journals_written = journals_written

    def checkpoint_deletions(self, timeout_s: float = 30.0) -> None:
        """Make ledgers deleted so far durable (blocking, not on the loop): first every
        journal record queued before now is written, so the checkpoint's marks lie after
        the deleted ledgers' records and a replay never creates them again; then a
        checkpoint and an index sync."""
        if not self._journals_written(timeout_s):
            raise StorageError(f"the journal did not write its queued records within {timeout_s:.0f}s; "
                               "the deletion is not made durable")
        self.checkpoint()
        self.sync_index()

    def start(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Start the flush thread; the calling thread (running `loop`) becomes the owner."""
        self._loop = loop
        self._owner_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._flush_loop, name="bk-flush", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the flush thread after a final checkpoint; close files."""
        if self._thread is not None:
            self._stopping = True
            self._flush_event.set()
            self._thread.join()
            self._thread = None
        try:
            self.checkpoint()
        except BaseException:
            try:  # close the files anyway; the checkpoint's error is the one that counts
                self.entry_logger.close()
            except StorageError as e:
                log.error("closing the entry logger after a failed checkpoint: %s", e)
            raise
        self.entry_logger.close()

    def close_index(self) -> None:
        self.index.close()

    # ------------------------------------------------------------ ledger state
    def get_ledger(self, ledger_id: int) -> LedgerDescriptor | None:
        # __init__ shadows this with the dict's own get (same result, one Python
        # call less on every add); kept for documentation and subclasses.
        return self._ledgers.get(ledger_id)

    def ledger_ids(self) -> list[int]:
        return list(self._ledgers)

    # The methods below run on the owner thread only.
    def create_ledger(self, ledger_id: int) -> LedgerDescriptor:
        desc = self._ledgers.get(ledger_id)
        if desc is None:
            desc = self._ledgers[ledger_id] = LedgerDescriptor(ledger_id)
            self._dirty[ledger_id] = desc
        return desc

    def update_ledger(self, desc: LedgerDescriptor, **changes) -> None:
        """Change persisted fields of a ledger (master_key, fenced, limbo, explicit_lac)."""
        for name, value in changes.items():
            setattr(desc, name, value)
        self._dirty[desc.ledger_id] = desc

    def delete_ledger(self, ledger_id: int) -> bool:
        existed = self._ledgers.pop(ledger_id, None) is not None
        self._active.delete_ledger(ledger_id)
        self._dirty[ledger_id] = None
        self.read_cache.delete_ledger(ledger_id)
        self._read_runs.forget(ledger_id)
        return existed

    # ------------------------------------------------------------ writes
    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> bool:
        """Put an entry in the write cache (owner thread); False when both halves are full."""
        if self._active.put(ledger_id, entry_id, entry):
            return True
        if self._pending is not None:
            return False
        self._swap()
        self._flush_event.set()
        return self._active.put(ledger_id, entry_id, entry)  # an empty half takes any entry

    def put_many(self, ledger_id: int, entry_ids: list, entries: list) -> int:
        """put() for each entry of one ledger in order, stopping at the first that finds
        both halves full; returns how many were stored (owner thread)."""
        stored = self._active.put_many(ledger_id, entry_ids, entries)
        if stored == len(entries) or self._pending is not None:
            return stored
        self._swap()  # as put(): the marks are read before the swap
        self._flush_event.set()
        # the fresh half takes at least the next entry (an empty half takes any entry)
        return stored + self._active.put_many(ledger_id, entry_ids[stored:], entries[stored:])

    def _swap(self) -> None:
        marks = self._mark_source()  # read before the swap: see module docstring
        dirty = {lid: (d.state() if d is not None else None) for lid, d in self._dirty.items()}
        self._dirty = {}
        self._pending = _PendingFlush(self._active, marks, dirty)
        self._active = WriteCache(self._half_bytes)

    async def wait_for_room(self, timeout_s: float) -> bool:
        """On the owner loop: wait until a flush frees a half (or timeout)."""
        if self._pending is None:
            return True
        fut = asyncio.get_running_loop().create_future()
        self._room_waiters.append(fut)
        # Many adds can wait at once: set the event only when it is not set (seen set,
        # the flush thread has yet to run the checkpoint that flushes the pending half).
        if not self._flush_event.is_set():
            self._flush_event.set()
        try:
            async with asyncio.timeout(timeout_s):
                await fut
        except asyncio.TimeoutError:
            return self._pending is None
        return True

    def _wake_room_waiters(self) -> None:
        waiters, self._room_waiters = self._room_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------ checkpoint
    def request_checkpoint(self) -> None:
        self._flush_event.set()

    def checkpoint(self) -> None:
        """Flush everything put so far; persist marks and ledger state. Blocking."""
        with self._checkpoint_lock:
            pending = self._pending
            if pending is not None:
                self._flush(pending)
            pending = self._on_owner(self._swap_for_checkpoint)
            if pending is not None:
                self._flush(pending)

    def _swap_for_checkpoint(self) -> _PendingFlush | None:
        if self._pending is not None:  # put() swapped since
            return self._pending
        if self._active.count or self._dirty:
            self._swap()
            return self._pending
        marks = self._mark_source()  # nothing to write, but the journal may have moved on
        return None if marks == self._last_marks else _PendingFlush(WriteCache(0), marks, {})

    def _on_owner(self, fn):
        """Run fn on the owner thread and wait for its result."""
        loop = self._loop
        if loop is None or self._owner_thread == threading.get_ident() or loop.is_closed():
            return fn()
        done = threading.Event()
        box: list = []

        def call():
            try:
                box.append(fn())
            except BaseException as e:  # handed to the waiting thread
                box.append(e)
            finally:
                done.set()
        loop.call_soon_threadsafe(call)
        while not done.wait(0.5):
            if loop.is_closed() or not loop.is_running():  # nobody left to race with
                return fn()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def run_on_owner(self, fn):
        """Run fn on the owner (event loop) thread and return its result; for other
        threads (GC) that change ledger state."""
        return self._on_owner(fn)

    @contextmanager
    def exclusive_writer(self) -> Iterator[None]:
        """Hold the checkpoint lock: the entry logger's writer side and LMDB write
        transactions are this thread's until the block ends. Compaction copies
        entries and switches their locations inside it, so a checkpoint never runs
        in between (and never sees a half-switched batch)."""
        with self._checkpoint_lock:
            yield

    def sync_index(self) -> None:
        """Make committed index transactions durable (a no-op cost with index_sync)."""
        if not self.config.index_sync:
            self.index.sync()

    def _checkpoint_behind(self) -> bool:
        """Asked by the entry logger while a checkpoint writes (flush thread): is the
        checkpoint falling behind the adds? True when adds already wait for room, or
        the active half is half full while the other is still being written: at this
        pace it fills before the checkpoint ends. A racy read of owner-thread state is
        fine here: the answer only picks the size of the next fdatasync step."""
        return bool(self._room_waiters) or self._active.size_bytes * 2 >= self._half_bytes

    def _flush(self, p: _PendingFlush) -> None:
        started = time.monotonic()
        flushed_bytes = p.half.size_bytes
        try:
            self._flush_half(p)
        except BaseException as e:
            metrics.FLUSH.failure((time.monotonic() - started) * 1000.0)
            if isinstance(e, StorageError) and self.on_error is not None:
                self.on_error(e)
            raise
        metrics.FLUSH.success((time.monotonic() - started) * 1000.0)
        metrics.FLUSH_SIZE.record(flushed_bytes)
        if p.marks:
            self._after_checkpoint(p.marks)

    def _flush_half(self, p: _PendingFlush) -> None:
        # One chunk of pacing.STEP_ENTRIES at a time, the GIL handed to the event loop
        # between chunks (flush_pacing): no C loop over a whole half holds the adds' loop
        # (issue 32).
        entry_logger = self.entry_logger
        step = pacing.chunk_entries(p.half.size_bytes, p.half.count, entry_logger.frame_bytes,
                                    entry_logger.record_overhead_bytes)
        pause = pacing.GilPacer(self._checkpoint_behind)
        with self.index.write() as w:
            # The locations and packed index records of one chunk at a time, all in this
            # one transaction. The entry log is fsynced before the transaction commits, so
            # the index never names a location that is not durable.
            for ledger_ids, entry_ids, entries in p.half.sorted_chunks(step):
                locations = entry_logger.add_entries(entries)
                w.put_location_lists(ledger_ids, entry_ids, locations)
                pause()
            if p.half.count:
                entry_logger.flush()
            for lid, state in p.dirty.items():
                if state is None:
                    w.delete_ledger(lid)
                else:
                    w.put_ledger(lid, state)
            for i, mark in enumerate(p.marks):
                w.set_log_mark(i, mark)
        # index_sync = false: the commit is not durable yet. Sync before the checkpoint counts:
        # the journal files behind its marks are deleted next, and with the journal off what it
        # flushed is durable only through it.
        self.sync_index()
        unpublished = self._pending is p
        if unpublished:  # only the flush side clears it; the owner only sets it from None
            self._pending = None
        self._last_marks = p.marks
        self.last_checkpoint_error = None  # before the count: who sees a new checkpoint sees it succeeded
        self.checkpoints += 1
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake_room_waiters)
        if unpublished:
            # Free the flushed half in steps, not in one dealloc that holds the GIL for
            # ~9 ms per 150k entries. A reader that still holds the half finds it empty
            # and goes on to the index, which has every entry: the commit came first.
            p.half.release(step, pause)

    def _flush_loop(self) -> None:
        interval_s = self.config.flush_interval_ms / 1000.0
        backoff_s = 0.0
        while not self._stopping:
            self._flush_event.wait(timeout=max(interval_s, backoff_s))
            self._flush_event.clear()
            if self._stopping:
                break
            try:
                self.checkpoint()
                backoff_s = 0.0
            except Exception as e:  # disk full, I/O error, index full: keep the data, retry
                if not isinstance(e, StorageError):
                    # a bug below (a raw OSError once): this thread must live on, a dead flush
                    # thread silently ends every checkpoint; the bookie is told like for I/O errors
                    log.exception("unexpected error in a checkpoint")
                    e = StorageError(f"unexpected error in a checkpoint: {e!r}")
                    if self.on_error is not None:
                        self.on_error(e)
                self.last_checkpoint_error = e
                backoff_s = min(max(backoff_s * 2, 0.1), 5.0)
                log.error("checkpoint failed (will retry in %.1fs): %s", backoff_s, e)
                time.sleep(backoff_s)

    # ------------------------------------------------------------ reads
    def get_cached(self, ledger_id: int, entry_id: int) -> bytes | None:
        entry = self._active.get(ledger_id, entry_id)
        if entry is None:
            pending = self._pending
            if pending is not None:
                entry = pending.half.get(ledger_id, entry_id)
            if entry is None:
                entry = self.read_cache.get(ledger_id, entry_id)
        return entry

    def read_from_storage(self, ledger_id: int, entry_id: int) -> bytes | None:
        """Index + entry log lookup (blocking; read worker threads). None = not stored."""
        return reads.drive(self.read_steps(ledger_id, entry_id), self.entry_logger.pread)

    def read_ahead_at(self, ledger_id: int, entry_id: int, last: int) -> None:
        """A read-ahead ahead of a scan (blocking: read threads): read_from_storage of the
        ledger's first entry in entry_id..last this bookie stores, which reads ahead from there
        into the read cache (ReadRuns). With E > WQ this bookie holds WQ of every E entries, and
        entry_id, the one after the last read-ahead, is another bookie's one time in E: a
        read-ahead of it alone found nothing, and the scan's READs waited for it, then missed."""
        if self.get_cached(ledger_id, entry_id) is not None:
            return
        found = self.index.next_location(ledger_id, entry_id, last)
        if found is not None:
            first, location = found
            reads.drive(self.read_steps(ledger_id, first, location), self.entry_logger.pread)

    def read_many(self, keys: list) -> tuple[list, list]:
        """read_from_storage of each (ledger_id, entry_id) of `keys`, in order (blocking: a read
        thread, one hop for all): lookups in one transaction (a miss takes read_steps' own), the
        steps driven by reads.drive_many. ([entry, None or the exception, per key], [(ledger_id,
        first, last planned) of each read-ahead])."""
        try:
            locations = self.index.get_locations(keys)
        except Exception:  # ids no index can hold, a damaged value: each key's own lookup decides
            locations = [None] * len(keys)
        calls: list = []
        out = reads.drive_many((self.read_steps(lid, eid, loc) for (lid, eid), loc in zip(keys, locations)),
                               self.entry_logger.pread,
                               _entrylog.preads if fileio.faults is None else None,  # faults: per pread
                               calls)
        return out, [span for span in map(self.read_ahead_span, calls) if span is not None]

    def read_ahead_sizes(self, ledger_id: int) -> tuple[int, int]:
        """(batch, most) of the ledger's read-aheads: a run's first read-ahead reads `batch`
        entries (read_ahead_batch_size, at most what one read holds: the span ReadRuns marks as
        being read); a scan's read-ahead doubles run by run up to `most`, what one read holds of
        the ledger's records (ReadRuns), or `batch` itself when that is 1 (read-ahead off, or
        records larger than one read) or the record size is not known yet."""
        batch = self.config.read_ahead_batch_size
        record = self.entry_logger.record_bytes(ledger_id)
        if not record:
            return batch, batch
        batch = min(batch, max(1, READ_AHEAD_MAX_BYTES // record))
        return batch, batch if batch <= 1 else max(batch, READ_AHEAD_MAX_BYTES // record)

    def read_ahead_planned(self, ledger_id: int, entry_id: int) -> int:
        """Entries a miss at entry_id would read now, 1 for its one entry only (ReadRuns.plan;
        asking changes nothing): the span a read-ahead started from there is noted as bringing
        in, while it is in flight."""
        return self._read_runs.ahead_count(ledger_id, entry_id, *self.read_ahead_sizes(ledger_id))

    def read_on_from(self, ledger_id: int, entry_id: int) -> int | None:
        """A reader got entry_id from the read cache: the entry to read ahead from now, so that a
        scan finds its next entries read when it asks (entry_id past the middle of the read-ahead
        that brought it, and the entry after that read-ahead not cached), else None. Cheap enough
        for the loop: one dict lookup and a scan of at most ReadRuns.STREAMS spans, a cache
        lookup when it says yes."""
        nxt = self._read_runs.read_on_from(ledger_id, entry_id)
        return None if nxt is None or self.get_cached(ledger_id, nxt) is not None else nxt

    def read_steps(self, ledger_id: int, entry_id: int, location: int | None = None) -> reads.Steps:
        """read_from_storage as steps (bk.entrylog.reads), for a driver that does the preads
        (a read thread, or the bookie's io_uring on the loop). The steps between preads are
        cache and index lookups, no I/O but the index's mapped pages; a read-ahead run is
        one Call."""
        # The caches are checked again here: an entry may have moved from the
        # write cache to the entry log between the caller's check and now, and the
        # index only has it once the flush committed.
        entry = self.get_cached(ledger_id, entry_id)
        if entry is not None:
            return entry
        if location is None:  # else the caller looked it up (read_many: one transaction for many)
            location = self.index.get_location(ledger_id, entry_id)
        if location is None:
            # A flush commits the index before it drops the cache half, so an entry stored
            # when this read began is always in one of them: missed in the index, then in
            # the caches, it moved in between and the index has it now. Without this last
            # lookup a read racing a checkpoint answered "no such entry" for a stored entry
            # (seen with the BP-46 repair: copy, checkpoint, limbo cleared mid-read).
            entry = self.get_cached(ledger_id, entry_id)
            if entry is not None:
                return entry
            location = self.index.get_location(ledger_id, entry_id)
        while True:
            if location is None:
                return None
            try:
                batch, most = self.read_ahead_sizes(ledger_id)
                count, scanning = self._read_runs.plan(ledger_id, entry_id, batch, most) if batch > 1 else (1, False)
                if count <= 1:
                    return (yield from self.entry_logger.entry_steps(ledger_id, entry_id, location))
                return (yield reads.Call(self._read_ahead, (ledger_id, entry_id, location, count, scanning)))
            except StorageError:  # CorruptedStorageError included
                # Compaction may have moved the entry and deleted its old log between
                # the index lookup and the read: only a location that did not change
                # is a real error.
                moved = self.index.get_location(ledger_id, entry_id)
                if moved == location:
                    raise
                location = moved

    def read_ahead_span(self, call: reads.Call) -> tuple[int, int, int] | None:
        """(ledger_id, first, last planned) of a Call of read_steps that reads ahead, else None."""
        if call.fn != self._read_ahead:
            return None
        ledger_id, entry_id, _location, count, _scanning = call.args
        return ledger_id, entry_id, entry_id + count - 1

    def read_span(self, ledger_id: int, entry_id: int, max_count: int,
                  max_bytes: int) -> FileSpan | BufferSpan | None:
        """Entries entry_id.. (at most max_count, within max_bytes) as the entry log holds them back
        to back, a BATCH_READ answer's body (bk.entrylog.spans; blocking: read worker threads).
        None when the first entry is in a cache (it is read from there) or not in the index
        (read_from_storage decides what that means)."""
        if self.get_cached(ledger_id, entry_id) is not None:
            return None
        locations = self.index.get_locations([(ledger_id, e) for e in range(entry_id, entry_id + max_count)])
        if locations[0] is None:
            return None
        _, scanning = self._read_runs.plan(ledger_id, entry_id, max_count)
        try:
            span = self.entry_logger.read_span(ledger_id, entry_id, locations, max_bytes,
                                               hint_bytes=READ_AHEAD_HINT_BYTES if scanning else 0)
        except StorageError:
            # as in read_from_storage: compaction may have moved the entry and deleted its log
            if self.index.get_location(ledger_id, entry_id) == locations[0]:
                raise
            return None
        if span is not None:
            self._read_runs.ran(ledger_id, entry_id, entry_id + span.count - 1)
        return span

    def _read_ahead(self, ledger_id: int, entry_id: int, location: int, count: int, scanning: bool) -> bytes:
        """The entry at `location` and up to count - 1 of the ledger's next records after it
        in the log, those into the read cache (blocking: one read of the log)."""
        # Read what `count` records of the ledger's last size need, not a whole 1.25 MiB: 100
        # records of 1 KiB read 1.25 MiB to keep 100 KiB, and every kept entry was copied out.
        record = self.entry_logger.record_bytes(ledger_id)
        max_bytes = READ_AHEAD_MAX_BYTES if record is None else min(READ_AHEAD_MAX_BYTES, count * record)
        run = self.entry_logger.read_run(location, count, max_bytes,
                                         hint_bytes=READ_AHEAD_HINT_BYTES if scanning else 0)
        if not run or run[0][0] != ledger_id or run[0][1] != entry_id:
            # read_run does not know which ids to expect; the strict read does.
            return self.entry_logger.read_entry(ledger_id, entry_id, location)
        ahead = [r for r in run[1:] if r[0] == ledger_id]
        if ahead:
            # A record's ids are its entry's first bytes: a damaged one (or a stale copy left
            # by compaction) can claim an entry that lives elsewhere. Only records the index
            # places exactly here are cached, so a flipped id never shadows a healthy entry.
            ids = [eid for _, eid, _, _ in ahead]
            low, high = min(ids), max(ids)
            if high - low < 2 * len(ids):  # the ledger's next ids, as a scan wrote them: one walk
                where = self.index.get_location_range(ledger_id, low, high)
                ahead = [(lid, eid, e) for lid, eid, e, loc in ahead if where.get(eid) == loc]
            else:
                where = self.index.get_locations([(lid, eid) for lid, eid, _, _ in ahead])
                ahead = [(lid, eid, e) for (lid, eid, e, loc), want in zip(ahead, where) if want == loc]
        first = run[0][2]
        # The entries are views of the run's one buffer: cached as views they keep it whole, so
        # they are copied when they are less than half of it (other ledgers' records), so that
        # the cache's byte bound stays within twice the memory it really holds.
        if 2 * (len(first) + sum(len(e) for _, _, e in ahead)) < len(first.obj):
            first = bytes(first)
            ahead = [(lid, eid, bytes(e)) for lid, eid, e in ahead]
        self.read_cache.put_many([(ledger_id, entry_id, first), *ahead])
        self._read_runs.ran(ledger_id, entry_id, ahead[-1][1] if ahead else entry_id)
        return first

    def missing_entries(self, ledger_id: int, entry_ids) -> list[int]:
        """Those of `entry_ids` stored nowhere (blocking; not on the loop). The order of the
        checks is read_from_storage's (caches, index, caches again: an entry moves from the
        write cache to the index only once its flush committed), so no stored entry is missed.
        An entry whose index location points into an entry log found gone at start (missing or
        cut short, self.log_check) is missing too: until a copy replaces that location. So is
        one whose record there is garbled or unreadable (EntryLogger.holds_entry: a repair
        that says done has checked that the bytes are there, not only that the index says so)."""
        get_cached, get_location, dead_from = self.get_cached, self.index.get_location, self._dead_from
        holds = self.entry_logger.holds_entry

        def missing(e: int) -> bool:
            if get_cached(ledger_id, e) is not None:
                return False
            location = get_location(ledger_id, e)
            if location is not None and not (dead_from and is_dead(dead_from, location)) \
                    and holds(ledger_id, e, location):
                return False
            return get_cached(ledger_id, e) is None
        return [e for e in entry_ids if missing(e)]

    def cached_entry_ids(self, ledger_id: int) -> list[int]:
        """Entry ids of the ledger in the write cache halves (owner thread: the loop)."""
        ids = self._active.entry_ids(ledger_id)
        if self._pending is not None:
            ids += self._pending.half.entry_ids(ledger_id)
        return ids

    def last_entry_id(self, ledger_id: int) -> int | None:
        """The highest entry id this bookie stores for the ledger, or None."""
        best = self.index.last_entry_id(ledger_id)
        for cache in (self._active, (self._pending.half if self._pending else None)):
            if cache is not None:
                last = cache.last_entry_id(ledger_id)
                if last is not None and (best is None or last > best):
                    best = last
        return best

    # ------------------------------------------------------------ state flags
    def get_flag(self, name: str) -> bool:
        return self.index.get_flag(name)

    def set_flag_now(self, name: str, value: bool) -> None:
        """Persist a bookie state flag at once (start/stop, not while flushing)."""
        with self._checkpoint_lock:
            with self.index.write() as w:
                w.set_flag(name, value)

    def stats(self) -> dict:
        pending = self._pending
        return {
            "write_cache_bytes": self._active.size_bytes + (pending.half.size_bytes if pending else 0),
            "read_cache_bytes": self.read_cache.size_bytes,
            "ledgers": len(self._ledgers),
            "checkpoints": self.checkpoints,
            "entry_log_rotations": self.entry_logger.rotations,
        }



__all__ = ["LedgerStorage", "LedgerState"]
