"""Issue 27, in-process clusters: entries lost with their entry logs are repaired (not reported
repaired), and a journal-off crash fences only what BookKeeper fences. The same with real
`bk bookie` processes: tests/integration/test_lost_logs.py."""
from __future__ import annotations

import asyncio
import os
import shutil

from bk.client import BookKeeper
from bk.formats import entrylog as fmt
from bk.meta.ledger_manager import LedgerManager
from bk.testing.inprocess import InProcessCluster

PW = b"pw"
SMALL_LOGS = dict(entry_log_size_limit_bytes="64KiB")
N = 150


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 90))


def payload(i: int) -> bytes:
    return b"entry-%d-" % i + bytes([i % 251]) * 600


async def write(bkc, n, e=3, wq=3, aq=2, close=True):
    lh = await bkc.create_ledger(e, wq, aq, password=PW)
    for i in range(n):
        await lh.add_entry(payload(i))
    if close:
        await lh.close()
    return lh


def logs_of(server) -> list[int]:
    """The ids of the bookie's entry logs that its index points into."""
    return sorted(server.bookie.storage.index.locations_by_log())


async def served(bookie, ledger_id: int, n: int) -> None:
    for e in range(n):
        assert bytes(await bookie.read_entry(ledger_id, e)).endswith(payload(e))


async def repaired(server, lids_n) -> dict:
    st = (await server.repair.wait()).as_dict()
    b = server.bookie
    assert st["state"] == "done" and st["ledgers_left"] == 0
    assert not b.needs_integrity_check and not b.limbo_ledgers()
    for lid, n in lids_n:
        assert b.missing_entries(lid, range(n)) == []
        await served(b, lid, n)
    return st


def test_deleted_entry_log_journal_on_is_found_limboed_and_copied_back(tmp_path):
    async def main():
        async with InProcessCluster(tmp_path, bookies=3, **SMALL_LOGS) as cluster:  # journal on, checking off
            async with BookKeeper(cluster.metadata_uri) as bkc:
                other = await write(bkc, 5)  # in the first log only
                lh = await write(bkc, N)
                await cluster.servers[0].bookie.checkpoint()
                await cluster.stop_bookie(0)
                victim = os.path.join(str(tmp_path), "bookie-0", "ledgers")
                d = fmt.log_dir(victim)
                logs = sorted(fmt.parse_log_file_name(n) for n in os.listdir(d) if n.endswith(".log"))
                assert len(logs) >= 2
                os.remove(os.path.join(d, fmt.log_file_name(logs[-1])))
                server = await cluster.start_bookie(0)
                # phase one for the ledger that lost entries only: in limbo, and closed so fenced too
                assert server.phase_one is not None and server.phase_one.ledgers_marked == 1
                assert server.bookie.is_limbo(lh.ledger_id) and not server.bookie.is_limbo(other.ledger_id)
                st = await repaired(server, [(lh.ledger_id, N), (other.ledger_id, 5)])
                found = server.bookie.log_check
                assert found.dead_entries > 0 and set(found.ledgers) == {lh.ledger_id}
                assert st["entries_lost"] == found.dead_entries
                assert st["entries_copied"] == found.dead_entries and st["errors"] == 0
                await cluster.stop_bookie(0)
                server = await cluster.start_bookie(0)  # the copies replaced every dead location
                assert not server.bookie.log_check.dead_logs and server.phase_one is None
                await served(server.bookie, lh.ledger_id, N)
    run(main())


def test_wiped_second_ledger_dir_journal_off_is_repaired(tmp_path):
    async def main():
        dirs = [os.path.join(str(tmp_path), "bookie-0", "ledgers"), os.path.join(str(tmp_path), "bookie-0", "l1")]
        async with InProcessCluster(tmp_path, bookies=0, journal_write_data=False, **SMALL_LOGS) as cluster:
            await cluster.start_bookie(0, ledger_dirs=dirs)
            for i in (1, 2):
                await cluster.start_bookie(i)
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await write(bkc, N)
                await cluster.servers[0].bookie.checkpoint()
                await cluster.stop_bookie(0)
                # the bookie spread its logs over both dirs; the index stays in the first
                logs = sorted(fmt.parse_log_file_name(n) for n in os.listdir(fmt.log_dir(dirs[0]))
                              if n.endswith(".log"))
                for log_id in logs[1::2]:
                    os.rename(os.path.join(fmt.log_dir(dirs[0]), fmt.log_file_name(log_id)),
                              os.path.join(fmt.log_dir(dirs[1]), fmt.log_file_name(log_id)))
                server = await cluster.start_bookie(0, ledger_dirs=dirs)
                assert server.phase_one is None
                await served(server.bookie, lh.ledger_id, N)
                await cluster.crash_bookie(0)
                shutil.rmtree(dirs[1])  # the second disk is replaced
                server = await cluster.start_bookie(0, ledger_dirs=dirs, data_integrity_cookie_stamping_enabled=True)
                st = await repaired(server, [(lh.ledger_id, N)])
                found = server.bookie.log_check
                assert {d.log_id for d in found.dead_logs} >= set(logs[1::2]) - {logs[-1]}
                assert found.dead_entries > 0
                assert st["entries_lost"] == found.dead_entries and st["entries_copied"] >= found.dead_entries
    run(main())


async def moved_off(cluster, bkc):
    """A writer of 20 entries on a journal-off bookie that crashes (losing them); the writer
    adds until its ensemble has left that bookie. (handle, bookie id, its index, next entry)"""
    lh = await write(bkc, 20, close=False)
    victim_id = lh.ensemble[0]
    victim = next(i for i in cluster.servers if cluster.bookie_id(i) == victim_id)
    await cluster.crash_bookie(victim)  # journal off: its 20 entries are gone
    n = 20
    while victim_id in lh.ensemble:  # the writer replaces it
        await lh.add_entry(payload(n))
        n += 1
    return lh, victim_id, victim, n


def test_writer_whose_ensemble_left_a_crashed_bookie_keeps_writing(tmp_path):
    """BookKeeper's pre-boot rule: only ledgers not closed whose LAST ensemble names the bookie
    are fenced. The writer moved off bookie 0 while it was down: it keeps writing, and bookie
    0's old segment is repaired without recovery."""
    async def main():
        async with InProcessCluster(tmp_path, bookies=4, journal_write_data=False,
                                    flush_interval_ms=3_600_000) as cluster:
            async with BookKeeper(cluster.metadata_uri, add_timeout_s=2.0) as bkc:
                lh, victim_id, victim, n = await moved_off(cluster, bkc)
                server = await cluster.start_bookie(victim)
                b = server.bookie
                # put in limbo unfenced at the start (the repair may clear the limbo before we look:
                # it runs at once and, under CI load, finished before start_bookie returned)
                assert (server.phase_one.ledgers_marked, server.phase_one.ledgers_fenced) == (1, 0)
                assert not b.is_fenced(lh.ledger_id)
                assert server.phase_one is not None and server.phase_one.ledgers_fenced == 0
                for i in range(n, n + 10):  # through the restart and the repair
                    await lh.add_entry(payload(i))
                md, _ = await LedgerManager(bkc.store).read_ledger_metadata(lh.ledger_id)
                moved_at = md.segments[1][0]  # the old segment: 0..moved_at-1, every entry on bookie 0
                assert md.segments[0][1].count(victim_id) == 1 and victim_id not in md.segments[-1][1]
                st = await repaired(server, [(lh.ledger_id, moved_at)])
                assert st["ledgers_recovered"] == 0 and st["entries_copied"] == moved_at >= 20
                for i in range(n + 10, n + 20):
                    await lh.add_entry(payload(i))
                await lh.close()
                md, _ = await LedgerManager(bkc.store).read_ledger_metadata(lh.ledger_id)
                assert md.is_closed and md.last_entry_id == n + 19
                assert not b.is_fenced(lh.ledger_id)
    run(main())


def test_crash_during_the_repair_of_an_unfenced_ledger_keeps_it_unfenced(tmp_path):
    """A second crash while the repair copies the moved-off writer's old segment: the next
    start limbos the ledger again without a fence, finishes the copy, the writer goes on."""
    async def main():
        async with InProcessCluster(tmp_path, bookies=4, journal_write_data=False,
                                    flush_interval_ms=3_600_000) as cluster:
            async with BookKeeper(cluster.metadata_uri, add_timeout_s=2.0) as bkc:
                lh, victim_id, victim, n = await moved_off(cluster, bkc)
                server = await cluster.start_bookie(victim, data_integrity_repair_rate_bytes_per_s=1,
                                                    rereplication_entry_batch_size=1)  # crawls
                await asyncio.sleep(0.3)
                assert server.repair.status.state == "running"
                await cluster.crash_bookie(victim)
                server = await cluster.start_bookie(victim)
                b = server.bookie
                # put in limbo unfenced at the start (the repair may clear the limbo before we look:
                # it runs at once and, under CI load, finished before start_bookie returned)
                assert (server.phase_one.ledgers_marked, server.phase_one.ledgers_fenced) == (1, 0)
                assert not b.is_fenced(lh.ledger_id)
                md, _ = await LedgerManager(bkc.store).read_ledger_metadata(lh.ledger_id)
                st = await repaired(server, [(lh.ledger_id, md.segments[1][0])])
                assert st["ledgers_recovered"] == 0
                for i in range(n, n + 10):
                    await lh.add_entry(payload(i))
                await lh.close()
                assert not b.is_fenced(lh.ledger_id)
    run(main())


def test_garbled_record_mid_log_is_repaired_not_reported_repaired(tmp_path):
    """A record garbled in the middle of a log that is neither missing nor cut short: the
    index still places the entry there, but the bytes are not its record. The repair counts
    it missing (EntryLogger.holds_entry), copies it from a peer, and the entry is served
    again. Before, the repair said done and the entry answered EIO for good."""
    from bk.testing.corruption import flip_entry_bit

    async def main():
        async with InProcessCluster(tmp_path, bookies=3, journal_write_data=False) as cluster:
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await write(bkc, N)
                await cluster.servers[0].bookie.checkpoint()
                await cluster.crash_bookie(0)  # unclean: phase one and the repair at the start
                flip_entry_bit([os.path.join(str(tmp_path), "bookie-0", "ledgers")], lh.ledger_id, N // 2,
                               part="size")
                server = await cluster.start_bookie(0)
                st = await repaired(server, [(lh.ledger_id, N)])
                assert st["entries_copied"] == 1 and st["errors"] == 0
    run(main())
