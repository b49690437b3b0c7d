"""EntryLogger after restarts and crashes: reopen, unclosed logs, torn tails, scan, map fallback."""
import os
import random
import struct

import pytest

from bk._native import load
from bk.config import load_config
from bk.entrylog import SCAN_BAD_SIZE, SCAN_CLEAN, SCAN_TRUNCATED, EntryLogger, LogScan
from bk.formats import entrylog as fmt

KiB = 1024


def cfg(**kw):
    kw.setdefault("entry_log_size_limit_bytes", 64 * KiB)
    return load_config(env={}, overrides=kw)


def entry(ledger_id, entry_id, payload_len):
    rng = random.Random(ledger_id * 7919 + entry_id)
    return struct.pack(">qq", ledger_id, entry_id) + rng.randbytes(payload_len)


def crash(el: EntryLogger) -> None:
    """Drop the logger the way a kill -9 would: no ledgers map, fds just closed."""
    el._files.close()
    if el._current is not None:
        el._current.close()


def usage_of(entries):
    out = {}
    for e in entries:
        lid = struct.unpack(">q", e[:8])[0]
        out[lid] = out.get(lid, 0) + len(e) + 4
    return out


def test_restart_reopens_and_reads_old_logs(tmp_path):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    el = EntryLogger(dirs, cfg())
    written = []
    for i in range(60):
        e = entry(i % 4, i // 4, 5000)
        [loc] = el.add_entries([e])
        written.append((e, loc))
    ids = el.log_ids()
    maps = {log_id: el.ledgers_map(log_id) for log_id in ids}
    el.close()
    el2 = EntryLogger(dirs, cfg())
    assert el2.log_ids() == ids + [ids[-1] + 1]
    assert el2.current_log_id == ids[-1] + 1
    for e, loc in written:
        lid, eid = struct.unpack(">qq", e[:16])
        assert el2.read_entry(lid, eid, loc) == e
    for log_id in ids:  # closed logs answer from their stored maps
        assert el2._log_info(log_id).map_offset > 0
        assert el2.ledgers_map(log_id) == maps[log_id]
    assert sum(sum(m.values()) for m in maps.values()) == sum(len(e) + 4 for e, _ in written)
    el2.close()


def test_unclosed_log_is_not_appended_after_restart(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    es = [entry(3, i, 300) for i in range(10)]
    locs = el.add_entries(es)
    el.flush()
    last = el.current_log_id
    path = el.log_path(last)
    crash(el)
    size = os.path.getsize(path)
    el2 = EntryLogger([str(tmp_path)], cfg())
    assert el2.current_log_id == last + 1
    more = el2.add_entries([entry(3, 10, 300)])
    el2.flush()
    assert fmt.split_location(more[0])[0] == last + 1
    assert os.path.getsize(path) == size  # untouched
    assert fmt.decode_header(open(path, "rb").read(fmt.LOG_HEADER_BYTES)).map_offset == 0
    for i, loc in enumerate(locs):
        assert el2.read_entry(3, i, loc) == es[i]
    assert el2.ledgers_map(last) == usage_of(es)  # no stored map: scanned
    scan = el2.scan(last)
    assert [r[:2] for r in scan] == [(3, i) for i in range(10)]
    assert scan.status == SCAN_CLEAN and scan.stop_offset == size
    el2.close()


@pytest.mark.parametrize("cut", [1, 4, 10, 20, 303])
def test_torn_last_record_in_unclosed_log(tmp_path, cut):
    el = EntryLogger([str(tmp_path)], cfg())
    es = [entry(6, i, 300) for i in range(8)]
    locs = el.add_entries(es)
    el.flush()
    log_id, path = el.current_log_id, el.log_path(el.current_log_id)
    crash(el)
    os.truncate(path, os.path.getsize(path) - cut)  # the last record lost its tail
    el2 = EntryLogger([str(tmp_path)], cfg())
    scan = el2.scan(log_id)
    recs = list(scan)
    assert [r[1] for r in recs] == list(range(7))
    assert [r[2] for r in recs] == locs[:7]
    assert scan.status == SCAN_TRUNCATED and scan.stop_offset == fmt.split_location(locs[7])[1]
    assert el2.ledgers_map(log_id) == usage_of(es[:7])
    assert el2.read_entry(6, 6, locs[6]) == es[6]
    with pytest.raises(Exception) as ei:
        el2.read_entry(6, 7, locs[7])
    assert type(ei.value).__name__ == "CorruptedStorageError"
    el2.close()


def test_garbage_after_records_stops_scan_with_bad_size(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    es = [entry(2, i, 100) for i in range(4)]
    el.add_entries(es)
    el.flush()
    log_id, path = el.current_log_id, el.log_path(el.current_log_id)
    crash(el)
    end = os.path.getsize(path)
    with open(path, "ab") as fh:
        fh.write(bytes(4096))  # e.g. a preallocated / zero-filled tail after a crash
    el2 = EntryLogger([str(tmp_path)], cfg())
    scan = el2.scan(log_id)
    assert len(list(scan)) == 4
    assert (scan.status, scan.stop_offset) == (SCAN_BAD_SIZE, end)
    el2.close()


def test_header_torn_by_crash(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    log_id, path = el.current_log_id, el.log_path(el.current_log_id)
    crash(el)
    os.truncate(path, 100)
    el2 = EntryLogger([str(tmp_path)], cfg())
    assert el2.current_log_id == log_id + 1
    scan = el2.scan(log_id)
    assert list(scan) == [] and scan.status == SCAN_TRUNCATED
    assert el2.ledgers_map(log_id) == {}
    el2.close()


def test_bad_ledgers_map_crc_falls_back_to_scan(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    es = [entry(lid, i, 1000) for i in range(5) for lid in (1, 2, 3)]
    el.add_entries(es)
    log_id = el.current_log_id
    el.close()
    path = el.log_path(log_id)
    hdr = fmt.decode_header(open(path, "rb").read(fmt.LOG_HEADER_BYTES))
    assert hdr.map_count == 3
    with open(path, "r+b") as fh:
        fh.seek(hdr.map_offset + 5)
        b = fh.read(1)
        fh.seek(hdr.map_offset + 5)
        fh.write(bytes([b[0] ^ 0xFF]))
    el2 = EntryLogger([str(tmp_path)], cfg())
    assert el2.ledgers_map(log_id) == usage_of(es)
    # a map cut off by a crash (header updated, map bytes lost) falls back the same way
    os.truncate(path, hdr.map_offset + 10)
    assert el2.ledgers_map(log_id) == usage_of(es)
    el2.close()


@pytest.mark.parametrize("chunk", [64, 100, 333, 1000, 4096])
def test_scan_across_chunk_boundaries(tmp_path, chunk):
    el = EntryLogger([str(tmp_path)], cfg(entry_log_size_limit_bytes=1024 * KiB))
    rng = random.Random(chunk)
    es = [entry(rng.randrange(1, 50), i, rng.choice([0, 10, 90, 500, 5000])) for i in range(150)]
    locs = el.add_entries(es)
    log_id = el.current_log_id
    el.close()
    path = el.log_path(log_id)
    end = fmt.decode_header(open(path, "rb").read(fmt.LOG_HEADER_BYTES)).map_offset
    scan = LogScan(load("entrylog"), path, log_id, end, 1 << 20, chunk_bytes=chunk)
    got = list(scan)
    assert scan.status == SCAN_CLEAN and scan.stop_offset == end
    assert got == [(*struct.unpack(">qq", e[:16]), loc, len(e)) for e, loc in zip(es, locs)]
    assert list(EntryLogger([str(tmp_path)], cfg()).scan(log_id)) == got  # default 4 MiB chunks


def test_scan_torn_tail_with_small_chunks(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    es = [entry(1, i, 700) for i in range(20)]
    locs = el.add_entries(es)
    el.flush()
    log_id, path = el.current_log_id, el.log_path(el.current_log_id)
    crash(el)
    os.truncate(path, os.path.getsize(path) - 100)
    scan = LogScan(load("entrylog"), path, log_id, os.path.getsize(path), 1 << 20, chunk_bytes=256)
    assert [r[2] for r in scan] == locs[:19]
    assert scan.status == SCAN_TRUNCATED and scan.stop_offset == fmt.split_location(locs[19])[1]
    # a scan bounded beyond the file (size changed under it) also reports the torn tail
    scan = LogScan(load("entrylog"), path, log_id, os.path.getsize(path) + 5000, 1 << 20, chunk_bytes=256)
    assert len(list(scan)) == 19 and scan.status == SCAN_TRUNCATED


def test_many_restarts_keep_every_entry(tmp_path):
    written = []
    for round_ in range(5):
        el = EntryLogger([str(tmp_path)], cfg())
        for e, loc in written:
            assert el.read_entry(*struct.unpack(">qq", e[:16]), loc) == e
        es = [entry(round_, i, 2000) for i in range(40)]
        written += zip(es, el.add_entries(es))
        el.flush()
        if round_ % 2:
            el.close()
        else:
            crash(el)
    el = EntryLogger([str(tmp_path)], cfg())
    total = sum(sum(el.ledgers_map(log_id).values()) for log_id in el.log_ids())
    assert total == sum(len(e) + 4 for e, _ in written)
    el.close()
