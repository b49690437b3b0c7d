"""bk.eventloop.cancel_and_wait: the task's own cancellation and errors are swallowed, the
caller's cancellation never is (a lost cancellation left a chaos run's crash waiting for
ever, seed 107897)."""
from __future__ import annotations

import asyncio

import pytest

from bk.eventloop import cancel_and_wait


def test_the_tasks_cancellation_and_error_are_not_the_callers():
    async def main():
        async def fails_when_cancelled():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                raise RuntimeError("cleanup failed")
        for coro in (asyncio.sleep(3600), fails_when_cancelled()):
            task = asyncio.ensure_future(coro)
            await asyncio.sleep(0)
            await cancel_and_wait(task)
            assert task.done()
        await cancel_and_wait(None)
    asyncio.run(main())


def test_a_caller_cancelled_while_it_waits_is_cancelled():
    async def main():
        async def slow_to_stop():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await asyncio.sleep(0.5)  # its cleanup takes a while
                raise
        task = asyncio.ensure_future(slow_to_stop())
        await asyncio.sleep(0)
        stopper = asyncio.ensure_future(cancel_and_wait(task))
        await asyncio.sleep(0.05)
        stopper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopper
        await asyncio.wait({task}, timeout=5)
    asyncio.run(main())
