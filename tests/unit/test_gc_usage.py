"""The per-entry-log usage format (bk.entrylog.usage): round trip, and a missing or
corrupt ledgers map rebuilt by a scan; the module is pure (no native kernels)."""
import os
import subprocess
import sys

import pytest

from bk.config import load_config
from bk.entrylog import EntryLogger
from bk.formats import entrylog as fmt
from bk.entrylog.usage import (EntryLogMetadata, ScanReport, list_entry_logs, read_ledgers_map, read_log_metadata,
                               scan_records)


def entry(lid, eid, size):
    return lid.to_bytes(8, "big") + eid.to_bytes(8, "big") + bytes([eid % 251]) * size


def write_logs(tmp_path, close=True, sizes=(100, 3000, 20)):
    cfg = load_config(overrides=dict(ledger_dirs=[str(tmp_path / "ledgers")], entry_log_size_limit_bytes="64KiB"),
                      env={})
    el = EntryLogger(cfg.ledger_dirs, cfg)
    expected: dict[int, dict[int, int]] = {}
    for eid in range(60):
        batch = [entry(lid, eid, sizes[lid % len(sizes)]) for lid in (1, 2, 3)]
        locs = el.add_entries(batch)
        for e, loc in zip(batch, locs):
            log_id = loc >> 32
            lid = int.from_bytes(e[:8], "big")
            per = expected.setdefault(log_id, {})
            per[lid] = per.get(lid, 0) + len(e) + 4
    el.flush()
    if close:
        el.close()
    return el, expected


def test_round_trip_from_ledgers_maps(tmp_path):
    el, expected = write_logs(tmp_path)
    logs = list_entry_logs(str(tmp_path / "ledgers"))
    assert [log_id for log_id, _ in logs] == sorted(expected)
    assert len(logs) > 2
    for log_id, path in logs:
        meta = read_log_metadata(path)
        assert meta.source == "map" and meta.log_id == log_id
        assert meta.ledgers == expected[log_id]
        assert meta.total_bytes == sum(expected[log_id].values()) and meta.usage == 1.0
        again = EntryLogMetadata.from_dict(meta.to_dict())
        assert again == meta
    # deleting a ledger lowers live bytes and usage, not the total
    meta = read_log_metadata(logs[0][1])
    freed = meta.remove_ledger(2)
    assert freed == expected[logs[0][0]][2]
    assert meta.live_bytes == meta.total_bytes - freed and meta.usage < 1.0
    assert meta.to_dict()["live_bytes"] == meta.live_bytes
    meta.remove_ledgers_if(lambda lid: True)
    assert meta.is_empty() and meta.live_bytes == 0


def test_corrupt_map_is_rebuilt_by_scan(tmp_path):
    _, expected = write_logs(tmp_path)
    log_id, path = list_entry_logs(str(tmp_path / "ledgers"))[0]
    with open(path, "r+b") as fh:
        header = fmt.decode_header(fh.read(fmt.LOG_HEADER_BYTES))
        fh.seek(header.map_offset + 3)
        b = fh.read(1)
        fh.seek(header.map_offset + 3)
        fh.write(bytes([b[0] ^ 0x40]))
    assert read_ledgers_map(path) is None
    meta = read_log_metadata(path)
    assert meta.source == "scan" and meta.ledgers == expected[log_id]


def test_missing_map_and_torn_tail_are_scanned(tmp_path):
    el, expected = write_logs(tmp_path, close=False)  # the current log has no map yet
    cur = el.current_log_id
    path = el.log_path(cur)
    el.flush()
    with open(path, "ab") as fh:  # a torn record: its size says more than is there
        fh.write((5000).to_bytes(4, "big") + entry(9, 9, 10))
    report = ScanReport()
    meta = read_log_metadata(path, report)
    assert meta.source == "scan" and meta.ledgers == expected[cur]
    assert not report.clean and report.reason == "torn tail"
    # a garbage size field (below the smallest entry)
    with open(path, "r+b") as fh:
        fh.truncate(report.stop_offset)
        fh.seek(report.stop_offset)
        fh.write(b"\x00\x00\x00\x03" + bytes(40))
    report = ScanReport()
    assert read_log_metadata(path, report).ledgers == expected[cur]
    assert not report.clean and report.reason.startswith("bad size")
    el.close()


def test_pure_scan_agrees_with_the_kernel_scan(tmp_path):
    el, _ = write_logs(tmp_path, sizes=(40000, 17, 900))
    el2 = EntryLogger([str(tmp_path / "ledgers")], load_config(
        overrides=dict(ledger_dirs=[str(tmp_path / "ledgers")]), env={}))
    try:
        for log_id, path in list_entry_logs(str(tmp_path / "ledgers")):
            if log_id == el2.current_log_id:
                continue
            kernel = [(lid, eid, loc & 0xFFFFFFFF, size) for lid, eid, loc, size in el2.scan(log_id)]
            report = ScanReport()
            assert list(scan_records(path, report=report)) == kernel
            assert report.clean and report.records == len(kernel)
    finally:
        el2.close()


def test_usage_module_loads_no_native_code():
    code = ("import sys, bk.entrylog.usage, bk.formats.entrylog, bk.formats.entry; "
            "bad = [m for m in sys.modules if m.startswith(('bk._native', 'bk.server', 'bk.index', 'lmdb'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_not_a_log(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_bytes(b"hello")
    with pytest.raises(ValueError):
        read_log_metadata(str(p))
    assert list_entry_logs(str(tmp_path / "nowhere")) == []
    os.makedirs(tmp_path / "l" / "current")
    (tmp_path / "l" / "current" / "zz.log").write_bytes(b"")
    assert list_entry_logs(str(tmp_path / "l")) == []
