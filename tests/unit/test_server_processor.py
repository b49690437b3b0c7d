"""RequestProcessor against a stand-in bookie: response sizes and flag bits, no sockets."""
import asyncio

import pytest

from bk.config import load_config
from bk.proto import BatchReadRequest, FrameDecoder, GetBookieInfoRequest, encode_response
from bk.formats.wire import BOOKIE_INFO_FREE_DISK_SPACE, BOOKIE_INFO_TOTAL_DISK_CAPACITY
from bk.errors import NoSuchEntryError
from bk.server.processor import RequestProcessor

MAX_FRAME = 1024


class _Bookie:
    def __init__(self, entries):
        self.entries = entries

    async def read_entry(self, ledger_id, entry_id):
        if entry_id >= len(self.entries):
            raise NoSuchEntryError(ledger_id=ledger_id, entry_id=entry_id)
        return self.entries[entry_id]


def _processor(entries, tmp_path=None):
    cfg = load_config(env={}, overrides={"max_frame_size_bytes": MAX_FRAME, "ledger_dirs": [str(tmp_path or "/")]})
    return RequestProcessor(_Bookie(entries), cfg)


def test_full_batch_read_response_fits_the_frame_limit():
    # 24-byte fixed part + (4 + 96) * 10 = 1024: an answer sized with 24 instead of the
    # response header's 32 bytes overran a max_frame_size_bytes of 1024 by 8 bytes.
    entries = [bytes([i]) * 96 for i in range(20)]
    proc = _processor(entries)
    req = BatchReadRequest(0, 7, 0, 1, 100, 0)
    resp = asyncio.run(proc.operations._batch_read_entries(req))
    frame = encode_response(resp)
    assert len(frame) - 4 <= MAX_FRAME
    assert len(resp.entries) == 9  # 32 + 9 * 100 = 932; a tenth would make 1032
    # the client's decoder (same limit) takes it
    (decoded,) = FrameDecoder(MAX_FRAME).feed_responses(frame)
    assert decoded.entries == entries[:9]


def test_batch_read_max_size_counts_the_whole_response():
    entries = [b"x" * 96] * 5
    resp = asyncio.run(_processor(entries).operations._batch_read_entries(BatchReadRequest(0, 7, 0, 1, 100, 232)))
    assert len(encode_response(resp)) - 4 <= 232 and len(resp.entries) == 2


def test_bookie_info_bits_follow_bookkeeper(tmp_path):
    proc = _processor([], tmp_path)
    total_only = asyncio.run(proc.operations.bookie_info(GetBookieInfoRequest(0, BOOKIE_INFO_TOTAL_DISK_CAPACITY)))
    free_only = asyncio.run(proc.operations.bookie_info(GetBookieInfoRequest(0, BOOKIE_INFO_FREE_DISK_SPACE)))
    assert total_only.total_disk_bytes > 0 and total_only.free_disk_bytes == 0
    assert free_only.free_disk_bytes > 0 and free_only.total_disk_bytes == 0


def test_batch_read_stops_before_a_damaged_entry_and_a_damaged_first_entry_is_eio():
    """A damaged entry mid-batch: the good prefix is served (the reader asks again from
    the damaged one and reads it elsewhere); a damaged first entry answers EIO, never an
    explicit negative (docs/DISK-FAULTS.md)."""
    from bk.errors import CorruptedStorageError
    from bk.proto import StatusCode

    class Damaged(_Bookie):
        async def read_entry(self, ledger_id, entry_id):
            if entry_id == 3:
                raise CorruptedStorageError("record holds another entry", ledger_id=ledger_id, entry_id=3)
            return await super().read_entry(ledger_id, entry_id)

    entries = [bytes([i]) * 10 for i in range(6)]
    cfg = load_config(env={}, overrides={"max_frame_size_bytes": MAX_FRAME, "ledger_dirs": ["/"]})
    proc = RequestProcessor(Damaged(entries), cfg)
    resp = asyncio.run(proc.operations._batch_read_entries(BatchReadRequest(0, 7, 0, 1, 10, 0)))
    assert resp.rc == 0 and resp.entries == entries[:3]
    with pytest.raises(CorruptedStorageError) as ei:
        asyncio.run(proc.operations._batch_read_entries(BatchReadRequest(0, 7, 3, 1, 10, 0)))
    assert ei.value.code == StatusCode.EIO  # what _run answers for it
