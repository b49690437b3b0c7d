"""The bookie's read worker threads: blocking storage reads (index lookups, preads, O_DIRECT
reads) run here so that the event loop never waits on the disk.

Lighter than ThreadPoolExecutor with run_in_executor, on purpose. A cold random READ is
little work in each thread and a lot of hand-offs: with the executor each job took a
queue put and get, an idle-semaphore release and acquire, a concurrent Future with its
condition, and one loop wake-up per result, every one a GIL hand-off between the loop and
a read thread. On 2 vCPUs that capped cold single-entry READs at about 7k/s with the loop
half idle, the read threads idle and the disk at queue depth 1, whatever the thread count
(docs/BENCHMARKS.md, eleventh round). Here a job is one SimpleQueue put and get, results
come back through one deque, and the loop is woken once for every result that finishes
before it drains them.

Cancellation: an awaiting coroutine may be cancelled while its job runs. The job's result
is then given to the job's `discard` (a span holds a buffer and an fd reference that must
go back), never dropped silently.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)


class ReadThreads:
    def __init__(self, loop: asyncio.AbstractEventLoop, count: int, name: str = "bk-read"):
        self._loop = loop
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._wake_pending = False  # a _drain is scheduled and has not yet cleared this
        self._threads = [threading.Thread(target=self._run, name=f"{name}_{i}", daemon=True) for i in range(count)]
        self._closed = False
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable, *args, discard: Callable[[Any], None] | None = None) -> asyncio.Future:
        """fn(*args) in a read thread; its result or exception on the returned future (the loop's).
        `discard(result)` is called instead when nobody waits for the result any more."""
        if self._closed:
            raise RuntimeError("read threads are shut down")
        fut = self._loop.create_future()
        self._jobs.put((fut, fn, args, discard))
        return fut

    def call(self, fn: Callable, args: tuple, done: Callable[[Any, BaseException | None], None]) -> None:
        """fn(*args) in a read thread, then `done(result, error)` on the loop: no future, no extra
        loop iteration (a batch of cold READs is answered by one such call). `done` is called
        exactly once while the loop runs (never if the loop closed first)."""
        if self._closed:
            raise RuntimeError("read threads are shut down")
        self._jobs.put((None, fn, args, done))

    def shutdown(self) -> None:
        """Finish the jobs queued, stop the threads, wait for them (blocking)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()

    def _run(self) -> None:
        jobs, done = self._jobs, self._done
        while True:
            job = jobs.get()
            if job is None:
                return
            fut, fn, args, discard = job
            try:
                outcome = (fn(*args), None)
            except BaseException as e:  # handed to the awaiting coroutine, as an executor would
                outcome = (None, e)
            done.append((fut, outcome, discard))
            with self._lock:
                if self._wake_pending:
                    continue
                self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nobody will take the results
                with self._lock:
                    self._wake_pending = False
                self._discard_all()

    def _drain(self) -> None:
        # The flag is cleared before the deque is emptied: a result appended after this point
        # either is popped below or schedules its own _drain, so none is left behind.
        with self._lock:
            self._wake_pending = False
        done = self._done
        while done:
            fut, (result, error), discard = done.popleft()
            if fut is None:  # a call(): its callback answers
                try:
                    discard(result, error)
                except Exception:  # one failing callback must not strand the results behind it
                    log.exception("a read thread's callback failed")
            elif fut.done():  # cancelled while its job ran
                _give_back(result, discard)
            elif error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

    def _discard_all(self) -> None:
        done = self._done
        while done:
            try:
                fut, (result, _), discard = done.popleft()
            except IndexError:
                return
            if fut is not None:  # a call()'s callback needs the loop: nothing to give back
                _give_back(result, discard)


def _give_back(result, discard) -> None:
    if discard is not None and result is not None:
        try:
            discard(result)
        except Exception:
            log.exception("giving back the result of a cancelled read")
