"""Fencing and ledger recovery against bookie processes on a real ZooKeeper (REPLICATION.md).

One module cluster: five `bk bookie` processes, each behind a fault-injecting
proxy (LocalCluster(proxied=True): the bookie binds 127.0.0.2:P, the proxy
127.0.0.1:P, so the bookie id reaches it through the proxy). Every test starts
from a healed cluster (all bookies running, no rules, nothing held).

Every add goes through bk.testing.history (History.add, or the same records
rebuilt from a child process's output), and after each scenario two fresh
readers read the closed ledger and `check_ledger` checks invariants 1-4;
`assert_closed` is invariant 5.

Scenarios: writer killed (kill -9 of its process) mid-stream; recovery while
the writer keeps writing; a lost fence with the writer's add held back; ten
recoverers at once; an empty last segment; one bookie of the last segment
down; too few bookies (LedgerRecoveryError, retried after they return);
fences surviving kill -9 of every bookie; a wrong password; the shell's
`readledger --recover` and `ledgermetadata`.

Run as a script (`python test_recovery_scenarios.py writer ...`) this file is
the child writer of the first scenario.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import uuid
from functools import partial

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the child writer runs this file as a script
    sys.path.insert(0, str(REPO))

from bk import eventloop  # noqa: E402
from bk.client import BookKeeper, BookieClient  # noqa: E402
from bk.client.quorum import AddFramer  # noqa: E402
from bk.errors import (  # noqa: E402
    BKError, LedgerFencedError, LedgerRecoveryError, NotEnoughBookiesError, UnauthorizedAccessError,
)
from bk.meta.ledger_metadata import LedgerState  # noqa: E402
from bk.proto import DEFAULT_MAX_FRAME_SIZE_BYTES, FLAG_DO_FENCING, DigestManager, StatusCode, master_key  # noqa: E402
from bk.testing.cluster import LocalCluster, run_shell  # noqa: E402
from bk.testing.history import History, assert_closed, check_ledger, entries_to_map  # noqa: E402
from bk.testing.proxy import (  # noqa: E402
    DOWN, UP, Rule, add_request, add_response, fencing_read, read_response,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PW = b"pw"
# Short client timeouts: paused bookies and dropped frames cost seconds, not the default 10 s.
FAST = dict(add_timeout_s=3.0, read_timeout_s=3.0, connect_timeout_s=3.0)
EFENCED, EUA = int(StatusCode.EFENCED), int(StatusCode.EUA)
FOREVER = range(0, 1 << 62)


def payload(tag: str, i: int) -> bytes:
    """Distinct bytes per (tag, i), 0..300 bytes of filler after a readable prefix."""
    filler = hashlib.sha256(f"{tag}:{i}".encode()).digest() * 10
    return f"{tag}-{i}-".encode() + filler[:(i * 37) % 301]


# ------------------------------------------------------------------ the cluster
@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    # A long flush interval: fences and entries are still only in the journal when bookies are killed.
    c = LocalCluster(str(tmp_path_factory.mktemp("recovery")), bookies=5, proxied=True,
                     zk_connect=f"{zk_server}/recovery-scenarios-{uuid.uuid4().hex[:8]}", flush_interval_ms=30000)
    c.start()
    yield c
    c.stop()


def heal(cluster: LocalCluster) -> None:
    """Every bookie running and reachable, no proxy rules, nothing held."""
    for p in cluster.proxies.values():
        p.set_blackhole(False)
        p.clear_rules()
        p.discard_held()
    for i, b in cluster.bookies.items():
        b.signal(signal.SIGCONT)
        if not b.alive:
            cluster.start_bookie(i, wait=False)
    for b in cluster.bookies.values():
        b.wait_serving()


@pytest.fixture
def healthy(cluster):
    heal(cluster)
    yield cluster
    for b in cluster.bookies.values():
        b.signal(signal.SIGCONT)  # never leave a paused bookie behind


# ------------------------------------------------------------------ helpers
async def create(bkc: BookKeeper, e: int, wq: int, aq: int):
    for _ in range(50):  # a bookie restarted after kill -9 registers once its old session expired
        try:
            return await bkc.create_ledger(e, wq, aq, digest_type="CRC32C", password=PW)
        except NotEnoughBookiesError:
            await asyncio.sleep(0.2)
    raise AssertionError("never enough writable bookies registered")


async def write(h: History, lh, tag: str, ids, window: int) -> list[BaseException]:
    """History.add every payload of `ids`, `window` in flight; stops issuing after the first error."""
    sem = asyncio.Semaphore(window)
    errors: list[BaseException] = []
    tasks = []

    async def one(i):
        try:
            await h.add(lh, payload(tag, i))
        except BKError as e:
            errors.append(e)
        finally:
            sem.release()

    for i in ids:
        await sem.acquire()
        if errors:
            sem.release()
            break
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    return errors


def start_adds(h: History, lh, tag: str, ids) -> list[asyncio.Future]:
    """Issue adds without waiting: the tasks run in creation order, each History.add invoking its
    add and getting its entry id in one step, so ids follow `ids`."""
    return [asyncio.ensure_future(h.add(lh, payload(tag, i))) for i in ids]


async def until(predicate, what: str, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def recover(uri: str, h: History, ledger_id: int, name: str, **options):
    async with BookKeeper(uri, **options) as bkc:
        rh = await bkc.open_ledger(ledger_id, password=PW, recovery=True)
    assert rh.is_closed
    h.recovered(ledger_id, rh.last_add_confirmed, name)
    return rh.metadata


async def metadata_of(uri: str, ledger_id: int):
    async with BookKeeper(uri) as bkc:
        return await bkc.ledger_manager.read_ledger_metadata(ledger_id)


async def verify(h: History, uri: str, ledger_id: int, readers: int = 2):
    """Invariants 1-5 with fresh readers; returns the closed metadata."""
    maps, metadata = [], None
    for _ in range(readers):
        async with BookKeeper(uri) as bkc:
            rh = await bkc.open_ledger(ledger_id, password=PW)
            metadata = rh.metadata
            last = rh.last_add_confirmed
            maps.append(entries_to_map(await rh.read_entries(0, last)) if last >= 0 else {})
    assert_closed(metadata, ledger_id)
    check_ledger(h, ledger_id, metadata, maps, check_length=True).assert_ok()
    return metadata


async def raw_call(bookie_id: str, send, *args, **kwargs):
    client = BookieClient(bookie_id, read_timeout_s=5.0, add_timeout_s=5.0)
    try:
        return await client.call(getattr(client, send), *args, **kwargs)
    finally:
        client.close()


def add_frame(ledger_id: int, entry_id: int, lac: int, length: int, data: bytes, password: bytes = PW) -> bytes:
    """A plain (non-recovery) ADD of the writer's kind, built by hand."""
    framer = AddFramer(DigestManager(ledger_id, "CRC32C", password), master_key(password),
                       DEFAULT_MAX_FRAME_SIZE_BYTES)
    return framer.frame(entry_id, lac, length, data)


def run(coro):
    return eventloop.run(coro)


# ------------------------------------------------------------------ 1. writer killed mid-stream
def child_writer(uri: str, e: int, wq: int, aq: int, count: int, window: int) -> None:
    """The writer process: `L id`, then `I i` before add i is invoked and `A i entry_id` once acknowledged."""
    out = sys.stdout

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    async def main():
        bkc = await BookKeeper.connect(uri)
        lh = await bkc.create_ledger(e, wq, aq, digest_type="CRC32C", password=PW)
        say(f"L {lh.ledger_id}")
        sem = asyncio.Semaphore(window)

        def done(i, fut):
            sem.release()
            if not fut.cancelled() and fut.exception() is None:
                say(f"A {i} {fut.result()}")

        for i in range(count):
            await sem.acquire()
            say(f"I {i}")
            lh.async_add_entry(payload("child", i)).add_done_callback(partial(done, i))
        await asyncio.sleep(3600)  # killed long before

    eventloop.run(main())


@pytest.mark.parametrize("e,wq,aq", [(3, 2, 2), (4, 3, 2)])
def test_writer_process_killed_mid_stream_then_recovered(healthy, e, wq, aq):
    """Scenario 1: kill -9 of the writer with adds in flight; another client recovers."""
    uri = healthy.metadata_uri
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, __file__, "writer", uri, str(e), str(wq), str(aq), "100000", "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    invoked, acked, ledger_id = [], {}, None
    try:
        for line in proc.stdout:
            kind, *rest = line.split()
            if kind == "L":
                ledger_id = int(rest[0])
            elif kind == "I":
                invoked.append(int(rest[0]))
            elif kind == "A":
                acked[int(rest[0])] = int(rest[1])
                if len(acked) == 1500:
                    proc.kill()  # SIGKILL: adds in flight, connections dropped by the kernel
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    assert ledger_id is not None and len(acked) >= 1500
    assert all(acked[i] == i for i in acked), "the writer gives ids in invocation order"
    assert len(invoked) > len(acked), "some adds were in flight when the writer died"

    h = History()
    for i in invoked:
        op = h.invoke(ledger_id, payload("child", i))
        if i in acked:
            h.ok(op, acked[i])
        else:
            h.unknown(op, "writer killed with the add in flight", entry_id=i)

    async def main():
        md = await recover(uri, h, ledger_id, "recoverer")
        assert md.last_entry_id >= max(acked)
        # A second recoverer finds the ledger closed and agrees.
        assert (await recover(uri, h, ledger_id, "second")).last_entry_id == md.last_entry_id
        await verify(h, uri, ledger_id)
    run(main())


# ------------------------------------------------------------------ 2. recovery while writing
def test_recovery_while_the_writer_keeps_writing(healthy):
    """Scenario 2: the writer is fenced out (LedgerFencedError); in-flight adds are unknown."""
    uri = healthy.metadata_uri

    async def main():
        h = History()
        async with BookKeeper(uri, **FAST) as writer:
            lh = await create(writer, 3, 2, 2)
            recovered = {}

            async def recover_soon():
                await until(lambda: lh.last_add_confirmed >= 400, "400 acknowledged entries")
                recovered["md"] = await recover(uri, h, lh.ledger_id, "recoverer")

            task = asyncio.ensure_future(recover_soon())
            errors = await write(h, lh, "w", range(1_000_000), window=32)
            await task
            assert errors and all(isinstance(err, LedgerFencedError) for err in errors), errors
            with pytest.raises(LedgerFencedError):
                await h.add(lh, payload("w", -1))
            end = recovered["md"].last_entry_id
            assert lh.last_add_confirmed <= end
            try:  # its close can only agree with the recovered end
                await lh.close()
            except LedgerFencedError:
                assert lh.last_add_confirmed < end
            else:
                assert lh.last_add_confirmed == end
        await verify(h, uri, lh.ledger_id)
    run(main())


# ------------------------------------------------------------------ 3. lost fence
def test_lost_fence_the_held_add_is_never_acknowledged(healthy):
    """Scenario 3: bookie Z never gets the fence; the writer's adds to Z are held back and
    released after recovery (Z accepts them: it is not fenced), the others answer EFENCED.
    One copy is no ack quorum: the writer must not get them acknowledged."""
    uri = healthy.metadata_uri

    async def main():
        h = History()
        async with BookKeeper(uri) as writer:  # default timeouts: held adds must not time out first
            lh = await create(writer, 3, 3, 2)
            for i in range(10):
                assert await h.add(lh, payload("lf", i)) == i
            x, y, z = (healthy.proxy_for(b) for b in lh.ensemble)
            z.add_rule(Rule(UP, fencing_read(lh.ledger_id), "drop"))  # the fence (and recovery reads) to Z
            held = add_request(lh.ledger_id, recovery=False)
            for p in (x, y, z):
                p.add_rule(Rule(UP, held, "hold"))
            late = start_adds(h, lh, "lf", range(10, 13))
            for p in (x, y, z):
                await asyncio.to_thread(p.wait_held, 3, UP)

            md = await recover(uri, h, lh.ledger_id, "recoverer")
            assert md.last_entry_id == 9

            # Z first: its EOKs arrive before the EFENCED of X and Y.
            acks_from_z = z.add_rule(Rule(DOWN, add_response(lh.ledger_id, range(10, 13), rc=0), "pass"))
            assert z.release_held() == 3
            await asyncio.to_thread(z.wait_hits, acks_from_z, 3)
            x.release_held()
            y.release_held()
            results = await asyncio.gather(*late, return_exceptions=True)
            assert all(isinstance(r, LedgerFencedError) for r in results), results
            assert lh.last_add_confirmed == 9
            # Z really stored entry 10 (a plain read, no fence flag): it was one copy short of a quorum.
            answer = await raw_call(lh.ensemble[2], "send_read", lh.ledger_id, 10)
            assert answer.rc == 0
        await verify(h, uri, lh.ledger_id)
    run(main())


# ------------------------------------------------------------------ 4. ten recoverers at once
def test_ten_clients_recover_the_same_ledger_at_once(healthy):
    """Scenario 4: a tail of entries on one bookie only; ten concurrent recoverers agree,
    the metadata goes OPEN -> IN_RECOVERY -> CLOSED exactly once."""
    uri = healthy.metadata_uri

    async def main():
        h = History()
        writer = await BookKeeper.connect(uri, **FAST)
        lh = await create(writer, 3, 3, 2)
        assert not await write(h, lh, "ten", range(30), window=8)
        x, y, z = (healthy.proxy_for(b) for b in lh.ensemble)
        z.add_rule(Rule(UP, add_request(lh.ledger_id, FOREVER), "hold"))  # 30..: X and Y (acked)
        y.add_rule(Rule(UP, add_request(lh.ledger_id, range(36, 1 << 62)), "hold"))  # 36..: X only
        stored_by_x = x.add_rule(Rule(DOWN, add_response(lh.ledger_id, range(30, 45), rc=0), "pass"))
        tail = start_adds(h, lh, "ten", range(30, 45))
        await asyncio.to_thread(x.wait_hits, stored_by_x, 15)
        await until(lambda: lh.last_add_confirmed == 35, "entries 30..35 acknowledged")
        _, version_before = await metadata_of(uri, lh.ledger_id)
        await writer.close()  # the writer dies; what Y and Z were holding is lost with its connections
        await asyncio.gather(*tail, return_exceptions=True)
        for p in (y, z):
            p.clear_rules()
            # Entries 36..44: X's copy (positive) and Y's and Z's "no such entry" (negative once two
            # are in) race; either end is legal (none was acknowledged). Slowing the negatives lets
            # the recoverers find X's tail and write it back concurrently.
            p.add_rule(Rule(DOWN, read_response(lh.ledger_id, range(36, 45)), "delay", delay_s=1.0))

        results = await asyncio.gather(*(recover(uri, h, lh.ledger_id, f"r{k}") for k in range(10)))
        ends = {md.last_entry_id for md in results}
        assert len(ends) == 1, f"recoverers disagree: {ends}"
        end = ends.pop()
        assert 35 <= end <= 44
        md, version = await metadata_of(uri, lh.ledger_id)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == end
        assert version == version_before + 2, "one IN_RECOVERY mark and one close, whoever won"
        await verify(h, uri, lh.ledger_id)
    run(main())


# ------------------------------------------------------------------ 5. empty last segment
def test_empty_last_segment_recovery_starts_there(healthy):
    """Scenario 5: the writer changed the ensemble (bookie X reset its connection on entry 10),
    stored nothing in the new segment and died; recovery starts at the new segment's first
    entry (not at the fenced LAC + 1, which lies in the old segment) and closes at 9."""
    uri = healthy.metadata_uri

    async def main():
        h = History()
        writer = await BookKeeper.connect(uri, **FAST)
        lh = await create(writer, 3, 3, 2)
        for i in range(10):
            await h.add(lh, payload("seg", i))
        victim = lh.ensemble[0]
        healthy.proxy_for(victim).add_rule(Rule(UP, add_request(lh.ledger_id, 10), "reset"))
        for b in healthy.bookie_ids:
            if b != victim:
                healthy.proxy_for(b).add_rule(Rule(UP, add_request(lh.ledger_id, FOREVER), "hold"))
        add10 = start_adds(h, lh, "seg", [10])
        await until(lambda: lh.ensemble_changes >= 1, "the ensemble change")
        md, _ = await metadata_of(uri, lh.ledger_id)
        assert [first for first, _ in md.segments] == [0, 10] and victim not in md.segments[1][1]
        newcomer = next(b for b in md.segments[1][1] if b not in md.segments[0][1])
        await asyncio.to_thread(healthy.proxy_for(newcomer).wait_held, 1, UP)
        await writer.close()  # dies with entry 10 held everywhere: the new segment stays empty
        await asyncio.gather(*add10, return_exceptions=True)
        await asyncio.to_thread(heal, healthy)

        md = await recover(uri, h, lh.ledger_id, "recoverer")
        assert md.last_entry_id == 9 and [first for first, _ in md.segments] == [0, 10]
        await verify(h, uri, lh.ledger_id)
        # A bookie that never saw the ledger: a fencing read creates it fenced (REPLICATION.md).
        stranger = next(b for b in healthy.bookie_ids if all(b not in ens for _, ens in md.segments))
        answer = await raw_call(stranger, "send_read", lh.ledger_id, -1, flags=FLAG_DO_FENCING,
                                master_key=master_key(PW))
        assert answer.rc in (int(StatusCode.ENOLEDGER), int(StatusCode.ENOENTRY))
        answer = await raw_call(stranger, "send_add", add_frame(lh.ledger_id, 10, 9, 1, b"z"), lh.ledger_id, 10)
        assert answer.rc == EFENCED
    run(main())


# ------------------------------------------------------------------ 6. one bookie of the last segment down
def test_recovery_with_one_bookie_of_the_last_segment_down(healthy):
    """Scenario 6 (E=3 WQ=3 AQ=2): entries 30.. were stored on X and Y only; X is killed.
    Recovery fences Y and Z, finds 30.. on Y alone, writes them back to Y and Z - X's failure
    needs no ensemble change, every write set still has AQ bookies up - and closes."""
    uri = healthy.metadata_uri

    async def main():
        h = History()
        writer = await BookKeeper.connect(uri, **FAST)
        lh = await create(writer, 3, 3, 2)
        assert not await write(h, lh, "one", range(30), window=8)
        x_id, y_id, z_id = lh.ensemble
        z = healthy.proxy_for(z_id)
        z.add_rule(Rule(UP, add_request(lh.ledger_id, FOREVER, recovery=False), "hold"))
        assert not await write(h, lh, "one", range(30, 60), window=8)  # acked by X and Y
        await writer.close()  # Z's held copies are lost with the writer's connection
        z.clear_rules()
        healthy.kill(healthy.index_of(x_id))

        md = await recover(uri, h, lh.ledger_id, "recoverer")
        assert md.last_entry_id == 59
        assert md.segments == ((0, lh.ensemble),)  # the write-back delayed the ensemble change
        await verify(h, uri, lh.ledger_id)  # X still down: readers use the other replicas
    run(main())


# ------------------------------------------------------------------ 7. too few bookies answer
@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_recovery_fails_when_too_few_bookies_answer_and_a_later_open_succeeds(healthy, fault):
    """Scenario 7: two of three bookies of the last segment killed (connection refused) or
    paused (timeouts): no fencing coverage, LedgerRecoveryError. The ledger is not closed: it
    stays IN_RECOVERY (the mark of step 1, as BookKeeper leaves it) with its segments and end
    unchanged, so nothing was decided. Once the bookies return, a new open recovers it."""
    uri = healthy.metadata_uri

    async def main():
        h = History()
        writer = await BookKeeper.connect(uri, **FAST)
        lh = await create(writer, 3, 3, 2)
        assert not await write(h, lh, "few", range(40), window=8)
        tail = start_adds(h, lh, "few", range(40, 50))
        await writer.close()
        await asyncio.gather(*tail, return_exceptions=True)
        before, _ = await metadata_of(uri, lh.ledger_id)
        victims = [healthy.index_of(b) for b in lh.ensemble[:2]]
        for i in victims:
            if fault == "kill":
                healthy.kill(i)
            else:
                healthy.bookies[i].signal(signal.SIGSTOP)

        quick = dict(read_timeout_s=1.0, connect_timeout_s=1.0)  # a paused bookie stays within its ZK session
        with pytest.raises(LedgerRecoveryError, match="cannot fence"):
            await recover(uri, h, lh.ledger_id, "too early", **quick)
        after, _ = await metadata_of(uri, lh.ledger_id)
        assert after.state is LedgerState.IN_RECOVERY
        assert (after.segments, after.last_entry_id, after.length) == (before.segments, before.last_entry_id,
                                                                       before.length)
        with pytest.raises(LedgerRecoveryError):  # still too few: a retry changes nothing either
            await recover(uri, h, lh.ledger_id, "still too early", **quick)
        assert (await metadata_of(uri, lh.ledger_id))[0] == after

        await asyncio.to_thread(heal, healthy)
        md = await recover(uri, h, lh.ledger_id, "later")
        assert md.last_entry_id >= 39
        await verify(h, uri, lh.ledger_id)
    run(main())


# ------------------------------------------------------------------ 8. fences survive kill -9
def test_fence_survives_kill_9_of_every_bookie(healthy):
    """Scenario 8: after recovery every bookie is killed and restarted (journal replay);
    each still refuses a plain add of the ledger (EFENCED) and the old writer stays fenced."""
    uri = healthy.metadata_uri

    async def main():
        h = History()
        async with BookKeeper(uri, **FAST) as writer:
            lh = await create(writer, 3, 2, 2)
            assert not await write(h, lh, "k9", range(20), window=1)
            md = await recover(uri, h, lh.ledger_id, "recoverer")
            assert md.last_entry_id == 19
            for i in healthy.bookies:
                healthy.kill(i)
            for i in healthy.bookies:
                healthy.start_bookie(i, wait=False)
            for b in healthy.bookies.values():
                await asyncio.to_thread(b.wait_serving)
            for bookie_id in lh.ensemble:
                frame = add_frame(lh.ledger_id, 20, 19, lh.length + 5, b"late!")
                answer = await raw_call(bookie_id, "send_add", frame, lh.ledger_id, 20)
                assert answer.rc == EFENCED, (bookie_id, answer)
            with pytest.raises(LedgerFencedError):
                await h.add(lh, payload("k9", 20))
        await verify(h, uri, lh.ledger_id)
    run(main())


# ------------------------------------------------------------------ 9. wrong password
def test_wrong_password_recovery_is_refused_and_fences_nothing(healthy):
    """Scenario 9: open with recovery and a wrong password raises UnauthorizedAccessError
    and changes nothing; a bookie refuses a fencing read with the wrong key (EUA) without
    fencing; the writer goes on and closes at its LAC."""
    uri = healthy.metadata_uri

    async def main():
        h = History()
        async with BookKeeper(uri, **FAST) as writer:
            lh = await create(writer, 3, 2, 2)
            assert not await write(h, lh, "pw", range(20), window=4)
            before = await metadata_of(uri, lh.ledger_id)
            async with BookKeeper(uri) as other:
                with pytest.raises(UnauthorizedAccessError):
                    await other.open_ledger(lh.ledger_id, password=b"not the password", recovery=True)
            assert await metadata_of(uri, lh.ledger_id) == before
            assert before[0].state is LedgerState.OPEN
            for bookie_id in lh.ensemble:
                answer = await raw_call(bookie_id, "send_read", lh.ledger_id, -1, flags=FLAG_DO_FENCING,
                                        master_key=master_key(b"not the password"))
                assert answer.rc == EUA
            assert not await write(h, lh, "pw", range(20, 40), window=4)
            assert lh.last_add_confirmed == 39
            await h.close(lh)
        md = await verify(h, uri, lh.ledger_id)
        assert md.last_entry_id == 39
    run(main())


# ------------------------------------------------------------------ the shell
def test_shell_readledger_recover_fences_closes_and_prints(healthy):
    """`bk shell readledger ID --recover` fences and closes an open ledger (the live writer is
    fenced out) and prints its entries; `bk shell ledgermetadata` shows it CLOSED."""
    uri = healthy.metadata_uri

    async def main():
        h = History()
        async with BookKeeper(uri, **FAST) as writer:
            lh = await create(writer, 3, 2, 2)
            for i in range(15):
                await h.add(lh, b"shell-entry-%d" % i)
            out = await asyncio.to_thread(run_shell, uri, "readledger", str(lh.ledger_id), "--recover",
                                          "--password", PW.decode())
            assert out.returncode == 0, out.stderr
            rows = [line.split("\t") for line in out.stdout.splitlines()]
            # The writer's LAC (14) reached the bookies only piggybacked on later entries: recovery
            # finds entry 14 anyway (it is on the bookies) and the shell prints all of them.
            assert rows == [[str(i), f"shell-entry-{i}"] for i in range(15)]
            out = await asyncio.to_thread(run_shell, uri, "--json", "ledgermetadata", str(lh.ledger_id))
            assert out.returncode == 0, out.stderr
            shown = json.loads(out.stdout)
            assert shown["state"] == "CLOSED" and shown["last_entry_id"] == 14
            with pytest.raises(LedgerFencedError):
                await h.add(lh, b"after the shell recovered it")
        h.recovered(lh.ledger_id, 14, "shell")
        await verify(h, uri, lh.ledger_id)
    run(main())


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "writer":
    _, _, _uri, _e, _wq, _aq, _count, _window = sys.argv
    child_writer(_uri, int(_e), int(_wq), int(_aq), int(_count), int(_window))
