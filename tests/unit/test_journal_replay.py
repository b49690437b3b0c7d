"""Journal replay: round trips, log marks, torn tails cut, corruption refused."""
from __future__ import annotations

import logging
import os
import random
import struct

import pytest

from bk.errors import CorruptedStorageError
from bk.journal import FENCE, MASTER_KEY, Journal, LogMark, file_path, list_files, meta_body
from test_journal import Completions, entry, kernel_mode, make_config, replay_all  # noqa: F401

CFG = make_config()


def write_journal(journal_dir: str, bodies: list[bytes], cfg=CFG, per_group: int = 1) -> list[LogMark]:
    """Log `bodies` in groups of `per_group`; returns the mark after each group."""
    j = Journal(journal_dir, cfg)
    j.start()
    c = Completions()
    marks = []
    for i, body in enumerate(bodies):
        j.log(body, c.cb, i)
        if (i + 1) % per_group == 0 or i == len(bodies) - 1:
            c.wait(i + 1)
            marks.append(j.last_mark())
    j.stop()
    assert all(exc is None for _, exc in c.done)
    return marks


def record_offsets(path: str) -> list[int]:
    """Offsets of every record in a (clean) journal file."""
    data = open(path, "rb").read()
    pos, out = 16, []
    while pos < len(data):
        out.append(pos)
        pos += 8 + struct.unpack_from(">I", data, pos)[0]
    return out


def test_missing_journal_dir_replays_nothing(tmp_path):
    result, got = replay_all(str(tmp_path / "nope"), CFG, LogMark(3, 77))
    assert (result.records, result.end_mark, result.cut_tail, got) == (0, LogMark(3, 77), None, [])


def test_round_trip_entries_and_meta(tmp_path, kernel_mode):
    rng = random.Random(1)
    bodies = []
    for i in range(200):
        if i % 50 == 0:
            bodies.append(meta_body(i, MASTER_KEY, bytes(20)))
        bodies.append(entry(i % 5, i, rng.choice([16, 17, 100, 1000, 5000])))
    bodies.append(meta_body(3, FENCE))
    write_journal(str(tmp_path), bodies, per_group=13)
    result, got = replay_all(str(tmp_path), CFG)
    assert [b for _, _, b in got] == bodies
    assert [(l, e) for l, e, _ in got] == [struct.unpack(">qq", b[:16]) for b in bodies]
    assert result.records == len(bodies) and result.cut_tail is None
    (fid, path), = list_files(str(tmp_path))
    assert result.end_mark == LogMark(fid, os.path.getsize(path))


def test_replay_from_a_mid_file_mark(tmp_path):
    bodies = [entry(1, i) for i in range(10)]
    marks = write_journal(str(tmp_path), bodies, per_group=1)
    result, got = replay_all(str(tmp_path), CFG, marks[4])
    assert [e for _, e, _ in got] == [5, 6, 7, 8, 9]
    assert result.records == 5 and result.end_mark == marks[-1]
    # a mark at the end replays nothing and keeps the mark
    result, got = replay_all(str(tmp_path), CFG, marks[-1])
    assert got == [] and result.end_mark == marks[-1]


def test_replay_spans_files_and_skips_files_before_the_mark(tmp_path):
    write_journal(str(tmp_path), [entry(1, i) for i in range(5)])
    write_journal(str(tmp_path), [entry(1, i) for i in range(5, 10)])
    write_journal(str(tmp_path), [entry(1, i) for i in range(10, 15)])
    assert [e for _, e, _ in replay_all(str(tmp_path), CFG)[1]] == list(range(15))
    assert [e for _, e, _ in replay_all(str(tmp_path), CFG, LogMark(2, 0))[1]] == list(range(5, 15))


def test_mark_into_a_deleted_file_starts_at_the_next_one(tmp_path):
    write_journal(str(tmp_path), [entry(1, i) for i in range(3)])
    write_journal(str(tmp_path), [entry(1, i) for i in range(3, 6)])
    os.unlink(file_path(str(tmp_path), 1))
    result, got = replay_all(str(tmp_path), CFG, LogMark(1, 50))
    assert [e for _, e, _ in got] == [3, 4, 5] and result.end_mark.file_id == 2


def test_mark_beyond_the_end_of_the_file(tmp_path, caplog):
    marks = write_journal(str(tmp_path), [entry(1, i) for i in range(3)])
    beyond = LogMark(marks[-1].file_id, marks[-1].offset + 1000)
    with caplog.at_level(logging.WARNING):
        result, got = replay_all(str(tmp_path), CFG, beyond)
    assert got == [] and result.end_mark == beyond and "beyond the end" in caplog.text


def _torn(path: str, kind: str, rng: random.Random) -> int:
    """Damage the tail of a journal file; returns where the valid data ends."""
    offsets = record_offsets(path)
    size = os.path.getsize(path)
    if kind == "truncate_mid_record":
        last = offsets[-1]
        os.truncate(path, last + rng.randint(1, size - last - 1))
        return last
    if kind == "truncate_mid_header":
        os.truncate(path, offsets[-1] + 5)
        return offsets[-1]
    with open(path, "ab") as fh:
        if kind == "zero_tail":
            fh.write(bytes(4096))
        elif kind == "garbage_tail":
            fh.write(rng.randbytes(3000))
        elif kind == "partial_group":  # a group's first record made it, the rest is zeros
            fh.write(struct.pack(">II", 100, 12345) + bytes(600))
    return size


@pytest.mark.parametrize("kind", ["truncate_mid_record", "truncate_mid_header", "zero_tail",
                                  "garbage_tail", "partial_group"])
def test_torn_tail_is_cut_reported_and_the_journal_restarts(tmp_path, caplog, kernel_mode, kind):
    rng = random.Random(kind)
    bodies = [entry(2, i, 300) for i in range(20)]
    write_journal(str(tmp_path), bodies, per_group=4)
    (fid, path), = list_files(str(tmp_path))
    valid_end = _torn(path, kind, rng)
    with caplog.at_level(logging.WARNING):
        result, got = replay_all(str(tmp_path), CFG)
    assert result.cut_tail == f"{path}@{valid_end}"
    assert path in caplog.text and "torn tail" in caplog.text
    assert os.path.getsize(path) == valid_end
    assert result.end_mark == LogMark(fid, valid_end)
    kept = [b for _, _, b in got]
    assert kept == bodies[:len(kept)] and len(kept) >= len(bodies) - 1
    # restart: replay again (clean now), start a new file, log more
    j = Journal(str(tmp_path), CFG)
    again = j.replay(LogMark(0, 0), lambda *a: None)
    assert again.cut_tail is None and again.records == len(kept)
    j.start()
    assert j.current_file_id == fid + 1
    c = Completions()
    j.log(entry(2, 100, 300), c.cb, 0)
    j.stop()
    assert c.done == [(0, None)]
    assert [b for _, _, b in replay_all(str(tmp_path), CFG)[1]] == kept + [entry(2, 100, 300)]


def test_corruption_followed_by_valid_records_is_refused(tmp_path, kernel_mode):
    write_journal(str(tmp_path), [entry(4, i, 200) for i in range(10)], per_group=10)
    (fid, path), = list_files(str(tmp_path))
    bad = record_offsets(path)[3]
    with open(path, "r+b") as fh:  # flip one bit of record 3's body
        fh.seek(bad + 8 + 50)
        byte = fh.read(1)
        fh.seek(bad + 8 + 50)
        fh.write(bytes([byte[0] ^ 0x10]))
    size = os.path.getsize(path)
    with pytest.raises(CorruptedStorageError) as info:
        replay_all(str(tmp_path), CFG)
    assert info.value.path == path and info.value.offset == bad
    assert path in str(info.value) and str(bad) in str(info.value)
    assert os.path.getsize(path) == size  # nothing was cut


def test_bad_length_in_the_middle_is_refused(tmp_path):
    write_journal(str(tmp_path), [entry(4, i, 200) for i in range(10)], per_group=10)
    (_, path), = list_files(str(tmp_path))
    bad = record_offsets(path)[5]
    with open(path, "r+b") as fh:
        fh.seek(bad)
        fh.write(bytes(4))  # length 0
    with pytest.raises(CorruptedStorageError) as info:
        replay_all(str(tmp_path), CFG)
    assert info.value.offset == bad


def test_torn_tail_in_a_file_that_is_not_the_last_is_corruption(tmp_path):
    write_journal(str(tmp_path), [entry(1, i, 200) for i in range(5)])
    write_journal(str(tmp_path), [entry(1, i, 200) for i in range(5, 10)])
    path1 = file_path(str(tmp_path), 1)
    last = record_offsets(path1)[-1]
    os.truncate(path1, last + 20)
    with pytest.raises(CorruptedStorageError) as info:
        replay_all(str(tmp_path), CFG)
    assert info.value.path == path1 and info.value.offset == last
    assert "later journal files" in str(info.value)


@pytest.mark.parametrize("field,offset", [("magic", 0), ("version", 4), ("file_id", 8)])
def test_bad_header_is_corruption(tmp_path, field, offset):
    write_journal(str(tmp_path), [entry(1, i) for i in range(3)])
    path = file_path(str(tmp_path), 1)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"XXXX" if field == "magic" else struct.pack(">I", 7) if field == "version"
                 else struct.pack(">Q", 99))
    with pytest.raises(CorruptedStorageError) as info:
        replay_all(str(tmp_path), CFG)
    assert info.value.path == path and info.value.offset == offset


def test_empty_and_header_torn_last_files(tmp_path):
    write_journal(str(tmp_path), [entry(1, i) for i in range(3)])
    empty = file_path(str(tmp_path), 2)
    open(empty, "wb").close()  # crash right after the file was created
    result, got = replay_all(str(tmp_path), CFG)
    assert len(got) == 3 and result.cut_tail is None and result.end_mark == LogMark(2, 0)
    with open(empty, "wb") as fh:
        fh.write(b"BKJN\0\0")  # crash in the middle of the header write
    result, got = replay_all(str(tmp_path), CFG)
    assert len(got) == 3 and result.cut_tail == f"{empty}@0" and os.path.getsize(empty) == 0


def test_short_header_in_a_file_that_is_not_the_last_is_corruption(tmp_path):
    write_journal(str(tmp_path), [entry(1, i) for i in range(3)])
    write_journal(str(tmp_path), [entry(1, i) for i in range(3)])
    os.truncate(file_path(str(tmp_path), 1), 10)
    with pytest.raises(CorruptedStorageError):
        replay_all(str(tmp_path), CFG)


def test_missing_file_between_replayed_files_is_corruption(tmp_path):
    for k in range(3):
        write_journal(str(tmp_path), [entry(1, k)])
    os.unlink(file_path(str(tmp_path), 2))
    with pytest.raises(CorruptedStorageError) as info:
        replay_all(str(tmp_path), CFG)
    assert "2.txn is missing" in str(info.value)


def test_record_too_short_for_ids_with_a_good_crc_is_corruption(tmp_path):
    from bk._native import load
    write_journal(str(tmp_path), [entry(1, 0)])
    path = file_path(str(tmp_path), 1)
    size = os.path.getsize(path)
    with open(path, "ab") as fh:
        fh.write(load("journal").frame_records([b"tiny"]))
    with pytest.raises(CorruptedStorageError) as info:
        replay_all(str(tmp_path), CFG)
    assert info.value.offset == size


def test_large_records_across_replay_chunks(tmp_path, monkeypatch):
    import bk.journal.replay as replay_mod
    monkeypatch.setattr(replay_mod, "CHUNK_BYTES", 4096)  # force records to straddle chunks
    rng = random.Random(3)
    bodies = [entry(6, i, rng.choice([100, 3000, 9000, 20000])) for i in range(40)]
    write_journal(str(tmp_path), bodies, per_group=7)
    result, got = replay_all(str(tmp_path), CFG)
    assert [b for _, _, b in got] == bodies and result.cut_tail is None
    # and a torn tail after chunked reading is still found at the right place
    (_, path), = list_files(str(tmp_path))
    last = record_offsets(path)[-1]
    os.truncate(path, last + 5000)
    result, got = replay_all(str(tmp_path), CFG)
    assert len(got) == 39 and result.cut_tail == f"{path}@{last}"


def test_replay_after_start_is_refused(tmp_path):
    j = Journal(str(tmp_path), CFG)
    j.start()
    try:
        with pytest.raises(RuntimeError):
            j.replay(LogMark(0, 0), lambda *a: None)
    finally:
        j.stop()
