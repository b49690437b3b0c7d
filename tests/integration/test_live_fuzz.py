"""A real `bk bookie` process (real ZooKeeper) under the live fuzzer (fuzz/live.py): 20,000
malformed frames over many connections, then the good client's ledger reads back byte for
byte from a bookie that is still up. The full-size run (1,000,000 frames, RSS checked) is
`python -m fuzz live`, with its figures in docs/FUZZING.md. Also the bookie bugs the live
fuzzer found, replayed from their saved inputs in fuzz/regressions/live/."""
import asyncio
import os
import struct

import pytest

import fuzz
from bk import eventloop
from bk.proto import FrameDecoder, ReadRequest, StatusCode, decode_response, encode_request, v3
from bk.testing.cluster import LocalCluster
from bk.formats.wire import OP_READ_LAC, PROTOCOL_VERSION, pack_header
from fuzz.live import fuzz_bookie

READ_LAC_HEADER = pack_header(PROTOCOL_VERSION, OP_READ_LAC)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("live-fuzz")), bookies=1,
                     zk_connect=f"{zk_server}/live-fuzz-{os.getpid()}")
    c.start()
    yield c
    c.stop()


def port_of(cluster):
    return int(cluster.bookie_ids[0].rsplit(":", 1)[1])


def saved(name: str) -> bytes:
    with open(os.path.join(fuzz.REGRESSIONS_DIR, "live", name), "rb") as f:
        return f.read()


async def exchange(port: int, data: bytes, answers: int, timeout_s: float = 20) -> list:
    """Send `data`, return the first `answers` frame bodies (fewer if the bookie closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    dec, out = FrameDecoder(), []
    try:
        writer.write(data)
        while len(out) < answers:
            chunk = await asyncio.wait_for(reader.read(65536), timeout_s)
            if not chunk:
                break
            out += [bytes(f) for f in dec.feed(chunk)]
    finally:
        writer.close()
    return out


def test_list_entries_after_add_at_2pow62(cluster):
    """GET_LIST_OF_ENTRIES_OF_LEDGER walked range(0, last + 1): after one add at entry 2**62 a
    worker thread looped (and grew a list) for ever. It lists what is stored."""
    async def main():
        bodies = await exchange(port_of(cluster), saved("list-entries-after-add-at-2pow62"), 2)
        assert len(bodies) == 2
        by_txn = {r.header.txnId: r for r in (v3.parse(v3.Response, b) for b in bodies)}  # answers may cross
        add, listing = by_txn[1], by_txn[2]
        assert add.addResponse.status == 0
        assert listing.getListOfEntriesOfLedgerResponse.status == 0
        ids = v3.decode_entries_availability(listing.getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger)
        assert ids == [1 << 62]
    eventloop.run(main())


def test_add_after_malformed_auth_is_not_run(cluster):
    """A malformed AUTH closes its connection; the ADD that came in the same read used to be
    stored all the same (and every further bad frame of the read logged its own warning)."""
    async def main():
        port = port_of(cluster)
        assert await exchange(port, saved("add-after-malformed-auth"), 1) == []  # closed, no answer
        (body,) = await exchange(port, encode_request(ReadRequest(0, 9002, 0)), 1)
        assert decode_response(body).rc == StatusCode.ENOLEDGER
    eventloop.run(main())


def test_live_fuzz_20000_frames(cluster):
    result = fuzz_bookie(cluster, frames=20000, concurrency=8, seed=3, settle_s=2.0, warmup_frames=0, entries=50)
    print(result)
    assert result["frames"] >= 20000 and result["connections"] > 10
    assert result["bookie_alive"], result.get("bookie_log_tail")
    assert result["read_back_equal"], result.get("bookie_log_tail")


def test_a_large_read_of_bad_frames_is_answered_in_order(cluster):
    """The connection decodes a large read in slices (bounded memory): frames that straddle a
    slice boundary are still decoded, and every error answer leaves in order."""
    async def main():
        n = 30000
        # READ_LAC of 13 bytes (one too many): EBADREQ naming the ledger it could read
        frames = b"".join(struct.pack(">iIqB", 13, READ_LAC_HEADER, lid, 0) for lid in range(n))
        bodies = await exchange(port_of(cluster), frames, n, timeout_s=60)
        answers = [decode_response(b) for b in bodies]
        assert [(a.rc, a.ledger_id) for a in answers] == [(StatusCode.EBADREQ, lid) for lid in range(n)]
    eventloop.run(main())
