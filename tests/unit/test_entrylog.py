"""EntryLogger: append/read, rotation, ledgers map, read_run, dirs, errors."""
import os
import random
import struct
import threading

import pytest

from bk.config import BookieConfig, load_config
from bk.entrylog import EntryLogger
from bk.entrylog import logger as logger_mod
from bk.formats import entrylog as fmt
from bk.entrylog.logger import DiskUsage
from bk.errors import ConfigError, CorruptedStorageError, DiskFullError, NoSuchEntryError, StorageError

KiB = 1024


def cfg(**kw) -> BookieConfig:
    kw.setdefault("entry_log_size_limit_bytes", 64 * KiB)
    return load_config(env={}, overrides=kw)


def entry(ledger_id: int, entry_id: int, payload_len: int, seed: int = 0) -> bytes:
    rng = random.Random(ledger_id * 1_000_003 + entry_id + seed)
    return struct.pack(">qq", ledger_id, entry_id) + rng.randbytes(payload_len)


def read_header(path):
    with open(path, "rb") as fh:
        return fmt.decode_header(fh.read(fmt.LOG_HEADER_BYTES))


@pytest.fixture
def dirs(tmp_path):
    return [str(tmp_path / "l0"), str(tmp_path / "l1")]


def test_round_trip_many_sizes_many_logs(dirs):
    el = EntryLogger(dirs, cfg())
    rng = random.Random(7)
    written = {}
    for batch in range(40):
        entries = []
        for _ in range(rng.randrange(1, 12)):
            lid = rng.randrange(1, 6)
            eid = len([k for k in written if k[0] == lid]) + sum(1 for e in entries if e[:8] == struct.pack(">q", lid))
            size = rng.choice([0, 1, 100, 1000, 4000, 10_000, 30_000])
            entries.append(entry(lid, eid, size))
        locs = el.add_entries(entries)
        assert len(locs) == len(entries)
        for e, loc in zip(entries, locs):
            written[struct.unpack(">qq", e[:16])] = (loc, e)
    el.flush()
    assert len(el.log_ids()) > 3  # 64 KiB logs
    logs_by_dir = {d: os.listdir(os.path.join(d, "current")) for d in dirs}
    assert sum(len(v) for v in logs_by_dir.values()) == len(el.log_ids())
    for (lid, eid), (loc, e) in written.items():
        assert el.read_entry(lid, eid, loc) == e
        log_id, off = fmt.split_location(loc)
        assert off >= fmt.LOG_HEADER_BYTES and (off + 4 + len(e) <= 64 * KiB or off == fmt.LOG_HEADER_BYTES)
    el.close()


def test_locations_are_sequential_records(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    es = [entry(1, i, i) for i in range(20)]
    locs = el.add_entries(es)
    assert locs[0] == (el.current_log_id << 32) | fmt.LOG_HEADER_BYTES
    for a, b, e in zip(locs, locs[1:], es):
        assert b - a == 4 + len(e)
    assert el.add_entries([]) == []
    el.close()


def test_rotation_writes_a_valid_ledgers_map(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    first = el.current_log_id
    expect: dict[int, int] = {}
    eid = 0
    while el.current_log_id == first:
        e = entry(eid % 3 + 10, eid, 3000)
        [loc] = el.add_entries([e])
        if fmt.split_location(loc)[0] == first:
            expect[eid % 3 + 10] = expect.get(eid % 3 + 10, 0) + len(e) + 4
        eid += 1
    path = el.log_path(first)
    hdr = read_header(path)
    assert hdr.log_id == first and hdr.map_count == 3
    assert hdr.map_offset == fmt.LOG_HEADER_BYTES + sum(expect.values())
    with open(path, "rb") as fh:
        raw = fh.read()
    assert len(raw) == hdr.map_offset + fmt.ledgers_map_bytes(3)
    assert fmt.decode_ledgers_map(raw[hdr.map_offset:], 3) == expect
    assert el.ledgers_map(first) == expect
    # the current log answers from memory
    cur = el.ledgers_map(el.current_log_id)
    assert sum(cur.values()) == 16 + 3000 + 4  # the one entry that started it
    el.close()
    assert read_header(el.log_path(el.current_log_id)).map_count == 1


def test_batch_split_across_rotation_and_oversized_entry(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg(max_frame_size_bytes=200 * KiB))
    es = [entry(1, i, 9000) for i in range(20)]  # ~180 KiB in one call: three logs
    locs = el.add_entries(es)
    assert len({fmt.split_location(l)[0] for l in locs}) == 3
    big = entry(2, 0, 100 * KiB)  # bigger than the limit: a log of its own
    [bloc] = el.add_entries([big])
    assert fmt.split_location(bloc)[1] == fmt.LOG_HEADER_BYTES
    for e, loc in zip(es + [big], locs + [bloc]):
        assert el.read_entry(*struct.unpack(">qq", e[:16]), loc) == e
    el.add_entries([entry(3, 0, 10)])  # and the next entry goes to a fresh log again
    assert el.current_log_id == fmt.split_location(bloc)[0] + 1
    for log_id in el.log_ids()[:-1]:
        m = el.ledgers_map(log_id)
        assert sum(m.values()) == sum(size + 4 for *_, size in el.scan(log_id))
    el.close()


def test_reads_before_flush_from_other_threads(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    es = [entry(5, i, 50 * i) for i in range(30)]
    locs = el.add_entries(es)
    got = {}

    def reader():
        got["x"] = [el.read_entry(5, i, loc) for i, loc in enumerate(locs)]

    t = threading.Thread(target=reader)
    t.start()
    t.join()
    assert got["x"] == es
    assert [r[:2] for r in el.scan(el.current_log_id)] == [(5, i) for i in range(30)]
    el.close()


def test_flush_fsyncs_what_was_appended(tmp_path, monkeypatch):
    track = tmp_path / "fsync.track"
    monkeypatch.setenv("BK_FSYNC_TRACK_FILE", str(track))
    el = EntryLogger([str(tmp_path / "l")], cfg())
    el.add_entries([entry(1, i, 100) for i in range(10)])
    path = os.path.abspath(el.log_path(el.current_log_id))
    el.flush()
    synced = [line.split("\t") for line in track.read_text().splitlines()]
    assert [path, str(os.path.getsize(path))] == synced[-1]
    el.close()


def test_corruption_is_never_no_such_entry(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    es = [entry(9, i, 200) for i in range(5)]
    locs = el.add_entries(es)
    el.flush()
    path = el.log_path(el.current_log_id)
    fd = os.open(path, os.O_RDWR)
    try:
        def flip(off, mask=0x40):
            b = os.pread(fd, 1, off)
            os.pwrite(fd, bytes([b[0] ^ mask]), off)

        _, off1 = fmt.split_location(locs[1])
        flip(off1)  # size field: far out of range
        _, off2 = fmt.split_location(locs[2])
        flip(off2 + 4 + 7)  # ledger id
        _, off3 = fmt.split_location(locs[3])
        flip(off3 + 4 + 8 + 7)  # entry id
        _, off4 = fmt.split_location(locs[4])
        flip(off4 + 2, 0x01)  # size + 256: in range, but the last record then runs past the file
    finally:
        os.close(fd)
    assert el.read_entry(9, 0, locs[0]) == es[0]
    for i in (1, 2, 3, 4):
        with pytest.raises(CorruptedStorageError) as ei:
            el.read_entry(9, i, locs[i])
        assert not isinstance(ei.value, NoSuchEntryError)
        assert ei.value.path == path and ei.value.offset == fmt.split_location(locs[i])[1]
    # asked-for ids that do not match the record
    with pytest.raises(CorruptedStorageError):
        el.read_entry(9, 1, locs[0])
    with pytest.raises(CorruptedStorageError):
        el.read_entry(8, 0, locs[0])
    # locations that cannot be right
    with pytest.raises(CorruptedStorageError):
        el.read_entry(9, 0, (el.current_log_id << 32) | 100)  # inside the header
    with pytest.raises(CorruptedStorageError):
        el.read_entry(9, 0, (el.current_log_id << 32) | 10_000_000)  # past the end
    with pytest.raises(CorruptedStorageError):
        el.read_entry(9, 0, (999 << 32) | fmt.LOG_HEADER_BYTES)  # no such log
    el.close()


def test_bad_entries_rejected_before_anything_is_written(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg(max_frame_size_bytes=2048))
    el.add_entries([entry(1, 0, 10)])
    before = os.path.getsize(el.log_path(el.current_log_id))
    with pytest.raises(ValueError, match="16"):
        el.add_entries([entry(1, 1, 10), b"short"])
    with pytest.raises(ValueError, match="max_frame_size_bytes"):
        el.add_entries([entry(1, 1, 4000)])
    with pytest.raises(TypeError):
        el.add_entries([entry(1, 1, 10), 5])
    assert os.path.getsize(el.log_path(el.current_log_id)) == before
    assert el.ledgers_map(el.current_log_id) == {1: 30}
    el.close()


def test_read_run(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    es = [entry(4, i, 100) for i in range(50)]
    locs = el.add_entries(es)
    run = el.read_run(locs[10], 5, 1 << 20)
    assert [(r[0], r[1], r[2], r[3]) for r in run] == [(4, i, es[i], locs[i]) for i in range(10, 15)]
    run = el.read_run(locs[10], 100, 3 * 116)  # bytes bound
    assert [r[1] for r in run] == [10, 11, 12]
    assert [r[1] for r in el.read_run(locs[45], 100, 1 << 20)] == [45, 46, 47, 48, 49]
    big = entry(4, 50, 20_000)
    [bloc] = el.add_entries([big])
    assert el.read_run(bloc, 10, 100) == [(4, 50, big, bloc)]  # at least one record
    end = bloc + 4 + len(big)
    assert el.read_run(end, 10, 1000) == []
    assert el.read_run(locs[0], 0, 1000) == []
    # a closed log: the run stops before its ledgers map
    closed = el.current_log_id
    el._rotate()
    assert [r[1] for r in el.read_run(locs[48], 100, 1 << 20)] == [48, 49, 50]
    assert fmt.split_location(locs[0])[0] == closed
    el.close()


def _advised_log(tmp_path, monkeypatch, count: int):
    """An entry logger with `count` ~1 KB records in one log, and the list every
    posix_fadvise call after they were written is recorded in."""
    advice = []
    real = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, how: (advice.append((off, n, how)),
                                                                       real(fd, off, n, how))[1])
    el = EntryLogger([str(tmp_path)], cfg(entry_log_size_limit_bytes=4 << 20))
    es = [entry(4, i, 1000) for i in range(count)]
    locs = el.add_entries(es)
    el.flush()
    advice.clear()
    return el, es, locs, advice


def test_read_fds_have_no_kernel_readahead_and_a_scan_hints_whole_blocks(tmp_path, monkeypatch):
    el, es, locs, advice = _advised_log(tmp_path, monkeypatch, 200)  # ~200 KB
    run = el.read_run(locs[0], 10, 8192, hint_bytes=65536)
    assert [r[1] for r in run] == list(range(len(run))) and 5 <= len(run) < 10  # 8 KiB of records
    assert advice[0] == (0, 0, os.POSIX_FADV_RANDOM)  # opened once, for every pread after
    # the blocks after the one past the run's end: whole, aligned, clipped to the data
    log_end = fmt.split_location(locs[-1])[1] + 4 + len(es[-1])
    assert advice[1:] == [(65536, min(2 * 65536, log_end - 65536), os.POSIX_FADV_WILLNEED)]
    advice.clear()
    assert el.read_run(locs[150], 10, 8192, hint_bytes=65536)[0][1] == 150
    assert el.read_run(locs[190], 10, 8192)[0][1] == 190  # no hint asked, none given; past the data: none
    assert advice == [] or all(off < log_end for off, _, _ in advice)
    el.close()


def test_read_entry_reads_a_ledgers_record_in_one_pread_once_it_knows_its_size(tmp_path, monkeypatch):
    es = [entry(4, i, 20_000) for i in range(5)] + [entry(6, 0, 100), entry(4, 5, 30_000)]
    el = EntryLogger([str(tmp_path)], cfg(entry_log_size_limit_bytes=1 << 20))
    locs = el.add_entries(es)
    el.flush()
    preads = []
    real = el.pread
    monkeypatch.setattr(el, "pread", lambda h, n, off: (preads.append(n), real(h, n, off))[1])
    assert el.read_entry(4, 0, locs[0]) == es[0]
    assert len(preads) == 2  # a guess of 4 KiB, then the rest
    preads.clear()
    assert el.read_entry(4, 3, locs[3]) == es[3] and len(preads) == 1
    assert el.read_entry(6, 0, locs[5]) == es[5] and len(preads) == 2  # another ledger: its own guess
    preads.clear()
    assert el.read_entry(4, 5, locs[6]) == es[6] and len(preads) == 2  # larger than the guess: the rest
    preads.clear()
    assert el.read_entry(4, 1, locs[1]) == es[1] and len(preads) == 1  # smaller: one read, bytes cut
    el.close()


def test_new_logs_go_to_the_dir_with_most_free_space(dirs, monkeypatch):
    space = {}

    def fake(path):
        return space[os.path.dirname(path)]

    monkeypatch.setattr(logger_mod, "_dir_space", fake)
    space[dirs[0]] = DiskUsage(1000, 100, 0.90)
    space[dirs[1]] = DiskUsage(1000, 300, 0.70)
    el = EntryLogger(dirs, cfg(disk_usage_threshold=0.95))
    assert el.log_path(el.current_log_id).startswith(dirs[1])
    space[dirs[1]] = DiskUsage(10_000, 500, 0.96)  # most free but over the threshold
    el._rotate()
    assert el.log_path(el.current_log_id).startswith(dirs[0])
    space[dirs[0]] = DiskUsage(1000, 10, 0.99)  # all over: emptiest still takes the data
    el._rotate()
    assert el.log_path(el.current_log_id).startswith(dirs[1])
    assert el.disk_usage() == {dirs[0]: space[dirs[0]], dirs[1]: space[dirs[1]]}
    el.close()


def test_log_ids_are_global_across_dirs(dirs):
    el = EntryLogger(dirs[:1], cfg())
    el.add_entries([entry(1, i, 30_000) for i in range(5)])
    el.close()
    ids = el.log_ids()
    os.makedirs(os.path.join(dirs[1], "current"))
    os.rename(el.log_path(ids[-1]), os.path.join(dirs[1], "current", fmt.log_file_name(ids[-1])))
    el2 = EntryLogger(dirs, cfg())
    assert el2.current_log_id == ids[-1] + 1
    assert el2.log_ids() == ids + [ids[-1] + 1]
    el2.close()
    # the same id in two dirs is an error, not a silent pick
    src = os.path.join(dirs[0], "current", fmt.log_file_name(ids[0]))
    with open(src, "rb") as a, open(os.path.join(dirs[1], "current", fmt.log_file_name(ids[0])), "wb") as b:
        b.write(a.read())
    with pytest.raises(CorruptedStorageError, match="twice"):
        EntryLogger(dirs, cfg())


def test_delete_log_and_close(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    locs = el.add_entries([entry(1, i, 20_000) for i in range(4)])
    old = fmt.split_location(locs[0])[0]
    assert el.read_entry(1, 0, locs[0])  # opens a read fd on the log
    with pytest.raises(ValueError):
        el.delete_log(el.current_log_id)
    path = el.log_path(old)
    assert el.delete_log(old) is True and not os.path.exists(path)
    assert el.delete_log(old) is False
    assert old not in el.log_ids()
    with pytest.raises(CorruptedStorageError):
        el.read_entry(1, 0, locs[0])
    el.close()
    el.close()  # idempotent
    with pytest.raises(StorageError):
        el.add_entries([entry(1, 9, 1)])
    with pytest.raises(StorageError):
        el.read_entry(1, 3, locs[3])


def test_failed_write_abandons_the_log_and_keeps_earlier_entries(tmp_path, monkeypatch):
    el = EntryLogger([str(tmp_path)], cfg())
    good = el.add_entries([entry(1, i, 100) for i in range(3)])
    first = el.current_log_id
    real_write = logger_mod.DurableFile.write
    calls = {"n": 0}

    def failing_write(self, data):
        calls["n"] += 1
        real_write(self, bytes(data)[:7])  # a partial record reaches the file
        raise DiskFullError("no space left on device (test)")

    monkeypatch.setattr(logger_mod.DurableFile, "write", failing_write)
    with pytest.raises(DiskFullError):
        el.add_entries([entry(1, 3, 100)])
    monkeypatch.setattr(logger_mod.DurableFile, "write", real_write)
    el.flush()  # owes the abandoned log its fsync
    [loc] = el.add_entries([entry(1, 3, 100)])
    assert fmt.split_location(loc)[0] == first + 1
    for i, l in enumerate(good):
        assert el.read_entry(1, i, l) == entry(1, i, 100)
    scan = el.scan(first)
    assert [r[1] for r in scan] == [0, 1, 2] and scan.status == 0  # partial record was cut
    el.close()


def test_size_limit_must_fit_a_location(tmp_path):
    with pytest.raises(ConfigError, match="entry_log_size_limit_bytes"):
        EntryLogger([str(tmp_path)], cfg(entry_log_size_limit_bytes=5 * 1024 ** 3))


def test_concurrent_readers_while_the_writer_rotates(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    published: list = []  # (entry, location), appended only after add_entries returned
    errors: list = []
    done = threading.Event()

    def reader(seed):
        rng = random.Random(seed)
        try:
            while not done.is_set() or rng.random() < 0.5:
                if published:
                    e, loc = published[rng.randrange(len(published))]
                    assert el.read_entry(*struct.unpack(">qq", e[:16]), loc) == e
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for i in range(300):
        es = [entry(7, 2 * i, 1500), entry(8, 2 * i + 1, 700)]
        published.extend(zip(es, el.add_entries(es)))
        if i % 50 == 0:
            el.flush()
    done.set()
    for t in threads:
        t.join()
    assert errors == []
    assert len(el.log_ids()) > 5
    el.close()


def test_read_fd_cache_is_bounded(tmp_path, monkeypatch):
    el = EntryLogger([str(tmp_path)], cfg())
    el._files._max_open = 3
    locs = [el.add_entries([entry(1, i, 40_000)])[0] for i in range(10)]  # one log each
    assert len({fmt.split_location(l)[0] for l in locs}) == 10
    for _ in range(2):
        for i, loc in enumerate(locs):
            assert el.read_entry(1, i, loc) == entry(1, i, 40_000)
            assert el._files.open_count() <= 3
    el.close()


def test_ledgers_map_matches_the_records_for_interleaved_batches(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg())
    rng = random.Random(11)
    for b in range(60):
        batch = [entry(rng.choice([1, 2, 3, 1 << 40]), b * 100 + i, rng.randrange(0, 3000))
                 for i in range(rng.randrange(1, 20))]
        if b % 3 == 0:
            batch.sort()  # sorted batches: long runs of one ledger
        el.add_entries([memoryview(e) for e in batch] if b % 5 == 0 else batch)
    assert len(el.log_ids()) > 4
    for log_id in el.log_ids():  # closed logs from their stored map, the current one from memory
        from_records: dict = {}
        for lid, _, _, size in el.scan(log_id):
            from_records[lid] = from_records.get(lid, 0) + size + 4
        assert el.ledgers_map(log_id) == from_records
    el.close()


def test_big_batches_are_framed_in_slices(tmp_path, monkeypatch):
    monkeypatch.setattr(logger_mod, "_FRAME_MAX_BYTES", 5000)
    el = EntryLogger([str(tmp_path)], cfg())
    es = [entry(1, i, random.Random(i).randrange(0, 7000)) for i in range(60)]
    locs = el.add_entries(es)
    assert len(locs) == 60 and len(el.log_ids()) > 1
    for i, (e, loc) in enumerate(zip(es, locs)):
        assert el.read_entry(1, i, loc) == e
    assert [r[2] for log_id in el.log_ids() for r in el.scan(log_id)] == locs
    el.close()


@pytest.mark.parametrize("copy", [False, True], ids=["split", "copied"])
def test_big_entries_written_without_a_copy_land_where_a_frame_would(tmp_path, monkeypatch, copy):
    """Batches of big entries go out as (size field, entry) buffers, IOV_MAX at a
    time, across slices and rotations: the logs hold exactly the copied frames."""
    if copy:
        monkeypatch.setattr(logger_mod, "SPLIT_MIN_ENTRY_BYTES", 1 << 40)
    monkeypatch.setattr(logger_mod, "IOV_MAX", 5)
    monkeypatch.setattr(logger_mod, "_FRAME_MAX_BYTES", 100 * KiB)
    el = EntryLogger([str(tmp_path)], cfg(entry_log_size_limit_bytes=256 * KiB))
    rng = random.Random(5)
    es = [entry(rng.randrange(3), i, rng.choice([20 * KiB, 40 * KiB, 100, 90 * KiB])) for i in range(60)]
    es.sort(key=lambda e: e[:16])
    batch = [bytearray(e) if i % 7 == 0 else memoryview(e) if i % 5 == 0 else e for i, e in enumerate(es)]
    locs = el.add_entries(batch)
    assert len(el.log_ids()) > 3
    for e, loc in zip(es, locs):
        lid, eid = struct.unpack(">qq", e[:16])
        assert el.read_entry(lid, eid, loc) == e
    assert [r[2] for log_id in el.log_ids() for r in el.scan(log_id)] == locs
    for log_id in el.log_ids():
        usage: dict = {}
        for lid, _, _, size in el.scan(log_id):
            usage[lid] = usage.get(lid, 0) + size + 4
        assert el.ledgers_map(log_id) == usage
    el.close()


def test_failed_split_write_abandons_the_log_after_some_buffers_landed(tmp_path, monkeypatch):
    monkeypatch.setattr(logger_mod, "IOV_MAX", 3)  # the failure comes after one pwritev succeeded
    el = EntryLogger([str(tmp_path)], cfg(entry_log_size_limit_bytes=1024 * KiB))
    good = el.add_entries([entry(1, i, 20 * KiB) for i in range(2)])
    first = el.current_log_id
    real_writev = logger_mod.DurableFile.writev
    calls = {"n": 0}

    def failing_writev(self, buffers):
        calls["n"] += 1
        if calls["n"] == 2:
            raise DiskFullError("no space left on device (test)")
        return real_writev(self, buffers)

    monkeypatch.setattr(logger_mod.DurableFile, "writev", failing_writev)
    with pytest.raises(DiskFullError):
        el.add_entries([entry(1, i, 20 * KiB) for i in range(2, 6)])
    monkeypatch.setattr(logger_mod.DurableFile, "writev", real_writev)
    el.flush()
    locs = el.add_entries([entry(1, i, 20 * KiB) for i in range(2, 6)])
    assert {fmt.split_location(loc)[0] for loc in locs} == {first + 1}
    for i, loc in enumerate(good + locs):
        assert el.read_entry(1, i, loc) == entry(1, i, 20 * KiB)
    scan = el.scan(first)
    assert [r[1] for r in scan] == [0, 1] and scan.status == 0  # the records of the failed batch were cut
    el.close()


def test_flush_bytes_syncs_in_steps_during_a_big_batch(tmp_path, monkeypatch):
    """entry_log_flush_bytes (BookKeeper's flushEntrylogBytes): a checkpoint's writes are
    fdatasynced every N bytes, each step one write of at most N bytes; 0 syncs only in flush()."""
    step = 64 * KiB
    entries = [entry(1, i, 1000) for i in range(300)]  # ~300 KiB: several steps
    for flush_bytes, expect_steps in ((step, True), (0, False)):
        el = EntryLogger([str(tmp_path / str(flush_bytes))], cfg(entry_log_size_limit_bytes=64 * 1024 ** 2,
                                                                  entry_log_flush_bytes=flush_bytes))
        syncs, writes = [], []
        real_fsync, real_write = logger_mod.DurableFile.fsync, logger_mod.DurableFile.write

        def fsync(self):
            syncs.append(self.size)
            real_fsync(self)

        def write(self, data):
            writes.append(len(data))
            return real_write(self, data)
        monkeypatch.setattr(logger_mod.DurableFile, "fsync", fsync)
        monkeypatch.setattr(logger_mod.DurableFile, "write", write)
        locs = el.add_entries(entries)
        during = list(syncs)
        el.flush()
        monkeypatch.undo()
        if expect_steps:
            # a sync once at least `step` bytes are unsynced; no write bigger than a step
            assert len(during) >= 2 and max(w for w in writes if w > fmt.LOG_HEADER_BYTES) <= step
            assert all(step <= b - a <= 2 * step for a, b in zip(during, during[1:]))
        else:
            assert during == [s for s in during if s <= fmt.LOG_HEADER_BYTES]  # only the new log's header
        assert [el.read_entry(1, i, loc) for i, loc in enumerate(locs)] == entries
        el.close()


def test_flush_steps_grow_while_the_checkpoint_is_behind(tmp_path, monkeypatch):
    """While `behind()` says the checkpoint falls behind the adds, the fdatasync steps
    grow to BEHIND_FLUSH_BYTES (more of the disk); otherwise they stay at
    entry_log_flush_bytes. Either way every entry is written and readable."""
    step, big = 64 * KiB, 256 * KiB
    monkeypatch.setattr(logger_mod, "BEHIND_FLUSH_BYTES", big)
    entries = [entry(1, i, 1000) for i in range(1100)]  # ~1.1 MiB
    gaps = {}
    for behind in (False, True):
        el = EntryLogger([str(tmp_path / str(behind))], cfg(entry_log_size_limit_bytes=64 * 1024 ** 2,
                                                             entry_log_flush_bytes=step))
        el.behind = lambda: behind
        syncs = []
        real_fsync = logger_mod.DurableFile.fsync

        def fsync(self):
            syncs.append(self.size)
            real_fsync(self)
        with monkeypatch.context() as m:
            m.setattr(logger_mod.DurableFile, "fsync", fsync)
            locs = el.add_entries(entries)
        during = [s for s in syncs if s > fmt.LOG_HEADER_BYTES]
        gaps[behind] = [b - a for a, b in zip(during, during[1:])]
        el.flush()
        assert [el.read_entry(1, i, loc) for i, loc in enumerate(locs)] == entries
        el.close()
    assert gaps[False] and all(step <= g < big for g in gaps[False])
    assert gaps[True] and all(big <= g <= big + step for g in gaps[True])
    assert len(gaps[True]) < len(gaps[False]) / 2


def test_flush_bytes_steps_are_off_with_the_journal_off(tmp_path):
    el = EntryLogger([str(tmp_path)], cfg(entry_log_flush_bytes=64 * KiB, journal_write_data=False))
    assert el._flush_bytes == 0
    el.close()
    el = EntryLogger([str(tmp_path / "on")], cfg(entry_log_flush_bytes=64 * KiB))
    assert el._flush_bytes == 64 * KiB
    el.close()


@pytest.mark.parametrize("remove", [True, False])
def test_synced_entry_log_pages_are_dropped(tmp_path, fadvise_calls, remove):
    advice = fadvise_calls
    el = EntryLogger([str(tmp_path)], cfg(entry_log_size_limit_bytes=64 * 1024 ** 2, entry_log_flush_bytes=64 * KiB,
                                          entry_log_remove_pages_from_cache=remove))
    entries = [entry(1, i, 1000) for i in range(300)]
    locs = el.add_entries(entries)
    el.flush()
    if remove:
        assert len(advice) >= 2 and all(how == os.POSIX_FADV_DONTNEED for _, _, how in advice)
        assert all(a[0] + a[1] == b[0] for a, b in zip(advice, advice[1:]))  # contiguous, whole pages
        assert all(off % 4096 == 0 and n % 4096 == 0 for off, n, _ in advice)
    else:
        assert advice == []
    assert [el.read_entry(1, i, loc) for i, loc in enumerate(locs)] == entries  # read back from the disk
    el.close()


def test_flush_bytes_must_not_be_negative(tmp_path):
    with pytest.raises(ConfigError, match="entry_log_flush_bytes"):
        cfg(entry_log_flush_bytes=-1)


def test_a_scan_hints_each_block_once(tmp_path, monkeypatch):
    # A WILLNEED call walks the page cache of its whole range; a scan's read-aheads inside one
    # block ask nothing new, the first past it asks for the one new block only.
    el, _, locs, advice = _advised_log(tmp_path, monkeypatch, 1000)  # ~1 MB
    run = el.read_run(locs[0], 10, 8192, hint_bytes=65536)
    advice.clear()
    el.read_run(locs[len(run)], 10, 8192, hint_bytes=65536)  # still before 64 KiB: asked already
    assert advice == []
    past = next(i for i, loc in enumerate(locs) if fmt.split_location(loc)[1] >= 65536)
    el.read_run(locs[past], 10, 8192, hint_bytes=65536)
    assert advice == [(3 * 65536, 65536, os.POSIX_FADV_WILLNEED)]
    advice.clear()
    el.read_run(locs[0], 10, 8192, hint_bytes=65536)  # another scan from the start: asked whole again
    assert advice == [(65536, 2 * 65536, os.POSIX_FADV_WILLNEED)]
    el.close()
