"""Format 2 journal files, written in place: preallocation, aligned groups, recycled
files, and the replay rule at a zeroed or stale tail (bk/journal/inplace.py, replay.py).

A crash is modelled two ways: a copy of the journal directory taken while the writer
runs (what a kill -9 leaves: every acknowledged group is fsynced and written), and
bk/testing's power-loss model (every write since the last fsync lost, the bytes under
it - zeros or a recycled file's old records - back)."""
from __future__ import annotations

import os
import random
import shutil
import struct

import pytest

from bk import fileio
from bk._native import load
from bk.errors import CorruptedStorageError
from bk.journal import Journal, LogMark, list_files
from bk.journal import inplace
from bk.journal import records as rec
from bk.testing.powerloss import simulate_power_loss
from test_journal import Completions, entry, kernel_mode, make_config  # noqa: F401

MiB = 1024 * 1024


def cfg(**kw):
    base = {"journal_format_version_to_write": 2, "journal_pre_alloc_size_mb": 1}
    base.update(kw)
    return make_config(**base)


def log_groups(j: Journal, bodies: list[bytes]) -> list[LogMark]:
    """Log each body as its own group (waits for each); the mark after each."""
    c = Completions()
    marks = []
    for i, body in enumerate(bodies):
        j.log(body, c.cb, i)
        c.wait(i + 1)
        marks.append(j.last_mark())
    assert all(exc is None for _, exc in c.done)
    return marks


def replay(journal_dir: str, config, mark=LogMark(0, 0)):
    got = []
    result = Journal(journal_dir, config).replay(mark, lambda l, e, b: got.append(bytes(b)))
    return result, got


def crash_copy(src: str, dst: str) -> str:
    """The journal directory as a kill -9 now would leave it (the writer keeps running)."""
    shutil.copytree(src, dst)
    return dst


def crashed_journal(tmp_path, config, bodies: list[bytes]) -> tuple[str, list[LogMark]]:
    """A journal that logged `bodies` (one group each), as a kill -9 left it: (dir, marks)."""
    d = str(tmp_path / "j")
    j = Journal(d, config)
    j.start()
    marks = log_groups(j, bodies)
    image = crash_copy(d, str(tmp_path / "crash"))
    j.stop()
    return image, marks


@pytest.mark.parametrize("mode", ["native", "pure"])
def test_kernels_agree_on_seeded_records(mode, monkeypatch):
    native = load("journal") if mode == "native" else None
    if mode == "native" and (os.environ.get("BK_NO_NATIVE") or native.__name__.endswith("_py")):
        pytest.skip("native journal kernel not in use")
    from bk._native import journal_py as pure
    k = native or pure
    bodies = [entry(1, i, 40 + 7 * i) for i in range(5)]
    seed = rec.file_seed(7)
    framed = k.frame_records(bodies, seed)
    assert framed == pure.frame_records(bodies, seed) != pure.frame_records(bodies)
    assert k.frame_headers(bodies, seed) == pure.frame_headers(bodies, seed)
    found, stop, status = k.scan_records(framed, 0, len(framed), 1 << 20, seed)
    assert (len(found), stop, status) == (5, len(framed), 0)
    # under another file's seed (or format 1's 0) the first record already fails its CRC
    assert k.scan_records(framed, 0, len(framed), 1 << 20, rec.file_seed(8))[1:] == (0, 3)
    assert k.scan_records(framed, 0, len(framed), 1 << 20)[1:] == (0, 3)
    # a valid record behind a long zero run is found; an old one is not
    buf = bytes(3 * MiB + 5) + framed
    assert k.find_valid_record(buf, 1, len(buf), 1 << 20, seed) == 3 * MiB + 5
    assert k.find_valid_record(buf, 1, len(buf), 1 << 20, rec.file_seed(8)) == -1
    with pytest.raises(ValueError):
        k.scan_records(framed, 0, len(framed), 1 << 20, 1 << 32)


def test_groups_are_aligned_in_a_preallocated_file(tmp_path, kernel_mode):
    config = cfg()
    j = Journal(str(tmp_path), config)
    j.start()
    (fid, path), = list_files(str(tmp_path))
    assert os.path.getsize(path) == 512 + MiB  # header block + one zeroed step
    with open(path, "rb") as fh:
        assert fh.read(20) == b"BKJN" + struct.pack(">IQI", 2, fid, 512)
    bodies = [entry(3, i, random.Random(i).choice([16, 100, 490, 1000, 5000, 9000])) for i in range(500)]
    marks = log_groups(j, bodies)
    assert all(m.offset % 512 == 0 for m in marks)
    size = os.path.getsize(path)
    # grown by whole steps, or by zero-ahead pieces while idle; never by a group
    assert size > 512 + MiB and (size - 512) % inplace.ZERO_AHEAD_BYTES == 0
    j.stop()
    assert os.path.getsize(path) == size  # stop writes FILE_END inside the zeroed space
    result, got = replay(str(tmp_path), config)
    assert got == bodies and result.cut_tail is None
    assert result.end_mark == marks[-1]


def test_rotation_ends_each_file_and_old_files_still_replay(tmp_path, kernel_mode):
    old = make_config()  # format 1
    j = Journal(str(tmp_path), old)
    j.start()
    first = [entry(1, i, 300) for i in range(20)]
    log_groups(j, first)
    j.stop()
    config = cfg(journal_max_size_bytes=64 * 1024)
    j = Journal(str(tmp_path), config)
    assert j.replay(LogMark(0, 0), lambda *a: None).records == 20
    j.start()
    second = [entry(2, i, 3000) for i in range(60)]
    log_groups(j, second)
    j.stop()
    assert len(list_files(str(tmp_path))) >= 4  # one format 1 file, then rotated format 2 files
    result, got = replay(str(tmp_path), config)
    assert got == first + second and result.cut_tail is None


def _stale_setup(tmp_path, n_old: int):
    """A journal file full of valid records, retired by gc for reuse; a later file
    recycles it. Every group is one 1000-byte record padded to 1024 bytes, in both
    lives, so the new data ends exactly where an old record starts."""
    config = cfg(journal_reuse_files=True)
    d = str(tmp_path / "j")
    j = Journal(d, config)
    j.start()
    old_fid = j.current_file_id
    old = [entry(9, i, 1000 - 8) for i in range(n_old)]
    log_groups(j, old)
    j.stop()
    j = Journal(d, config)
    j.replay(LogMark(0, 0), lambda *a: None)
    j.start()
    assert j.gc(LogMark(j.current_file_id, 0)) == 1  # the old file is kept for reuse
    j.stop()
    j = Journal(d, config)
    j.replay(LogMark(0, 0), lambda *a: None)
    j.gc(LogMark(j.last_mark().file_id + 1, 0))  # the second file is kept for reuse too
    j.start()  # recycles the first file (the oldest kept)
    return config, d, j, old_fid, old


def test_a_recycled_file_never_replays_its_old_valid_records(tmp_path, kernel_mode):
    config, d, j, old_fid, old = _stale_setup(tmp_path, 50)
    (fid, path), = list_files(d)
    assert fid > old_fid and os.path.getsize(path) >= 50 * 1024  # the old file, written over in place
    new = [entry(5, i, 1000 - 8) for i in range(10)]
    marks = log_groups(j, new)
    assert marks[-1].offset == 512 + 10 * 1024
    with open(path, "rb") as fh:  # an old record, valid under the old file's seed, is next
        fh.seek(marks[-1].offset)
        head = fh.read(8 + 1000 - 8)
    assert struct.unpack(">I", head[:4])[0] == 1000 - 8
    assert rec.parse_ids(head[8:]) == (9, 10)
    image = crash_copy(d, str(tmp_path / "crash"))  # no FILE_END: a crash
    j.stop()
    result, got = replay(image, config)
    assert got == new and result.cut_tail is not None and result.end_mark == marks[-1]
    # replay closed the file: the next start writes after it, and both replay clean
    j2 = Journal(image, config)
    j2.replay(LogMark(0, 0), lambda *a: None)
    j2.start()
    log_groups(j2, [entry(5, 10, 100)])
    j2.stop()
    assert replay(image, config)[1] == new + [entry(5, 10, 100)]


def test_zeroed_tail_after_a_crash_is_the_quiet_end(tmp_path, kernel_mode):
    config = cfg()
    bodies = [entry(4, i, 700) for i in range(30)]
    image, marks = crashed_journal(tmp_path, config, bodies)
    result, got = replay(image, config)
    assert got == bodies and result.cut_tail is None and result.end_mark == marks[-1]
    (fid, path), = list_files(image)
    with open(path, "rb") as fh:
        fh.seek(marks[-1].offset)
        end = fh.read(24)
    assert rec.parse_ids(end[8:]) == (rec.FILLER_LEDGER, rec.FILE_END)


@pytest.mark.parametrize("damage", ["torn_record", "garbage"])
def test_torn_group_is_closed_and_reported(tmp_path, kernel_mode, damage):
    config = cfg()
    bodies = [entry(4, i, 700) for i in range(12)]
    image, marks = crashed_journal(tmp_path, config, bodies)
    (fid, path), = list_files(image)
    end = marks[-1].offset
    with open(path, "r+b") as fh:  # a group that was being written: part of it made it
        fh.seek(end)
        if damage == "torn_record":
            fh.write(load("journal").frame_records([entry(4, 12, 700)], rec.file_seed(fid))[:300])
        else:
            fh.write(random.Random(3).randbytes(900))
    result, got = replay(image, config)
    assert got == bodies and result.cut_tail == f"{path}@{end}"
    assert replay(image, config)[0].cut_tail is None  # closed with FILE_END: clean now


def test_valid_record_after_the_stop_is_corruption(tmp_path, kernel_mode):
    config = cfg()
    image, marks = crashed_journal(tmp_path, config, [entry(6, i, 200) for i in range(10)])
    (fid, path), = list_files(image)
    bad = marks[3].offset
    with open(path, "r+b") as fh:  # flip a bit in record 4's body: records 5.. still valid
        fh.seek(bad + 30)
        b = fh.read(1)
        fh.seek(bad + 30)
        fh.write(bytes([b[0] ^ 1]))
    with pytest.raises(CorruptedStorageError) as info:
        replay(image, config)
    assert info.value.offset == bad


def test_a_file_that_is_not_the_last_must_end_with_its_end_record(tmp_path, kernel_mode):
    config = cfg()
    image, _marks = crashed_journal(tmp_path, config, [entry(6, i, 200) for i in range(5)])  # no FILE_END
    later = Journal(image, config)
    later.start()  # without replay (which would close the file): a later file exists
    later.stop()
    with pytest.raises(CorruptedStorageError, match="without its end record"):
        replay(image, config)


def test_power_loss_brings_back_the_stale_tail_and_replay_ignores_it(tmp_path, kernel_mode, monkeypatch):
    track = str(tmp_path / "fsync.log")
    monkeypatch.setenv("BK_FSYNC_TRACK_FILE", track)
    config, d, j, old_fid, old = _stale_setup(tmp_path, 40)
    new = [entry(5, i, 1000 - 8) for i in range(6)]
    marks = log_groups(j, new)
    # a group written in place but never fsynced (the crash came before its fsync)
    lost = load("journal").frame_records([entry(5, 6, 1000 - 8)], rec.file_seed(j.current_file_id))
    j._file.write(lost + bytes(24))
    (fid, path), = list_files(d)
    with open(path, "rb") as fh:
        fh.seek(marks[-1].offset)
        assert fh.read(len(lost)) == lost
    report = simulate_power_loss(track, [d])
    assert path in report.truncated
    with open(path, "rb") as fh:  # the old record is back under the lost group
        fh.seek(marks[-1].offset)
        assert rec.parse_ids(fh.read(24)[8:]) == (9, 6)
    result, got = replay(d, config)
    assert got == new and result.end_mark == marks[-1]
    j._file.close()
    j._file = None
    j.stop()


def test_power_loss_after_growth_loses_only_the_unsynced_bytes(tmp_path, kernel_mode, monkeypatch):
    track = str(tmp_path / "fsync.log")
    monkeypatch.setenv("BK_FSYNC_TRACK_FILE", track)
    config = cfg()
    d = str(tmp_path / "j")
    j = Journal(d, config)
    j.start()
    marks = log_groups(j, [entry(2, i, 3000) for i in range(500)])  # grows past the first step
    assert os.path.getsize(list_files(d)[0][1]) > 512 + MiB
    j._file.write(b"\x01" * 5000)  # unsynced
    simulate_power_loss(track, [d], tear=True, rng=random.Random(5))
    result, got = replay(d, config)
    assert len(got) == 500 and result.end_mark == marks[-1]
    j._file.close()
    j._file = None
    j.stop()
    assert fileio.tracking_enabled()
