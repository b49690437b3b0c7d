"""EntryLogCompactor: copy an entry log's live entries away, switch the index, delete it.

The one sequence that deletes entry data that may still be live; every step is made
durable before the next one may assume it (GC.md "Compaction, step by step"):

  1. mark     `compacting/<log id>` committed in the index (and synced): from here
              every start of GC finishes this compaction (`finish_pending`).
  2. copy     batches of the log's records whose location the index still names
              are appended to the current entry log and fdatasync'ed;
  3. switch   in one LMDB transaction per batch, each entry's location becomes
              the copy's, only where the index still holds the old location (an
              entry re-added or moved since keeps its newer one, a deleted ledger
              stays deleted); committed and synced;
  4. check    when the scan of the old log did not end clean (a damaged record: what
              lies past it was not seen), every location the index still places in
              the log (a walk of the whole index, whatever ledger it belongs to) is
              read by location, copied and switched as in 2-3; then no location may
              point into the log any more (else: stop, keep the log, report);
  5. delete   the old log file is unlinked and its directory fsynced;
  6. unmark   the marker is cleared.

A crash anywhere leaves the old log on disk until step 5, and the index names only
durable records (copies are durable before the switch commits), so no live entry is
lost; a copy made before a crash but never switched is dead weight in its new log.
The next GC start repeats steps 2-6 for the marked log (copying what the index still
names there: nothing after step 3), so it always finishes.

Threads: compaction runs on the GC thread. Steps 2-3 of a batch run inside
`LedgerStorage.exclusive_writer()` (the checkpoint lock): the entry logger has one
writer at a time and a checkpoint never interleaves with a batch's copy and switch.
Reading the old log, the index lookups and the throttle sleep run outside the lock.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from bk.entrylog import SCAN_CLEAN, SCAN_REASONS
from bk.errors import StorageError
from bk.formats.entrylog import LOG_SIZE_FIELD_BYTES

log = logging.getLogger(__name__)

BATCH_BYTES = 4 * 1024 * 1024  # copied, made durable and switched together (unthrottled)
MIN_BATCH_BYTES = 256 * 1024
BATCH_ENTRIES = 20_000


def _no_step(step: str, log_id: int) -> None:
    pass


@dataclass
class CompactionResult:
    log_id: int
    entries_copied: int = 0
    entries_switched: int = 0
    bytes_copied: int = 0  # record bytes written to the current log (size fields included)
    file_bytes_deleted: int = 0  # the old log's size on disk, once deleted
    deleted: bool = False
    error: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def batch_bytes_for(rate_bytes_per_s: int) -> int:
    """Throttled, a batch is an eighth of a second's worth (at least MIN_BATCH_BYTES): its
    write, fdatasync and index switch come in small steps beside the adds instead of one
    burst a second (bench.gc: 1 KiB adds next to a 4 MiB/s compaction)."""
    if not rate_bytes_per_s:
        return BATCH_BYTES
    return max(MIN_BATCH_BYTES, min(BATCH_BYTES, rate_bytes_per_s // 8))


class Throttle:
    """Sleep so that `rate_bytes_per_s` is not exceeded on average (0 = no limit)."""

    def __init__(self, rate_bytes_per_s: int, sleep: Callable[[float], None] = time.sleep):
        self.rate = rate_bytes_per_s
        self._sleep = sleep
        self._start = time.monotonic()
        self._bytes = 0

    def account(self, nbytes: int) -> None:
        if not self.rate:
            return
        self._bytes += nbytes
        ahead_s = self._bytes / self.rate - (time.monotonic() - self._start)
        if ahead_s > 0:
            self._sleep(ahead_s)


def _once_per_ledger(is_live: Callable[[int], bool]) -> Callable[[int], bool]:
    """is_live asked once per ledger for one compaction (it may read the index). A
    ledger found live stays live for the compaction: at worst a ledger deleted
    meanwhile is copied once more, and the conditional switch drops the copy."""
    seen: dict[int, bool] = {}

    def live(ledger_id: int) -> bool:
        v = seen.get(ledger_id)
        if v is None:
            v = seen[ledger_id] = is_live(ledger_id)
        return v
    return live


class EntryLogCompactor:
    def __init__(self, storage, rate_bytes_per_s: int = 0):
        self.storage = storage
        self.index = storage.index
        self.entry_logger = storage.entry_logger
        self.rate_bytes_per_s = rate_bytes_per_s
        # Crash tests set this to stop the process at a step ("after_copy",
        # "after_switch", "before_delete", "after_delete"); it runs after the step's
        # writes are durable.
        self.step_hook: Callable[[str, int], None] = _no_step

    # ------------------------------------------------------------ markers
    def pending(self) -> list[int]:
        return self.index.compacting_logs()

    def _set_marker(self, log_id: int, on: bool) -> None:
        with self.storage.exclusive_writer():
            with self.index.write() as w:
                w.set_compacting_log(log_id, on)
        self.storage.sync_index()

    def finish_pending(self, is_live: Callable[[int], bool], stop: Callable[[], bool] = lambda: False
                       ) -> list[CompactionResult]:
        """Finish every compaction a crash (or a stop) interrupted."""
        out = []
        for log_id in self.pending():
            if stop():
                break
            if self.entry_logger.log_path(log_id) is None:  # deleted; only the marker was left
                self._set_marker(log_id, False)
                out.append(CompactionResult(log_id, deleted=True))
                continue
            log.info("finishing the interrupted compaction of entry log %x", log_id)
            out.append(self.compact(log_id, is_live, stop))
        return out

    # ------------------------------------------------------------ compaction
    def compact(self, log_id: int, is_live: Callable[[int], bool],
                stop: Callable[[], bool] = lambda: False) -> CompactionResult:
        """Compact one closed log (steps 1-6 of the module docstring). Returns what it
        did; `error` is set (and the log kept) when it could not finish safely.
        `is_live(ledger_id)` is GC's one rule (a ledger is dead only when gone from
        memory and from the committed index); it is asked once per ledger."""
        result = CompactionResult(log_id)
        if log_id not in self.entry_logger.closed_log_ids():
            result.error = f"entry log {log_id:x} is not a closed log"
            return result
        is_live = _once_per_ledger(is_live)
        self._set_marker(log_id, True)
        throttle = Throttle(self.rate_bytes_per_s)
        batch_limit = batch_bytes_for(self.rate_bytes_per_s)
        scan = self.entry_logger.scan(log_id, with_entries=True)
        seen = ((lid, eid, loc, entry) for lid, eid, loc, _size, entry in scan if is_live(lid))
        if not self._copy_all(seen, result, throttle, batch_limit, stop):
            return result
        unusable = self.entry_logger.map_unusable(log_id) if scan.status == SCAN_CLEAN else ""
        if scan.status != SCAN_CLEAN or unusable:
            # Damage inside the log: the records past it were not seen, and whichever
            # ledgers they belong to, the index says where they are (step 4). A map that
            # fails its check where the header says makes that offset, where the scan
            # stopped, suspect too (a wrong header): records may lie past it.
            damage = (f"{SCAN_REASONS.get(scan.status, scan.status)} at offset {scan.stop_offset}" if not unusable
                      else f"ledgers map unusable ({unusable}) at offset {scan.stop_offset}")
            if not self._move_indexed(log_id, damage, result, throttle, batch_limit, stop):
                return result
        self.step_hook("before_delete", log_id)
        result.file_bytes_deleted = self.entry_logger.log_file_bytes(log_id)
        self.entry_logger.delete_log(log_id)
        result.deleted = True
        self.step_hook("after_delete", log_id)
        self._set_marker(log_id, False)
        return result

    def _move_indexed(self, log_id: int, damage: str, result: CompactionResult, throttle: Throttle,
                      batch_limit: int, stop: Callable[[], bool]) -> bool:
        """Copy and switch every entry the index still places in a damaged log, read by
        its location; True when afterwards no location points into the log any more
        (it may go), else the log is kept and `result.error` says why."""
        unreadable = 0

        def placed():
            nonlocal unreadable
            for lid, eid, loc in self.index.iter_locations_in_logs([log_id]):  # streamed: bounded memory
                try:
                    yield lid, eid, loc, self.entry_logger.read_entry(lid, eid, loc)
                except StorageError as e:  # damaged itself: it stays where the index says
                    unreadable += 1
                    log.error("compaction of entry log %x: ledger %d entry %d cannot be read: %s",
                              log_id, lid, eid, e)
        if not self._copy_all(placed(), result, throttle, batch_limit, stop):
            return False
        left = self.index.count_locations_in_logs([log_id])[log_id]  # after the switches, from the index
        if left:
            result.error = (f"entry log {log_id:x} is damaged ({damage}) and the index still places {left} "
                            f"entries in it ({unreadable} unreadable); kept")
            log.error("compaction: %s", result.error)
            return False
        log.warning("compaction: entry log %x was damaged (%s); every entry the index placed in it was "
                    "copied", log_id, damage)
        return True

    def _copy_all(self, records, result: CompactionResult, throttle: Throttle, batch_limit: int,
                  stop: Callable[[], bool]) -> bool:
        """Copy and switch (ledger, entry, location, entry bytes) records in batches of
        batch_limit bytes or BATCH_ENTRIES, throttled; False when stopped between two
        batches (result.error says so)."""
        batch: list = []
        batch_bytes = 0
        for record in records:
            batch.append(record)
            batch_bytes += len(record[3]) + LOG_SIZE_FIELD_BYTES
            if batch_bytes >= batch_limit or len(batch) >= BATCH_ENTRIES:
                if stop():
                    result.error = "stopped"
                    return False
                self._move(batch, result)
                throttle.account(batch_bytes)
                batch, batch_bytes = [], 0
        if batch:
            self._move(batch, result)
            throttle.account(batch_bytes)
        return True

    def _move(self, batch: list, result: CompactionResult) -> None:
        """Copy the batch's entries the index still names, then switch them (steps 2-3)."""
        current = self.index.get_locations([(lid, eid) for lid, eid, _, _ in batch])
        batch = [r for r, cur in zip(batch, current) if cur == r[2]]
        if not batch:
            return
        entries = [r[3] for r in batch]
        storage = self.storage
        with storage.exclusive_writer():
            new_locs = self.entry_logger.add_entries(entries)
            self.entry_logger.flush()
            self.step_hook("after_copy", batch[0][2] >> 32)
            with self.index.write() as w:
                moved = w.switch_locations(
                    (lid, eid, old, new) for (lid, eid, old, _), new in zip(batch, new_locs))
        storage.sync_index()
        result.entries_copied += len(batch)
        result.entries_switched += moved
        result.bytes_copied += sum(len(e) + LOG_SIZE_FIELD_BYTES for e in entries)
        self.step_hook("after_switch", batch[0][2] >> 32)
