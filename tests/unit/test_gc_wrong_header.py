"""A closed entry log whose header names the wrong ledgers-map offset (the class of
apache/bookkeeper#4607: a wrong entry-log header made GC delete a live log).

The map is not found where the header says (it fails its CRC there), so the log is learnt
by a scan; that scan stops at the header's offset, so when the offset happens to fall on a
record boundary it ends "clean" having seen only the records before it. Such a view is
partial: the log is never deleted whole or compacted on it; the index decides what is live.
Here the header points at the first record of ledger 3: the scan sees ledger 2 only
(deleted), ledgers 3 and 4 lie past it; with compaction ledger 1 (live) lies first, so the
log is not empty by the scan and compaction copies what the scan saw."""
import asyncio
import os

import pytest

from bk import eventloop
from bk.bookie import Bookie
from bk.formats import entrylog as fmt
from bk.testing.corruption import logs_holding
from bk.testing.gc_host import DeletePolicy

from tests.unit.test_gc_damaged_logs import NO_COMPACTION, check, log_id_of, make_config, off_loop, write


def point_header_at(path: str, offset: int) -> None:
    """Rewrite the header's map offset (the map itself stays where it was written)."""
    with open(path, "r+b") as fh:
        header = fmt.decode_header(fh.read(fmt.LOG_HEADER_BYTES))
        assert header.map_offset and header.map_offset != offset
        fh.seek(0)
        fh.write(fmt.encode_header(header.log_id, offset, header.map_count))
        fh.flush()
        os.fsync(fh.fileno())


@pytest.mark.parametrize("compaction", [False, True], ids=["whole-log-deletion", "compaction"])
def test_a_log_whose_header_points_before_its_last_records_keeps_them(tmp_path, compaction):
    """Fails before: the scan up to the header's offset ended clean with ledger 2 only;
    once 2 was deleted the log was deleted whole (or compacted and deleted) with ledgers
    3 and 4 in it, which then answered EIO."""
    cfg = make_config(tmp_path, **({} if compaction else NO_COMPACTION))
    live = [1, 3, 4] if compaction else [3, 4]
    asyncio.run(write(cfg, sorted([2, *live])))
    (path, first_of_3, _), = logs_holding(cfg.ledger_dirs, 3)
    (path2, _, _), = logs_holding(cfg.ledger_dirs, 2)
    assert path2 == path
    point_header_at(path, first_of_3)
    log_id = log_id_of(path)

    async def main():
        async with Bookie(cfg) as b:
            b.gc.policy = DeletePolicy([2])
            out = await off_loop(b.gc.trigger, force_major=compaction)
            assert out["ledgers_deleted"] == [2]
            assert log_id not in out["logs_deleted"]
            if compaction:  # every entry the index placed there was copied first
                assert out["logs_compacted"] == [log_id], out
            else:
                assert os.path.exists(path) and "ledgers map unusable" in b.gc.status()["damaged_logs"][f"{log_id:x}"]
            await check(b, live)
            await off_loop(b.gc.trigger, force_major=compaction)
            await check(b, live)
        async with Bookie(cfg) as b:
            await check(b, live)
    eventloop.run(main())
