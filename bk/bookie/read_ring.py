"""The bookie's single-entry reads through io_uring, driven from the event loop.

A cold READ through the read threads costs about five context switches and eight futex
calls (job to a thread, the GIL back and forth around its pread, the result back to the
loop); on 2 vCPUs that, not the disk, bounded cold 64 KiB READs (docs/BENCHMARKS.md,
twelfth round). Here the loop runs the read's steps itself (LedgerStorage.read_steps:
caches, index, record checks, all without I/O but the index's mapped pages) and hands
each pread to the kernel through a ring (bk/bookie/_ring.pyx). Reads queued in one loop
iteration go to the kernel in one system call; finished ones come back through an
eventfd the loop watches. A read-ahead run (a Call step) still goes to a read thread.

`read_io` (BookieConfig): "auto" uses the ring where it works and the read threads
elsewhere, "ring" insists (an error at start without it), "threads" never uses it.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import os

from bk import fileio
from bk._native import load_optional
from bk.entrylog.files import read_error
from bk.entrylog.reads import Pread, Steps
from bk.errors import ConfigError, StorageError

from .read_threads import ReadThreads

log = logging.getLogger(__name__)

RING_ENTRIES = 256  # reads in the kernel at once; more wait in the ring, in order


def ring_module():
    """bk.bookie._ring, or None when it was not built (no liburing at build time) or
    BK_NO_NATIVE=1 (bk._native decides, for every kernel)."""
    return load_optional("ring", "bk.bookie")


def ring_unavailable() -> str | None:
    """Why this process cannot read through io_uring, or None when it can."""
    mod = ring_module()
    if mod is None:
        return ("bk.bookie._ring is not loaded (BK_NO_NATIVE=1, or liburing-dev was missing"
                " when bk was built)")
    try:
        mod.Ring(2).close()
    except OSError as e:  # ENOSYS: old kernel; EPERM: seccomp or kernel.io_uring_disabled
        return f"io_uring cannot be set up here: {e.strerror or e}"
    return None


def make_ring(loop: asyncio.AbstractEventLoop, threads: ReadThreads, read_io: str) -> "RingReads | None":
    """The ring `read_io` asks for, or None (the read threads serve single reads)."""
    if read_io == "threads":
        return None
    why = ring_unavailable()
    if why is None:
        return RingReads(loop, threads)
    if read_io == "ring":
        raise ConfigError(f"read_io is 'ring' but {why}")
    log.warning("reading entry logs through the read threads: %s", why)
    return None


class ReadAheadsInFlight:
    """The read-ahead runs read threads are reading now: per ledger, (first, last, future) of
    each (last: the last entry it planned to read; the future is done when it is).

    Pipelined single READs of a scan arrive together: 100 in flight, the first miss starts a
    read-ahead of the next 100 entries, and the 99 behind it used to miss too and each pread
    its own entry (ReadRuns gives a miss inside a span in flight its one entry), so most of a
    cold scan was read twice, once entry by entry. A miss that such a run covers waits for it
    and is then served from the read cache (Bookie.read_entry), and the first one to wait
    starts the next run at once (Bookie._follow): a scan then finds its next entries read,
    or being read, instead of stalling on the disk every read_ahead_batch_size entries.
    The bookie's cold READs in batches (Bookie.read_entries_cb) note a scan's read-ahead here too."""

    __slots__ = ("_by_ledger",)

    def __init__(self):
        self._by_ledger: dict[int, list] = {}

    def note(self, ledger_id: int, first: int, last: int, fut: asyncio.Future) -> list:
        runs = self._by_ledger.setdefault(ledger_id, [])
        run = [first, last, fut, False]  # False: no read-ahead started after it yet (Bookie._follow)
        runs.append(run)
        fut.add_done_callback(lambda _f: self._drop(ledger_id, run))
        return run

    def _drop(self, ledger_id: int, run) -> None:
        runs = self._by_ledger.get(ledger_id)
        if runs is not None:
            runs.remove(run)
            if not runs:
                del self._by_ledger[ledger_id]

    def covering(self, ledger_id: int, entry_id: int) -> list | None:
        """The run in flight that will read entry_id, `[first, last, future, followed]`, or None."""
        for run in self._by_ledger.get(ledger_id, ()):
            if run[0] <= entry_id <= run[1]:
                return run
        return None


class RingReads:
    def __init__(self, loop: asyncio.AbstractEventLoop, threads: ReadThreads, entries: int = RING_ENTRIES):
        self._loop = loop
        self._threads = threads
        self._ring = ring_module().Ring(entries)
        self._submit_pending = False
        self._closed = False
        self.read_aheads = ReadAheadsInFlight()
        loop.add_reader(self._ring.fileno(), self._ring.complete)

    @property
    def in_flight(self) -> int:
        return self._ring.in_flight

    async def run(self, steps: Steps, span_of=None):
        """Drive a read's steps (bk.entrylog.reads): preads through the ring, a Call in a read
        thread. Returns what the steps return; their StorageError is raised here. `span_of(call)`:
        the (ledger_id, first, last) a Call reads ahead, or None; such a Call is noted in
        `read_aheads` while it runs."""
        try:
            op = next(steps)
            while True:
                if op.__class__ is Pread:
                    fut = self._pread(op, steps)
                else:
                    fut = self._threads.submit(op.fn, *op.args)
                    span = span_of(op) if span_of is not None else None
                    if span is not None:
                        self.read_aheads.note(*span, fut)
                try:
                    out = await fut
                except StorageError as e:
                    op = steps.throw(e)
                except asyncio.CancelledError:
                    if op.__class__ is not Pread:
                        steps.close()
                    # else the pread's completion closes the steps: until then the
                    # kernel reads through the fd they hold
                    raise
                else:
                    op = steps.send(out)
        except StopIteration as stop:
            return stop.value

    def _pread(self, op: Pread, steps: Steps) -> asyncio.Future:
        fut = self._loop.create_future()
        h, offset = op.h, op.offset

        def done(data, err: int) -> None:
            if fut.done():  # the reader was cancelled; the file goes back now
                steps.close()
            elif err:
                fut.set_exception(read_error(h.path, offset, OSError(err, os.strerror(err))))
            else:
                fut.set_result(data)

        if self._closed:
            fut.set_exception(StorageError("the bookie is stopping: its reads are closed"))
            return fut
        if fileio.faults is not None:  # injected read errors, as EntryLogger.pread sees them
            try:
                fileio.check_read(h.path)
            except OSError as e:
                fut.set_exception(read_error(h.path, offset, e))
                return fut
        self._ring.read(h.fd, op.n, offset, done)
        if not self._submit_pending:
            # Every pread queued in this loop iteration goes to the kernel in one call.
            self._submit_pending = True
            self._loop.call_soon(self._submit)
        return fut

    def _submit(self) -> None:
        self._submit_pending = False
        try:
            self._ring.submit()
        except OSError as e:  # the kernel refused the batch: each read fails, none hangs
            log.error("io_uring submit failed: %s", e)
            self._ring.fail_prepared(e.errno or errno.EIO)

    def close(self) -> None:
        """Wait for the reads in the kernel and answer every queued one (blocking, briefly).

        On the loop's thread: the eventfd's reader and the futures those answers settle belong
        to the loop, which is not thread-safe. Called from another thread while the loop runs
        (an in-process crash stops the bookie from a worker thread), the close is handed to the
        loop and waited for, as long as the loop runs: one that stops with the close still
        queued (or closes before it can be queued) races nothing any more, and the close is
        done here. A foreign thread's remove_reader closed a libuv handle behind the loop's
        back, and loop.close() failed with EBUSY much later (chaos seed 62830)."""
        if self._closed:
            return
        if self._loop.is_running() and asyncio._get_running_loop() is not self._loop:
            if self._close_on_the_loop() or self._closed:
                return
        self._closed = True
        try:
            self._loop.remove_reader(self._ring.fileno())
        except (RuntimeError, ValueError, OSError):
            pass  # the loop is closed already
        self._ring.close()

    def _close_on_the_loop(self) -> bool:
        """close() run by the loop, from another thread: True once it ran there, False when the
        loop stopped or closed first (the caller closes in place)."""
        done: concurrent.futures.Future = concurrent.futures.Future()

        def close_here() -> None:
            try:
                self.close()
            except Exception as e:  # noqa: BLE001 - handed to the waiting thread
                done.set_exception(e)
            else:
                done.set_result(None)
        try:
            self._loop.call_soon_threadsafe(close_here)
        except RuntimeError:  # the loop closed meanwhile
            return False
        while not done.done():
            if not self._loop.is_running():  # stopped with the close queued: nothing races us now
                return False
            concurrent.futures.wait([done], timeout=0.2)
        done.result()  # what the close raised on the loop, raised here
        return True
