"""bk.bookie._ring and bk.bookie.read_ring: the bookie's single-entry reads through io_uring.

What the ring promises: every queued read gets exactly one answer (its bytes, short at the
end of a file, or an errno), more reads than its capacity wait their turn, close() waits
for reads the kernel holds (it writes their buffers) and answers the rest, and a reader
cancelled mid-read keeps its entry-log file until the kernel is done with it. And the
bookie reads the same entries, errors and "no such entry" through it as through its read
threads (bk.entrylog.reads: one set of steps, two drivers)."""
from __future__ import annotations

import asyncio
import errno
import hashlib
import os

import pytest

from bk import eventloop
from bk.bookie import Bookie
from bk.bookie.read_ring import RingReads, make_ring, ring_module
from bk.bookie.read_threads import ReadThreads
from bk.config import load_config
from bk.entrylog.reads import Pread
from bk.errors import ConfigError, LedgerLimboError, NoSuchEntryError, StorageError

pytestmark = pytest.mark.usefixtures("io_uring_reads")

KEY = hashlib.sha1(b"ring").digest()


def _reap(ring, want: int, answers: list) -> None:
    """Complete until `want` answers arrived (bounded: the reads are of a local file)."""
    for _ in range(10_000):
        if len(answers) >= want:
            return
        ring.submit()
        ring.complete()
    raise AssertionError(f"{len(answers)} of {want} reads answered")


def test_reads_answer_what_pread_reads_short_at_the_end_and_errors_as_errno(tmp_path):
    path = tmp_path / "f"
    data = os.urandom(300_000)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    ring = ring_module().Ring(8)  # fewer slots than reads: the rest wait, in order
    answers: dict[int, tuple] = {}
    try:
        asks = [(i * 7_001 % 290_000, 1 + i * 997 % 20_000) for i in range(40)]
        asks += [(299_990, 100), (300_000, 10), (400_000, 10)]  # short, at the end, past it
        for i, (off, n) in enumerate(asks):
            ring.read(fd, n, off, lambda d, e, i=i: answers.__setitem__(i, (None if d is None else bytes(d), e)))
        ring.read(-1, 10, 0, lambda d, e: answers.__setitem__("bad", (d, e)))
        assert ring.in_flight == len(asks) + 1
        _reap(ring, len(asks) + 1, answers)
        for i, (off, n) in enumerate(asks):
            assert answers[i] == (os.pread(fd, n, off), 0), i
        assert answers[len(asks) - 2] == (b"", 0) and len(answers[len(asks) - 3][0]) == 10
        assert answers["bad"] == (None, errno.EBADF)
        assert ring.in_flight == 0
        with pytest.raises(ValueError):
            ring.read(fd, 0, 0, print)
    finally:
        ring.close()
        os.close(fd)
    with pytest.raises(RuntimeError):
        ring.read(fd, 1, 0, print)


def _file_and_ring(tmp_path, data: bytes, capacity: int):
    path = tmp_path / "f"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY), ring_module().Ring(capacity), []


def test_close_waits_for_the_kernels_reads_and_answers_the_waiting_ones(tmp_path):
    fd, ring, answers = _file_and_ring(tmp_path, b"x" * 65536, 4)
    for i in range(10):
        ring.read(fd, 4096, i * 4096, lambda d, e, i=i: answers.append((i, None if d is None else len(d), e)))
    ring.submit()  # 4 in the kernel, 6 waiting for room
    ring.close()
    os.close(fd)
    assert sorted(answers) == [(i, 4096, 0) for i in range(4)] + [(i, None, errno.ECANCELED) for i in range(4, 10)]
    ring.close()  # twice is fine


def test_a_failed_submit_answers_each_unsent_read_once(tmp_path):
    fd, ring, answers = _file_and_ring(tmp_path, b"y" * 8192, 8)
    try:
        for i in range(3):
            ring.read(fd, 100, i, lambda d, e, i=i: answers.append((i, e)))
        ring.fail_prepared(errno.EIO)  # what RingReads does when io_uring_submit fails
        ring.fail_prepared(errno.EIO)  # nothing answered twice
        assert answers == [(0, errno.EIO), (1, errno.EIO), (2, errno.EIO)]
        ring.read(fd, 100, 0, lambda d, e: answers.append(("after", bytes(d))))
        _reap(ring, 4, answers)  # the no-ops go in with the next submit and answer nobody
        for _ in range(100):
            ring.complete()
        assert answers[3:] == [("after", b"y" * 100)]
        assert ring.in_flight == 0
    finally:
        ring.close()
        os.close(fd)


class _Handle:
    def __init__(self, fd: int, path: str):
        self.fd, self.path, self.released = fd, path, False


def _steps(h, n: int):
    try:
        data = yield Pread(h, n, 0)
        return bytes(data)
    finally:
        h.released = True


async def _a_read_waiting_on_a_pipe(tmp_path):
    """A ring whose one read waits in the kernel for a pipe's bytes: (threads, reads, r, w,
    handle, the reader's task)."""
    loop = asyncio.get_running_loop()
    threads = ReadThreads(loop, 1)
    reads = RingReads(loop, threads)
    r, w = os.pipe()
    h = _Handle(r, str(tmp_path / "pipe"))
    task = asyncio.ensure_future(reads.run(_steps(h, 5)))
    await asyncio.sleep(0.05)
    assert reads.in_flight == 1
    return threads, reads, r, w, h, task


def test_a_cancelled_reader_keeps_its_file_until_the_kernel_is_done(tmp_path):
    """A read of a pipe waits for its bytes; the reader is cancelled meanwhile. Its steps
    (which hold the file) close only when the kernel answers: a file released earlier
    could be closed and its fd number reused under a read still in the kernel."""
    async def main():
        threads, reads, r, w, h, task = await _a_read_waiting_on_a_pipe(tmp_path)
        try:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.05)
            assert not h.released and reads.in_flight == 1
            os.write(w, b"hello")
            for _ in range(200):
                if h.released:
                    break
                await asyncio.sleep(0.01)
            assert h.released and reads.in_flight == 0
            # and an uncancelled one gets its bytes
            h2 = _Handle(r, h.path)
            os.write(w, b"world")
            assert await reads.run(_steps(h2, 5)) == b"world" and h2.released
        finally:
            os.write(w, b"spare")  # close() waits for a read still in the kernel
            reads.close()
            threads.shutdown()
            os.close(r)
            os.close(w)
    eventloop.run(main())


def test_close_from_another_thread_runs_on_the_loop_and_answers_the_read_there(tmp_path):
    """Chaos seed 62830: an in-process crash closes the ring from a worker thread. The close
    (remove_reader, and the answers it gives reads still queued) must run on the loop: the
    loop is watched (bk.testing.loopcheck) and records any call from the worker."""
    from bk.testing.loopcheck import checked_loop_factory

    async def main():
        threads, reads, r, w, _, task = await _a_read_waiting_on_a_pipe(tmp_path)
        try:
            os.write(w, b"bytes")  # close() waits for the read in the kernel, then answers it
            await asyncio.to_thread(reads.close)
            assert reads._closed and await task == b"bytes"
            await asyncio.to_thread(reads.close)  # twice is fine
        finally:
            threads.shutdown()
            os.close(r)
            os.close(w)
    foreign: list = []
    with asyncio.Runner(loop_factory=checked_loop_factory(foreign)) as runner:
        runner.run(main())
    assert [line for calls in foreign for line in calls.describe()] == []


class _StoppedLoop:
    """A loop that takes callbacks and never runs them, then stops: the close handed to it
    must not leave its caller waiting."""

    def __init__(self):
        self.running, self.queued, self.readers = True, [], {}

    def is_running(self):
        return self.running

    def add_reader(self, fd, cb):
        self.readers[fd] = cb

    def remove_reader(self, fd):
        return self.readers.pop(fd, None) is not None

    def call_soon_threadsafe(self, cb, *args):
        self.queued.append(cb)
        self.running = False  # it stops before running it


def test_a_close_handed_to_a_loop_that_stops_first_is_done_by_the_caller():
    loop = _StoppedLoop()
    reads = RingReads(loop, threads=None)
    reads.close()  # from this thread, which runs no loop: handed over, then done here
    assert reads._closed and loop.readers == {} and len(loop.queued) == 1
    loop.queued[0]()  # the queued close, should the loop ever run it: nothing left to do
    assert loop.readers == {}


def test_read_io_choices(monkeypatch):
    async def main():
        loop = asyncio.get_running_loop()
        threads = ReadThreads(loop, 1)
        try:
            assert make_ring(loop, threads, "threads") is None
            ring = make_ring(loop, threads, "auto")
            assert isinstance(ring, RingReads)
            ring.close()
            monkeypatch.setattr("bk.bookie.read_ring.ring_unavailable", lambda: "io_uring cannot be set up here: EPERM")
            assert make_ring(loop, threads, "auto") is None  # the read threads serve
            with pytest.raises(ConfigError, match="EPERM"):
                make_ring(loop, threads, "ring")
        finally:
            threads.shutdown()
    eventloop.run(main())
    with pytest.raises(ConfigError):
        load_config(env={}, overrides={"read_io": "aio"})


def test_read_io_ring_where_it_cannot_run_fails_before_the_bookie_opens_anything(tmp_path, monkeypatch):
    monkeypatch.setattr("bk.bookie.bookie.ring_unavailable", lambda: "io_uring cannot be set up here: EPERM")
    b = Bookie(_config(tmp_path, "ring"))
    with pytest.raises(ConfigError, match="EPERM"):
        eventloop.run(b.start())
    assert not (tmp_path / "ledgers").exists() or not any((tmp_path / "ledgers").rglob("*.log"))


# ------------------------------------------------------------------ the bookie through the ring
def _entry(ledger_id: int, entry_id: int, size: int) -> bytes:
    payload = bytes([entry_id % 251]) * size
    return (ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big", signed=True)
            + (-1).to_bytes(8, "big", signed=True) + len(payload).to_bytes(8, "big") + payload)


def _config(tmp_path, read_io: str, **kw):
    return load_config(env={}, overrides=dict(
        journal_dirs=[str(tmp_path / "journal")], ledger_dirs=[str(tmp_path / "ledgers")],
        flush_interval_ms=60_000, write_cache_max_size_bytes="4MiB", read_io=read_io, **kw))


@pytest.mark.parametrize("read_io", ["ring", "threads"])
def test_the_bookie_reads_the_same_through_ring_and_threads(tmp_path, read_io):
    """Entries of several sizes (one pread, or a second when the guess was short), from
    the entry logs after a restart, random order, many at once; a miss is "no such entry",
    limbo is limbo; and a stop with reads under way answers them."""
    cfg = _config(tmp_path, read_io, read_ahead_batch_size=1)
    sizes = {e: (10, 5000, 70_000, 200)[e % 4] for e in range(60)}

    async def write():
        b = Bookie(cfg)
        await b.start()
        try:
            for e, size in sizes.items():
                await b.add_entry(3, e, _entry(3, e, size), KEY)
        finally:
            await b.stop()

    async def read():
        b = Bookie(cfg)
        await b.start()
        try:
            assert (b._ring is not None) == (read_io == "ring")
            order = sorted(sizes, key=lambda e: (e * 37) % 61)
            got = await asyncio.gather(*(b.read_entry(3, e) for e in order))
            assert [bytes(g) for g in got] == [_entry(3, e, sizes[e]) for e in order]
            assert bytes(await b.read_entry(3, -1)) == _entry(3, 59, sizes[59])
            with pytest.raises(NoSuchEntryError):
                await b.read_entry(3, 60)
            await b.mark_for_integrity_check([(3, KEY)])
            with pytest.raises(LedgerLimboError):  # may be lost, never "no such entry"
                await b.read_entry(3, 60)
            assert bytes(await b.read_entry(3, 1)) == _entry(3, 1, sizes[1])  # stored: served
            await b.clear_limbo([3])
            with pytest.raises(NoSuchEntryError):
                await b.read_entry(3, 60)
            pending = [asyncio.ensure_future(b.read_entry(3, e)) for e in range(0, 60, 3)]
            await asyncio.sleep(0)
        finally:
            await b.stop()
        done = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 10)  # none hangs
        for got in done:  # each its entry, or the error of a bookie that stopped
            assert isinstance(got, StorageError) or bytes(got).startswith((3).to_bytes(8, "big")), got
    eventloop.run(write())
    eventloop.run(read())
