"""Run one Scenario: start the cluster, write and tail, inject the schedule, heal, verify.

    result = run_scenario(generate(seed), work_dir)     # blocking; a fresh event loop
    result.ok, result.failures, result.trace

Phases of a run:
1. the cluster (clusters.py) with short timeouts, the journal on or off, AutoRecovery
   on or off, and the scenario's `test_break`;
2. one writer client per ledger adds its entries through History.add (a window of
   adds in flight, payload sizes from the plan), tailing readers read up to the LAC
   meanwhile, and every fault of the schedule is applied at its time and healed
   `duration_ms` later (nemesis.py);
3. each writer ends as planned: closes its ledger, dies (its client closes with
   adds in flight), or lives on (keeps its handle; its next add must fail);
4. heal everything, then verify (verify.py).
A harness exception or a run over its time limit is a failure too (`harness`,
`timeout`): a hang is a liveness bug until shown otherwise. So is a call into the run's
event loop from another thread (`thread`, bk.testing.loopcheck): it breaks things later and
at random (seed 62830), so it is caught where it happens.
"""
from __future__ import annotations

import asyncio
import faulthandler
import hashlib
import io
import logging
import os
import random
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field

from bk.client import BookKeeper
from bk.client.placement import EnsemblePlacementPolicy
from bk.errors import BKError, NotEnoughBookiesError
from bk.testing.history import History
from bk.testing.loopcheck import checked_loop_factory

from .clients import CrashableHandle, client_options, route_client, stop_routes, tls_config
from .clusters import BookieStartError, InProcessChaosCluster, ProcessChaosCluster
from .diagnose import Budget, LoopLag
from .excuse import BITFLIP, BOOKIE_REFUSED, JOURNAL_OFF_CRASH, JOURNAL_OFF_CRASH_UNWATCHED, entry_at_unflipped, \
    read_watch, watch_storage
from .nemesis import KINDS
from .scenario import INPROCESS, UNSYNCED_CUT_BREAKS, Scenario, stream
from . import storage

log = logging.getLogger(__name__)
PASSWORD = b"chaos"
CLIENT_TIMEOUTS = dict(add_timeout_s=0.5, read_timeout_s=0.5, connect_timeout_s=0.5)
RUN_LIMIT_S = {"inprocess": 60.0, "process": 240.0}


@dataclass
class RunResult:
    seed: int
    mode: str
    ok: bool
    failures: list[str] = field(default_factory=list)  # "category: message"
    trace: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)  # kinds of the active faults, in schedule order
    faults_applied: int = 0
    acked: int = 0
    lost_excused: int = 0
    excused: list[dict] = field(default_factory=list)  # each excused entry: ledger, entry, reason, bookies
    duration_s: float = 0.0
    replay: str = ""
    describe: object = None  # what the run can say about its writers if it hangs
    clients: dict = field(default_factory=dict)  # the client side drawn: client_draws
    storage: dict = field(default_factory=dict)  # the bookies' storage drawn (storage.py)
    reached: dict = field(default_factory=dict)  # what their counters say the run reached (storage.reached)
    checker: dict = field(default_factory=dict)  # what the checker met that it judged again (verify.py)

    @property
    def excused_by_reason(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for x in self.excused:
            out[x["reason"]] = out.get(x["reason"], 0) + 1
        return dict(sorted(out.items()))

    @property
    def categories(self) -> list[str]:
        return sorted({f.split(":", 1)[0] for f in self.failures})

    def to_json(self) -> dict:
        return {"seed": self.seed, "mode": self.mode, "ok": self.ok, "failures": self.failures,
                "categories": self.categories, "faults": self.faults, "faults_applied": self.faults_applied,
                "acked": self.acked, "lost_excused": self.lost_excused, "excused": self.excused,
                "excused_by_reason": self.excused_by_reason, "duration_s": round(self.duration_s, 3),
                "replay": self.replay, "clients": self.clients, "storage": self.storage, "reached": self.reached,
                "checker": self.checker,
                **({} if self.ok else {"trace": self.trace})}


def payload(seed: int, ledger: int, i: int, size: int) -> bytes:
    head = b"%d/%d/%d:" % (seed, ledger, i)
    body = hashlib.blake2b(head).digest()
    return (head + body * (size // len(body) + 1))[:max(size, len(head))] if size else head


def bookie_config(s: Scenario) -> dict:
    rng = stream(s.seed, "config")
    values = dict(journal_write_data=s.journal, flush_interval_ms=rng.choice([50, 200, 1000]),
                  autorecovery_enabled=s.autorecovery, lost_bookie_recovery_delay_s=0,
                  open_ledger_rereplication_grace_period_ms=300, data_integrity_repair_retry_max_s=0.3,
                  write_cache_max_size_bytes="4MiB", read_cache_max_size_bytes="4MiB",
                  journal_max_group_wait_ms=1.0, disk_check_interval_ms=200, gc_wait_time_ms=3_600_000,
                  zk_timeout_ms=2000,
                  # bookie processes: zk-expire goes through the admin socket (in-process: the store)
                  admin_socket_enabled=s.mode != INPROCESS,
                  # an HTTP server on an ephemeral port of 127.0.0.2 could take the port of a
                  # bookie that is down (seed 4321: the bookie could not come back)
                  http_server_enabled=False)
    if s.draw_for in UNSYNCED_CUT_BREAKS:
        # a checkpoint fsyncs the entry logs and the index, so what it covers survives the cut
        # even unsynced in the journal: with 50 ms between checkpoints (and a cut that then
        # reached its bookies one after the other) the entry was durable somewhere first in 10
        # of the 14 seeds of 1-40 that missed the break
        values["flush_interval_ms"] = 1000
    if s.mode != INPROCESS and s.autorecovery:
        # nothing can trigger the auditor's ledger check from outside a process: run it often
        values["auditor_periodic_check_interval_s"] = 1
    # GC, deletes, small logs and caches, two ledger dirs: drawn from their own stream (storage.py)
    values.update(storage.draw_storage(s.seed, s.draw_for).config())
    return values


class Chaos:
    """The run's shared state: the cluster, the history, what the nemesis did."""

    def __init__(self, scenario: Scenario, cluster, trace: list[str]):
        self.s = scenario
        self.cluster = cluster
        self.lag: LoopLag | None = None  # the run's, from its start (_watched); None outside a run
        self.trace = trace
        self.t0 = time.monotonic()
        self.history = History()
        self.ledgers: dict[int, int] = {}  # plan index -> ledger id
        self.handles: dict[int, object] = {}  # plan index -> writer's LedgerHandle
        self.crashed: set[int] = set()
        self.crash_times: dict[int, list[float]] = {}  # bookie -> when it crashed (monotonic)
        self.sent_at: dict[tuple[int, int], float] = {}  # (ledger, acknowledged entry) -> add sent
        self.writing: asyncio.Future | None = None  # every writer (run_fault's `after_acks` stops waiting)
        self.anchored = asyncio.Event()  # the `after_acks` fault was applied (the others wait for it)
        self.corrupted: set[int] = set()  # bookies a bit flip hit (what it excuses: `flipped`)
        self.flipped: dict[int, set[tuple[int, int]]] = {}  # bookie -> (ledger, entry) whose record was flipped
        self.unresolved_flips: list[tuple[int, str, int, int]] = []  # (bookie, log, offset, bit): mapped at the end
        self.watches: dict[int, list] = {}  # bookie -> a StorageWatch per storage instance it ran (excuse.py)
        self.refused: dict[int, str] = {}  # bookie -> why it did not restart (detected corruption)
        self.rules: dict[int, object] = {}
        self.disk_rules: dict[int, tuple[int, int]] = {}  # fault index -> (bookie, disk-fault rule id)
        self.disk_faults_applied: dict[int, int] = {}  # bookie -> disk rules ever applied to it
        self.applied = 0
        self.rejudged: dict[str, int] = {}  # verify.py: answers judged again under newer metadata
        self.recoverers: list[asyncio.Task] = []
        self.tailed: list[tuple[int, int, bytes]] = []  # (plan index, entry id, bytes) tailing readers read
        self.clients: list[BookKeeper] = []  # writers' clients, closed when the run ends
        self.deleted: list[int] = []  # ledgers storage.deleter deleted for sure (never read back)
        # the client side (clients.py): each client's protocol, TLS, the writers a client fault acts on
        self.protocols: dict[str, str] = {}  # client role -> "v2" / "v3"
        self.tls_trust_store = ""  # the run's CA when the bookies serve TLS
        self.routes: dict[int, dict[str, object]] = {}  # plan index -> bookie id -> its private proxy
        self.crashables: dict[int, object] = {}  # plan index -> the writer's CrashableHandle
        self.crashed_writers: set[int] = set()  # plan indices whose writer was killed mid-add

    def budget(self, wait_s: float):
        """diagnose.Budget of `wait_s` on this run's loop (plain wall time outside a run)."""
        return Budget(self.lag, wait_s)

    def note(self, text: str) -> None:
        self.trace.append(f"{(time.monotonic() - self.t0) * 1000:7.0f}ms {text}")

    def fault_rng(self, fault):
        return stream(self.s.seed, "fault", fault.index, "apply")

    def mark_crashed(self, i: int, at: float | None = None) -> None:
        """Bookie i stopped at `at` (time.monotonic(); now when None): never earlier than it
        really stopped, or an add it acknowledged in between would not be excused by it."""
        self.crashed.add(i)
        self.crash_times.setdefault(i, []).append(time.monotonic() if at is None else at)

    def watch(self, i: int) -> None:
        """Watch the storage bookie i runs now (in-process; processes watch themselves:
        read_process_watches)."""
        server = (getattr(self.cluster, "servers", None) or {}).get(i)
        storage = getattr(getattr(server, "bookie", None), "storage", None)
        if storage is not None:
            self.watches.setdefault(i, []).append(watch_storage(storage))

    def read_process_watches(self) -> None:
        """Bookie processes watch themselves into files (excuse.watch_from_env): read them once
        the run is healed (a line written later only makes an entry durable that really is)."""
        files = getattr(self.cluster, "watch_files", None)
        if files is not None:
            for i in range(self.cluster.count):
                self.watches[i] = [read_watch(path) for path in files(i)]

    def excuses(self, ledger_id: int, entry_id: int) -> dict[int, str]:
        """Bookie -> why it may have lost this entry without knowing it (excuse.py): journal off,
        a crash after the entry's add was sent (a crash before it cannot lose it) before a
        checkpoint of that bookie made it durable; this entry's record flipped on it; the bookie
        refused to come back. An entry no add of ours acknowledged: any crash."""
        sent = self.sent_at.get((ledger_id, entry_id), float("-inf"))
        out: dict[int, str] = {}
        if not self.s.journal:
            for i, ts in self.crash_times.items():
                if max(ts) < sent:
                    continue
                watches = self.watches.get(i)
                if not watches:
                    out[i] = JOURNAL_OFF_CRASH_UNWATCHED
                elif not any(w.durable(ledger_id, entry_id) for w in watches):
                    out[i] = JOURNAL_OFF_CRASH
        for i, entries in self.flipped.items():
            if (ledger_id, entry_id) in entries:
                out.setdefault(i, BITFLIP)
        for i in self.refused:
            out[i] = BOOKIE_REFUSED
        return out

    def lossy_for(self, ledger_id: int, entry_id: int) -> set[int]:
        return set(self.excuses(ledger_id, entry_id))

    def durable_on(self, i: int, ledger_id: int, entry_id: int) -> bool:
        """A checkpoint of bookie i was seen making this entry durable."""
        return any(w.durable(ledger_id, entry_id) for w in self.watches.get(i, ()))

    def must_hold(self, i: int, ledger_id: int, entry_id: int) -> bool:
        """Bookie i must still have this entry: a checkpoint of it made it durable, or the storage
        it runs now stored it (no crash since, so it is in its write cache or its logs)."""
        watches = self.watches.get(i, ())
        current = self.cluster.alive(i) and watches and (ledger_id, entry_id) in watches[-1].stored_at
        return bool(current) or self.durable_on(i, ledger_id, entry_id)

    def mark_corrupted(self, i: int) -> None:
        self.corrupted.add(i)

    def mark_flipped(self, i: int, entry: tuple[int, int] | None, log_path: str = "", offset: int = -1,
                     bit: int = 0) -> None:
        """A bit of bookie i's entry log flipped: in `entry`'s record, or (None) in a record not
        whole yet, found at the end of the run (resolve_flips)."""
        self.corrupted.add(i)
        if entry is not None:
            self.flipped.setdefault(i, set()).add(entry)
        elif offset >= 0:
            self.unresolved_flips.append((i, log_path, offset, bit))

    def resolve_flips(self, work_dir: str) -> None:
        for i, path, offset, bit in self.unresolved_flips:
            entry = entry_at_unflipped(path, offset, bit, work_dir)
            self.note(f"flipped bit at {offset} of {os.path.basename(path)} on bookie {i}: entry {entry}")
            if entry is not None:
                self.flipped.setdefault(i, set()).add(entry)
        self.unresolved_flips.clear()

    def add_disk_rule(self, fault_index: int, bookie: int, rule_id: int) -> None:
        self.disk_rules[fault_index] = (bookie, rule_id)
        self.disk_faults_applied[bookie] = self.disk_faults_applied.get(bookie, 0) + 1

    async def restart(self, i: int) -> None:
        if self.cluster.alive(i) or i in self.refused:
            return
        if any(bookie == i for bookie, _ in self.disk_rules.values()):
            # not while its disk is failing or full: it would refuse (and an in-process bookie
            # whose start fails after opening its index leaks that LMDB environment, so its
            # next start in this process would fail too); it starts once the disk is healed
            self.note(f"bookie {i} stays down until its disk is healed")
            return
        applied = self.disk_faults_applied.get(i, 0)
        try:
            await self.cluster.restart(i)
            self.watch(i)
            self.note(f"restart bookie {i}")
        except BookieStartError as e:
            if self.disk_faults_applied.get(i, 0) != applied:
                # a disk fault applied while it was starting (seed 10322), maybe healed again before
                # the start gave up (seed 20099): that fault's heal restarts it
                self.note(f"bookie {i} failed to start as its disk began failing; it starts once healed: {e}")
                return
            self.refused[i] = str(e)
            self.note(f"bookie {i} refused to start: {e}")

    def start_recoverer(self, plan_index: int, who: str, exact: bool = False) -> str:
        if not self.ledgers:
            return "no ledger yet to recover"
        k = plan_index if exact else sorted(self.ledgers)[plan_index % len(self.ledgers)]
        lid = self.ledgers[k]
        options = client_options(self, "recoverer-" + who.replace(" ", "-"))

        async def recover():
            try:
                async with BookKeeper(self.cluster.metadata_uri, **options) as bkc:
                    rh = await bkc.open_ledger(lid, password=PASSWORD, recovery=True)
                self.history.recovered(lid, rh.last_add_confirmed, who)
                self.note(f"{who}: recovered ledger {lid} at {rh.last_add_confirmed}")
            except BKError as e:
                self.note(f"{who}: recovery of ledger {lid} failed: {e!r}")
        self.recoverers.append(asyncio.ensure_future(recover()))
        return f"a second client recovers ledger {lid} while its writer writes"

    def describe_writers(self) -> list[str]:
        """Each writer handle's add path state (for a run that hangs)."""
        out = []
        for k, lh in sorted(self.handles.items()):
            core = lh._core
            first = core.pending[0] if core.pending else None
            out.append(f"ledger {lh.ledger_id}: ensemble {list(lh.ensemble)} failed {sorted(core.failed_bookies)}"
                       f" changing {core.changing} change task {lh._change_task} fatal {lh._fatal}"
                       f" lac {core.lac} pushed {core.last_add_pushed} pending {len(core.pending)}"
                       + (f" first {first.entry_id} acks {first.ack_count} sent {first.sent}" if first else "")
                       + f" metadata session {_session_state(lh._bk.store)}")
        return out

    # ------------------------------------------------------------ nemesis timeline
    async def run_fault(self, fault) -> None:
        kind = KINDS[fault.kind]
        after_acks = fault.param("after_acks")
        if after_acks:  # anchored to the workload (scenario.py, _drawn_for): right after that ack
            while len(self.sent_at) < after_acks and not (self.writing is not None and self.writing.done()):
                await asyncio.sleep(0.002)
        elif any(f.param("after_acks") for f in self.s.active_faults):
            await self.anchored.wait()  # every other fault's clock starts after the anchored one
        await asyncio.sleep(fault.at_ms / 1000)
        try:
            self.note(f"fault {fault.describe()}: " + await kind.apply(self, fault))
        finally:
            if after_acks:
                self.anchored.set()
        self.applied += 1
        if fault.duration_ms:
            await asyncio.sleep(fault.duration_ms / 1000)
            await kind.heal(self, fault)
            self.note(f"healed fault #{fault.index} ({fault.kind})")

    async def heal_all(self) -> None:
        for fault in self.s.active_faults:
            await KINDS[fault.kind].heal(self, fault)
        await self.cluster.heal_network()
        for i in range(self.cluster.count):
            await self.restart(i)
        await self.wait_registered()
        self.note("healed everything")

    async def wait_registered(self, timeout_s: float = 30.0) -> None:
        """Every running bookie registered again (a bookie process restarted after kill -9
        registers once ZooKeeper expired its dead session): recovery needs them to choose from."""
        want = {self.cluster.bookie_id(i) for i in range(self.cluster.count) if self.cluster.alive(i)}
        async with BookKeeper(self.cluster.metadata_uri, **client_options(self, "checker")) as bkc:
            deadline = time.monotonic() + timeout_s
            while not want <= set(await bkc.registration.writable_bookies()) | set(
                    await bkc.registration.readonly_bookies()):
                if time.monotonic() > deadline:
                    self.note(f"not every running bookie registered after {timeout_s:g}s")
                    return
                await asyncio.sleep(0.1)


# ------------------------------------------------------------ workload
async def writer(chaos: Chaos, plan) -> None:
    s, h = chaos.s, chaos.history
    placement = EnsemblePlacementPolicy(rng=stream(s.seed, "placement", plan.index))
    bkc = await BookKeeper.connect(chaos.cluster.metadata_uri, placement=placement,
                                   **client_options(chaos, f"writer-{plan.index}"))
    chaos.clients.append(bkc)
    await route_client(chaos, bkc, plan.index)
    lh = None
    for _ in range(40):
        try:
            lh = await bkc.create_ledger(plan.ensemble, plan.write_quorum, plan.ack_quorum, password=PASSWORD)
            break
        except (NotEnoughBookiesError, BKError) as e:
            chaos.note(f"ledger {plan.index}: create failed: {e!r}")
            await asyncio.sleep(0.05)
    if lh is None:
        return
    chaos.ledgers[plan.index], chaos.handles[plan.index] = lh.ledger_id, lh
    adder = chaos.crashables[plan.index] = CrashableHandle(lh, bkc)  # a writer-crash kills it (clients.py)
    chaos.note(f"ledger {plan.index} = {lh.ledger_id} {plan.shape} on {[chaos.cluster.index_of(b) for b in lh.ensemble]}")
    rng = stream(s.seed, "payloads", plan.index)
    sem = asyncio.Semaphore(plan.window)
    failed: list[BaseException] = []

    async def one(i: int) -> None:
        try:
            sent = time.monotonic()  # before the add: a crash from here on may lose it (journal off)
            entry_id = await h.add(adder, payload(s.seed, plan.index, i, rng_sizes[i]))
            chaos.sent_at[(lh.ledger_id, entry_id)] = sent
        except BKError as e:
            failed.append(e)
        finally:
            sem.release()

    rng_sizes = [rng.randint(*plan.entry_bytes) for _ in range(plan.entries)]
    tasks = []
    for i in range(plan.entries):
        await sem.acquire()
        if failed or adder.crashed:
            sem.release()
            break
        tasks.append(asyncio.ensure_future(one(i)))
        await asyncio.sleep(plan.pace_ms / 1000)
    await asyncio.gather(*tasks)
    chaos.note(f"ledger {plan.index}: writer done at LAC {lh.last_add_confirmed}"
               f" ({h.summary(lh.ledger_id)}){f', first error {failed[0]!r}' if failed else ''}")
    if adder.crashed:
        return  # killed mid-add: it neither closes nor writes on (its handle is dropped)
    if plan.writer_end == "closes" and not failed:
        try:
            await h.close(lh)
            chaos.note(f"ledger {plan.index}: writer closed at {lh.last_add_confirmed}")
        except BKError as e:
            chaos.note(f"ledger {plan.index}: writer close failed: {e!r}")
    elif plan.writer_end == "dies":
        await bkc.close()
        chaos.note(f"ledger {plan.index}: writer died")


async def tailer(chaos: Chaos, k: int, writing: asyncio.Future) -> None:
    async with BookKeeper(chaos.cluster.metadata_uri, **client_options(chaos, f"tailer-{k}")) as bkc:
        seen: dict[tuple[int, int], bytes] = {}
        while not writing.done():
            for plan_index, lid in list(chaos.ledgers.items()):
                try:
                    rh = await bkc.open_ledger(lid, password=PASSWORD, recovery=False)
                    first = max((e for (p, e) in seen if p == plan_index), default=-1) + 1
                    if rh.last_add_confirmed >= first:
                        for entry in await rh.read_entries(first, rh.last_add_confirmed):
                            seen[(plan_index, entry.entry_id)] = bytes(entry.data)
                except BKError:
                    pass  # faults: a tailing read may fail; what it does read is checked
            await asyncio.sleep(0.03)
        chaos.tailed += [(p, e, v) for (p, e), v in seen.items()]
        chaos.note(f"tailing reader {k}: read {len(seen)} entries")


async def _scenario(s: Scenario, work_dir: str, result: RunResult, zk_connect: str | None, lag: LoopLag) -> None:
    from .verify import verify
    trace = result.trace
    config, trust_store = bookie_config(s), ""
    if s.tls:  # the bookies serve TLS, every client connects with it (clients.py)
        tls, trust_store = tls_config(work_dir)
        config.update(tls)
    if s.mode == INPROCESS:
        cluster = InProcessChaosCluster(work_dir, s.bookies, test_break=s.test_break, **config)
    else:
        if zk_connect is None:
            raise RuntimeError("a process-mode run needs a ZooKeeper (zk_connect)")
        cluster = ProcessChaosCluster(work_dir, s.bookies, f"{zk_connect}/chaos-{s.seed}-{os.getpid()}-"
                                      f"{int(time.time() * 1000) % 10**9}", test_break=s.test_break,
                                      **config)
    await cluster.start()
    chaos = Chaos(s, cluster, trace)
    chaos.tls_trust_store = trust_store
    for i in range(s.bookies):
        chaos.watch(i)
    result.describe = chaos.describe_writers
    stored = storage.draw_storage(s.seed, s.draw_for)
    chaos.lag, lag.note = lag, chaos.note  # diagnose.py: a late loop explains timeouts, and stretches waits
    try:
        chaos.note(s.describe())
        chaos.note(stored.describe())
        writers = asyncio.ensure_future(asyncio.gather(*(writer(chaos, p) for p in s.ledgers)))
        chaos.writing = writers
        deleting = asyncio.ensure_future(storage.deleter(chaos, stored))
        tailers = [asyncio.ensure_future(tailer(chaos, k, writers)) for k in range(s.tailing_readers)]
        faults = [asyncio.ensure_future(chaos.run_fault(f)) for f in s.active_faults]
        await asyncio.gather(writers, deleting, *faults, *tailers)
        await asyncio.gather(*chaos.recoverers)
        await chaos.heal_all()
        result.faults_applied = chaos.applied
        await verify(chaos, result)
        await storage.check_deleted(chaos, result.failures)
    finally:
        chaos.note(lag.summary())
        storage.record(chaos, stored, result)
        result.clients = client_draws(chaos)
        result.checker = dict(chaos.rejudged)
        for c in chaos.clients:
            await c.close()
        await stop_routes(chaos)
        await cluster.stop()


def client_draws(chaos: Chaos) -> dict:
    """What the run drew for its client side, for its JSON (runner.py sums it)."""
    s = chaos.s
    acked = [len(chaos.history.acknowledged(chaos.ledgers[p.index])) if p.index in chaos.ledgers else 0
             for p in s.ledgers]
    return {"entries": [p.entries for p in s.ledgers], "acked": acked, "long_ledger": any(p.long for p in s.ledgers),
            "tls": s.tls, "protocols": dict(sorted(chaos.protocols.items())),
            "client_faults": [f.kind for f in s.active_faults if KINDS[f.kind].group == "client"]}


def _session_state(store) -> str:
    zk = getattr(store, "_client", None)  # kazoo's client, for a ZooKeeper store
    if zk is None:
        return type(store).__name__
    return f"{zk.state} (client state {zk.client_state}, connected {zk.connected})"


async def _watched(coro, limit_s: float, result: RunResult, lag: LoopLag):
    """`coro` within `limit_s` of the time the loop had (diagnose.Budget: a starved loop's
    lateness is added back, up to STARVED_CAP times the limit); past it, every task's stack
    goes to the trace (what hangs, and where) before the run is cancelled and reported as a
    timeout (TimeoutError with the budget spent)."""
    lag.start()
    budget = lag.budget(limit_s)
    task = asyncio.ensure_future(coro)
    try:
        while (remaining := budget.remaining()) > 0:
            done, _ = await asyncio.wait({task}, timeout=remaining)
            if task in done:
                return task.result()
        describe = getattr(result, "describe", None)
        if describe is not None:
            result.trace += ["writers at the time limit: " + line for line in describe()]
        with tempfile.TemporaryFile("w+") as fh:  # every thread too: a blocked callback thread shows here
            faulthandler.dump_traceback(fh, all_threads=True)
            fh.seek(0)
            result.trace.append("threads at the time limit:\n" + fh.read())
        for t in asyncio.all_tasks():
            if t is asyncio.current_task():
                continue
            out = io.StringIO()
            t.print_stack(limit=12, file=out)
            result.trace.append(f"still running at the time limit: {t.get_name()}\n{out.getvalue()}")
        task.cancel()
        try:
            async with asyncio.timeout(30):
                await task
        except BaseException:  # noqa: BLE001 - cancelled, or failing while it is: the timeout is the finding
            pass
        raise asyncio.TimeoutError(budget.describe())
    finally:
        await lag.stop()


def run_scenario(s: Scenario, work_dir: str, *, zk_connect: str | None = None, keep_dir: bool = False,
                 time_limit_s: float | None = None) -> RunResult:
    """Run one scenario in a fresh event loop; never raises for what the run finds."""
    result = RunResult(s.seed, s.mode, ok=False, faults=[f.kind for f in s.active_faults])
    limit = time_limit_s or RUN_LIMIT_S[s.mode]
    os.makedirs(work_dir, exist_ok=True)
    # the client's ensemble placement (and anything else on the global random) from the seed
    # too, so a replay puts its ledgers on the same bookies
    random.seed(f"{s.seed}:global")
    started = time.monotonic()
    foreign: list = []  # calls into the run's loop from other threads (bk.testing.loopcheck)
    try:
        with asyncio.Runner(loop_factory=checked_loop_factory(foreign)) as runner:
            lag = LoopLag()
            runner.run(_watched(_scenario(s, work_dir, result, zk_connect, lag), limit, result, lag))
    except asyncio.TimeoutError as e:
        result.failures.append(f"timeout: the run did not finish within {e or f'{limit:g}s'} (a hang)")
    except BaseException as e:  # noqa: BLE001 - a harness error is a finding too
        if isinstance(e, KeyboardInterrupt):
            raise
        result.failures.append(f"harness: {type(e).__name__}: {e}")
        result.trace.append(traceback.format_exc())
    for calls in foreign:  # the loop is not thread-safe: such a call breaks things later, at random
        for call in calls.describe():
            result.failures.append("thread: " + call.split("\n", 1)[0])
            result.trace.append(call)
    result.duration_s = time.monotonic() - started
    result.ok = not result.failures
    if not keep_dir:
        shutil.rmtree(work_dir, ignore_errors=True)
    return result


__all__ = ["CLIENT_TIMEOUTS", "Chaos", "PASSWORD", "RunResult", "bookie_config", "payload", "run_scenario"]
