"""bk.bookie.read_threads: the bookie's read worker threads - results and errors reach the
awaiting coroutine, a cancelled job's result is given back (never dropped), shutdown
finishes what was queued, and no result is lost to the wake-up coalescing."""
from __future__ import annotations

import asyncio
import threading

import pytest

from bk import eventloop
from bk.bookie.read_threads import ReadThreads


def test_results_and_errors_reach_their_awaiters():
    async def main():
        threads = ReadThreads(asyncio.get_running_loop(), 4)
        try:
            assert await asyncio.gather(*(threads.submit(pow, i, 2) for i in range(500))) == \
                [i * i for i in range(500)]
            with pytest.raises(ZeroDivisionError):
                await threads.submit(divmod, 1, 0)
            names = await asyncio.gather(*(threads.submit(lambda: threading.current_thread().name)
                                           for _ in range(50)))
            assert set(names) <= {f"bk-read_{i}" for i in range(4)}
            assert threading.current_thread().name not in names  # never on the loop's thread
        finally:
            threads.shutdown()
    eventloop.run(main())


def test_results_finishing_while_a_drain_runs_are_not_left_behind():
    """Many jobs finishing at once from many threads: every future completes (a result
    appended after the drain cleared its flag schedules another drain)."""
    async def main():
        threads = ReadThreads(asyncio.get_running_loop(), 8)
        try:
            for _ in range(20):
                got = await asyncio.wait_for(asyncio.gather(*(threads.submit(int, i) for i in range(2000))), 30)
                assert got == list(range(2000))
        finally:
            threads.shutdown()
    eventloop.run(main())


def test_a_cancelled_jobs_result_is_discarded_not_dropped():
    released, gate = [], threading.Event()

    def slow(x):
        gate.wait(10)
        return x

    async def main():
        threads = ReadThreads(asyncio.get_running_loop(), 1)
        try:
            fut = threads.submit(slow, "span", discard=released.append)
            none = threads.submit(slow, None, discard=released.append)
            await asyncio.sleep(0.05)
            fut.cancel()
            none.cancel()
            gate.set()
            assert await threads.submit(int, 7) == 7  # the cancelled jobs ran and were drained first
            assert released == ["span"]  # a None result has nothing to give back
        finally:
            threads.shutdown()
    eventloop.run(main())


def test_shutdown_finishes_queued_jobs_then_refuses_more():
    async def main():
        threads = ReadThreads(asyncio.get_running_loop(), 2)
        futs = [threads.submit(pow, i, 3) for i in range(100)]
        await asyncio.to_thread(threads.shutdown)
        assert [await f for f in futs] == [i ** 3 for i in range(100)]
        assert not any(t.is_alive() for t in threads._threads)
        with pytest.raises(RuntimeError, match="shut down"):
            threads.submit(int, 1)
    eventloop.run(main())


def test_results_after_the_loop_closed_are_given_back():
    released, gate = [], threading.Event()
    loop = asyncio.new_event_loop()
    threads = ReadThreads(loop, 1)
    threads.submit(lambda: gate.wait(10) and "span", discard=released.append)
    loop.close()
    gate.set()
    threads.shutdown()
    assert released == ["span"]
