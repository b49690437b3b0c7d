"""How a checkpoint's flush thread shares the GIL with the bookie's event loop (issue 32).

A flush is C loops over a whole write-cache half: taking the entries out of their dicts,
framing them, the index kernel's packing, LMDB's putmulti, freeing the half. A C loop never
lets go of the GIL, and a thread that wants the GIL (the event loop, with adds and reads to
answer) asks the holder to drop it only after the interpreter's switch interval (5 ms): every
long C loop in the flush thread was a stall of the loop of up to 5 ms and more (measured with
`python -m bench.checkpoint_stall --phases`: 2-8 ms in the index puts and entry-log writes
with 64k-entry chunks).

So the flush works in chunks of a few hundred entries, taken from the half's dicts one
chunk at a time (no list of a whole half: those were C loops of their own to build and free,
and walked by every young-generation collection of the cyclic GC while they lived), and
between chunks it calls a `GilPacer`: once GIL_BUDGET_S of work has passed since the last
hand-over, it sleeps YIELD_S (a real sleep: `sleep(0)` re-takes the GIL before a waiting
thread has woken), so the flush keeps the loop waiting for about GIL_BUDGET_S at a time.
When the checkpoint is behind (adds already wait for write-cache room) it does not pause:
the adds are waiting for the flush itself, and a paused flush would only lower the peak.
"""
from __future__ import annotations

import time
from typing import Callable

# Steps sized to stay near GIL_BUDGET_S of C work each on this project's test hosts: taking
# 4096 entries out of a dict held the GIL 0.4-1.2 ms, 64k index records 2-4 ms.
STEP_ENTRIES = 512  # a flush's chunk (entry-log write + index put) and its steps freeing the half
GIL_BUDGET_S = 0.0002
YIELD_S = 0.00002


def yield_gil() -> None:
    time.sleep(YIELD_S)


class GilPacer:
    """Called between a flush's steps; hands the GIL over when the budget is spent."""

    __slots__ = ("_since", "_behind")

    def __init__(self, behind: Callable[[], bool] = lambda: False):
        self._behind = behind
        self._since = time.monotonic()

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self._since < GIL_BUDGET_S:
            return
        if not self._behind():
            yield_gil()
            now = time.monotonic()
        self._since = now


def chunk_entries(half_bytes: int, half_count: int, frame_bytes: int, record_overhead: int) -> int:
    """Entries per flush chunk: STEP_ENTRIES, cut to whole entry-log frames when a frame
    holds fewer (`frame_bytes`: the entry logger's write and fdatasync step). A chunk that
    ended a little past a frame wrote that rest as a write of its own and fsynced more often
    (1 KiB entries in 512-entry chunks: 1.5x the pwrites and fdatasyncs of whole frames)."""
    if half_count <= 0:
        return STEP_ENTRIES
    per_frame = max(1, frame_bytes // (half_bytes // half_count + record_overhead))
    if per_frame >= STEP_ENTRIES:
        return STEP_ENTRIES
    return per_frame * max(1, STEP_ENTRIES // per_frame)

