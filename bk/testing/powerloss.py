"""Simulated power loss for crash tests.

`kill -9` keeps the page cache, so it cannot show that fsync is called at the
right moments. With `BK_FSYNC_TRACK_FILE` set, bk.fileio logs every file's size
after each successful fsync. After killing the process, `simulate_power_loss`
rolls every file back to what a power cut could leave:

- a file that was fsynced is truncated to its last fsynced size, and with
  `tear=True` keeps a random part of the next page of lost data (a torn write)
  or gets garbage there;
- a file that was never fsynced is deleted (its directory entry was never made
  durable either);
- LMDB files (`data.mdb`, `lock.mdb`) are left alone: LMDB fsyncs its own
  commits, and a committed transaction is durable by LMDB's design.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

from bk.errors import StorageError

PAGE_BYTES = 4096
LMDB_FILES = {"data.mdb", "lock.mdb"}


@dataclass
class PowerLossReport:
    truncated: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (old, new)
    deleted: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (f"power loss: {len(self.truncated)} files truncated, {len(self.deleted)} deleted, "
                f"{len(self.torn)} torn")


def read_fsync_log(track_file: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    if not os.path.exists(track_file):
        return sizes
    with open(track_file, "r", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            path, sep, size = line.rstrip("\n").rpartition("\t")
            if sep and size.isdigit():
                sizes[path] = int(size)  # later lines win: the last fsync counts
    return sizes


def simulate_power_loss(track_file: str, roots: list[str], *, tear: bool = False,
                        rng: random.Random | None = None) -> PowerLossReport:
    rng = rng or random.Random()
    synced = read_fsync_log(track_file)
    report = PowerLossReport()
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                if name in LMDB_FILES:
                    continue
                path = os.path.abspath(os.path.join(dirpath, name))
                if path == os.path.abspath(track_file):
                    continue
                size = os.path.getsize(path)
                durable = synced.get(path)
                if durable is None:
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


def halt_without_checkpoint(bookie) -> None:
    """Stop an in-process Bookie the way a crash would leave it: journals drained
    and closed (what they acknowledged is on disk), but no final checkpoint, the
    unclean-shutdown flag left set, and everything since the last checkpoint only
    in the journal. The next start must replay it."""
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
