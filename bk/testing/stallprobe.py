"""Loop-lag and GIL-hold probes, for measuring what a checkpoint costs the event loop.

GilProbe: a thread that sleeps `period_s` (0.1 ms) again and again and records how much
later than asked it woke. A sleep releases the GIL; waking, the thread must take it back,
so the oversleep is (scheduler delay +) how long another thread held the GIL. On a busy
2-core host the scheduler part is not zero: compare windows of one run, not runs.

LoopLagProbe: a callback on an asyncio loop that reschedules itself every `period_s`
and records how late each call ran: the longest stall of that loop (a callback, or a
GIL held by another thread while the loop wanted it).

Both keep (time, lateness) samples so a caller can split them into windows (inside a
checkpoint and outside): `max_in(windows)` / `max_outside(windows)`. Measurement only:
never used by production code and never asserted on in tests (speed is not asserted).
"""
from __future__ import annotations

import asyncio
import threading
import time


class _Samples:
    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (monotonic time at wake, lateness s)

    def _select(self, windows, inside: bool) -> list[float]:
        out = []
        for t, late in self.samples:
            # a sample belongs to a window when its wait overlapped it (woke after its start,
            # began before its end)
            hit = any(start <= t and t - late <= end for start, end in windows)
            if hit == inside:
                out.append(late)
        return out

    def max_in(self, windows) -> float:
        return max(self._select(windows, True), default=0.0)

    def max_outside(self, windows) -> float:
        return max(self._select(windows, False), default=0.0)

    def percentile(self, q: float, windows=None, inside: bool = True) -> float:
        values = sorted(self._select(windows, inside) if windows is not None else [s for _, s in self.samples])
        if not values:
            return 0.0
        return values[min(len(values) - 1, int(q * len(values)))]


class GilProbe(_Samples):
    """A thread sleeping period_s in a loop; oversleep = time waiting for the GIL."""

    def __init__(self, period_s: float = 0.0001) -> None:
        super().__init__()
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bk-gil-probe", daemon=True)

    def _run(self) -> None:
        period, clock, sleep, append = self.period_s, time.monotonic, time.sleep, self.samples.append
        while not self._stop.is_set():
            t0 = clock()
            sleep(period)
            t1 = clock()
            append((t1, max(0.0, t1 - t0 - period)))

    def start(self) -> "GilProbe":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class LoopLagProbe(_Samples):
    """A callback on `loop` every period_s; lateness = how long the loop was held."""

    def __init__(self, loop: asyncio.AbstractEventLoop, period_s: float = 0.0001) -> None:
        super().__init__()
        self.loop = loop
        self.period_s = period_s
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def _tick(self) -> None:
        now = time.monotonic()
        self.samples.append((now, max(0.0, now - self._due)))
        self._due = now + self.period_s
        self._handle = self.loop.call_at(self.loop.time() + self.period_s, self._tick)

    def start(self) -> "LoopLagProbe":
        """Call on the loop's thread (or before the loop runs)."""
        self._due = time.monotonic() + self.period_s
        self._handle = self.loop.call_at(self.loop.time() + self.period_s, self._tick)
        return self

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
