"""GC chaos: seeded schedules against one storage engine's destructive paths.

    python -m bk.testing.chaos --mode gc --seeds 200 --json gc.json
    python -m bk.testing.chaos --mode gc --seed 17                      # replay one, with its trace
    python -m bk.testing.chaos --mode gc --seeds 200 --break gc-dead-from-memory
(one seed or many, the summary: bk.testing.chaos.gc_runner; docs/CHAOS.md "GC chaos")

The cluster runs never reach GC (an hour between passes, no deletions, no damaged
logs). Here each seed drives one in-process engine (bk.bookie.Bookie, 64 KiB entry
logs, the journal on or off, drawn by the seed) through a random schedule of:

  add        entries of random sizes (8 B - 3 KiB) to 1-3 ledgers, maybe a new one
  checkpoint
  restart    a clean stop (every log closed with its ledgers map) and a start
  crash      halt_without_checkpoint, then the newest log's ledgers map stripped: the
             map-less log a crash leaves (in-process the halt closes the log with its
             map, so the strip models what kill -9 leaves); journal off, what no
             checkpoint covered may be gone, and is added again (BP-46 would copy it)
  delete     1-2 live ledgers lose their metadata, a GC pass
  damage     after a clean stop, a closed log loses its map and one record's size field
             is garbled (a record near the log's start more often than not): the scan
             of that log stops there; the record hit may be a live entry's, which from
             then on must answer EIO
  commit     an index commit fails (ENOSPC) during a GC delete, the next pass compacts
             the logs holding that ledger, and the stop's checkpoint fails as well
  gc         a pass: force_major, or compact_logs of random closed logs

Every GC pass asks the bookie's own scan-and-compare policy, over an in-memory
metadata store holding the live ledgers' metadata, and draws a metadata fault of
its own (bk.testing.chaos.gc_metadata: a listing that omits live ledgers, reads
that fail with a connection loss, a store that is down), from a generator seeded
apart from the schedule's; but for the commit step's first pass, whose fault is the
full disk.

The checker runs after every restart, after every GC pass and at the end: every
entry of every live ledger reads back byte for byte, except those whose record was
garbled, which answer an I/O error (never "no such entry/ledger", never other bytes,
unless the start's entry-log check declared that location missing: lost_at_boot);
a ledger whose deletion was durable never comes back; a ledger whose metadata is gone
but whose delete did not become durable (the failed commit) or did not happen (its
metadata read failed: kept) is back whole or gone whole; journal off, a crash may take
the entries of such a ledger that no checkpoint covered (nobody adds them again).
Breaks (bk.testing.chaos.gc_breaks) re-introduce three fixed defects by injection.
"""
from __future__ import annotations

import asyncio
import errno
import os
import random
from dataclasses import asdict, dataclass, field

from bk._native import load
from bk.bookie import Bookie
from bk.bookie.log_check import is_dead
from bk.formats import entrylog as fmt
from bk.entrylog.files import LogScan
from bk.errors import BookieIOError, NoSuchEntryError, NoSuchLedgerError, StorageError
from bk.testing.corruption import damage_record_size, strip_ledgers_map
from bk.testing.diskfaults import DiskFaults
from bk.testing.engine_host import expected_entry, ledger_key
from bk.testing.gc_host import gc_config
from bk.testing.powerloss import halt_without_checkpoint

from . import gc_breaks
from .gc_metadata import ChaosMetadata

STEPS = {"add": 8, "checkpoint": 2, "restart": 1, "crash": 1.2, "delete": 2, "damage": 1.5, "commit": 0.8,
         "gc": 2.5}
MISSING = (NoSuchEntryError, NoSuchLedgerError)


class _FullDiskPolicy:
    """The policy, whose deletes find the disk full: every index commit fails from the
    moment the GC pass asks the metadata (its checkpoint, any retry of it) until healed."""

    def __init__(self, policy, faults: DiskFaults):
        self.policy = policy
        self.faults = faults

    async def find_garbage(self, local, delete):
        self.faults.fail(op="commit", errno=errno.ENOSPC, count=None)
        return await self.policy.find_garbage(local, delete)


class Failed(Exception):
    """A finding of the checker: the run failed."""


@dataclass
class GcRunResult:
    seed: int
    test_break: str
    journal: bool
    ok: bool = True
    failures: list = field(default_factory=list)
    failed_step: str = ""  # the schedule step whose check failed first
    finding: bool = False  # the checker's finding (else an error the schedule did not expect)
    steps: dict = field(default_factory=dict)
    entries: int = 0
    garbled_live: int = 0
    ledgers_deleted: int = 0
    metadata_faults: dict = field(default_factory=dict)  # GC passes by metadata fault drawn
    duration_s: float = 0.0
    trace: list = field(default_factory=list)

    def to_json(self) -> dict:
        out = asdict(self)
        out.pop("trace")
        out["replay"] = replay_command(self.seed, self.test_break)
        return out


def replay_command(seed: int, test_break: str = "") -> str:
    return f"python -m bk.testing.chaos --mode gc --seed {seed}" + (f" --break {test_break}" if test_break else "")


class GcChaos:
    """One seed's run. The model: `live` ledger -> entry sizes (entry id = position),
    `doomed` (metadata gone, a delete not known durable: whole or gone), `deleted`
    (durably gone), `garbled` (live entries whose record the nemesis garbled), `durable`
    (journal off: entries a checkpoint covered), `crash_lost` (journal off: entries of
    doomed ledgers a crash took before any checkpoint covered them)."""

    def __init__(self, seed: int, work_dir: str, test_break: str = "", n_steps: int | None = None):
        self.seed, self.test_break = seed, test_break
        self.rng = random.Random(seed)
        self.journal = self.rng.random() < 0.6
        self.n_steps = n_steps or self.rng.randint(25, 45)
        self.cfg = gc_config(work_dir, journal_off=not self.journal, flush_interval_ms=60_000)
        self.live: dict[int, list[int]] = {}
        self.doomed: dict[int, list[int]] = {}
        self.deleted: set[int] = set()
        self.garbled: set[tuple[int, int]] = set()
        self.durable: dict[int, int] = {}
        self.crash_lost: set[tuple[int, int]] = set()
        self.meta = ChaosMetadata(seed, self.cfg)
        self.policy = self.meta.policy
        self.next_ledger = 1
        self.bookie: Bookie | None = None
        self.result = GcRunResult(seed, test_break, self.journal)
        self.result.metadata_faults = self.meta.counts  # filled as passes draw them
        self.step = "start"

    def say(self, line: str) -> None:
        self.result.trace.append(f"[{self.step}] {line}")

    # ------------------------------------------------------------ the engine
    async def start(self) -> None:
        self.bookie = b = Bookie(self.cfg)
        await b.start()
        b.gc.policy = self.policy
        gc_breaks.apply(b, self.test_break)

    async def stop(self) -> None:
        await self.bookie.stop()
        self.mark_durable()

    def mark_durable(self) -> None:
        self.durable = {lid: len(sizes) for lid, sizes in (*self.live.items(), *self.doomed.items())}

    async def gc_pass(self, force_major: bool = False, logs=None, durable: bool = True,
                      metadata_fault: bool = True) -> dict:
        """One pass; with `metadata_fault` under the metadata fault it draws (gc_metadata)."""
        gc = self.bookie.gc
        fault = self.meta.arm(sorted(self.live), sorted(self.doomed)) if metadata_fault else "not drawn"
        try:
            out = await asyncio.to_thread(gc.compact_logs, logs) if logs is not None else \
                await asyncio.to_thread(gc.trigger, force_major=force_major)
        finally:
            self.meta.heal()
        for lid in out["ledgers_deleted"]:
            if durable:  # its checkpoint and index sync succeeded
                self.doomed.pop(lid, None)
                self.deleted.add(lid)
        hexes = lambda ids: "[" + " ".join(f"{i:x}" for i in ids) + "]"  # noqa: E731 - log ids, as in file names
        self.say(f"gc {'logs ' + hexes(logs) if logs is not None else 'major' if force_major else 'pass'}: "
                 f"deleted ledgers {out['ledgers_deleted']}, logs {hexes(out['logs_deleted'])}, compacted "
                 f"{hexes(out['logs_compacted'])}{', errors ' + str(len(out['errors'])) if out['errors'] else ''}"
                 f" (metadata {fault})")
        return out

    def closed_logs(self) -> list[int]:
        return self.bookie.storage.entry_logger.closed_log_ids()

    # ------------------------------------------------------------ the checker
    async def read(self, lid: int, eid: int):
        """The entry's bytes, or the "missing" or I/O error it answered."""
        try:
            return bytes(await self.bookie.read_entry(lid, eid))
        except (*MISSING, BookieIOError) as e:
            return e

    def lost_at_boot(self, lid: int, eid: int, got) -> bool:
        """A garbled record that the start's entry-log check took for a torn tail (it was
        the last record the index names in its log): the entry is declared missing, which
        in a bookie puts its ledger in limbo for the BP-46 repair (bk.server.integrity),
        and the engine alone answers "no such entry"."""
        b = self.bookie
        if not isinstance(got, NoSuchEntryError) or not b.log_check.dead_logs:
            return False
        loc = b.storage.index.get_location(lid, eid)
        if loc is not None and is_dead(b.log_check.dead_from, loc):
            self.say(f"ledger {lid} entry {eid} (garbled) was declared missing at start: limbo in a bookie")
            return True
        return False

    def where(self, lid: int, eid: int) -> str:
        """Where the index places an entry, for a finding's message."""
        loc = self.bookie.storage.index.get_location(lid, eid)
        return "no index location" if loc is None else f"index location log {loc >> 32:x} offset {loc & 0xFFFFFFFF}"

    def right(self, lid: int, eid: int, size: int, got) -> bool:
        """The entry's bytes; for a garbled record, an I/O error (or missing, see lost_at_boot)."""
        if (lid, eid) in self.garbled:
            return isinstance(got, BookieIOError) or self.lost_at_boot(lid, eid, got)
        return got == expected_entry(self.seed, lid, eid, size)

    def wrong(self, what: str, lid: int, eid: int, got) -> Failed:
        answer = f"{type(got).__name__}: {got}" if isinstance(got, Exception) else f"other bytes ({len(got)} B)"
        return Failed(f"{what}: entry {eid} answered {answer} ({self.where(lid, eid)})")

    async def check(self, after_crash: bool = False) -> None:
        """The invariants (module docstring). After a journal-off crash, entries no
        checkpoint covered may be missing: they are added again."""
        b, readd = self.bookie, []
        for lid, sizes in self.live.items():
            for eid, size in enumerate(sizes):
                got = await self.read(lid, eid)
                if isinstance(got, MISSING) and after_crash and not self.journal and eid >= self.durable.get(lid, 0) \
                        and (lid, eid) not in self.garbled:
                    readd.append((lid, eid))
                elif not self.right(lid, eid, size, got):
                    raise self.wrong(f"ledger {lid}{' (record garbled)' if (lid, eid) in self.garbled else ''}",
                                     lid, eid, got)
        for lid in sorted(self.deleted):
            if b.ledger_exists(lid):
                raise Failed(f"ledger {lid}, durably deleted, is back ({len(b.storage.index.entry_ids(lid))} entries;"
                             f" unclean start {b.was_unclean_shutdown}, {b.replayed_records} journal records replayed)")
        for lid, sizes in self.doomed.items():
            # A GC pass may delete it while it is read (one runs at a start that finds a
            # compaction pending): its answers then end in "no such ledger/entry".
            got = [await self.read(lid, eid) for eid in range(len(sizes))]
            if after_crash and not self.journal:  # what no checkpoint covered may be gone for good
                took = {(lid, e) for e in range(self.durable.get(lid, 0), len(got))
                        if isinstance(got[e], MISSING) and (lid, e) not in self.garbled} - self.crash_lost
                if took:
                    self.crash_lost |= took
                    self.say(f"ledger {lid} (metadata gone, not deleted): the crash took {len(took)} entries"
                             " no checkpoint covered (journal off; nobody adds them again)")
            gone_now = MISSING if not b.ledger_exists(lid) else ()
            gone = next((e for e, g in enumerate(got) if isinstance(g, gone_now)), len(got))
            bad = [e for e in range(gone) if not self.right(lid, e, sizes[e], got[e])
                   and not ((lid, e) in self.crash_lost and isinstance(got[e], MISSING))]
            bad += [e for e in range(gone, len(got)) if not isinstance(got[e], MISSING)]
            if bad:
                raise self.wrong(f"ledger {lid}, whose delete was not durable, is neither whole nor gone "
                                 f"({len(bad)} of {len(got)} entries wrong)", lid, bad[0], got[bad[0]])
        for lid, eid in readd:
            entry = expected_entry(self.seed, lid, eid, self.live[lid][eid])
            await b.add_entry(lid, eid, entry, ledger_key(self.seed, lid))
        if readd:
            self.say(f"added again {len(readd)} entries the crash took (journal off)")

    # ------------------------------------------------------------ the steps
    async def do_add(self) -> None:
        rng = self.rng
        if len(self.live) < 2 or rng.random() < 0.25:
            self.live[self.next_ledger] = []
            await self.meta.create(self.next_ledger)
            self.next_ledger += 1
        lids = rng.sample(sorted(self.live), min(len(self.live), rng.randint(1, 3)))
        n = rng.randint(5, 40)
        for _ in range(n):
            for lid in lids:
                sizes = self.live[lid]
                size = rng.randint(8, 200) if rng.random() < 0.3 else rng.randint(200, 3000)
                await self.bookie.add_entry(lid, len(sizes), expected_entry(self.seed, lid, len(sizes), size),
                                            ledger_key(self.seed, lid))
                sizes.append(size)
        self.say(f"add {n} entries to each of {lids}")

    async def do_checkpoint(self) -> None:
        await self.bookie.checkpoint()
        self.mark_durable()
        self.say("checkpoint")

    async def do_restart(self) -> None:
        await self.stop()
        await self.start()
        self.say("clean restart")
        await self.check()

    async def do_crash(self) -> None:
        await asyncio.to_thread(halt_without_checkpoint, self.bookie)
        logs = self.log_files()
        stripped = ""
        if logs:
            try:
                strip_ledgers_map(logs[-1][1])
                stripped = f", log {logs[-1][0]:x} left without its map"
            except ValueError:
                pass
        await self.start()
        self.say(f"crash{stripped}")
        await self.check(after_crash=True)

    async def do_delete(self) -> None:
        if len(self.live) < 2:
            return
        lids = self.rng.sample(sorted(self.live), min(len(self.live) - 1, self.rng.randint(1, 2)))
        for lid in lids:
            self.doomed[lid] = self.live.pop(lid)
            await self.meta.remove(lid)
        self.say(f"metadata of {lids} deleted")
        await self.gc_pass(force_major=self.rng.random() < 0.5)
        await self.check()

    async def do_damage(self) -> None:
        await self.stop()
        logs = self.log_files()
        hit = None
        if logs:
            log_id, path = self.rng.choice(logs)
            try:
                strip_ledgers_map(path)
            except ValueError:  # already map-less (a crash's log)
                pass
            records = list(LogScan(load("entrylog"), path, log_id, os.path.getsize(path), 1 << 31))
            if records:
                lid, eid, loc, _size = records[int(len(records) * self.rng.random() ** 3)]
                damage_record_size(path, loc & fmt.MAX_OFFSET)
                hit = (log_id, lid, eid, loc)
        await self.start()
        if hit is not None:
            log_id, lid, eid, loc = hit
            sizes = self.live.get(lid, self.doomed.get(lid, ()))
            indexed = eid < len(sizes) and self.bookie.storage.index.get_location(lid, eid) == loc
            if indexed:
                self.garbled.add((lid, eid))
                self.result.garbled_live += 1
            self.say(f"log {log_id:x}: map stripped, record of ledger {lid} entry {eid} garbled"
                     f" ({'a live entry: EIO from now on' if indexed else 'not a live location'})")
        await self.check()

    async def do_commit(self) -> None:
        """A GC delete whose index commit fails (a full disk), compaction of that
        ledger's logs, a stop whose checkpoint fails too (issue 27's second defect)."""
        if len(self.live) < 2:
            return
        await self.bookie.checkpoint()
        self.mark_durable()
        closed = set(self.closed_logs())
        index = self.bookie.storage.index

        def logs_of(lid: int) -> list[int]:
            locs = index.get_locations([(lid, e) for e in range(len(self.doomed.get(lid) or self.live[lid]))])
            return sorted({loc >> 32 for loc in locs if loc is not None} & closed)
        held = [x for x in sorted(self.live) if logs_of(x)]  # in a closed log, so compaction can reach it
        lid = self.rng.choice(held or sorted(self.live))
        logs = logs_of(lid)
        faults = DiskFaults.install()
        try:
            self.doomed[lid] = self.live.pop(lid)
            await self.meta.remove(lid)
            self.bookie.gc.policy = _FullDiskPolicy(self.policy, faults)
            self.say(f"metadata of [{lid}] deleted, index commits failing (ENOSPC) from the delete on")
            # the pass's fault is the full disk: its metadata answers (else a failed read
            # would keep the ledger, and the failed commit this step is about never happens)
            await self.gc_pass(durable=False, metadata_fault=False)
            faults.heal()
            self.bookie.gc.policy = self.policy
            if logs:
                await self.gc_pass(logs=logs, durable=False)
            await self.check()
            faults.fail(op="commit", errno=errno.ENOSPC, count=None)
            try:
                await self.bookie.stop()  # its checkpoint fails: the unclean-shutdown flag stays
            except StorageError as e:  # the flag could not be cleared (nothing was left to checkpoint)
                self.say(f"stop: {type(e).__name__}")
                self.bookie.storage.close_index()
            faults.heal()
        finally:
            DiskFaults.uninstall()
        await self.start()
        self.say(f"restart after the failed stop: ledger {lid} {'back' if self.bookie.ledger_exists(lid) else 'gone'}")
        await self.check()

    async def do_gc(self) -> None:
        closed = self.closed_logs()
        if closed and self.rng.random() < 0.5:
            await self.gc_pass(logs=sorted(self.rng.sample(closed, self.rng.randint(1, min(4, len(closed))))))
        else:
            await self.gc_pass(force_major=True)
        await self.check()

    def log_files(self) -> list[tuple[int, str]]:
        d = fmt.log_dir(self.cfg.ledger_dirs[0])
        out = [(fmt.parse_log_file_name(n), os.path.join(d, n)) for n in os.listdir(d)] if os.path.isdir(d) else []
        return sorted((i, p) for i, p in out if i is not None)

    # ------------------------------------------------------------ the run
    async def run(self) -> None:
        names, weights = list(STEPS), list(STEPS.values())
        await self.start()
        try:
            self.step = "add"
            await self.do_add()
            for i in range(self.n_steps):
                self.step = f"{i + 1}:{self.rng.choices(names, weights)[0]}"
                kind = self.step.split(":")[1]
                self.result.steps[kind] = self.result.steps.get(kind, 0) + 1
                await getattr(self, f"do_{kind}")()
            self.step = "end"
            await self.check()
            await self.do_restart()
            await self.gc_pass(force_major=True)
            await self.check()
        finally:
            if self.bookie is not None and self.bookie._running:
                await self.bookie.stop()
        self.result.entries = sum(len(s) for s in self.live.values())
        self.result.ledgers_deleted = len(self.deleted)

