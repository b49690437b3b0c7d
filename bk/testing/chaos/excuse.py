"""What a chaos run may excuse, per bookie and per entry, and why (docs/CHAOS.md, "Excused losses").

A fault excuses an acknowledged entry on one bookie only where that bookie may really have
lost it; the checker then excuses the entry's loss only when >= AQ bookies of its write set
may have (verify.may_be_lost). The reasons, as the run's JSON names them:

- JOURNAL_OFF_CRASH: the journal is off (BP-46), the bookie crashed after the entry's add was
  sent, and no checkpoint of that bookie had made the entry durable before. Observed, not
  assumed: each in-process storage instance is watched (`watch_storage`): an entry that its
  `put`/`put_many` stored at t is durable once a `checkpoint()` that *began* after t has
  returned. A checkpoint flushes both write-cache halves as they were when it began (the
  pending one, then the active one it swaps out), fsyncs the entry log and syncs the index
  before it returns; one a crash interrupts fails at its next write (the crash gate) and raises,
  so it is never counted. A durable entry stays durable: a correct GC moves a live entry only
  by a copy made durable before the index switches to it (docs/GC.md; many runs run GC:
  storage.py), and a later crash or power cut rolls back only what was not synced (a GC that
  loses a live entry is what inv1 must catch, not excuse). Whatever the watch missed (a
  checkpoint before the watch was installed) only excuses more, never less.
  A bookie process is watched the same way from inside (`watch_from_env`, set up by the
  runner's process cluster through BK_TEST_STORAGE_WATCH): each storage instance it opens
  appends its first stores and its completed checkpoints to a watch file of its own, outside
  the bookie's directories (a power cut never touches it), and the runner reads those files at
  the end of the run (`read_watch`). Times are CLOCK_MONOTONIC, one clock for every process.
  A SIGKILL between a checkpoint's return and its line only excuses more.
- JOURNAL_OFF_CRASH_UNWATCHED: the same, on a bookie that crashed with no watch at all (no
  storage instance of it was ever watched): any crash after the add was sent excuses it there.
- BITFLIP: the entry whose entry-log record holds a flipped bit, on that bookie only (the
  record is found by walking the log's records before the flip; a flip in a record still
  being written is resolved at the end of the run from a copy with the bit put back).
  A journal flip excuses no entry: with the journal on, a replay that meets it refuses to
  start (BOOKIE_REFUSED); a bookie that never replays it never reads it.
- BOOKIE_REFUSED: the bookie refused to start again (it detected a corruption): its whole
  share is gone with it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

from bk.entrylog.usage import ScanReport, scan_records

JOURNAL_OFF_CRASH = "journal-off-crash"
JOURNAL_OFF_CRASH_UNWATCHED = "journal-off-crash-unwatched"
BITFLIP = "bitflip"
BOOKIE_REFUSED = "bookie-refused"
REASONS = (JOURNAL_OFF_CRASH, JOURNAL_OFF_CRASH_UNWATCHED, BITFLIP, BOOKIE_REFUSED)
WATCH_ENV = "BK_TEST_STORAGE_WATCH"  # a directory: each bookie process's watch files go there


class StorageWatch:
    """One storage instance's stores and completed checkpoints (times: time.monotonic())."""

    __slots__ = ("stored_at", "last_checkpoint_began", "checkpoints")

    def __init__(self) -> None:
        self.stored_at: dict[tuple[int, int], float] = {}  # first store of each (ledger, entry)
        self.last_checkpoint_began = float("-inf")  # the latest start of a checkpoint that returned
        self.checkpoints = 0

    def durable(self, ledger_id: int, entry_id: int) -> bool:
        t = self.stored_at.get((ledger_id, entry_id))
        # strictly later: the store's time is read after put returned, the checkpoint's before it
        # began, so a later start is a checkpoint that found the entry in the write cache
        return t is not None and self.last_checkpoint_began > t


def watch_storage(storage, log_fd: int | None = None) -> StorageWatch:
    """Watch one LedgerStorage instance (instance attributes shadow its methods: the bookie
    calls `storage.put`, `storage.put_many` and its flush thread `self.checkpoint()`). With
    `log_fd` (a bookie process), each first store and each completed checkpoint is also
    appended there as one line, one write(2) each (O_APPEND: whole lines, whatever thread)."""
    w = StorageWatch()
    put, put_many, checkpoint = storage.put, storage.put_many, storage.checkpoint

    def stored(ledger_id, entry_ids, now):
        lines = []
        for entry_id in entry_ids:
            if (ledger_id, entry_id) not in w.stored_at:
                w.stored_at[(ledger_id, entry_id)] = now
                lines.append(f"S {ledger_id} {entry_id} {now!r}\n")
        if log_fd is not None and lines:
            os.write(log_fd, "".join(lines).encode())

    def watched_put(ledger_id, entry_id, entry):
        done = put(ledger_id, entry_id, entry)
        if done:
            stored(ledger_id, (entry_id,), time.monotonic())
        return done

    def watched_put_many(ledger_id, entry_ids, entries):
        done = put_many(ledger_id, entry_ids, entries)
        stored(ledger_id, list(entry_ids)[:done], time.monotonic())
        return done

    def watched_checkpoint():
        began = time.monotonic()
        checkpoint()  # raises when a write, fsync or index sync failed (a crash gate, a disk fault)
        w.last_checkpoint_began = max(w.last_checkpoint_began, began)
        w.checkpoints += 1
        if log_fd is not None:
            os.write(log_fd, f"C {began!r}\n".encode())

    storage.put, storage.put_many, storage.checkpoint = watched_put, watched_put_many, watched_checkpoint
    return w


def read_watch(path: str) -> StorageWatch:
    """The StorageWatch a bookie process's watch file records. Only whole lines count: a torn
    last one (no newline yet) is skipped, and what it would have said only excuses more."""
    w = StorageWatch()
    with open(path, "rb") as fh:
        for raw in fh.read().decode(errors="replace").split("\n")[:-1]:
            parts = raw.split()
            try:
                if len(parts) == 4 and parts[0] == "S":
                    w.stored_at.setdefault((int(parts[1]), int(parts[2])), float(parts[3]))
                elif len(parts) == 2 and parts[0] == "C":
                    w.last_checkpoint_began = max(w.last_checkpoint_began, float(parts[1]))
                    w.checkpoints += 1
            except ValueError:
                continue
    return w


def _watch_prefix(bookie_id: str) -> str:
    return bookie_id.replace(":", "_").replace("/", "_") + "."


def watch_files(directory: str, bookie_id: str) -> list[str]:
    """A bookie's watch files, one per storage instance, oldest first."""
    prefix = _watch_prefix(bookie_id)
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix) and n.endswith(".watch")]
    except FileNotFoundError:
        return []
    return [os.path.join(directory, n) for n in sorted(names, key=lambda n: int(n[len(prefix):-6]))]


def watch_from_env(bookie) -> None:
    """How a `bk bookie` process of a chaos run watches itself ($BK_TEST_STORAGE_WATCH, set by
    the process cluster): the storage it opens is watched before the journal replay's
    checkpoint and before it serves, into a new file named after the bookie and the instant."""
    directory = os.environ.get(WATCH_ENV, "")
    if not directory:
        return
    open_and_replay = bookie._open_and_replay

    def watched_open_and_replay():
        open_and_replay()
        path = os.path.join(directory, f"{_watch_prefix(bookie.bookie_id)}{time.monotonic_ns()}.watch")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        watch_storage(bookie.storage, log_fd=fd)  # the descriptor lives as long as the process

    bookie._open_and_replay = watched_open_and_replay


def entry_at(path: str, offset: int) -> tuple[int, int] | None:
    """(ledger, entry) of the whole record of entry log `path` holding byte `offset`, or None
    (the header, the ledgers map, or past the last whole record)."""
    for lid, eid, pos, size in scan_records(path, report=ScanReport()):
        if pos <= offset < pos + 4 + size:
            return lid, eid
        if pos > offset:
            return None
    return None


def entry_at_unflipped(path: str, offset: int, bit: int, work_dir: str) -> tuple[int, int] | None:
    """entry_at on a copy of `path` with the flipped bit put back (a flip in the size field of
    a record written after the flip would otherwise hide it)."""
    try:
        if os.path.getsize(path) <= offset:
            return None  # rolled back by a power cut: the flipped byte is gone
        fd, copy = tempfile.mkstemp(dir=work_dir, suffix=".log")
        os.close(fd)
        try:
            shutil.copyfile(path, copy)
            with open(copy, "r+b") as fh:
                fh.seek(offset)
                byte = fh.read(1)
                fh.seek(offset)
                fh.write(bytes([byte[0] ^ (1 << bit)]))
            return entry_at(copy, offset)
        finally:
            os.unlink(copy)
    except OSError:
        return None


__all__ = ["BITFLIP", "BOOKIE_REFUSED", "JOURNAL_OFF_CRASH", "JOURNAL_OFF_CRASH_UNWATCHED", "REASONS",
           "StorageWatch", "WATCH_ENV", "entry_at", "entry_at_unflipped", "read_watch", "watch_files",
           "watch_from_env", "watch_storage"]
