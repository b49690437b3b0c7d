"""bk's client against three Apache BookKeeper bookies of 4.17.4 and of 4.15.5, v2 and v3.

4.15 bookies predate BATCH_READ (v2 op code 7): they drop the connection on it. With E == WQ
bk's client reads ranges with BATCH_READ, so the 4.15.5 runs prove that the client notices,
reads those bookies entry by entry, and the read that met the drop still succeeds."""
from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from interop_support import (  # noqa: E402
    PASSWORD, RELEASES, format_root, fresh_root, run_async, start_java_bookies,
)

from bk.client import BookKeeper  # noqa: E402
from bk.meta.ledger_metadata import LedgerState  # noqa: E402

N = 400


def data(i: int) -> bytes:
    return b"bk-%06d-" % i + bytes([i & 0xFF]) * (100 + i % 300)


@pytest.fixture(scope="module", params=RELEASES)
def java_cluster(request, interop_zk, tmp_path_factory):
    release = request.param
    uri = f"zk://{fresh_root(interop_zk, 'javabookies')}/ledgers"
    format_root(uri)
    bookies = start_java_bookies(uri, tmp_path_factory.mktemp("java-bookies"), 3, release)
    try:
        yield release, uri, bookies
    finally:
        for b in bookies:
            b.stop()


async def write(bkc, e, wq, aq, n=N, close=True):
    lh = await bkc.create_ledger(e, wq, aq, digest_type="CRC32C", password=PASSWORD)
    await lh.add_entries([data(i) for i in range(n)])
    if close:
        await lh.close()
    return lh


async def check_reads(rh, n=N):
    assert (await rh.read_entry(0)).data == data(0)
    assert (await rh.read_entry(n - 1)).data == data(n - 1)
    assert [e.data for e in await rh.read_entries(0, n - 1)] == [data(i) for i in range(n)]
    assert [e.data for e in await rh.read_entries(37, 251)] == [data(i) for i in range(37, 252)]
    assert [e.data async for e in rh.read_entries_iter(0)] == [data(i) for i in range(n)]


@pytest.mark.parametrize("protocol", ["v2", "v3"])
def test_create_add_read_close_and_recover(java_cluster, protocol):
    release, uri, bookies = java_cluster

    async def go():
        async with BookKeeper(uri, protocol=protocol) as bkc:
            ids = {b.bookie_id for b in bookies}
            # E == WQ: range reads use BATCH_READ where the bookie has it
            lh = await write(bkc, 3, 3, 2)
            assert set(lh.metadata.segments[0][1]) == ids
            await check_reads(lh)
            async with BookKeeper(uri, protocol=protocol) as reader:
                rh = await reader.open_ledger(lh.ledger_id, PASSWORD)
                assert rh.is_closed and rh.last_add_confirmed == N - 1
                await check_reads(rh)
                refused = {b for b, c in reader.pool.clients().items() if c.batch_reads_refused}
                # 4.15 lacks BATCH_READ: every bookie asked one is read entry by entry from then on
                assert refused == (ids if release == "release-4.15.5" else set()), refused
            # striped (E > WQ): single reads only
            lh2 = await write(bkc, 3, 2, 2)
            await check_reads(lh2)
            # a writer that stops without closing: a second client recovers the ledger
            open_lh = await write(bkc, 3, 3, 2, n=150, close=False)
            async with BookKeeper(uri, protocol=protocol) as other:
                rh = await other.open_ledger(open_lh.ledger_id, PASSWORD, recovery=True)
                assert rh.is_closed and rh.last_add_confirmed == 149
                assert (await other.get_ledger_metadata(open_lh.ledger_id)).state == LedgerState.CLOSED
                assert [e.data for e in await rh.read_entries(0, 149)] == [data(i) for i in range(150)]
            # the fenced writer cannot add any more
            with pytest.raises(Exception):
                await open_lh.add_entry(b"after recovery")
            for ledger_id in (lh.ledger_id, lh2.ledger_id, open_lh.ledger_id):
                await bkc.delete_ledger(ledger_id)

    run_async(go())
