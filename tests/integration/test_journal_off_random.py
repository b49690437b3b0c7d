"""Randomized journal-off (BP-46) histories: crashes of one, two or all bookies of a ledger
in the middle of its writes, then recovery, with the history checker.

Four `bk bookie` processes, `journal_write_data = false`, a 1 s flush interval (so a crash
loses the entries of the last second or so: some entries survive, some do not). Each
iteration, driven by its own seed:
- a ledger of shape E/WQ/AQ in 3/3/2, 3/2/2, 4/3/2 and a writer adding 50..600 entries
  (1..64 in flight) through History.add;
- at a random point, 1, 2 or 3 bookies of its ensemble are SIGKILLed, some of them with
  simulated power loss on top (unsynced writes dropped, sometimes a torn last page), and
  the writer dies with them (its adds in flight: outcome unknown);
- the crashed bookies restart (BP-46 phase one fences and limbos the ledger; their repair
  starts) and each acknowledged entry of their share is read from them at once: it must be
  the entry or EUNKNOWNLEDGERSTATE, never an explicit negative;
- a recoverer opens the ledger with recovery, retrying for a while (the bookies' own repair
  may close it first).
Invariants: a ledger that ends CLOSED is closed at or above every acknowledged entry, and
two fresh readers agree on it and read every acknowledged entry with its bytes, unless
at least AQ bookies of that entry's write set crashed (journal off, it may then be lost for
real: BP-46 cannot bring back what no bookie kept); even then no read ever says "no such
entry" for it. A ledger recovery cannot close stays OPEN/IN_RECOVERY, and that is allowed
only when at least AQ of its bookies crashed.

Environment: BK_JOURNAL_OFF_ITERATIONS (default 4), BK_JOURNAL_OFF_SEED (first seed;
iteration i uses seed + i). A failure names its seed: rerun it with
BK_JOURNAL_OFF_SEED=<seed> BK_JOURNAL_OFF_ITERATIONS=1.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import random
import uuid

import pytest

from bk import eventloop
from bk.client import BookKeeper, BookieClient
from bk.errors import BKError, NoSuchEntryError, NotEnoughBookiesError
from bk.proto import StatusCode
from bk.testing.cluster import LocalCluster
from bk.testing.history import History, check_ledger
from bk.testing.powerloss import simulate_power_loss

pytestmark = pytest.mark.integration

ITERATIONS = int(os.environ.get("BK_JOURNAL_OFF_ITERATIONS", "4"))
BASE_SEED = int(os.environ.get("BK_JOURNAL_OFF_SEED", "4601"))
SHAPES = [(3, 3, 2), (3, 2, 2), (4, 3, 2)]
BOOKIES = 4
PW = b"pw"
FAST = dict(add_timeout_s=3.0, read_timeout_s=3.0, connect_timeout_s=3.0)
NEGATIVE = (int(StatusCode.ENOENTRY), int(StatusCode.ENOLEDGER))
ITERATION_LIMIT_S = 120.0


def payload(seed: int, i: int) -> bytes:
    return f"{seed}-{i}-".encode() + hashlib.sha256(b"%d:%d" % (seed, i)).digest() * (i % 5)


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    data = str(tmp_path_factory.mktemp("journal-off-random"))
    track = os.path.join(data, "fsync.track")
    c = LocalCluster(data, bookies=BOOKIES, zk_connect=f"{zk_server}/journal-off-random-{uuid.uuid4().hex[:8]}",
                     env=dict(os.environ, BK_FSYNC_TRACK_FILE=track), journal_write_data=False,
                     flush_interval_ms=1000, zk_timeout_ms=4000, data_integrity_repair_retry_max_s=2.0)
    c.start()
    c.track_file = track
    yield c
    c.stop()


async def write(h: History, lh, seed: int, count: int, window: int) -> None:
    sem = asyncio.Semaphore(window)
    failed = asyncio.Event()

    async def one(i):
        try:
            await h.add(lh, payload(seed, i))
        except BKError:
            failed.set()
        finally:
            sem.release()

    tasks = []
    for i in range(count):
        await sem.acquire()
        if failed.is_set():
            sem.release()
            break
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks, return_exceptions=True)


async def wait_registered(bkc: BookKeeper, want: set, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while set(await bkc.registration.writable_bookies()) != want:
        if loop.time() > deadline:
            raise AssertionError(f"bookies not all registered after {timeout_s}s")
        await asyncio.sleep(0.1)


def share(md, bookie: str, entry_id: int) -> bool:
    """Is `bookie` in the write set of `entry_id` under the ledger's segments?"""
    first_ids = [f for f, _ in md.segments]
    k = max(i for i, f in enumerate(first_ids) if f <= entry_id)
    ensemble = md.segments[k][1]
    return bookie in [ensemble[(entry_id + i) % md.ensemble_size] for i in range(md.write_quorum_size)]


async def iteration(cluster: LocalCluster, seed: int, trace: list[str]) -> None:
    rng = random.Random(seed)
    uri = cluster.metadata_uri
    e, wq, aq = rng.choice(SHAPES)
    count, window = rng.randint(50, 600), rng.choice([1, 8, 64])
    crash_at = rng.randint(0, count // 2)
    k = rng.choices([1, 2, 3], weights=[5, 3, 2])[0]
    h = History()
    async with BookKeeper(uri, **FAST) as probe:
        await wait_registered(probe, set(cluster.bookie_ids))
    writer = await BookKeeper.connect(uri, **FAST)
    for _ in range(100):
        try:
            lh = await writer.create_ledger(e, wq, aq, password=PW)
            break
        except NotEnoughBookiesError:
            await asyncio.sleep(0.2)
    lid = lh.ledger_id
    writing = asyncio.ensure_future(write(h, lh, seed, count, window))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while lh.last_add_confirmed < crash_at and not writing.done() and loop.time() < deadline:
        await asyncio.sleep(0.005)
    victims = rng.sample(list(lh.ensemble), min(k, len(lh.ensemble)))
    trace.append(f"seed {seed}: shape {e}/{wq}/{aq}, {count} adds, window {window}, ledger {lid},"
                 f" crash at LAC {lh.last_add_confirmed} of {len(victims)} bookies")
    for b in victims:
        i = cluster.index_of(b)
        cluster.kill(i)
        cluster.bookies[i].proc.wait()
        if rng.random() < 0.4:
            report = simulate_power_loss(cluster.track_file, [os.path.join(cluster.data_dir, f"bookie-{i}")],
                                         tear=rng.random() < 0.5, rng=rng)
            trace.append(f"bookie {i}: kill -9 + {report}")
        else:
            trace.append(f"bookie {i}: kill -9")
    await writer.close()  # the writer dies with them: its adds in flight have unknown outcomes
    await writing
    acked = h.acknowledged(lid)
    trace.append(f"{len(acked)} acknowledged ({h.summary(lid)})")
    for b in victims:
        await asyncio.to_thread(cluster.start_bookie, cluster.index_of(b), False)
        await asyncio.to_thread(cluster.bookies[cluster.index_of(b)].wait_serving)

    async with BookKeeper(uri, **FAST) as bkc:
        md, _ = await bkc.ledger_manager.read_ledger_metadata(lid)
        # a restarted bookie never denies what it may have acknowledged
        for b in victims:
            client = BookieClient(b, read_timeout_s=5.0)
            try:
                for entry_id in sorted(acked):
                    if share(md, b, entry_id):
                        r = await client.call(client.send_read, lid, entry_id)
                        assert r.rc not in NEGATIVE, (f"restarted bookie {b} answered {StatusCode(r.rc).name}"
                                                      f" for acknowledged entry {entry_id}")
            finally:
                client.close()
        last_error = None
        for _ in range(10):
            try:
                rh = await bkc.open_ledger(lid, password=PW, recovery=True)
                h.recovered(lid, rh.last_add_confirmed, "recoverer")
                break
            except BKError as err:
                last_error = err
                await asyncio.sleep(0.5)
        md, _ = await bkc.ledger_manager.read_ledger_metadata(lid)
        trace.append(f"metadata {md.state.name} last {md.last_entry_id}; last recovery error {last_error!r}")
        if md.is_closed:
            assert md.last_entry_id >= max(acked, default=-1), "closed below an acknowledged entry"
            readers = []
            for _ in range(2):
                got: dict[int, bytes] = {}
                async with BookKeeper(uri, **FAST) as reader:
                    rh = await reader.open_ledger(lid, password=PW, recovery=False)
                    for entry_id in range(md.last_entry_id + 1):
                        try:
                            got[entry_id] = (await rh.read_entries(entry_id, entry_id))[0].data
                        except NoSuchEntryError:
                            raise AssertionError(f"entry {entry_id} <= lastEntryId answered NoSuchEntry")
                        except BKError as err:
                            crashed = sum(share(md, b, entry_id) for b in victims)
                            assert crashed >= aq, (f"entry {entry_id} unreadable ({err!r}) though only {crashed}"
                                                   f" bookies of its write set crashed")
                readers.append(got)
            lost = set(acked) - set(readers[0])
            if lost:  # only entries whose every acknowledging bookie crashed (see the docstring)
                trace.append(f"{len(lost)} acknowledged entries lost for real (>= AQ copies crashed)")
                for entry_id in lost:
                    h_ops = [op for op in h.ops(lid) if op.entry_id == entry_id]
                    for op in h_ops:
                        op.outcome = type(op.outcome).UNKNOWN  # not checkable: the checker skips it
            check_ledger(h, lid, md, readers, require_complete=False).assert_ok()
        else:
            assert len(victims) >= aq, (f"recovery never closed the ledger though only {len(victims)} bookies"
                                        f" crashed (AQ {aq}): {last_error!r}")
            assert md.last_entry_id == -1
        await bkc.delete_ledger(lid)  # the bookies' repair lets go of it


@pytest.mark.timeout(ITERATIONS * ITERATION_LIMIT_S + 60)
def test_journal_off_random_crashes(cluster):
    for i in range(ITERATIONS):
        seed = BASE_SEED + i
        trace: list[str] = []
        try:
            eventloop.run(asyncio.wait_for(iteration(cluster, seed, trace), ITERATION_LIMIT_S))
        except BaseException as e:
            raise AssertionError(f"seed {seed} failed: {e!r}\n  " + "\n  ".join(trace) +
                                 f"\nreplay: BK_JOURNAL_OFF_SEED={seed} BK_JOURNAL_OFF_ITERATIONS=1") from e
        if os.environ.get("BK_JOURNAL_OFF_VERBOSE") == "1":
            print("\n  ".join(trace))
