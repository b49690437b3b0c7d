"""GC's safety rules against a real ZooKeeper (bookies in this process, their GC
driven through the same Python API the admin socket calls):
- the metadata store unreachable during a pass: nothing is deleted;
- a candidate's metadata read failing (not "no such ledger"): kept;
- a ledger whose bookie data appears after the pass took its local snapshot: kept;
- over-replicated copies: deleted only for closed ledgers no ensemble of which names
  this bookie, not before gc_over_replicated_ledger_wait_time_ms, never while a
  replication worker holds the ledger's lock.
Each unsafe-looking case is followed by the pass that does delete, so a test cannot
pass because GC deleted nothing at all."""
import asyncio
import os
import time

import pytest

from bk import eventloop
from bk.client import BookKeeper
from bk.errors import MetadataStoreError, NoSuchLedgerError
from bk.meta import open_store
from bk.meta.ledger_manager import LedgerManager
from bk.meta.ledger_metadata import LedgerMetadata
from bk.meta.underreplication import LedgerUnderreplicationManager
from bk.testing.engine_host import expected_entry, ledger_key
from bk.testing.inprocess import InProcessCluster
from bk.testing.proxy import ThreadedProxy

SETTINGS = dict(entry_log_size_limit_bytes="64KiB", gc_wait_time_ms=3_600_000, gc_metadata_timeout_ms=1500)


async def trigger(server) -> dict:
    return await asyncio.to_thread(server.bookie.gc.trigger)


async def write_ledgers(uri, count, entries=50):
    ids = []
    async with BookKeeper(uri) as bkc:
        for _ in range(count):
            lh = await bkc.create_ledger(1, 1, 1, digest_type="CRC32C", password=b"pw")
            for i in range(entries):
                await lh.add_entry(os.urandom(1000))
            await lh.close()
            ids.append(lh.ledger_id)
    return ids


async def delete_ledger(uri, lid):
    async with BookKeeper(uri) as bkc:
        await bkc.delete_ledger(lid)


def test_store_unreachable_during_a_pass_deletes_nothing(zk_server, zk_metadata_uri, tmp_path):
    host, port = zk_server.split(":")
    proxy = ThreadedProxy(host, int(port)).start()
    root = zk_metadata_uri.split("/", 3)[3]
    proxied = f"zk://127.0.0.1:{proxy.proxy.port}/{root}"

    async def main():
        async with InProcessCluster(tmp_path, bookies=1, metadata_uri=proxied, **SETTINGS) as cluster:
            server = cluster.servers[0]
            keep, doomed = await write_ledgers(zk_metadata_uri, 2)
            await delete_ledger(zk_metadata_uri, doomed)
            await server.bookie.checkpoint()
            proxy.set_blackhole(True)
            try:
                out = await trigger(server)
            finally:
                proxy.set_blackhole(False)
                proxy.close_connections()  # kazoo reconnects now instead of after its read timeout
            assert out["ledgers_deleted"] == [] and any("metadata scan failed" in e for e in out["errors"]), out
            assert server.bookie.ledger_exists(doomed) and server.bookie.ledger_exists(keep)
            assert await server.bookie.read_entry(doomed, 49)
            deadline = time.monotonic() + 20
            while True:  # the session comes back; then the pass deletes
                out = await trigger(server)
                if out["ledgers_deleted"] or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert out["ledgers_deleted"] == [doomed], out
            assert server.bookie.ledger_exists(keep)
    try:
        eventloop.run(main())
    finally:
        proxy.stop()


def test_failed_metadata_read_keeps_the_candidate(zk_metadata_uri, tmp_path):
    async def main():
        async with InProcessCluster(tmp_path, bookies=1, metadata_uri=zk_metadata_uri, **SETTINGS) as cluster:
            server = cluster.servers[0]
            keep, doomed = await write_ledgers(zk_metadata_uri, 2)
            await delete_ledger(zk_metadata_uri, doomed)
            lm = server.gc_policy.ledger_manager
            real = lm.read_ledger_metadata

            async def lost(ledger_id):
                raise MetadataStoreError("ConnectionLoss")  # what a session loss looks like
            lm.read_ledger_metadata = lost
            out = await trigger(server)
            assert out["ledgers_deleted"] == [] and server.bookie.ledger_exists(doomed)
            assert any(f"ledger {doomed} kept" in e for e in out["errors"]), out
            lm.read_ledger_metadata = real
            out = await trigger(server)
            assert out["ledgers_deleted"] == [doomed] and out["ok"], out
    eventloop.run(main())


def test_ledger_created_during_a_pass_is_kept(zk_metadata_uri, tmp_path):
    async def main():
        async with InProcessCluster(tmp_path, bookies=1, metadata_uri=zk_metadata_uri, **SETTINGS) as cluster:
            server = cluster.servers[0]
            bookie = server.bookie
            await write_ledgers(zk_metadata_uri, 1)
            newcomer = 424242
            lm = server.gc_policy.ledger_manager
            real = lm.list_ledger_ids

            async def list_while_a_ledger_is_created():
                # bookie data for a ledger whose metadata is not visible (yet): it came
                # after the local snapshot of this pass
                await bookie.add_entry(newcomer, 0, expected_entry(1, newcomer, 0, 100), ledger_key(1, newcomer))
                return await real()
            lm.list_ledger_ids = list_while_a_ledger_is_created
            out = await trigger(server)
            lm.list_ledger_ids = real
            assert out["ledgers_deleted"] == [] and bookie.ledger_exists(newcomer), out
            assert await bookie.read_entry(newcomer, 0) == expected_entry(1, newcomer, 0, 100)
            # one pass later it was in the snapshot and has no metadata: garbage
            out = await trigger(server)
            assert out["ledgers_deleted"] == [newcomer], out
            with pytest.raises(NoSuchLedgerError):
                await bookie.read_entry(newcomer, 0)
    eventloop.run(main())


def test_over_replicated_copies_are_deleted_only_when_safe(zk_metadata_uri, tmp_path):
    async def main():
        settings = dict(SETTINGS, gc_over_replicated_ledger_wait_time_ms=1500)
        async with InProcessCluster(tmp_path, bookies=2, metadata_uri=zk_metadata_uri, **settings) as cluster:
            server = cluster.servers[0]
            me, other = cluster.bookie_id(0), cluster.bookie_id(1)
            store = await open_store(zk_metadata_uri)
            lm = LedgerManager(store)
            urm = LedgerUnderreplicationManager(store)
            try:
                shapes = {  # ledger -> (segments, closed)
                    101: ([(0, [other])], True),             # moved away, closed: over-replicated
                    102: ([(0, [me]), (5, [other])], True),  # an older segment still names me
                    103: ([(0, [other])], False),            # open: its ensemble may change again
                    104: ([(0, [other])], True),             # a worker holds its replication lock
                }
                for lid, (segments, closed) in shapes.items():
                    md = LedgerMetadata.new(segments[0][1], 1, 1)
                    md = md.replace(segments=tuple((f, tuple(b)) for f, b in segments))
                    if closed:
                        md = md.with_closed(9, 10 * 100)
                    await lm.create_ledger_metadata(lid, md)
                    for eid in range(10):
                        await server.bookie.add_entry(lid, eid, expected_entry(1, lid, eid, 100), ledger_key(1, lid))
                assert await urm.acquire_ledger_lock(104, "some-worker")
                out = await trigger(server)  # too early: the check runs every 1.5 s
                assert out["ledgers_deleted"] == [], out
                await asyncio.sleep(1.6)
                out = await trigger(server)
                assert out["ledgers_deleted"] == [101] and out["over_replicated_deleted"] == [101], out
                for lid in (102, 103, 104):
                    assert await server.bookie.read_entry(lid, 9) == expected_entry(1, lid, 9, 100)
                await urm.release_ledger_lock(104)
                await asyncio.sleep(1.6)
                out = await trigger(server)
                assert out["over_replicated_deleted"] == [104], out
                assert server.bookie.ledger_exists(102) and server.bookie.ledger_exists(103)
            finally:
                await urm.close()
                await store.close()
    eventloop.run(main())
