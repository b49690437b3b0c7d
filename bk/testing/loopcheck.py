"""Catch calls into an event loop from a thread other than the loop's own.

An asyncio loop (uvloop's as much as the standard one) is not thread-safe: from another
thread only `call_soon_threadsafe` (and what is built on it, run_coroutine_threadsafe) may
be used. uvloop checks the thread only in debug mode, and a violation does not fail where it
happens: `remove_reader` from a foreign thread closes a libuv handle behind the loop's back,
and what breaks is something later, at random (chaos seed 62830: `loop.close()` raised EBUSY
after a run that had verified clean; the in-process crash's `halt_without_checkpoint` closed
the io_uring reader from its worker thread).

`watch_loop_thread(loop)` wraps the loop's thread-bound methods on that one loop object (no
class or production code changes): a call from another thread is recorded in the returned
`ForeignCalls`, with the caller's stack, and then goes ahead as before (the run stays the run
it was; the caller decides whether a record is a failure). Injected by the tests and the chaos
runner (`checked_loop_factory`).
"""
from __future__ import annotations

import asyncio
import threading
import traceback

# The loop methods that are not thread-safe and that code in a thread can reach: directly,
# or through an asyncio object (a future's set_result calls call_soon, a timer's cancel
# closes a libuv handle).
THREAD_BOUND = ("call_soon", "call_later", "call_at", "create_task", "create_future",
                "add_reader", "remove_reader", "add_writer", "remove_writer", "stop", "close")
KEEP = 20  # calls recorded with their stacks; more are only counted


class ForeignCalls(list):
    """(method, thread name, stack) of the first KEEP calls made from a foreign thread;
    `total` counts them all."""

    total = 0

    def describe(self) -> list[str]:
        lines = [f"loop.{name}() called from thread {thread!r} (not the loop's):\n{stack}"
                 for name, thread, stack in self]
        if self.total > len(self):
            lines.append(f"{self.total - len(self)} more such calls, not listed\n")
        return lines


def watch_loop_thread(loop) -> ForeignCalls:
    """Record every call of a THREAD_BOUND method of `loop` from a thread other than the one
    running it. Before the loop runs (set-up code in the creating thread) nothing is recorded."""
    calls = ForeignCalls()
    lock = threading.Lock()

    def wrap(name: str):
        method = getattr(loop, name)

        def checked(*args, **kwargs):
            # running, and not in this thread: the caller is some other thread
            if loop.is_running() and asyncio._get_running_loop() is not loop:
                with lock:
                    calls.total += 1
                    if len(calls) < KEEP:
                        stack = "".join(traceback.format_stack(limit=12)[:-1])
                        calls.append((name, threading.current_thread().name, stack))
            return method(*args, **kwargs)
        checked.__name__ = name
        return checked

    for name in THREAD_BOUND:
        setattr(loop, name, wrap(name))
    return calls


def checked_loop_factory(sink: list):
    """A loop factory for asyncio.Runner: the project's loop (bk.eventloop), watched; each
    loop's ForeignCalls is appended to `sink`."""
    from bk import eventloop

    make = eventloop.loop_factory()

    def factory():
        loop = make()
        sink.append(watch_loop_thread(loop))
        return loop
    return factory
