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


def test_no_asyncio_wait_for_in_bk():
    # Python 3.11's wait_for returns the inner result and drops a cancellation of the caller that
    # lands as the inner future completes (fixed in 3.12 by rebuilding it on asyncio.timeout):
    # a replication worker lost its cancel that way and ran on (chaos seed 107897). bk uses
    # `async with asyncio.timeout(...)` instead; this keeps wait_for from coming back.
    import ast
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2] / "bk"
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            func = getattr(node, "func", None)
            if (isinstance(func, ast.Attribute) and func.attr == "wait_for" and getattr(func.value, "id", "") == "asyncio"
                    or isinstance(func, ast.Name) and func.id == "wait_for"):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert found == []
