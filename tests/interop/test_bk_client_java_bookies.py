"""bk's client against three Apache BookKeeper bookies of 4.17.4 and of 4.15.5, v2 and v3.

4.15 bookies predate BATCH_READ (v2 op code 7): they drop the connection on it. With E == WQ
bk's client reads ranges with BATCH_READ, so the 4.15.5 runs prove that the client notices,
reads those bookies entry by entry, and the read that met the drop still succeeds."""
from __future__ import annotations

import asyncio
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


@pytest.mark.parametrize("protocol", ["v3", "v2"])
def test_tailing_reader_and_explicit_lac_on_java_bookies(java_cluster, protocol):
    """v3: the tail long-polls BookKeeper's bookies (previousLAC, timeOut, ENTRY_PIGGYBACK) and an
    idle writer's WRITE_LAC wakes them (setExplicitLac); v2: it polls READ_LAC. Every entry once,
    in order, the last one before the close; the loop ends after the close."""
    release, uri, bookies = java_cluster

    async def go():
        async with BookKeeper(uri, explicit_lac_interval_ms=20) as wbk, \
                BookKeeper(uri, protocol=protocol) as rbk:
            lh = await wbk.create_ledger(3, 3, 2, digest_type="CRC32C", password=PASSWORD)
            rh = await rbk.open_ledger(lh.ledger_id, PASSWORD, recovery=False)
            got = []
            seen_all = asyncio.Event()

            async def tail():
                async with rh.tail(0) as entries:
                    async for entry in entries:
                        got.append(entry)
                        if entry.entry_id == 59:
                            seen_all.set()
                return entries
            reader = asyncio.ensure_future(tail())
            for i in range(60):
                await lh.add_entry(data(i))
                if i % 10 == 0:
                    await asyncio.sleep(0.01)
            await asyncio.wait_for(seen_all.wait(), 30)  # the idle writer's explicit LAC shows entry 59
            assert lh.explicit_lac.sends >= 1
            await lh.close()
            stats = await asyncio.wait_for(reader, 30)
            assert [(e.entry_id, e.data) for e in got] == [(i, data(i)) for i in range(60)]
            assert (stats.long_polls > 0) == (protocol == "v3") and (stats.polls > 0) == (protocol == "v2")
    run_async(go())
