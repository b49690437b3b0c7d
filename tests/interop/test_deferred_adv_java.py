"""bk's deferred sync + force() and create_ledger_adv against three Apache BookKeeper bookies (4.17.4 and
4.15.5): DEFERRED_SYNC is the v3 AddRequest.writeFlags and FORCE_LEDGER a v3 operation there too,
so a bk client (v2 by default: it sends both on its v3 side connections) must get the same answers."""
from __future__ import annotations

import asyncio
import pathlib
import random
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from interop_support import PASSWORD, RELEASES, format_root, fresh_root, run_async, start_java_bookies  # noqa: E402

from bk.client import BookKeeper  # noqa: E402


def data(i: int) -> bytes:
    return b"deferred-%05d-" % i + bytes([i & 0xFF]) * (50 + i % 500)


@pytest.fixture(scope="module", params=RELEASES)
def java_cluster(request, interop_zk, tmp_path_factory):
    uri = f"zk://{fresh_root(interop_zk, 'javadeferred')}/ledgers"
    format_root(uri)
    bookies = start_java_bookies(uri, tmp_path_factory.mktemp("java-bookies"), 3, request.param)
    try:
        yield uri
    finally:
        for b in bookies:
            b.stop()


def test_deferred_sync_and_force_on_java_bookies(java_cluster):
    async def go():
        async with BookKeeper(java_cluster) as bkc:
            lh = await bkc.create_ledger(3, 3, 2, password=PASSWORD, write_flags={"DEFERRED_SYNC"})
            assert await asyncio.gather(*(lh.add_entry(data(i)) for i in range(300))) == list(range(300))
            assert (lh.last_add_confirmed, lh.last_add_acked) == (-1, 299)
            await lh.force()
            assert lh.last_add_confirmed == 299
            await lh.add_entry(data(300))
            await lh.close()  # forces first
            async with BookKeeper(java_cluster, protocol="v3") as reader:
                rh = await reader.open_ledger(lh.ledger_id, PASSWORD)
                assert rh.is_closed and rh.last_add_confirmed == 300
                assert [e.data for e in await rh.read_entries(0, 300)] == [data(i) for i in range(301)]

    run_async(go())


def test_create_ledger_adv_out_of_order_on_java_bookies(java_cluster):
    order = list(range(200))
    random.Random(5).shuffle(order)

    async def go():
        async with BookKeeper(java_cluster) as bkc:
            lh = await bkc.create_ledger_adv(3, 2, 2, password=PASSWORD)
            ids = await asyncio.gather(*(lh.add_entry(e, data(e)) for e in order))
            assert ids == order and lh.last_add_confirmed == 199
            await lh.close()
            rh = await bkc.open_ledger(lh.ledger_id, PASSWORD)
            assert rh.last_add_confirmed == 199 and rh.length == sum(len(data(e)) for e in range(200))
            assert [e.data for e in await rh.read_entries(0, 199)] == [data(e) for e in range(200)]

    run_async(go())
