"""Running coroutines on uvloop (the project's event loop), with a plain asyncio fallback."""
from __future__ import annotations

import asyncio
from typing import Any, Coroutine


def loop_factory():
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """asyncio.run on uvloop (Python 3.11 has no loop_factory on asyncio.run)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
