"""A real `bk bookie` process driven over v3 by a client written from BookkeeperProtocol.proto's
facts (tests/integration/v3_wire.py, no bk.proto code): every operation, good and bad input,
v2 and v3 connections at once, AUTH with authentication off."""
import asyncio
import os
import struct

import pytest

from bk import eventloop
from bk.proto import AddRequest, FrameDecoder, ReadRequest, encode_request, master_key
from bk.proto.digest import DigestManager
from bk.testing.cluster import LocalCluster

from v3_wire import STATUS, Answer, V3Client, add_body, availability, decode, encode, one, read_body, request, signed

pytestmark = pytest.mark.integration

KEY = master_key(b"pw")


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("v3")), bookies=1, zk_connect=f"{zk_server}/v3-{os.getpid()}")
    c.start()
    yield c
    c.stop()


def port_of(cluster):
    return int(cluster.bookie_ids[0].rsplit(":", 1)[1])


def entry(ledger_id, entry_id, payload=b"data", lac=None):
    lac = entry_id - 1 if lac is None else lac
    return DigestManager(ledger_id, "CRC32C", b"pw").frame_entry(entry_id, lac, len(payload), payload)


def run(coro):
    return eventloop.run(coro)


def test_add_and_read(cluster):
    async def main():
        async with V3Client(port_of(cluster)) as c:
            for e in range(5):
                a = await c.call("ADD_ENTRY", add_body(100, e, KEY, entry(100, e, b"v3-%d" % e)))
                assert a.status == STATUS["EOK"] and a.field(1) == STATUS["EOK"]
                assert (a.field(2), a.field(3)) == (100, e)
            a = await c.call("READ_ENTRY", read_body(100, 3))
            assert a.status == 0 and a.field(4) == entry(100, 3, b"v3-3") and (a.field(2), a.field(3)) == (100, 3)
            a = await c.call("READ_ENTRY", read_body(100, -1))  # the last entry, answered under entry -1
            assert a.status == 0 and a.field(4) == entry(100, 4, b"v3-4") and signed(a.field(3)) == -1
            assert (await c.call("READ_ENTRY", read_body(100, 77))).status == STATUS["ENOENTRY"]
            a = await c.call("READ_ENTRY", read_body(999, 0))
            assert a.status == STATUS["ENOLEDGER"] and a.field(1) == STATUS["ENOLEDGER"]
    run(main())


def test_many_adds_in_one_write_are_answered_by_txn_id(cluster):
    async def main():
        async with V3Client(port_of(cluster)) as c:
            frames = [request("ADD_ENTRY", 1000 + e, add_body(101, e, KEY, entry(101, e))) for e in range(200)]
            c.send(b"".join(frames))
            answers = await c.answers(200)
            assert sorted(a.txn_id for a in answers) == list(range(1000, 1200))
            assert all(a.status == 0 and a.field(3) == a.txn_id - 1000 for a in answers)
    run(main())


def test_fencing_read_and_recovery_add(cluster):
    async def main():
        async with V3Client(port_of(cluster)) as c:
            assert (await c.call("ADD_ENTRY", add_body(102, 0, KEY, entry(102, 0)))).status == 0
            a = await c.call("READ_ENTRY", read_body(102, -1, fence_key=master_key(b"wrong")))
            assert a.status == STATUS["EUA"]
            a = await c.call("READ_ENTRY", read_body(102, -1, fence_key=KEY))
            assert a.status == 0 and a.field(4) == entry(102, 0)
            a = await c.call("ADD_ENTRY", add_body(102, 1, KEY, entry(102, 1)))
            assert a.status == STATUS["EFENCED"] and a.field(1) == STATUS["EFENCED"]
            a = await c.call("ADD_ENTRY", add_body(102, 1, KEY, entry(102, 1), recovery=True))
            assert a.status == 0
            # a fencing read without its key is a bad request
            a = await c.call("READ_ENTRY", [(1, 102), (2, 0), (100, 1)])
            assert a.status == STATUS["EBADREQ"]
    run(main())


def test_write_lac_and_read_lac(cluster):
    async def main():
        dm = DigestManager(103, "CRC32C", b"pw")
        async with V3Client(port_of(cluster)) as c:
            assert (await c.call("READ_LAC", [(1, 103)])).status == STATUS["ENOLEDGER"]
            for e in range(3):
                assert (await c.call("ADD_ENTRY", add_body(103, e, KEY, entry(103, e)))).status == 0
            lac_buf = dm.frame_lac(1)
            a = await c.call("WRITE_LAC", [(1, 103), (2, 1), (3, KEY), (4, lac_buf)])
            assert a.status == 0 and (a.field(1), a.field(2)) == (0, 103)
            a = await c.call("READ_LAC", [(1, 103)])
            assert a.status == 0 and a.field(3) == lac_buf and a.field(4) == entry(103, 2)
            # a LAC buffer for another lac, and a wrong key
            assert (await c.call("WRITE_LAC", [(1, 103), (2, 2), (3, KEY), (4, lac_buf)])).status == STATUS["EBADREQ"]
            a = await c.call("WRITE_LAC", [(1, 103), (2, 1), (3, master_key(b"x")), (4, lac_buf)])
            assert a.status == STATUS["EUA"]
    run(main())


def test_bookie_info_force_ledger_and_list_of_entries(cluster):
    async def main():
        async with V3Client(port_of(cluster)) as c:
            a = await c.call("GET_BOOKIE_INFO", [(1, 0x01)])  # TOTAL_DISK_CAPACITY
            assert a.status == 0 and a.field(2) > 0 and a.field(3, 0) == 0
            a = await c.call("GET_BOOKIE_INFO", [(1, 0x03)])
            assert a.field(2) >= a.field(3) > 0
            a = await c.call("FORCE_LEDGER", [(1, 104)])
            assert a.status == 0 and a.field(2) == 104
            for e in (0, 1, 2, 5, 6, 9):
                assert (await c.call("ADD_ENTRY", add_body(104, e, KEY, entry(104, e)))).status == 0
            a = await c.call("GET_LIST_OF_ENTRIES_OF_LEDGER", [(1, 104)])
            assert a.status == 0 and a.field(2) == 104 and availability(a.field(3)) == [0, 1, 2, 5, 6, 9]
            a = await c.call("GET_LIST_OF_ENTRIES_OF_LEDGER", [(1, 10404)])
            assert a.status == STATUS["ENOLEDGER"]
    run(main())


def test_auth_and_start_tls_with_both_off(cluster):
    async def main():
        async with V3Client(port_of(cluster)) as c:
            a = await c.call("AUTH", [(1, "SomePlugin"), (2, b"token")])
            assert a.status == 0 and a.field(1) == b"AuthDisabledPlugin" and a.field(2) == b""
            assert (await c.call("START_TLS", [])).status == STATUS["EBADREQ"]
            assert (await c.call("ADD_ENTRY", add_body(105, 0, KEY, entry(105, 0)))).status == 0
        # v2 AUTH: header(version 2, op 3) + AuthMessage; answered in v2 with the same message shape
        async with V3Client(port_of(cluster)) as c:
            msg = encode([(1, "SomePlugin"), (2, b"token")])
            c.send(struct.pack(">iI", 4 + len(msg), (2 << 24) | (3 << 16)) + msg)
            raw = await c.frame()
            assert struct.unpack_from(">I", raw)[0] == (2 << 24) | (3 << 16)
            answer = decode(raw[4:])
            assert one(answer, 1) == b"AuthDisabledPlugin" and one(answer, 2) == b""
    run(main())


def test_bad_requests_are_ebadreq_and_the_connection_lives(cluster):
    async def main():
        async with V3Client(port_of(cluster)) as c:
            assert (await c.call("RANGE_READ_ENTRY", None)).status == STATUS["EBADREQ"]  # unsupported op
            assert (await c.call("ADD_ENTRY", None)).status == STATUS["EBADREQ"]  # no addRequest
            a = await c.call("ADD_ENTRY", add_body(106, -2, KEY, entry(106, 0)))
            assert a.status == STATUS["EBADREQ"] and signed(a.field(3)) == -2
            assert (await c.call("ADD_ENTRY", add_body(106, 0, b"short", entry(106, 0)))).status == STATUS["EBADREQ"]
            # the body names another entry than the request
            assert (await c.call("ADD_ENTRY", add_body(106, 1, KEY, entry(106, 0)))).status == STATUS["EBADREQ"]
            assert (await c.call("READ_ENTRY", read_body(106, -5))).status == STATUS["EBADREQ"]
            assert (await c.call("READ_LAC", [(1, -1)])).status == STATUS["EBADREQ"]
            a = await c.call("ADD_ENTRY", add_body(106, 0, KEY, entry(106, 0)))
            assert a.status == 0
    run(main())


def test_a_v2_frame_after_v3_frames_switches_the_connection_to_v2(cluster):
    # BookKeeper's rule: a connection is tried as v3 until a frame does not parse, then v2 for good
    async def main():
        async with V3Client(port_of(cluster)) as c:
            assert (await c.call("ADD_ENTRY", add_body(107, 0, KEY, entry(107, 0)))).status == 0
            c.send(encode_request(AddRequest(0, KEY, 107, 1, entry(107, 1))))
            (r,) = FrameDecoder().feed_responses(struct.pack(">i", 24) + await c.frame())
            assert (r.rc, r.ledger_id, r.entry_id) == (0, 107, 1)
            c.send(encode_request(ReadRequest(0, 107, 0)))
            raw = await c.frame()
            assert struct.unpack_from(">Ii", raw) == ((2 << 24) | (2 << 16), 0)
    run(main())


def test_v2_and_v3_connections_at_once(cluster):
    async def main():
        port = port_of(cluster)
        async with V3Client(port) as v3c, V3Client(port) as v2c:
            # interleave: v3 writes even entries of ledger 108, v2 odd ones, both read the other's
            for e in range(0, 40, 2):
                v3c.send(request("ADD_ENTRY", e, add_body(108, e, KEY, entry(108, e))))
                v2c.send(encode_request(AddRequest(0, KEY, 108, e + 1, entry(108, e + 1))))
            v3_answers = await v3c.answers(20)
            v2_raw = [await v2c.frame() for _ in range(20)]
            assert {a.field(3) for a in v3_answers if a.status == 0} == set(range(0, 40, 2))
            assert {struct.unpack_from(">Iiqq", r)[3] for r in v2_raw
                    if struct.unpack_from(">Iiqq", r)[1] == 0} == set(range(1, 40, 2))
            a = await v3c.call("READ_ENTRY", read_body(108, 39))
            assert a.status == 0 and a.field(4) == entry(108, 39)
            v2c.send(encode_request(ReadRequest(0, 108, 38)))
            raw = await v2c.frame()
            assert raw[24:] == entry(108, 38)
    run(main())


def test_long_poll_read_waits_for_the_lac(cluster):
    async def main():
        port = port_of(cluster)
        async with V3Client(port) as c, V3Client(port) as writer:
            for e in range(2):
                assert (await c.call("ADD_ENTRY", add_body(109, e, KEY, entry(109, e)))).status == 0
            # LAC known to the bookie is 0 (entry 1 piggybacks lac 0); wait for more than 0
            txn = c.next_txn()
            c.send(request("READ_ENTRY", txn, read_body(109, -1, previous_lac=0, timeout_ms=5000, piggyback=True)))
            await asyncio.sleep(0.2)
            assert (await writer.call("ADD_ENTRY", add_body(109, 2, KEY, entry(109, 2)))).status == 0
            (a,) = await c.answers()
            assert a.txn_id == txn and a.status == 0 and signed(a.field(5)) == 1  # maxLAC
            assert a.field(3) == 1 and a.field(4) == entry(109, 1)  # piggybacked entry previousLAC + 1
            # nothing newer: answered at the timeout with the known LAC and no body
            a = await c.call("READ_ENTRY", read_body(109, -1, previous_lac=1, timeout_ms=200, piggyback=True))
            assert a.status == 0 and signed(a.field(5)) == 1 and a.field(4) is None
    run(main())


def test_garbage_that_is_neither_v3_nor_v2_keeps_the_bookie_serving(cluster):
    async def main():
        port = port_of(cluster)
        async with V3Client(port) as c:
            c.send(struct.pack(">i", 6) + b"\x0a\x04\x08\x03\x10\x02")  # a header without txnId
            raw = await c.frame()  # not v3 (required field missing): judged as v2 -> v2 error answer
            assert struct.unpack_from(">i", raw, 4)[0] in (100, 103)
        async with V3Client(port) as c:
            assert (await c.call("ADD_ENTRY", add_body(110, 0, KEY, entry(110, 0)))).status == 0
    run(main())


def test_answer_decoder_is_the_protos(cluster):
    # the independent decoder reads bk's answer exactly: unknown fields would show here
    async def main():
        async with V3Client(port_of(cluster)) as c:
            a = await c.call("ADD_ENTRY", add_body(111, 0, KEY, entry(111, 0)))
            assert set(decode(a.raw)) == {1, 2, 101} and set(a.body) == {1, 2, 3}
            assert isinstance(a, Answer)
    run(main())


# ---------------------------------------------------------------- bk's own client over v3
def test_bk_client_speaks_v3(cluster):
    from bk.client import BookKeeper

    async def main():
        async with BookKeeper(cluster.metadata_uri, protocol="v3") as bk:
            lh = await bk.create_ledger(1, 1, 1, password=b"pw")
            for i in range(50):
                assert await lh.add_entry(b"entry-%d" % i) == i
            assert await lh.read_last_add_confirmed() == 49
            await lh.close()
            async with await bk.open_ledger(lh.ledger_id, b"pw") as rh:
                entries = await rh.read_entries(0, 49)  # BATCH_READ is v2-only: a side connection
                assert [e.data for e in entries] == [b"entry-%d" % i for i in range(50)]
            client = bk.pool.get(cluster.bookie_ids[0])
            assert client._core.protocol.v3
            info = await client.call(client.send_bookie_info, 3)
            assert info.rc == 0 and info.total_disk_bytes >= info.free_disk_bytes > 0
    run(main())


def test_bk_client_in_v2_sends_the_v3_only_operations_in_v3(cluster):
    from bk.client import BookKeeper

    async def main():
        async with BookKeeper(cluster.metadata_uri) as bk:
            lh = await bk.create_ledger(1, 1, 1, password=b"pw")
            await lh.add_entry(b"x")
            client = bk.pool.get(cluster.bookie_ids[0])
            info = await client.call(client.send_bookie_info, 3)
            lac = await client.call(client.send_read_lac, lh.ledger_id)
            assert info.rc == 0 and lac.rc == 0 and lac.last_entry is not None
            assert not client._core.protocol.v3 and client._side_client._core.protocol.v3
    run(main())


def test_long_ledger_ids_end_to_end(cluster):
    """After the short id counter overflowed (idgen-long exists, as BookKeeper creates it) a
    ledger gets a 63-bit id; bookies, metadata and reads all carry it."""
    from bk.client import BookKeeper
    from bk.meta.store import join_path

    async def main():
        async with BookKeeper(cluster.metadata_uri, protocol="v3") as bk:
            try:
                await bk.store.create(join_path(bk.ledger_manager.root, "idgen-long"), b"")
                lh = await bk.create_ledger(1, 1, 1, password=b"pw")
                assert lh.ledger_id >= 1 << 32
                for i in range(3):
                    await lh.add_entry(b"long-%d" % i)
                await lh.close()
                assert lh.ledger_id in await bk.list_ledgers()
                async with await bk.open_ledger(lh.ledger_id, b"pw") as rh:
                    assert [e.data for e in await rh.read_entries(0, 2)] == [b"long-%d" % i for i in range(3)]
            finally:
                from bk.errors import MetadataNotEmptyError, MetadataNotFoundError
                try:  # other tests of this module create short ids
                    for hob in await bk.store.children(join_path(bk.ledger_manager.root, "idgen-long")):
                        await bk.store.delete(join_path(bk.ledger_manager.root, "idgen-long", hob))
                    await bk.store.delete(join_path(bk.ledger_manager.root, "idgen-long"))
                except (MetadataNotEmptyError, MetadataNotFoundError):
                    pass
    run(main())
