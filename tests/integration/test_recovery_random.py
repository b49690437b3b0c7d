"""Randomized fencing and recovery: a writer, faults, concurrent recoverers, invariants after each run.

Five `bk bookie` processes on a real ZooKeeper, each behind a fault-injecting
proxy (LocalCluster(proxied=True)). Each iteration, driven by its own seed:
- a ledger of shape E/WQ/AQ in 3/2/2, 3/3/2, 4/3/2 and a writer adding small
  entries (1..64 in flight) through History.add;
- faults on at most two bookies at a time while it writes (and, unless the
  liveness check below is chosen, while recovery runs): kill -9 or graceful
  stop (restarted later or at the end), SIGSTOP for up to 1.5 s, proxy rules
  that drop (adds, reads, fencing reads, everything), delay, hold (the held
  adds are released after recovery: late adds from a fenced-out writer),
  reset connections, and blackholes;
- the writer then dies (its client closes with adds in flight), keeps writing
  while it is fenced out, or closes the ledger itself;
- 1..3 concurrent recoverers (open_ledger(recovery=True)). Under faults they
  may fail (LedgerRecoveryError or another BKError); after healing, one
  recovery must close the ledger (liveness). In about a third of the "writer
  dies" runs the liveness check is strict: with every other bookie healthy
  and registered, one bookie of the last segment is made unreachable (kill,
  pause, blackhole, drop or reset everything) and every recoverer must succeed;
- afterwards the old writer cannot get another add acknowledged, and two fresh
  readers' entries pass `check_ledger` (invariants 1-4) with `assert_closed` (5).

Why one unreachable bookie and not E - AQ: fencing needs answers covering the
ensemble (E - AQ + 1 of E) and a negative read needs WQ - AQ + 1 of WQ, so
recovery tolerates AQ - 1 unreachable bookies (1 for every shape here); for
4/3/2, E - AQ = 2 would leave only 2 of the 3 answers fencing needs.

Environment: BK_RANDOM_ITERATIONS (default 5), BK_RANDOM_SEED (the first
iteration's seed; iteration i uses seed + i), BK_RANDOM_VERBOSE=1 (print each
iteration's trace; run pytest with -s). Every failure names its seed:
rerun it with BK_RANDOM_SEED=<seed> BK_RANDOM_ITERATIONS=1.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.errors import BKError, NotEnoughBookiesError
from bk.testing.cluster import LocalCluster
from bk.testing.history import History, assert_closed, check_ledger, entries_to_map
from bk.testing.proxy import DOWN, UP, Rule, add_request, fencing_read, read_request

pytestmark = pytest.mark.integration

ITERATIONS = int(os.environ.get("BK_RANDOM_ITERATIONS", "5"))
BASE_SEED = int(os.environ.get("BK_RANDOM_SEED", "7001"))
VERBOSE = os.environ.get("BK_RANDOM_VERBOSE") == "1"  # print every iteration's trace (with -s)
SHAPES = [(3, 2, 2), (3, 3, 2), (4, 3, 2)]
BOOKIES = 5
MAX_FAULTED = 2
ITERATION_LIMIT_S = 150.0
PW = b"random-pw"
FAST = dict(add_timeout_s=2.0, read_timeout_s=2.0, connect_timeout_s=2.0)


def payload(seed: int, i: int) -> bytes:
    filler = hashlib.blake2b(b"%d:%d" % (seed, i)).digest() * 4
    return b"%d-%d-" % (seed, i) + filler[:(seed + i * 13) % 257]


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    # PYTHONFAULTHANDLER: a bookie that crashes in native code leaves its stack in its log.
    c = LocalCluster(str(tmp_path_factory.mktemp("recovery-random")), bookies=BOOKIES, proxied=True,
                     zk_connect=f"{zk_server}/recovery-random-{uuid.uuid4().hex[:8]}",
                     env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    c.start()
    yield c
    c.stop()


class Chaos:
    """Faults on the proxied cluster; `heal()` undoes all of them."""

    def __init__(self, cluster: LocalCluster, rng: random.Random, trace: list[str]):
        self.cluster = cluster
        self.rng = rng
        self.trace = trace
        self.faulted: set[int] = set()
        # Undo actions due later: (task, acting). A task still sleeping is cancelled by heal();
        # one already acting (a restart in a thread) is awaited, never cancelled halfway.
        self.timers: list[tuple[asyncio.Task, list[bool]]] = []
        self.stopping = asyncio.Event()
        self.planned = 0  # faults run() will apply
        self.applied = 0
        self.recovering = False  # once set, the remaining faults come quickly: they hit the recoverers

    def note(self, what: str) -> None:
        self.trace.append(what)

    def _later(self, delay_s: float, fn, *args) -> None:
        acting = [False]

        async def run():
            await asyncio.sleep(delay_s)
            acting[0] = True
            await fn(*args)
        self.timers.append((asyncio.ensure_future(run()), acting))

    async def _resume(self, i: int) -> None:
        self.cluster.bookies[i].signal(signal.SIGCONT)
        self.note(f"SIGCONT bookie {i}")

    async def _restart(self, i: int) -> None:
        if not self.cluster.bookies[i].alive:
            await asyncio.to_thread(self.cluster.start_bookie, i, False)
            self.note(f"restart bookie {i}")

    async def _unblackhole(self, i: int) -> None:
        self.cluster.proxies[i].set_blackhole(False)
        self.note(f"blackhole off on bookie {i}")

    async def fault(self, i: int, kind: str, ledger_id: int, bounded: bool = True) -> None:
        """Apply one fault of `kind` to bookie i; `bounded` faults undo themselves after a while."""
        rng, cluster, proxy = self.rng, self.cluster, self.cluster.proxies[i]
        self.faulted.add(i)
        if kind == "kill":
            await asyncio.to_thread(cluster.kill, i)
            self.note(f"kill -9 bookie {i}")
            if bounded and rng.random() < 0.5:
                self._later(rng.uniform(0.2, 1.5), self._restart, i)
        elif kind == "stop":
            cluster.bookies[i].signal(signal.SIGCONT)  # a paused bookie could not stop
            await asyncio.to_thread(cluster.stop_bookie, i)
            self.note(f"SIGTERM bookie {i}")
            if bounded and rng.random() < 0.5:
                self._later(rng.uniform(0.2, 1.5), self._restart, i)
        elif kind == "pause":
            cluster.bookies[i].signal(signal.SIGSTOP)
            pause_s = rng.uniform(0.1, 1.5) if bounded else 8.0  # well inside the 10 s ZK session
            self.note(f"SIGSTOP bookie {i} for {pause_s:.2f}s")
            self._later(pause_s, self._resume, i)
        elif kind == "blackhole":
            proxy.set_blackhole(True)
            off_s = rng.uniform(0.2, 1.5) if bounded else 60.0
            self.note(f"blackhole bookie {i} for {off_s:.2f}s")
            self._later(off_s, self._unblackhole, i)
        elif kind == "drop":
            direction = rng.choice([UP, DOWN, "both"])
            which = rng.choice(["adds", "reads", "fencing", "all"])
            match = {"adds": add_request(ledger_id), "reads": read_request(ledger_id),
                     "fencing": fencing_read(ledger_id), "all": None}[which]
            once = bounded and rng.random() < 0.5
            proxy.add_rule(Rule(direction, match, "drop", once=once))
            self.note(f"drop {which} {direction} at bookie {i}{' once' if once else ''}")
        elif kind == "drop-all":
            proxy.add_rule(Rule("both", None, "drop"))
            self.note(f"drop everything at bookie {i}")
        elif kind == "delay":
            direction = rng.choice([UP, DOWN, "both"])
            delay_s = rng.uniform(0.01, 0.4)
            proxy.add_rule(Rule(direction, None, "delay", delay_s=delay_s))
            self.note(f"delay {direction} {delay_s:.3f}s at bookie {i}")
        elif kind == "hold":
            proxy.add_rule(Rule(UP, add_request(ledger_id, recovery=False), "hold"))
            self.note(f"hold the writer's adds at bookie {i} (released after recovery)")
        elif kind == "reset":
            proxy.add_rule(Rule(rng.choice([UP, DOWN]), None, "reset", once=bounded))
            self.note(f"reset connections at bookie {i}{' once' if bounded else ''}")
        else:
            raise ValueError(kind)

    async def run(self, ledger_id: int, ensemble_of) -> None:
        """0..3 random faults at random moments, on at most MAX_FAULTED bookies."""
        rng = self.rng
        for _ in range(self.planned):
            try:
                await asyncio.wait_for(self.stopping.wait(), rng.uniform(0.0, 0.15 if self.recovering else 0.4))
                return  # stop() was called
            except asyncio.TimeoutError:
                pass
            ensemble = [self.cluster.index_of(b) for b in ensemble_of()]
            pool = ensemble if rng.random() < 0.75 else list(self.cluster.bookies)
            fresh = [i for i in pool if i not in self.faulted]
            if len(self.faulted) >= MAX_FAULTED or not fresh:
                candidates = sorted(self.faulted & set(pool))
            else:
                candidates = fresh
            if candidates:
                kind = rng.choice(["kill", "stop", "pause", "pause", "drop", "drop", "delay", "hold", "reset",
                                   "blackhole"])
                await self.fault(rng.choice(candidates), kind, ledger_id)
            self.applied += 1

    async def heal(self, release_held: bool = True) -> None:
        for task, acting in self.timers:
            if not acting[0]:
                task.cancel()
        await asyncio.gather(*(task for task, _ in self.timers), return_exceptions=True)
        self.timers.clear()
        cluster = self.cluster
        for i, p in cluster.proxies.items():
            p.clear_rules()
            if release_held:
                n = p.release_held()  # late adds of a (maybe fenced-out) writer reach the bookie now
                if n:
                    self.note(f"released {n} held frames at bookie {i}")
            p.discard_held()
            p.set_blackhole(False)
        for i, b in cluster.bookies.items():
            b.signal(signal.SIGCONT)
            if not b.alive:
                await asyncio.to_thread(cluster.start_bookie, i, False)
        for b in cluster.bookies.values():
            await asyncio.to_thread(b.wait_serving)
        self.faulted.clear()

    async def wait_registered(self, bkc: BookKeeper, timeout_s: float = 40.0) -> None:
        """Every bookie registered writable (a bookie restarted after kill -9 waits for its old session)."""
        want = set(self.cluster.bookie_ids)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while set(await bkc.registration.writable_bookies()) != want:
            if loop.time() > deadline:
                raise AssertionError(f"bookies not all registered after {timeout_s}s")
            await asyncio.sleep(0.1)


async def write(h: History, lh, seed: int, count: int, window: int, stop: asyncio.Event) -> list[BaseException]:
    sem = asyncio.Semaphore(window)
    errors: list[BaseException] = []
    tasks = []

    async def one(i):
        try:
            await h.add(lh, payload(seed, i))
        except BKError as e:
            errors.append(e)
        finally:
            sem.release()

    for i in range(count):
        await sem.acquire()
        if errors or stop.is_set():
            sem.release()
            break
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    return errors


async def iteration(cluster: LocalCluster, seed: int, trace: list[str]) -> None:
    rng = random.Random(seed)
    chaos = Chaos(cluster, rng, trace)
    await chaos.heal(release_held=False)
    uri = cluster.metadata_uri
    e, wq, aq = rng.choice(SHAPES)
    end = rng.choices(["dies", "lives", "closes"], weights=[5, 4, 1])[0]
    strict = end == "dies" and rng.random() < 0.35
    count, window = rng.randint(10, 400), rng.choice([1, 4, 16, 64])
    trigger = rng.randint(0, count // 2)
    if end == "lives":
        count = 3000  # it keeps writing until it is fenced out (or runs out of bookies)
    chaos.planned = rng.choice([0, 1, 1, 2, 2, 3])
    before = rng.randint(0, chaos.planned)  # faults applied before the writer's end and the recoverers
    trace.append(f"shape {e}/{wq}/{aq}, writer {end}, {count} adds, window {window}, recovery after {trigger}"
                 f" acks and {before} of {chaos.planned} faults{', strict liveness' if strict else ''}")

    h = History()
    writer = await BookKeeper.connect(uri, **FAST)
    try:
        for _ in range(100):
            try:
                lh = await writer.create_ledger(e, wq, aq, digest_type="CRC32C", password=PW)
                break
            except NotEnoughBookiesError:
                await asyncio.sleep(0.2)
        else:
            raise AssertionError("never enough writable bookies")
        lid = lh.ledger_id
        trace.append(f"ledger {lid} on {[cluster.index_of(b) for b in lh.ensemble]}")
        stop_writing = asyncio.Event()
        writing = asyncio.ensure_future(write(h, lh, seed, count, window, stop_writing))
        faults = asyncio.ensure_future(chaos.run(lid, lambda: lh.ensemble))

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 4.0
        while loop.time() < deadline and (chaos.applied < before or (
                lh.last_add_confirmed < trigger and not writing.done())):
            await asyncio.sleep(0.01)
        trace.append(f"writer at LAC {lh.last_add_confirmed}")
        writer_closed = False
        if end == "dies":
            await writer.close()  # in-flight adds: outcome unknown
            await writing
            trace.append("writer died")
        elif end == "closes":
            stop_writing.set()
            await writing
            try:
                await h.close(lh)
                writer_closed = True
                trace.append(f"writer closed at {lh.last_add_confirmed}")
            except BKError as err:
                trace.append(f"writer close failed: {err!r}")

        if strict:
            await faults
            await chaos.heal()
            async with BookKeeper(uri) as probe:
                await chaos.wait_registered(probe)
                md, _ = await probe.ledger_manager.read_ledger_metadata(lid)
            victim = cluster.index_of(rng.choice(md.last_segment[1]))
            kind = rng.choice(["kill", "pause", "blackhole", "drop-all", "reset"])
            await chaos.fault(victim, kind, lid, bounded=False)

        async def recoverer(k: int):
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            try:
                async with BookKeeper(uri, **FAST) as bkc:
                    rh = await bkc.open_ledger(lid, password=PW, recovery=True)
            except BKError as err:
                trace.append(f"recoverer {k}: {err!r}")
                return err
            h.recovered(lid, rh.last_add_confirmed, f"recoverer {k}")
            trace.append(f"recoverer {k}: closed at {rh.last_add_confirmed}")
            return rh.metadata

        chaos.recovering = True
        results = await asyncio.gather(*(recoverer(k) for k in range(rng.choice([1, 1, 2, 3]))))
        if strict:
            failed = [r for r in results if isinstance(r, BaseException)]
            assert not failed, f"liveness: recovery failed with one bookie of the last segment unreachable: {failed}"

        chaos.stopping.set()
        await faults  # a fault in progress (a kill or stop in a thread) completes first
        await chaos.heal()
        if not any(not isinstance(r, BaseException) for r in results) and not writer_closed:
            async with BookKeeper(uri, **FAST) as bkc:  # healed: recovery must now succeed
                rh = await bkc.open_ledger(lid, password=PW, recovery=True)
            h.recovered(lid, rh.last_add_confirmed, "after healing")
            trace.append(f"after healing: closed at {rh.last_add_confirmed}")

        stop_writing.set()
        errors = await writing
        trace.append(f"writer: LAC {lh.last_add_confirmed}, {h.summary(lid)}, first error"
                     f" {errors[0]!r}" if errors else f"writer: LAC {lh.last_add_confirmed}, {h.summary(lid)}")
        # The ledger is closed: the old writer can get nothing more acknowledged.
        with pytest.raises(BKError):
            await h.add(lh, b"after recovery")
    finally:
        await writer.close()

    maps, metadata = [], None
    for _ in range(2):
        async with BookKeeper(uri) as reader:
            rh = await reader.open_ledger(lid, password=PW)
            metadata = rh.metadata
            last = rh.last_add_confirmed
            maps.append(entries_to_map(await rh.read_entries(0, last)) if last >= 0 else {})
    trace.append(f"closed at {metadata.last_entry_id}, segments {[f for f, _ in metadata.segments]}")
    assert_closed(metadata, lid)
    check_ledger(h, lid, metadata, maps, check_length=True).assert_ok()


@pytest.mark.timeout(ITERATION_LIMIT_S + 60)
@pytest.mark.parametrize("seed", [BASE_SEED + i for i in range(ITERATIONS)], ids=lambda s: f"seed{s}")
def test_random_faults_and_recoverers_keep_the_invariants(cluster, seed):
    trace: list[str] = []

    async def main():
        try:
            await asyncio.wait_for(iteration(cluster, seed, trace), ITERATION_LIMIT_S)
        except BaseException as err:
            steps = "\n  ".join(trace)
            raise AssertionError(f"seed {seed} failed (rerun: BK_RANDOM_SEED={seed} BK_RANDOM_ITERATIONS=1):"
                                 f" {type(err).__name__}: {err}\n  {steps}") from err
        if VERBOSE:
            print(f"\nseed {seed}:\n  " + "\n  ".join(trace))
    eventloop.run(main())
