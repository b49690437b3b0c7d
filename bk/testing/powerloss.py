"""Simulated power loss for crash tests (docs/DISK-FAULTS.md, "Power loss").

`kill -9` keeps the page cache, so it cannot show that fsync is called at the
right moments. With `BK_FSYNC_TRACK_FILE` set, bk.fileio logs every file's size
after each successful fsync, every directory's listing when an fsync of it began
(a new directory is logged empty) and, before an unlink or a rename over a file,
a hard link to the old file. After the bookie stopped (a killed process, or an
in-process bookie behind its crash gate), `simulate_power_loss` leaves its files
as a power cut could:

- directory entries: in a directory with a logged listing, a name created since its
  last fsync is removed (a file, or a whole directory tree), a file unlinked since is
  put back, and a file renamed over since gets its old contents back (rename undone);
- a file written in place (a format 2 journal file, fileio.track_in_place) gets back,
  after its last fsynced data end, what it held when last made durable whole (zeros,
  or a recycled file's old records): every write since that fsync is lost;
- a file that was fsynced is truncated to its last fsynced size, and with
  `tear=True` keeps a random part of the next page of lost data (a torn write)
  or gets garbage there; a file never fsynced is emptied when its name is durable,
  deleted when not;
- LMDB's `data.mdb`: with `index_sync = true` LMDB syncs every commit itself, so
  what the file holds when the bookie stopped is its last commit (the crash gate
  fails every commit after the cut); with `index_sync = false`,
  `install_index_model()` keeps a copy of it at every `Index.sync()` (and at open),
  and the cut puts the last copy back: commits since the last sync are rolled back.
  `lock.mdb` is never fsynced: it is emptied like any such file.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import threading
from dataclasses import dataclass, field

from bk.errors import StorageError

PAGE_BYTES = 4096
LMDB_DATA = "data.mdb"


@dataclass
class PowerLossReport:
    truncated: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (old, new)
    deleted: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)  # unlinks and renames undone
    index_rolled_back: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (f"power loss: {len(self.truncated)} files truncated, {len(self.deleted)} deleted, "
                f"{len(self.torn)} torn, {len(self.restored)} unlinks/renames undone, "
                f"{len(self.index_rolled_back)} indexes rolled back")


@dataclass
class TrackLog:
    sizes: dict[str, int] = field(default_factory=dict)          # file -> last fsynced size
    listings: dict[str, tuple[int, set]] = field(default_factory=dict)  # dir -> (seq, names)
    aside: list[tuple[int, str, str, str]] = field(default_factory=list)  # (seq, kind, path, link)
    index_copies: dict[str, str] = field(default_factory=dict)   # data.mdb -> its last synced copy
    in_place: dict[str, str] = field(default_factory=dict)   # file written in place -> its durable copy


def read_track_log(track_file: str) -> TrackLog:
    out = TrackLog()
    if not os.path.exists(track_file):
        return out
    with open(track_file, "r", encoding="utf-8", errors="replace") as fh:
        for seq, line in enumerate(fh):
            line = line.rstrip("\n")
            if line.startswith("#"):
                parts = line.split("\t", 2)
                if len(parts) != 3:
                    continue  # a line torn by the crash of a writer process
                kind, path, extra = parts
                if kind == "#D":
                    try:
                        out.listings[path] = (seq, set(json.loads(extra)))
                    except ValueError:
                        continue
                elif kind in ("#U", "#R"):
                    out.aside.append((seq, kind[1], path, extra))
                elif kind == "#M":
                    out.index_copies[path] = extra
                elif kind == "#P":
                    out.in_place[path] = extra
                continue
            path, sep, size = line.rpartition("\t")
            if sep and size.isdigit():
                out.sizes[path] = int(size)  # later lines win: the last fsync counts
    return out


def read_fsync_log(track_file: str) -> dict[str, int]:
    return read_track_log(track_file).sizes


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


def _undo_directory_entries(log: TrackLog, root: str, report: PowerLossReport) -> None:
    """Top-down: a directory removed here takes its tree with it."""
    for dirpath, dirs, files in os.walk(root, topdown=True):
        dirpath = os.path.abspath(dirpath)
        known = log.listings.get(dirpath)
        if known is None:
            continue  # made before tracking began: taken as durable
        seq, durable = known
        # unlinks and renames over a name since the last fsync: the first one's link holds
        # the contents the name durably had
        first: dict[str, tuple[str, str]] = {}
        for s, kind, path, link in log.aside:
            if s > seq and os.path.dirname(path) == dirpath:
                first.setdefault(os.path.basename(path), (kind, link))
        for name, (kind, link) in first.items():
            if name in durable and os.path.exists(link):
                target = os.path.join(dirpath, name)
                tmp = target + ".powerloss-restore"
                shutil.copyfile(link, tmp)  # a copy: the link may be needed by a later cut too
                os.replace(tmp, target)
                report.restored.append(target)
        for name in sorted(set(os.listdir(dirpath)) - durable):
            _remove(os.path.join(dirpath, name))
            report.deleted.append(os.path.join(dirpath, name))
        dirs[:] = [d for d in dirs if os.path.isdir(os.path.join(dirpath, d))]


def simulate_power_loss(track_file: str, roots: list[str], *, tear: bool = False,
                        rng: random.Random | None = None) -> PowerLossReport:
    rng = rng or random.Random()
    log = read_track_log(track_file)
    synced = log.sizes
    report = PowerLossReport()
    for root in roots:
        _undo_directory_entries(log, os.path.abspath(root), report)
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                path = os.path.abspath(os.path.join(dirpath, name))
                if path == os.path.abspath(track_file):
                    continue
                if name == LMDB_DATA:
                    copy = log.index_copies.get(path)
                    if copy is not None and os.path.exists(copy):
                        shutil.copyfile(copy, path)  # the index as of its last sync
                        report.index_rolled_back.append(path)
                    continue  # else synced at every commit (index_sync = true)
                if path in log.in_place:
                    _restore_in_place(path, log.in_place[path], synced.get(path, 0), tear, rng, report)
                    continue
                size = os.path.getsize(path)
                durable = synced.get(path)
                if durable is None:
                    listed = log.listings.get(os.path.abspath(dirpath))
                    if listed is not None and name in listed[1]:
                        durable = 0  # its name is durable, none of its bytes
                    else:
                        os.unlink(path)
                        report.deleted.append(path)
                        continue
                if size <= durable:
                    continue
                with open(path, "r+b") as fh:
                    lost = b""
                    if tear:
                        fh.seek(durable)
                        page_end = (durable // PAGE_BYTES + 1) * PAGE_BYTES
                        lost = fh.read(min(size, page_end) - durable)
                    fh.truncate(durable)
                    if tear and lost:
                        keep = rng.randrange(0, len(lost) + 1)
                        tail = lost[:keep]
                        if rng.random() < 0.5:  # garbage instead of the real bytes
                            tail = bytes(rng.getrandbits(8) for _ in range(keep))
                        fh.seek(durable)
                        fh.write(tail)
                        report.torn.append(path)
                report.truncated[path] = (size, durable)
    return report


def _restore_in_place(path: str, copy: str, durable: int, tear: bool, rng: random.Random,
                      report: PowerLossReport) -> None:
    """A file written in place (fileio.track_in_place): bytes after its last fsynced data
    end get back what the copy (the file as last made durable whole) holds there: every
    write since the last fsync is lost, the zeros or old records under it come back. The
    file's size is the copy's, or the last fsynced size when a fsynced write grew the file
    past the copy (a FILE_END written at the preallocated end: chaos seed 70431). With
    `tear`, part of the next page of lost data survives, or garbage lands there."""
    if not os.path.exists(copy):
        return
    with open(copy, "rb") as fh:
        old = fh.read()
    size = max(len(old), durable)  # a fsynced write is durable wherever it lands
    with open(path, "r+b") as fh:
        now = fh.read()
        if now[:durable] + old[durable:] == now and len(now) == size:
            return
        page_end = (durable // PAGE_BYTES + 1) * PAGE_BYTES
        out = bytearray(now[:durable] + old[durable:])
        if tear:
            lost = now[durable:min(page_end, len(now), len(old))]
            keep = rng.randrange(0, len(lost) + 1)
            tail = lost[:keep]
            if rng.random() < 0.5:
                tail = bytes(rng.getrandbits(8) for _ in range(keep))
            out[durable:durable + keep] = tail
            report.torn.append(path)
        fh.seek(0)
        fh.write(out)
        fh.truncate(size)
    report.truncated[path] = (len(now), durable)


# ---------------------------------------------------------------------------- the index model
_index_model_lock = threading.Lock()


def install_index_model() -> None:
    """Model LMDB's durability with `index_sync = false` (this process, idempotent): copy
    data.mdb aside at open and at every `Index.sync()`, logged as `#M` in the track file,
    so a power cut rolls the index back to its last sync. Wraps bk.index.Index from here:
    nothing in bk.index knows of it. With `index_sync = true` it does nothing (LMDB syncs
    every commit)."""
    from bk.index import index as ix
    with _index_model_lock:
        if getattr(ix.Index, "_powerloss_model", False):
            return
        orig_init, orig_sync = ix.Index.__init__, ix.Index.sync

        def __init__(self, path, config, *, readonly=False):
            orig_init(self, path, config, readonly=readonly)
            if not readonly and not config.index_sync:
                _copy_index(self, orig_sync)

        def sync(self):
            if self._env.flags().get("sync", True):
                return orig_sync(self)
            _copy_index(self, orig_sync)

        ix.Index.__init__, ix.Index.sync = __init__, sync
        ix.Index._powerloss_model = True


def _copy_index(index, orig_sync) -> None:
    from bk import fileio
    want = os.environ.get("BK_FSYNC_TRACK_FILE")
    # the writer lock: no commit runs between the sync and the copy
    txn = index._env.begin(write=True)
    try:
        orig_sync(index)
        if want:
            data = os.path.abspath(os.path.join(index.path, LMDB_DATA))
            copies = want + ".index"
            os.makedirs(copies, exist_ok=True)
            copy = os.path.join(copies, data.replace(os.sep, "_"))
            shutil.copyfile(data, copy + ".tmp")
            os.replace(copy + ".tmp", copy)
            fileio._track_event("M", data, copy)
    finally:
        txn.abort()


def halt_without_checkpoint(bookie) -> None:
    """Stop an in-process Bookie the way a crash would leave it: no final checkpoint,
    the unclean-shutdown flag left set, everything since the last checkpoint only in
    the journal (the next start must replay it). Called alone, the journals' stop still
    writes and fsyncs what they had queued; behind InProcessCluster.crash_bookie's
    crash gate those writes (and a checkpoint in progress) fail, so it is a kill -9."""
    if bookie.gc is not None:
        bookie.gc.stop()
    for journal in bookie.journals:
        journal.stop()
    storage = bookie.storage
    storage._stopping = True
    storage._flush_event.set()
    if storage._thread is not None:
        storage._thread.join()
        storage._thread = None
    bookie.stop_reads()
    bookie._running = False
    try:
        storage.entry_logger.close()
    except StorageError:  # a failed disk (fsyncgate: a file whose fsync failed refuses more):
        pass              # a killed process closes nothing gracefully either
    storage.close_index()
