"""Journal writer: group commit, completions, rotation, gc, sync modes, I/O errors.

Helpers at the top are shared with test_journal_replay.py.
"""
from __future__ import annotations

import asyncio
import os
import struct
import threading
import time

import pytest

import bk.fileio
from bk.config import load_config
from bk.errors import BadRequestError, DiskFullError, StorageError
from bk.fileio import DurableFile
from bk.journal.journal import FIELDS
from bk.formats.journal import JOURNAL_V1_HEADER_BYTES
from bk.journal import (
    EXPLICIT_LAC,
    FENCE,
    MASTER_KEY,
    Journal,
    LogMark,
    file_path,
    list_files,
    meta_body,
)

_ids = struct.Struct(">qq")


# ---------------------------------------------------------------- shared helpers
def make_config(**overrides):
    # format 1 (appended; still written on request and always read): these tests know its
    # byte layout. Format 2 (in place, the default) has tests/unit/test_journal_inplace.py.
    base = {"journal_max_group_wait_ms": 1.0, "journal_flush_when_queue_empty": True,
            "journal_format_version_to_write": 1}
    base.update(overrides)
    return load_config(env={}, overrides=base)


def entry(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    """An entry-shaped record body of `size` bytes starting with the ids."""
    head = _ids.pack(ledger_id, entry_id)
    fill = (f"L{ledger_id}E{entry_id}|" * (size // 4 + 1)).encode()
    return head + fill[: max(0, size - len(head))]


class Completions:
    """Collects journal callbacks; wait(n) blocks until n of them arrived."""

    def __init__(self):
        self.done: list = []
        self.threads: set = set()
        self._cond = threading.Condition()

    def cb(self, ctx, exc):
        with self._cond:
            self.done.append((ctx, exc))
            self.threads.add(threading.current_thread().name)
            self._cond.notify_all()

    def wait(self, n: int, timeout_s: float = 20.0) -> list:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.done) >= n, timeout_s)
        assert ok, f"only {len(self.done)} of {n} journal completions arrived"
        return self.done


def replay_all(journal_dir: str, config, mark=LogMark(0, 0)):
    got = []
    j = Journal(journal_dir, config)
    result = j.replay(mark, lambda l, e, body: got.append((l, e, bytes(body))))
    return result, got


@pytest.fixture(params=["native", "pure"])
def kernel_mode(request, monkeypatch):
    """Run a test with the native journal kernel and again with the pure twin."""
    if request.param == "pure":
        monkeypatch.setenv("BK_NO_NATIVE", "1")
    else:
        from bk._native import load_native
        if os.environ.get("BK_NO_NATIVE") or load_native("journal") is None:
            pytest.skip("native journal kernel not in use")
    return request.param


# ---------------------------------------------------------------- tests
def test_log_before_start_and_after_stop_fails_the_callback(tmp_path):
    j = Journal(str(tmp_path), make_config())
    c = Completions()
    j.log(entry(1, 0), c.cb, "early")
    assert c.wait(1)[0][0] == "early" and isinstance(c.done[0][1], StorageError)
    j.start()
    j.log(entry(1, 1), c.cb, "ok")
    j.stop()
    with pytest.raises(RuntimeError):
        j.start()
    j.log(entry(1, 2), c.cb, "late")
    assert [(ctx, exc is None) for ctx, exc in c.wait(3)] == [("early", False), ("ok", True), ("late", False)]


def test_bad_body_is_rejected_and_nothing_is_queued(tmp_path):
    j = Journal(str(tmp_path), make_config())
    j.start()
    c = Completions()
    with pytest.raises(BadRequestError):
        j.log(b"short", c.cb, 0)
    with pytest.raises(BadRequestError):
        j.log(b"x" * (j._max_record_bytes + 1), c.cb, 0)
    j.log(entry(1, 0), c.cb, 1)
    j.stop()
    assert c.done == [(1, None)]


def test_non_buffer_body_fails_only_its_own_record(tmp_path):
    j = Journal(str(tmp_path), make_config(journal_max_group_wait_ms=50, journal_flush_when_queue_empty=False))
    c = Completions()
    j.start()
    j.log(entry(1, 0), c.cb, 0)
    j.log("a str is not bytes-like!", c.cb, 1)
    j.log(entry(1, 2), c.cb, 2)
    j.stop()
    result = dict(c.wait(3))
    assert result[0] is None and result[2] is None and isinstance(result[1], BadRequestError)
    assert [e for _, e, _ in replay_all(str(tmp_path), make_config())[1]] == [0, 2]


def test_group_commit_from_loop_and_threads(tmp_path, kernel_mode):
    """Every record completes once, on the loop, in journal order, one loop call per group."""
    cfg = make_config(journal_max_group_wait_ms=2.0, journal_flush_when_queue_empty=False)
    n_threads, per_thread, from_loop = 4, 500, 800

    async def main():
        loop = asyncio.get_running_loop()
        calls = []

        class CountingLoop:  # forwards to the real loop, counting hand-overs
            def call_soon_threadsafe(self, fn, *args):
                calls.append(len(args[0]) // FIELDS)  # items are flat: body, cb, ctx
                return loop.call_soon_threadsafe(fn, *args)

        j = Journal(str(tmp_path), cfg, loop=CountingLoop())
        j.start()
        order: list = []
        loop_thread = threading.current_thread()
        all_done = asyncio.Event()
        total = n_threads * per_thread + from_loop
        wrong_thread = []

        def cb(ctx, exc):
            assert exc is None
            if threading.current_thread() is not loop_thread:
                wrong_thread.append(ctx)
            order.append(ctx)
            if len(order) == total:
                all_done.set()

        lock = threading.Lock()
        logged: list = []  # the order log() calls happened in

        def producer(t):
            for i in range(per_thread):
                with lock:
                    j.log(entry(t, i), cb, (t, i))
                    logged.append((t, i))

        threads = [threading.Thread(target=producer, args=(t,)) for t in range(1, n_threads + 1)]
        for t in threads:
            t.start()
        for i in range(from_loop):
            with lock:
                j.log(entry(0, i), cb, (0, i))
                logged.append((0, i))
            if i % 100 == 0:
                await asyncio.sleep(0)
        for t in threads:
            t.join()
        await asyncio.wait_for(all_done.wait(), 30)
        j.stop()
        return j, order, logged, calls, wrong_thread

    j, order, logged, calls, wrong_thread = asyncio.run(main())
    assert wrong_thread == []
    assert order == logged  # completions in journal (log) order, each exactly once
    assert len(calls) == j.groups_written and sum(calls) == len(order)
    assert j.records_written == len(order)
    _, got = replay_all(str(tmp_path), cfg)
    assert [(l, e) for l, e, _ in got] == logged


def test_no_loop_runs_callbacks_on_the_journal_thread(tmp_path):
    j = Journal(str(tmp_path), make_config(), index=3)
    j.start()
    c = Completions()
    for i in range(10):
        j.log(entry(1, i), c.cb, i)
    c.wait(10)
    j.stop()
    assert c.threads == {"bk-journal-3"}
    assert [ctx for ctx, _ in c.done] == list(range(10))


def test_records_arriving_during_fsync_form_the_next_group(tmp_path, monkeypatch):
    in_fsync, release = threading.Event(), threading.Event()
    real_fsync = DurableFile.fsync
    j = Journal(str(tmp_path), make_config())
    j.start()

    def slow_fsync(self):
        if not release.is_set():
            in_fsync.set()
            release.wait(10)
        real_fsync(self)

    monkeypatch.setattr(DurableFile, "fsync", slow_fsync)
    c = Completions()
    j.log(entry(1, 0), c.cb, 0)
    assert in_fsync.wait(10)
    for i in range(1, 51):
        j.log(entry(1, i), c.cb, i)
    release.set()
    c.wait(51)
    j.stop()
    assert j.groups_written == 2
    assert [ctx for ctx, _ in c.done] == list(range(51))


class InlineLoop:
    """Stands in for the event loop: records each hand-over's group size, runs it inline."""

    def __init__(self):
        self.group_sizes: list[int] = []

    def call_soon_threadsafe(self, fn, *args):
        self.group_sizes.append(len(args[0]) // FIELDS)  # items are flat: body, cb, ctx
        fn(*args)


def test_deep_queue_of_big_records_forms_threshold_sized_groups(tmp_path, monkeypatch):
    in_fsync, release = threading.Event(), threading.Event()
    real_fsync = DurableFile.fsync
    cfg = make_config(journal_buffered_writes_threshold_bytes=256 * 1024)
    loop = InlineLoop()
    j = Journal(str(tmp_path), cfg, loop=loop)
    j.start()

    def slow_fsync(self):
        if not release.is_set():
            in_fsync.set()
            release.wait(10)
        real_fsync(self)

    monkeypatch.setattr(DurableFile, "fsync", slow_fsync)
    c = Completions()
    j.log(entry(1, 0, 100), c.cb, 0)
    assert in_fsync.wait(10)
    for i in range(1, 41):  # 40 x 64 KiB queue up behind the blocked fsync
        j.log(entry(1, i, 64 * 1024), c.cb, i)
    release.set()
    c.wait(41)
    j.stop()
    assert [ctx for ctx, _ in c.done] == list(range(41))
    # 256 KiB groups hold 4 records of 64 KiB + 8 bytes of framing (the 4th crosses it)
    assert loop.group_sizes[0] == 1 and sum(loop.group_sizes) == 41
    assert max(loop.group_sizes[1:]) <= 5 and len(loop.group_sizes) >= 9


def test_threshold_flushes_without_waiting_for_max_wait(tmp_path):
    # a one-minute group wait: only the byte threshold can flush these records
    cfg = make_config(journal_max_group_wait_ms=60_000, journal_flush_when_queue_empty=False,
                      journal_buffered_writes_threshold_bytes=4096)
    j = Journal(str(tmp_path), cfg)
    j.start()
    c = Completions()
    for i in range(5):
        j.log(entry(1, i, 1000), c.cb, i)
    c.wait(5)
    j.stop()
    assert all(exc is None for _, exc in c.done)


def test_a_waiting_group_is_woken_by_the_record_that_fills_it(tmp_path):
    # The writer has taken the first record and waits (one-minute deadline) for more;
    # records trickle in one by one, each after the writer is asleep again: log()
    # must wake it once the queue holds what fills the 4 KiB group.
    cfg = make_config(journal_max_group_wait_ms=60_000, journal_flush_when_queue_empty=False,
                      journal_buffered_writes_threshold_bytes=4096)
    j = Journal(str(tmp_path), cfg)
    j.start()
    c = Completions()
    for i in range(8):
        j.log(entry(1, i, 1000), c.cb, i)
        time.sleep(0.02)
    c.wait(4, timeout_s=10)  # the first four records fill a group: written long before the deadline
    j.stop()  # the rest (a group that never fills) is written by stop
    assert sorted(ctx for ctx, _ in c.done) == list(range(8))
    assert all(exc is None for _, exc in c.done)


def test_max_group_wait_flushes_a_small_group(tmp_path):
    cfg = make_config(journal_max_group_wait_ms=5, journal_flush_when_queue_empty=False)
    j = Journal(str(tmp_path), cfg)
    j.start()
    c = Completions()
    j.log(entry(1, 0), c.cb, 0)
    c.wait(1)  # the threshold (512 KiB) is never reached: the wait deadline flushed it
    j.stop()


def test_stop_drains_the_queue(tmp_path):
    cfg = make_config(journal_max_group_wait_ms=60_000, journal_flush_when_queue_empty=False)
    j = Journal(str(tmp_path), cfg)
    j.start()
    c = Completions()
    for i in range(100):
        j.log(entry(7, i), c.cb, i)
    j.stop()
    assert [ctx for ctx, exc in c.done if exc is None] == list(range(100))
    assert len(replay_all(str(tmp_path), cfg)[1]) == 100


def test_rotation_creates_consecutive_files_with_headers(tmp_path):
    cfg = make_config(journal_max_size_bytes=64 * 1024)
    j = Journal(str(tmp_path), cfg)
    j.start()
    first = j.current_file_id
    c = Completions()
    for i in range(300):
        j.log(entry(2, i, 1000), c.cb, i)
        if i % 20 == 19:
            c.wait(i + 1)  # groups of ~20 KB, so files fill over several groups
    j.stop()
    files = list_files(str(tmp_path))
    ids = [fid for fid, _ in files]
    assert ids == list(range(first, first + len(ids))) and len(ids) >= 3
    for fid, path in files:
        with open(path, "rb") as fh:
            head = fh.read(JOURNAL_V1_HEADER_BYTES)
        assert head == b"BKJN" + struct.pack(">IQ", 1, fid)
    for _, path in files[:-1]:
        assert os.path.getsize(path) >= 64 * 1024
    result, got = replay_all(str(tmp_path), cfg)
    assert [e for _, e, _ in got] == list(range(300))
    assert result.end_mark == LogMark(ids[-1], os.path.getsize(files[-1][1]))


def test_gc_deletes_files_behind_the_mark_only(tmp_path):
    cfg = make_config(journal_max_size_bytes=64 * 1024)
    j = Journal(str(tmp_path), cfg)
    j.start()
    c = Completions()
    for i in range(200):
        j.log(entry(3, i, 1000), c.cb, i)
        if i % 20 == 19:
            c.wait(i + 1)  # small groups: the 64 KiB files fill over several of them
        if i == 149:
            mark = j.last_mark()
    c.wait(200)
    j.stop()  # no rotation may race with the listings below
    before = [fid for fid, _ in list_files(str(tmp_path))]
    assert mark.file_id >= 2
    assert j.gc(mark) == sum(1 for fid in before if fid < mark.file_id) >= 1
    after = [fid for fid, _ in list_files(str(tmp_path))]
    assert after == [fid for fid in before if fid >= mark.file_id]
    # a mark beyond the current file never deletes the file being written
    j2 = Journal(str(tmp_path), cfg)
    j2.start()
    remaining = len(list_files(str(tmp_path)))
    assert j2.gc(LogMark(j2.current_file_id + 5, 0)) == remaining - 1
    assert [fid for fid, _ in list_files(str(tmp_path))] == [j2.current_file_id]
    j2.log(entry(3, 200, 1000), c.cb, 200)
    c.wait(201)
    j2.stop()
    _, got = replay_all(str(tmp_path), cfg, LogMark(j2.current_file_id, 0))
    assert [(l, e) for l, e, _ in got] == [(3, 200)]


def test_last_mark_tracks_written_records(tmp_path):
    j = Journal(str(tmp_path), make_config())
    j.start()
    assert j.last_mark() == LogMark(j.current_file_id, JOURNAL_V1_HEADER_BYTES)
    c = Completions()
    j.log(entry(1, 0, 100), c.cb, 0)
    c.wait(1)
    assert j.last_mark() == LogMark(j.current_file_id, JOURNAL_V1_HEADER_BYTES + 108)
    j.stop()


def test_meta_records_round_trip(tmp_path):
    cfg = make_config()
    j = Journal(str(tmp_path), cfg)
    j.start()
    c = Completions()
    bodies = [meta_body(9, MASTER_KEY, b"k" * 20), entry(9, 0), meta_body(9, FENCE),
              meta_body(9, EXPLICIT_LAC, b"\x00lac-buffer")]
    for i, b in enumerate(bodies):
        j.log(b, c.cb, i)
    j.stop()
    _, got = replay_all(str(tmp_path), cfg)
    assert got == [(9, MASTER_KEY, bodies[0]), (9, 0, bodies[1]), (9, FENCE, bodies[2]),
                   (9, EXPLICIT_LAC, bodies[3])]
    with pytest.raises(ValueError):
        meta_body(9, -1, b"")


def _count_fdatasync(monkeypatch):
    calls = []
    real = os.fdatasync

    def counting(fd):
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(bk.fileio.os, "fdatasync", counting)
    return calls


def test_sync_data_false_never_fsyncs(tmp_path, monkeypatch):
    calls = _count_fdatasync(monkeypatch)
    cfg = make_config(journal_sync_data=False)
    j = Journal(str(tmp_path), cfg)
    j.start()
    c = Completions()
    for i in range(50):
        j.log(entry(1, i), c.cb, i)
    c.wait(50)
    j.stop()
    assert calls == []
    assert len(replay_all(str(tmp_path), cfg)[1]) == 50


def test_sync_data_true_fsyncs_once_per_group(tmp_path, monkeypatch):
    j = Journal(str(tmp_path), make_config())
    j.start()
    calls = _count_fdatasync(monkeypatch)
    c = Completions()
    for i in range(50):
        j.log(entry(1, i), c.cb, i)
    c.wait(50)
    j.stop()
    assert len(calls) == j.groups_written >= 1


@pytest.mark.parametrize("where", ["write", "fsync", "unexpected"])
def test_io_error_fails_the_group_and_everything_after(tmp_path, monkeypatch, where):
    cfg = make_config()
    j = Journal(str(tmp_path), cfg)
    j.start()
    c = Completions()
    j.log(entry(1, 0), c.cb, "before")
    c.wait(1)

    def boom(self, *a):
        if where == "disk_full":
            raise DiskFullError(f"no space left on device while writing {self.path}")
        if where == "unexpected":
            raise RuntimeError("a bug below the journal")
        raise StorageError(f"I/O error while {where} {self.path}")

    if where == "fsync":
        monkeypatch.setattr(DurableFile, "fsync", boom)
    else:
        monkeypatch.setattr(DurableFile, "write", boom)
        monkeypatch.setattr(DurableFile, "writev", boom)
    for i in range(1, 20):
        j.log(entry(1, i), c.cb, i)
    c.wait(20)
    j.log(entry(1, 99), c.cb, "after-failure")
    c.wait(21)
    monkeypatch.undo()
    j.stop()
    assert c.done[0] == ("before", None)
    assert all(isinstance(exc, StorageError) for _, exc in c.done[1:])
    assert isinstance(j.failed, StorageError)
    assert c.done[-1][0] == "after-failure"


def test_disk_full_fails_its_groups_only_and_cuts_the_partial_write(tmp_path, monkeypatch):
    """A write that finds no space is not fsyncgate: nothing failed to sync. The group is
    failed (never acknowledged), the file is cut back to the group's start, and once
    there is room again the journal goes on; replay sees no hole."""
    j = Journal(str(tmp_path), make_config())
    errors = []
    j.on_error = errors.append
    j.start()
    c = Completions()
    j.log(entry(1, 0), c.cb, 0)
    c.wait(1)
    real_write = DurableFile.write

    def short_then_full(self, data):
        real_write(self, bytes(data)[:5])  # a short write, then no space
        raise DiskFullError(f"no space left on device while writing {self.path}")

    monkeypatch.setattr(DurableFile, "write", short_then_full)
    monkeypatch.setattr(DurableFile, "writev", lambda self, bufs: short_then_full(self, b"".join(bufs)))
    for i in range(1, 4):
        j.log(entry(1, i), c.cb, i)
        c.wait(i + 1)
    monkeypatch.undo()
    assert j.failed is None
    assert errors and all(isinstance(e, DiskFullError) for e in errors)
    for i in range(4, 6):
        j.log(entry(1, i), c.cb, i)
    c.wait(6)
    j.stop()
    assert [exc is None for _, exc in c.done] == [True, False, False, False, True, True]
    replayed = []
    j2 = Journal(str(tmp_path), make_config())
    j2.replay(LogMark(0, 0), lambda lid, eid, body: replayed.append(eid))
    assert replayed == [0, 4, 5]


@pytest.mark.parametrize("error", [StorageError, DiskFullError])
def test_rotation_failure(tmp_path, monkeypatch, error):
    """An I/O error opening the next file fails later records; a full disk does not: the
    old file stays current (the new one is tried again after the next group)."""
    cfg = make_config(journal_max_size_bytes=64 * 1024)
    j = Journal(str(tmp_path), cfg)
    j.start()

    def no_file(self, file_id):
        raise error(f"cannot create journal file {file_id:x}")

    monkeypatch.setattr(Journal, "_open_file", no_file)
    c = Completions()
    j.log(entry(1, 0, 70 * 1024), c.cb, "fills-the-file")
    c.wait(1)
    j.log(entry(1, 1), c.cb, "after-rotation-failed")
    c.wait(2)
    monkeypatch.undo()
    j.log(entry(1, 2), c.cb, "later")
    c.wait(3)
    j.stop()
    assert c.done[0] == ("fills-the-file", None)
    assert c.done[1][0] == "after-rotation-failed"
    if error is DiskFullError:
        assert c.done[1][1] is None and c.done[2][1] is None and j.failed is None
        assert j.current_file_id == 2  # rotated once the disk had room
    else:
        assert isinstance(c.done[1][1], StorageError) and isinstance(j.failed, StorageError)


def test_start_after_replay_of_a_wiped_directory_sorts_after_the_mark(tmp_path):
    # the index remembers mark (5, x) but the journal files are gone: new files
    # must sort after the mark or a later replay would skip them
    cfg = make_config()
    j = Journal(str(tmp_path), cfg)
    result = j.replay(LogMark(5, 400), lambda *a: None)
    assert result.records == 0 and result.cut_tail is None
    j.start()
    assert j.current_file_id == 6
    j.stop()


def test_start_uses_highest_existing_id_plus_one(tmp_path):
    cfg = make_config()
    for expected in (1, 2, 3):
        j = Journal(str(tmp_path), cfg)
        j.start()
        assert j.current_file_id == expected
        assert os.path.exists(file_path(str(tmp_path), expected))
        j.stop()


def test_big_records_are_written_without_a_frame_copy_and_replay_the_same(tmp_path, kernel_mode, monkeypatch):
    """Batches of big bodies go out as header + body buffers (pwritev, IOV_MAX at a
    time); the file is byte-for-byte what framing them would give, whatever mix of
    sizes and buffer types."""
    from bk.journal import journal as journal_mod
    monkeypatch.setattr(journal_mod, "IOV_MAX", 7)  # many pwritev calls per group
    cfg = make_config(journal_max_group_wait_ms=50, journal_flush_when_queue_empty=False,
                      journal_buffered_writes_threshold_bytes=16 * 1024 * 1024)
    j = Journal(str(tmp_path), cfg)
    c = Completions()
    bodies = []
    for i in range(700):
        size = journal_mod.SPLIT_MIN_BODY_BYTES + (i % 7) * 1000 if i % 50 else 100
        body = entry(3, i, size)
        bodies.append(body)
        j_body = bytearray(body) if i % 11 == 0 else (memoryview(body) if i % 13 == 0 else body)
        if i == 0:
            j.start()
        j.log(j_body, c.cb, i)
    j.stop()
    assert [ctx for ctx, exc in c.wait(700) if exc is None] == list(range(700))
    _, got = replay_all(str(tmp_path), cfg)
    assert [b for _, _, b in got] == bodies
    from bk._native import load
    with open(file_path(str(tmp_path), 1), "rb") as f:
        assert f.read()[JOURNAL_V1_HEADER_BYTES:] == load("journal").frame_records(bodies)


def test_a_bad_body_among_big_records_fails_alone(tmp_path):
    from bk.journal import journal as journal_mod
    j = Journal(str(tmp_path), make_config(journal_max_group_wait_ms=50, journal_flush_when_queue_empty=False))
    c = Completions()
    j.start()
    big = journal_mod.SPLIT_MIN_BODY_BYTES * 2
    j.log(entry(1, 0, big), c.cb, 0)
    j.log("x" * big, c.cb, 1)  # a str has a length but is not bytes-like
    j.log(entry(1, 2, big), c.cb, 2)
    j.stop()
    result = dict(c.wait(3))
    assert result[0] is None and result[2] is None and isinstance(result[1], BadRequestError)
    assert [e for _, e, _ in replay_all(str(tmp_path), make_config())[1]] == [0, 2]


# ---------------------------------------------------------------- log_many (the bookie's add batches)
def test_log_many_completes_once_when_the_last_group_is_durable(tmp_path, kernel_mode):
    cfg = make_config(journal_buffered_writes_threshold_bytes=1024)  # splits the run over groups
    loop = InlineLoop()
    j = Journal(str(tmp_path), cfg, loop=loop)
    j.start()
    c, written = Completions(), []

    def cb(ctx, exc):
        written.append(j.records_written)  # at completion, every record of the run is written
        c.cb(ctx, exc)
    j.log(entry(1, 0), cb, "single")
    j.log_many([entry(1, i) for i in range(1, 21)], cb, "run")
    j.log(entry(1, 21), cb, "after")
    c.wait(3)
    j.stop()
    assert c.done == [("single", None), ("run", None), ("after", None)] and written[1] >= 21
    assert len(loop.group_sizes) >= 3 and sum(loop.group_sizes) == 22
    assert [e for _, e, _ in replay_all(str(tmp_path), cfg)[1]] == list(range(22))


def test_log_many_run_fails_when_any_of_its_groups_fails(tmp_path, monkeypatch):
    j = Journal(str(tmp_path), make_config(journal_buffered_writes_threshold_bytes=1024), loop=InlineLoop())
    j.start()
    c, writes = Completions(), []

    def first_write_fails(self, *a):  # the run's first group fails, its later groups are never written
        writes.append(a)
        raise StorageError(f"I/O error while writing {self.path}")
    for name in ("write", "writev"):
        monkeypatch.setattr(DurableFile, name, first_write_fails)
    j.log_many([entry(2, i) for i in range(20)], c.cb, "run")
    c.wait(1)
    j.log_many([entry(2, i) for i in range(20, 25)], c.cb, "later run")
    c.wait(2)
    monkeypatch.undo()
    j.stop()
    assert len(writes) == 1 and [ctx for ctx, _ in c.done] == ["run", "later run"]
    assert all(isinstance(exc, StorageError) for _, exc in c.done)


def test_log_many_refuses_bad_bodies_whole_and_fails_when_not_started(tmp_path):
    j, c = Journal(str(tmp_path), make_config()), Completions()
    j.log_many([entry(3, 0)], c.cb, "early")
    assert isinstance(c.wait(1)[0][1], StorageError)
    j.start()
    for bad in ([], [entry(3, 1), b"short"], [bytearray(entry(3, 2))], [b"x" * (j._max_record_bytes + 1)]):
        with pytest.raises(BadRequestError):
            j.log_many(bad, c.cb, "bad")
    j.log_many([entry(3, 1), entry(3, 2)], c.cb, "ok")
    j.stop()
    assert [ctx for ctx, _ in c.wait(2)] == ["early", "ok"] and c.done[1][1] is None
    assert [e for _, e, _ in replay_all(str(tmp_path), make_config())[1]] == [1, 2]


@pytest.mark.parametrize("remove", [True, False])
def test_synced_journal_pages_are_dropped_from_the_page_cache(tmp_path, fadvise_calls, remove):
    """journal_remove_pages_from_cache: after each group's fsync, POSIX_FADV_DONTNEED of the
    whole pages below the durable size that were not dropped yet; the partial last page stays
    (the next group rewrites it). Replay still reads every record."""
    advice = fadvise_calls
    cfg = make_config(journal_remove_pages_from_cache=remove)
    j = Journal(str(tmp_path), cfg)
    j.start()
    c = Completions()
    for i in range(40):  # ~40 groups of a 3000-byte record each (each waits for its completion)
        j.log(entry(1, i, 3000), c.cb, i)
        c.wait(i + 1)
    j.stop()
    if not remove:
        assert advice == []
    else:
        assert advice and all(how == os.POSIX_FADV_DONTNEED for _, _, how in advice)
        assert advice[0][0] == 0 and all(off % 4096 == 0 and n % 4096 == 0 and n > 0 for off, n, _ in advice)
        # contiguous ranges, never past the data written
        assert all(a[0] + a[1] == b[0] for a, b in zip(advice, advice[1:]))
        size = max(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())  # the one file written to
        assert advice[-1][0] + advice[-1][1] <= size
        assert advice[-1][0] + advice[-1][1] > size - 2 * 4096
    result, got = replay_all(str(tmp_path), cfg)
    assert [e for _, e, _ in got] == list(range(40)) and all(b == entry(1, e, 3000) for _, e, b in got)
