"""A replication lock whose acquisition timed out after ZooKeeper created it (the create
reached the server, the reply never reached the caller) is found and released by the
session that made it, against a real ZooKeeper: AutoRecovery on another session can take
the ledger at once instead of after this session ends (for a bookie: never)."""
import asyncio

from bk import eventloop
from bk.meta import open_store
from bk.meta.underreplication import LedgerUnderreplicationManager
from bk.testing.slow_store import SlowStore


def test_timed_out_lock_acquisition_is_released_on_zookeeper(zk_metadata_uri):
    async def main():
        zk = await open_store(zk_metadata_uri)
        lost = SlowStore(zk, lose_reply=lambda op, path: op == "create" and "/locks/" in path)
        gc = LedgerUnderreplicationManager(lost)
        worker_store = await open_store(zk_metadata_uri)
        worker = LedgerUnderreplicationManager(worker_store)
        try:
            assert await worker.acquire_ledger_lock(8, "autorecovery:2")  # someone else's: kept
            try:
                await asyncio.wait_for(gc.acquire_ledger_lock(9, "gc-bookie-1"), 1.0)
                raise AssertionError("the lost reply did not time out")
            except asyncio.TimeoutError:
                pass
            assert lost.lost == [("create", gc.lock_path(9))]  # the server did create it
            taken = False
            for _ in range(100):  # released in the background, without waiting for it here
                taken = await worker.acquire_ledger_lock(9, "autorecovery:2")
                if taken:
                    break
                await asyncio.sleep(0.05)
            assert taken, "the timed-out lock still blocks AutoRecovery"
            await gc.wait_lost_locks_resolved()
            assert gc.lost_locks_released == 1
            assert await worker.lock_holder(9) == "autorecovery:2" and await worker.lock_holder(8) == "autorecovery:2"
            await worker.release_ledger_lock(9)
            await worker.release_ledger_lock(8)
        finally:
            await gc.close()
            await worker.close()
            await zk.close()
            await worker_store.close()
    eventloop.run(main())
