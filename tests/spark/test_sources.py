"""The entry-log data source on files this test writes byte by byte (its own packing,
not bk's writer): closed logs, a log still being written (no ledgers map), a torn
tail, a corrupt ledgers map, a flipped payload byte, a garbage file; the job never
fails on them, and every figure is what the test put there.

Record = size u32 | ledger i64 | entry i64 | LAC i64 | length i64 | CRC32C u32 | payload:
4 + 32 + 4 + payload bytes in the log.
"""
import json
import os
import struct

import google_crc32c
import pytest

from bk.meta.cookie import Cookie, write_directory_cookie

HEADER_BYTES = 1024
OVERHEAD = 4 + 32 + 4


def entry(lid: int, eid: int, payload: bytes) -> bytes:
    head = struct.pack(">qqqq", lid, eid, eid - 1, 0)
    crc = google_crc32c.extend(google_crc32c.value(head), payload)
    body = head + struct.pack(">I", crc) + payload
    return struct.pack(">I", len(body)) + body


def write_log(path: str, log_id: int, records: list[bytes], usage: dict[int, int] | None, corrupt_map=False):
    """Header (magic, version 1, log id, map offset, map count), records, then the map."""
    body = b"".join(records)
    map_offset = HEADER_BYTES + len(body) if usage is not None else 0
    head = struct.pack(">4sIQQI", b"BKLO", 1, log_id, map_offset, len(usage or {}))
    with open(path, "wb") as fh:
        fh.write(head + bytes(HEADER_BYTES - len(head)) + body)
        if usage is not None:
            items = b"".join(struct.pack(">qQ", k, v) for k, v in sorted(usage.items()))
            crc = google_crc32c.value(items) ^ (1 if corrupt_map else 0)
            fh.write(items + struct.pack(">I", crc))


@pytest.fixture(scope="module")
def bookie_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("bookie") / "ledgers")
    write_directory_cookie(d, Cookie("127.0.0.9:3181", ("/j",), (d,)))
    cur = os.path.join(d, "current")
    expect = {}  # log id -> {ledger: bytes}
    # log 1: closed, two ledgers
    recs = [entry(10, e, b"a" * 100) for e in range(5)] + [entry(11, e, b"b" * 300) for e in range(2)]
    expect[1] = {10: 5 * (OVERHEAD + 100), 11: 2 * (OVERHEAD + 300)}
    write_log(os.path.join(cur, "1.log"), 1, recs, expect[1])
    # log 2: being written (no map), its last record torn in half
    recs = [entry(11, e, b"c" * 200) for e in range(2, 6)]
    torn = entry(12, 0, b"d" * 500)
    expect[2] = {11: 4 * (OVERHEAD + 200)}
    write_log(os.path.join(cur, "2.log"), 2, recs + [torn[:len(torn) // 2]], None)
    # log 3: closed but its map fails its CRC: rebuilt by a walk; one payload byte flipped
    recs = [entry(12, e, b"e" * 64) for e in range(3)]
    bad = bytearray(recs[1])
    bad[-1] ^= 0xFF
    recs[1] = bytes(bad)
    expect[3] = {12: 3 * (OVERHEAD + 64)}
    write_log(os.path.join(cur, "3.log"), 3, recs, expect[3], corrupt_map=True)
    # log 4: garbage named like a log
    with open(os.path.join(cur, "4.log"), "wb") as fh:
        fh.write(b"\x07" * 3000)
    return d, expect, len(torn) // 2


def test_ledgers_map_mode(spark, bookie_dir):
    d, expect, _ = bookie_dir
    rows = [r.asDict() for r in spark.read.format("bk_entry_logs").option("ledger_dirs", d).load().collect()]
    assert {r["bookie_id"] for r in rows} == {"127.0.0.9:3181"}, "the bookie id comes from the cookie"
    got: dict[int, dict] = {}
    for r in rows:
        if r["ledger_id"] is not None:
            got.setdefault(r["log_id"], {})[r["ledger_id"]] = r["bytes"]
    assert got == expect
    by_log = {r["log_id"]: r for r in rows}
    assert by_log[1]["source"] == "map" and by_log[1]["closed"]
    assert by_log[2]["source"] == "scan" and not by_log[2]["closed"] and by_log[2]["scan_status"] == "torn tail"
    assert by_log[2]["invalid_bytes"] == bookie_dir[2]
    assert by_log[3]["source"] == "scan", "a map failing its CRC is rebuilt by a walk"
    assert by_log[4]["ledger_id"] is None and by_log[4]["bytes"] == 0 and by_log[4]["scan_status"]


def test_full_scan_mode(spark, bookie_dir):
    d, expect, torn_bytes = bookie_dir
    df = spark.read.format("bk_entry_logs").option("ledger_dirs", d).option("mode", "scan").load()
    rows = [r.asDict() for r in df.collect()]
    ok = [r for r in rows if r["status"] == "ok"]
    per: dict[tuple, int] = {}
    for r in ok:
        per[(r["log_id"], r["ledger_id"])] = per.get((r["log_id"], r["ledger_id"]), 0) + 4 + r["size"]
    assert per == {(log, lid): n for log, m in expect.items() for lid, n in m.items()}
    # without a hint a digest matching neither CRC cannot be judged (MAC? corrupt?): null, not false
    undecided = [(r["log_id"], r["ledger_id"], r["entry_id"]) for r in ok if r["checksum_valid"] is None]
    assert undecided == [(3, 12, 1)] and not [r for r in ok if r["checksum_valid"] is False]
    assert all(r["checksum"] == "crc32c" for r in ok if r["checksum_valid"])
    assert sorted((r["log_id"], r["entry_id"]) for r in ok if r["ledger_id"] == 11) == \
        [(1, 0), (1, 1), (2, 2), (2, 3), (2, 4), (2, 5)]
    tails = {r["log_id"]: r for r in rows if r["status"] != "ok"}
    assert tails[2]["status"] == "torn tail" and tails[2]["size"] == torn_bytes
    assert tails[4]["status"] in ("torn tail", "bad size 117901063") and tails[4]["size"] == 3000 - HEADER_BYTES
    # digest_types (the job takes it from the ledger metadata) says which digest each ledger has
    df = spark.read.format("bk_entry_logs").option("ledger_dirs", d).option("mode", "scan") \
        .option("digest_types", json.dumps({"10": "MAC", "12": "CRC32C"})).load()
    rows = [r.asDict() for r in df.where("status = 'ok'").collect()]
    assert [(r["log_id"], r["ledger_id"], r["entry_id"]) for r in rows if r["checksum_valid"] is False] == [(3, 12, 1)]
    mac = [r for r in rows if r["ledger_id"] == 10]
    assert mac and all(r["checksum"] == "mac" and r["checksum_valid"] is None for r in mac)


def test_bad_options_are_clear_errors(spark, tmp_path):
    with pytest.raises(Exception, match="no ledger directory"):
        spark.read.format("bk_entry_logs").option("ledger_dirs", str(tmp_path / "nope")).load().collect()
    with pytest.raises(Exception, match="mode must be"):
        spark.read.format("bk_entry_logs").option("ledger_dirs", str(tmp_path)).option("mode", "x").load()
