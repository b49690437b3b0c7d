"""bk.testing.loopcheck: a call into a running event loop from another thread is recorded
(and still made); the loop's own thread and call_soon_threadsafe are not."""
from __future__ import annotations

import asyncio

import pytest

from bk.testing.loopcheck import checked_loop_factory


def _run(coro_fn) -> list:
    sink: list = []
    with asyncio.Runner(loop_factory=checked_loop_factory(sink)) as runner:
        runner.run(coro_fn())
    assert len(sink) == 1
    return sink[0]


def test_a_foreign_threads_call_is_recorded_with_its_stack_and_still_made():
    fired = []

    async def main():
        loop = asyncio.get_running_loop()

        def from_a_worker():
            loop.call_later(0.01, fired.append, "timer")  # not thread-safe
        await asyncio.to_thread(from_a_worker)
        await asyncio.sleep(0.1)
    calls = _run(main)
    assert [c[0] for c in calls] == ["call_later"]
    assert "from_a_worker" in calls[0][2]
    assert "call_later() called from thread" in calls.describe()[0]
    assert fired == ["timer"]


@pytest.mark.parametrize("how", ["the loop's own thread", "call_soon_threadsafe"])
def test_what_is_allowed_is_not_recorded(how):
    async def main():
        loop = asyncio.get_running_loop()
        if how == "call_soon_threadsafe":
            done = loop.create_future()
            await asyncio.to_thread(loop.call_soon_threadsafe, done.set_result, 1)
            await done
        else:
            loop.call_soon(lambda: None)
            loop.call_later(0, lambda: None)
            await asyncio.sleep(0)
    assert _run(main) == []


def test_past_the_first_twenty_calls_are_only_counted():
    async def main():
        loop = asyncio.get_running_loop()

        def many():
            for _ in range(30):
                loop.call_soon_threadsafe(lambda: None)
                loop.call_soon(lambda: None)
        await asyncio.to_thread(many)
        await asyncio.sleep(0)
    calls = _run(main)
    assert len(calls) == 20 and calls.total == 30
    assert calls.describe()[-1].startswith("10 more such calls")
