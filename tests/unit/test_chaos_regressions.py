"""Regressions found by the chaos runner (bk.testing.chaos), each named after its seed.
Replay the original: the command in the test's docstring."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bk.client import BookKeeper
from bk.testing.inprocess import InProcessCluster


@pytest.mark.timeout(60)
def test_seed25_crash_during_a_checkpoint_does_not_deadlock(tmp_path):
    """python -m bk.testing.chaos --seed 25 --mode inprocess --break forget-fence hung for good:
    InProcessCluster.crash_bookie joined the storage thread on the event loop's thread while
    that thread's checkpoint waited for the loop (LedgerStorage._on_owner). Here the
    checkpoint is made to reach the loop only once the crash is under way."""
    async def main():
        async with InProcessCluster(tmp_path, bookies=1, flush_interval_ms=3_600_000) as cluster:
            storage = cluster.servers[0].bookie.storage
            entered = threading.Event()
            real = storage._on_owner

            def late_on_owner(fn):
                entered.set()
                time.sleep(0.3)  # the crash reaches its join meanwhile
                return real(fn)
            storage._on_owner = late_on_owner
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await bkc.create_ledger(1, 1, 1, password=b"pw")
                await lh.add_entry(b"in the write cache")
            storage.request_checkpoint()
            assert await asyncio.to_thread(entered.wait, 10)
            await asyncio.wait_for(cluster.crash_bookie(0), 20)
            server = await cluster.start_bookie(0)
            assert server.bookie.missing_entries(lh.ledger_id, range(1)) == []  # journal replay
    asyncio.run(main())


@pytest.mark.timeout(60)
def test_seed161_a_connection_lost_before_it_is_registered_fails_the_requests(monkeypatch):
    """python -m bk.testing.chaos --seed 161 --mode process hung (2 runs in 5): a bookie was
    killed behind its proxy, which accepted the writer's connection and closed it at once.
    connection_lost arrived before BookieClient._connect had made that protocol the current
    one, so it was ignored; the dead protocol then became current, every flush raised
    RuntimeError, and the adds on it never completed nor failed. Here the connection dies
    inside connection_made, so its connection_lost runs before _connect resumes."""
    from bk import eventloop
    from bk.client import BookieClient, bookie_client
    from bk.errors import BookieConnectionError

    made = bookie_client._BookieProtocol.connection_made

    def made_then_lost(self, transport):
        made(self, transport)
        transport.abort()
    monkeypatch.setattr(bookie_client._BookieProtocol, "connection_made", made_then_lost)

    async def main():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = BookieClient(f"127.0.0.1:{port}", read_timeout_s=30.0, connect_timeout_s=30.0)
        try:
            with pytest.raises(BookieConnectionError):
                await asyncio.wait_for(client.call(client.send_read, 1, 0), 10)
        finally:
            client.close()
            server.close()
            await server.wait_closed()
    eventloop.run(main())


def test_seed20099_a_start_failed_by_a_disk_fault_healed_meanwhile_is_not_a_refusal():
    """python -m bk.testing.chaos --seed 20099 --mode process (1 of 150 process seeds): a crashed
    bookie's restart was under way when an fsync-error fault hit its disk; the fault was healed
    before the start gave up on the failing fsync, so the runner found no disk rule active, called
    the bookie one that refused to start although nothing corrupted it, and never restarted it.
    A start during which any disk fault was applied is excused; the fault's heal restarts it."""
    from bk.testing.chaos.clusters import BookieStartError
    from bk.testing.chaos.run import Chaos
    from bk.testing.chaos.scenario import generate

    class _Cluster:
        def __init__(self):
            self.up = False
            self.starts = 0

        def alive(self, i):
            return self.up

        async def restart(self, i):
            self.starts += 1
            if self.starts == 1:  # the fault comes and goes while this start runs
                chaos.add_disk_rule(7, i, 1)
                chaos.disk_rules.pop(7)
                raise BookieStartError(f"bookie {i} did not start: fsync of directory failed (EIO)")
            self.up = True

    async def main():
        await chaos.restart(1)
        assert 1 not in chaos.refused and not cluster.up
        await chaos.restart(1)  # what the fault's heal does
        assert cluster.up and 1 not in chaos.refused

    cluster = _Cluster()
    chaos = Chaos(generate(20099), cluster, [])
    asyncio.run(main())


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("io_uring_reads")
def test_seed62830_an_in_process_crash_calls_the_event_loop_only_from_its_thread(tmp_path):
    """python -m bk.testing.chaos --seed 62830 --mode inprocess failed once in about 10,000
    runs (replays passed): `loop.close()` raised EBUSY after a run that verified clean. The
    crash's halt_without_checkpoint runs in a worker thread and closed the bookie's io_uring
    reads there, and their close calls loop.remove_reader: a libuv handle closed from a
    foreign thread while the loop ran. The race itself is rare; the foreign call is not:
    every in-process crash made it. Here the loop is watched (bk.testing.loopcheck, as
    every chaos run's is now) and a crash must not call into it from another thread."""
    from bk.testing.loopcheck import checked_loop_factory

    async def main():
        async with InProcessCluster(tmp_path, bookies=2) as cluster:
            assert cluster.servers[0].bookie._ring is not None  # the reads this is about
            async with BookKeeper(cluster.metadata_uri) as bkc:
                lh = await bkc.create_ledger(2, 2, 2, password=b"pw")
                for i in range(20):
                    await lh.add_entry(b"entry %d" % i)
                reads = asyncio.ensure_future(lh.read_entries(0, 19))  # in flight at the crash, perhaps
                await cluster.crash_bookie(0)
                await asyncio.gather(reads, return_exceptions=True)
            server = await cluster.start_bookie(0)
            assert server.bookie.missing_entries(lh.ledger_id, range(20)) == []
    foreign: list = []
    with asyncio.Runner(loop_factory=checked_loop_factory(foreign)) as runner:
        runner.run(main())
    assert [line for calls in foreign for line in calls.describe()] == []


@pytest.mark.timeout(60)
def test_seed123424_a_share_probed_on_a_stream_a_drop_fault_broke_is_asked_again(tmp_path):
    """python -m bk.testing.chaos --seed 123424 (TLS, AutoRecovery): a bookie lacked two
    entries of its share after AutoRecovery and no marker was left. The chaos proxy cannot
    find frames in TLS (a record header read as a length prefix is out of range), so a drop
    fault drops raw chunks: the bookie's TLS session breaks when the next record reaches it,
    and the first request a client sends on that connection after the heal fails with the
    connection lost. When that request was the audit's probe of the lacking share, the
    checker answered "unknown" and the auditor did not mark the ledger. A probe whose
    connection broke is now asked again on a new one, and finds the share missing."""
    from bk.meta.underreplication import LedgerUnderreplicationManager
    from bk.replication import Auditor, LedgerChecker
    from bk.replication.admin import list_underreplicated
    from bk.testing.chaos.clients import tls_config
    from bk.testing.chaos.clusters import InProcessChaosCluster
    from bk.testing.proxy import Rule

    async def main():
        tls, trust = tls_config(str(tmp_path))
        cluster = await InProcessChaosCluster(str(tmp_path / "c"), 2, **tls).start()
        try:
            async with BookKeeper(cluster.metadata_uri, tls_trust_store=trust, read_timeout_s=1) as bkc:
                lh = await bkc.create_ledger(2, 2, 2, password=b"pw")
                for i in range(5):
                    await lh.add_entry(b"entry %d" % i)
                await lh.close()
                md = await bkc.get_ledger_metadata(lh.ledger_id)
                checker = LedgerChecker(bkc.pool)
                assert not (await checker.check(lh.ledger_id, md)).unknown  # the connections exist
                lacking = cluster.bookie_id(1)
                client = bkc.pool.get(lacking)
                rule = cluster.proxy(1).add_rule(Rule("up", None, "drop"))  # the chaos "drop all up"
                with pytest.raises(Exception):  # unanswered: its bytes never reached the bookie
                    await client.call(client.send_read, lh.ledger_id, 0)
                cluster.proxy(1).remove_rule(rule)  # healed; the TLS stream has a hole
                cluster.servers[1].bookie.storage.delete_ledger(lh.ledger_id)  # the share is lost
                result = await checker.check(lh.ledger_id, md)
                assert result.missing == {lacking} and not result.unknown, result
                auditor = await Auditor(bkc, LedgerUnderreplicationManager(bkc.store), "auditor:1",
                                        check_interval_s=0, bookie_check_interval_s=0).start()
                try:
                    assert await auditor.check_all_ledgers() == 1
                    marks = await list_underreplicated(auditor.urm)
                    assert [(m.ledger_id, sorted(m.missing_replicas)) for m in marks] == [(lh.ledger_id, [lacking])]
                finally:
                    await auditor.stop()
        finally:
            await cluster.stop()
    asyncio.run(main())
