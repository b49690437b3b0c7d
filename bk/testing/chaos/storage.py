"""The bookies' storage in a cluster chaos run: drawn per seed, so the runs reach the code
that loses data in BookKeeper's history (issue 28, "Workloads that reach the dangerous code").

    plan = draw_storage(seed)              # from stream(seed, "storage") alone
    plan.config()                          # the bookie settings it adds (run.bookie_config)
    await deleter(chaos, plan)             # short ledgers written, closed and deleted meanwhile
    await check_deleted(chaos, bkc, out)   # a deleted ledger never comes back in the metadata
    reached(bookies)                       # what the bookies' own counters say the run reached

The draw has its own random stream, so every other part of a seed (cluster, workload,
faults, placement) is what it was before the draw existed. Per seed:
- GC every 100-500 ms (60% of seeds) with minor and major compaction thresholds that fire
  (minor 0.2-0.6 every second, major 0.7-0.95 every 1 or 3 s) and 1-3 short ledgers a client
  writes, closes and deletes while the plan's writers write (BookKeeper.delete_ledger), so a
  GC pass finds dead ledgers and compacts logs holding their entries and live ones; without
  GC, 0-1 such ledgers (their metadata goes, their entries stay); each of 20-60 entries of
  1-8 KiB, 16 or 32 adds in flight (bursts that fill a small write cache: a run with one has
  at least one such ledger);
- small entry logs (64 KiB-1 MiB) and journals (64-256 KiB) that rotate (60%);
- a small write cache (64-128 KiB) that fills: adds wait for a flush, and past
  `write_cache_full_wait_ms` (5 ms-2 s) are refused with ETOOMANYREQUESTS (50%);
- two ledger directories per bookie (50%: bk.testing.cluster.ledger_dirs_of puts both under
  `<bookie>/ledgers`, so a disk fault on the ledger dirs, a power cut of the bookie's
  directory, the crash gate (its config's ledger_dirs) and a bit flip cover both; in-process,
  SeparateDisks makes new entry logs alternate between them).
The deleted ledgers are never read back; the plan's ledgers are checked as always (inv1:
every acknowledged entry still read, which is what catches a GC that deletes live data).
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import asdict, dataclass

from bk.errors import BKError, NoSuchLedgerMetadataError

from .scenario import UNSYNCED_CUT_BREAKS, stream

log = logging.getLogger(__name__)
KiB = 1024
DELETE_PASSWORD = b"chaos-deleted"


@dataclass(frozen=True)
class StoragePlan:
    gc: bool
    gc_wait_time_ms: int
    minor_compaction_threshold: float
    major_compaction_threshold: float
    major_compaction_interval_s: int  # minor: every second
    small_logs: bool  # entry logs and journals small enough to rotate
    entry_log_size_limit_bytes: int
    journal_max_size_bytes: int
    small_cache: bool  # a write cache small enough to fill
    write_cache_bytes: int
    write_cache_full_wait_ms: int
    ledger_dirs: int  # per bookie
    deletes: int  # short ledgers written, closed and deleted during the run
    delete_entries: tuple[int, int]  # entries of each, drawn in [lo, hi]
    delete_entry_bytes: tuple[int, int]
    delete_window: int

    def config(self) -> dict:
        """The bookie settings this plan adds (run.bookie_config)."""
        out: dict = {}
        if self.ledger_dirs > 1:  # InProcessCluster / LocalCluster: ledger_dirs_of
            out["ledger_dirs_per_bookie"] = self.ledger_dirs
        if self.gc:
            out.update(gc_wait_time_ms=self.gc_wait_time_ms,
                       minor_compaction_threshold=self.minor_compaction_threshold, minor_compaction_interval_s=1,
                       major_compaction_threshold=self.major_compaction_threshold,
                       major_compaction_interval_s=self.major_compaction_interval_s,
                       compaction_rate_bytes_per_s=0)
        if self.small_logs:
            out.update(entry_log_size_limit_bytes=self.entry_log_size_limit_bytes,
                       journal_max_size_bytes=self.journal_max_size_bytes)
        if self.small_cache:
            out.update(write_cache_max_size_bytes=self.write_cache_bytes,
                       write_cache_full_wait_ms=self.write_cache_full_wait_ms)
        return out

    def drawn(self) -> dict:
        """What a run's JSON records (tables split by it)."""
        return {"gc": self.gc, "small_logs": self.small_logs, "small_cache": self.small_cache,
                "two_dirs": self.ledger_dirs == 2, "deletes": self.deletes}

    def describe(self) -> str:
        return (f"storage: gc {'every %d ms' % self.gc_wait_time_ms if self.gc else 'off'}"
                + (f" (minor {self.minor_compaction_threshold}, major {self.major_compaction_threshold})"
                   if self.gc else "")
                + (f", entry logs {self.entry_log_size_limit_bytes // KiB} KiB, journals"
                   f" {self.journal_max_size_bytes // KiB} KiB" if self.small_logs else ", default log sizes")
                + (f", write cache {self.write_cache_bytes // KiB} KiB (full wait {self.write_cache_full_wait_ms} ms)"
                   if self.small_cache else "")
                + f", {self.ledger_dirs} ledger dir(s), {self.deletes} deleted ledger(s)")


def draw_storage(seed: int, draw_for: str = "") -> StoragePlan:
    """The storage of `seed`'s bookies, from stream(seed, "storage") alone. Every value is drawn
    whether it is used or not, so one switch never shifts another's draw. A scenario drawn for
    a break whose entries live only until the next checkpoint (UNSYNCED_CUT_BREAKS) keeps GC
    and the write cache as before: a GC pass and a full half both checkpoint, making the entries
    durable before the cut that would show the break."""
    rng = stream(seed, "storage")
    gc = rng.random() < 0.6
    gc_wait = rng.randint(100, 500)  # runs last 1-2 s: several passes in each
    minor = rng.choice([0.2, 0.4, 0.6])
    major = rng.choice([0.7, 0.8, 0.95])
    major_every = rng.choice([1, 3])
    small_logs = rng.random() < 0.6
    log_limit = rng.choice([64 * KiB, 64 * KiB, 64 * KiB, 128 * KiB, 256 * KiB, 1024 * KiB])
    journal_max = rng.choice([64 * KiB, 128 * KiB, 256 * KiB])
    small_cache = rng.random() < 0.5
    # measured (seeds 60001-60080): 64 KiB filled in 12 of 17 runs with a deleter, 128 KiB in 1 of
    # 8, 256 KiB in none of 9: a flush of a half is fast, only a burst fills the other half first
    cache = rng.choice([64 * KiB, 64 * KiB, 64 * KiB, 128 * KiB])
    full_wait = rng.choice([5, 100, 500, 2000])  # 5 ms: a flush often takes longer, adds are refused
    dirs = 2 if rng.random() < 0.5 else 1
    deletes = rng.choice([1, 2, 3]) if gc else rng.choice([0, 1, 1])
    lo = rng.choice([1000, 2000, 4000])
    entries_lo = rng.randint(20, 40)
    window = rng.choice([16, 32, 32])
    if small_cache:  # the deleter's bursts are what fill it
        deletes = max(deletes, 1)
    if draw_for in UNSYNCED_CUT_BREAKS:
        gc = small_cache = False
        deletes = 0
    return StoragePlan(gc, gc_wait, minor, major, major_every, small_logs, log_limit, journal_max, small_cache, cache,
                       full_wait, dirs, deletes, (entries_lo, entries_lo + 20), (lo, lo + 4000), window)


# ------------------------------------------------------------ the deleted ledgers
async def deleter(chaos, plan: StoragePlan) -> None:
    """Write `plan.deletes` short ledgers one after the other while the plan's writers write,
    close each and delete it (BookKeeper.delete_ledger): GC then finds dead ledgers whose entries
    share entry logs with live ones. Faults may fail any step: what was deleted for sure is
    recorded in `chaos.deleted` (check_deleted), nothing of these ledgers is ever read back."""
    from bk.client import BookKeeper
    from .clients import client_options
    if not plan.deletes:
        return
    rng = stream(chaos.s.seed, "storage", "deleter")
    bookies = chaos.s.bookies
    async with BookKeeper(chaos.cluster.metadata_uri, **client_options(chaos, "deleter")) as bkc:
        for k in range(plan.deletes):
            e = rng.choice([n for n in (2, 3) if n < bookies] or [2])  # a spare bookie left
            wq = rng.randint(2, e)
            entries = rng.randint(*plan.delete_entries)
            sizes = [rng.randint(*plan.delete_entry_bytes) for _ in range(entries)]
            try:
                lh = await bkc.create_ledger(e, wq, wq, password=DELETE_PASSWORD)
            except BKError as ex:
                chaos.note(f"deleted ledger #{k}: create failed: {ex!r}")
                continue
            sem = asyncio.Semaphore(plan.delete_window)
            written = 0

            async def one(size: int) -> None:
                nonlocal written
                try:
                    await lh.add_entry(bytes([k + 1]) * size)
                    written += 1
                except BKError:
                    pass
                finally:
                    sem.release()

            tasks = []
            for size in sizes:
                await sem.acquire()
                tasks.append(asyncio.ensure_future(one(size)))
            await asyncio.gather(*tasks)
            try:
                await lh.close()
            except BKError as ex:
                chaos.note(f"deleted ledger #{k} = {lh.ledger_id}: close failed: {ex!r}")
            try:
                await bkc.delete_ledger(lh.ledger_id)
            except BKError as ex:
                chaos.note(f"deleted ledger #{k} = {lh.ledger_id}: delete failed: {ex!r}")
                continue
            chaos.deleted.append(lh.ledger_id)
            chaos.note(f"deleted ledger #{k} = {lh.ledger_id} ({e}/{wq}/{wq}, {written} of {entries} entries"
                       f" of {plan.delete_entry_bytes[0]}-{plan.delete_entry_bytes[1]} B)")


async def check_deleted(chaos, out: list[str]) -> None:
    """A ledger deleted for sure never comes back in the metadata (nothing the run does may
    recreate it: recovery, AutoRecovery, a bookie's GC). Run after verify, the cluster healed."""
    from bk.client import BookKeeper
    from .clients import client_options
    if not chaos.deleted:
        return
    async with BookKeeper(chaos.cluster.metadata_uri, **client_options(chaos, "checker")) as bkc:
        for lid in chaos.deleted:
            try:
                md = await bkc.get_ledger_metadata(lid)
            except NoSuchLedgerMetadataError:
                continue
            except BKError as e:
                chaos.note(f"deleted ledger {lid}: metadata read failed: {e!r}")
                continue
            out.append(f"deleted: ledger {lid} was deleted, yet its metadata is back ({md.state.name})")


def record(chaos, plan: StoragePlan, result) -> None:
    """The run's JSON: what was drawn (`storage`, with the journal on or off and how many ledgers
    the deleter deleted for sure) and what the bookies reached (`reached`: in-process runs only;
    a bookie process's counters die with it)."""
    result.storage = dict(plan.drawn(), journal=chaos.s.journal, deleted=len(chaos.deleted))
    started = getattr(chaos.cluster, "started", None)
    result.reached = reached(started) if started else {}


# ------------------------------------------------------------ two ledger dirs, two disks
class SeparateDisks:
    """Two ledger dirs on one filesystem (/dev/shm) report the same free space, so the entry
    logger (which opens each new log in the dir with the most free space) would put every log in
    the first. While installed (an in-process run with two dirs: InProcessChaosCluster), each
    ledger dir looks like a disk of its own: the filesystem's free space less what that dir's
    logs hold, so new logs alternate between the dirs and GC, compaction, the start-up log check
    and the faults meet logs in both. Through the entry logger's test seam (`_dir_space`);
    a full disk (bk.testing.diskfaults) still reports itself. Bookie processes keep the plain
    choice (their logs stay in the first dir)."""

    _installed: "SeparateDisks | None" = None

    def __init__(self):
        from bk.entrylog import logger
        self._logger = logger
        self._plain = logger._dir_space

    def space(self, path: str):
        usage = self._plain(path)
        try:
            used = sum(e.stat().st_size for e in os.scandir(path) if e.is_file(follow_symlinks=False))
        except OSError:
            return usage
        return usage._replace(free_bytes=max(0, usage.free_bytes - used))

    @classmethod
    def install(cls) -> None:
        if cls._installed is None:
            cls._installed = cls()
            cls._installed._logger._dir_space = cls._installed.space

    @classmethod
    def uninstall(cls) -> None:
        if cls._installed is not None:
            cls._installed._logger._dir_space = cls._installed._plain
            cls._installed = None


# ------------------------------------------------------------ what the run reached
REACHED_KEYS = ("gc_passes", "gc_ledgers_deleted", "gc_logs_deleted", "gc_logs_compacted", "compaction_runs",
                "entry_log_rotations", "journal_rotations", "adds_throttled", "adds_rejected", "checkpoints")


def reached(bookies) -> dict[str, int]:
    """Sum the counters of every Bookie the run started (a restart is a new one): GC passes,
    ledgers GC deleted, entry logs GC deleted whole or compacted, compaction runs (minor or major,
    with or without a log under the threshold),
    entry-log and journal rotations, adds that found the write cache full (throttled) and
    those refused once it stayed full (ETOOMANYREQUESTS), checkpoints."""
    out = dict.fromkeys(REACHED_KEYS, 0)
    for b in bookies:
        gc = getattr(b, "gc", None)
        if gc is not None:
            st = gc._status  # the figures gc.status() reports, without its disk look-ups
            out["gc_passes"] += st["passes"]
            out["gc_ledgers_deleted"] += st["ledgers_deleted"]
            out["gc_logs_deleted"] += st["logs_deleted"]
            out["gc_logs_compacted"] += st["logs_compacted"]
            out["compaction_runs"] += gc._bk["majorCompactionCounter"] + gc._bk["minorCompactionCounter"]
        storage = getattr(b, "storage", None)
        if storage is not None:
            out["entry_log_rotations"] += storage.entry_logger.rotations
            out["checkpoints"] += storage.checkpoints
        out["journal_rotations"] += sum(getattr(j, "rotations", 0) for j in getattr(b, "journals", ()))
        out["adds_throttled"] += getattr(b, "adds_throttled", 0)
        out["adds_rejected"] += getattr(b, "adds_rejected", 0)
    return out


DRAWS = ("gc", "small_logs", "small_cache", "two_dirs", "journal")


def storage_table(results: list[dict]) -> dict:
    """A batch's summary (runner.summarize): the reached counters summed over its runs, how many
    runs reached each, and per drawn setting (on, off) its runs, failed runs and mean run time."""
    drawn = [r for r in results if r.get("storage")]
    total: dict[str, int] = dict.fromkeys(REACHED_KEYS, 0)
    runs_reaching: dict[str, int] = dict.fromkeys(REACHED_KEYS, 0)
    for r in drawn:
        for k, v in r.get("reached", {}).items():
            total[k] = total.get(k, 0) + v
            runs_reaching[k] = runs_reaching.get(k, 0) + (v > 0)
    draws = {}
    for key in DRAWS:
        for value in (True, False):
            rs = [r for r in drawn if bool(r["storage"].get(key)) == value]
            draws[f"{key} {'on' if value else 'off'}"] = {
                "runs": len(rs), "failed_runs": sum(not r["ok"] for r in rs),
                "mean_run_s": round(sum(r["duration_s"] for r in rs) / max(1, len(rs)), 3)}
    return {"runs": len(drawn), "reached_runs": sum(bool(r.get("reached")) for r in drawn), "reached": total,
            "runs_reaching": runs_reaching,
            "client_deleted_ledgers": sum(r["storage"].get("deleted", 0) for r in drawn), "draws": draws}


__all__ = ["DRAWS", "REACHED_KEYS", "SeparateDisks", "StoragePlan", "check_deleted", "deleter", "draw_storage",
           "reached", "record", "storage_table"]
