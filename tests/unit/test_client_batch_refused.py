"""bk's client against bookies that predate BATCH_READ (BookKeeper < 4.17).

A 4.15 bookie does not know v2 op code 7: it logs "Received unknown request op
code = 7" and closes the connection. With E == WQ the client reads ranges with
BATCH_READ, so it must notice the drop, read that bookie entry by entry from
then on (for the client's lifetime, said once in the log), and the read that
met the drop must still succeed."""
from __future__ import annotations

import logging
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_client_support import FakeCluster, run_async, until  # noqa: E402

from bk.client import BookKeeper  # noqa: E402
from bk.proto import BatchReadRequest, StatusCode  # noqa: E402

N = 300
WANT = [b"entry-%d" % i for i in range(N)]


def predates_batch_read(bookie) -> None:
    """Make a fake bookie answer op code 7 as a 4.15 bookie does: close that connection."""
    handle = bookie._handle

    def _handle(conn, req):
        if isinstance(req, BatchReadRequest):
            bookie.requests.append(("batch", req.ledger_id, req.start_entry_id))
            conn.transport.abort()
            return
        handle(conn, req)

    bookie._handle = _handle


async def written(bkc, n=N, ensemble=3):
    lh = await bkc.create_ledger(ensemble, ensemble, ensemble)
    await lh.add_entries([b"entry-%d" % i for i in range(n)])
    await lh.close()
    return lh


def ops(cluster, bookie=None):
    return [op for b in cluster.bookies if bookie in (None, b) for op, _, _ in b.requests]


def clear(cluster):
    for b in cluster.bookies:
        b.requests.clear()


@run_async
async def test_a_bookie_that_drops_batch_reads_is_read_entry_by_entry_and_the_read_succeeds(caplog):
    caplog.set_level(logging.WARNING, logger="bk.client.bookie_client")
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, batch_read_entries=10) as bkc:
        lh = await written(bkc)
        for b in cluster.bookies:
            predates_batch_read(b)
        clear(cluster)
        rh = lh  # the writer's own handle: reads through the client's one pool
        entries = await rh.read_entries(0, N - 1)  # the read that meets the drops
        assert [e.data for e in entries] == WANT
        assert "batch" in ops(cluster)
        assert all(c.batch_reads_refused for c in bkc.pool.clients().values())
        clear(cluster)
        for _ in range(2):  # remembered: no batch is ever sent to them again
            assert [e.data for e in await rh.read_entries(0, N - 1)] == WANT
            assert [e.data for e in await rh.read_entries(17, 170)] == WANT[17:171]
        assert set(ops(cluster)) == {"read"}
    said = [r.getMessage() for r in caplog.records if "predates BookKeeper 4.17" in r.getMessage()]
    assert sorted(m.split()[1] for m in said) == sorted(b.bookie_id for b in cluster.bookies)  # once each


@run_async
async def test_only_the_old_bookie_loses_batch_reads_in_a_mixed_ensemble():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, batch_read_entries=10) as bkc:
        lh = await written(bkc)
        old = cluster.bookies[1]
        predates_batch_read(old)
        assert [e.data for e in await lh.read_entries(0, N - 1)] == WANT
        clear(cluster)
        assert [e.data for e in await lh.read_entries(0, N - 1)] == WANT
        assert "batch" not in ops(cluster, old)
        assert "batch" in ops(cluster) and {"batch"} >= set(ops(cluster)) - {"read"}
        refused = {bid for bid, c in bkc.pool.clients().items() if c.batch_reads_refused}
        assert refused == {old.bookie_id}


@run_async
async def test_a_bookie_answering_batch_reads_with_ebadreq_is_read_entry_by_entry():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, batch_read_entries=10) as bkc:
        lh = await written(bkc, 100)
        bad = int(StatusCode.EBADREQ)
        for b in cluster.bookies:
            b.read_hook = lambda req: bad if isinstance(req, BatchReadRequest) else None
        assert [e.data for e in await lh.read_entries(0, 99)] == WANT[:100]
        clear(cluster)
        assert [e.data for e in await lh.read_entries(0, 99)] == WANT[:100]
        assert set(ops(cluster)) == {"read"}


@run_async
async def test_a_connection_lost_without_a_batch_pending_keeps_batch_reads():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri, batch_read_entries=10) as bkc:
        lh = await written(bkc, 100)
        for b in cluster.bookies:
            b.kill_connections()  # a plain drop (a restart, a network blip): nothing learnt
        await until(lambda: not any(c.connected for c in bkc.pool.clients().values()), "the client saw the drops")
        assert [e.data for e in await lh.read_entries(0, 99)] == WANT[:100]
        assert not any(c.batch_reads_refused for c in bkc.pool.clients().values())
        assert "batch" in ops(cluster)
