"""What a failing run's trace needs to tell a slow machine from a stuck bookie.

Seed 101207 (1 of the first 1,200 of seeds 100001-110000 on 35ec543, load about 12 on 2
cores; 43 replays passed) failed liveness: for 4 s every recovery attempt of a 3/3/3 ledger
found all three bookies not answering a READ within the client's 0.5 s, and the trace could
not say why. Two explanations predict different evidence, so a run now records both:

- `LoopLag`: the event loop that runs the bookies, their proxies and the clients is late when
  a callback holds it or the process gets no CPU; every lateness over STALL_S is noted with
  its time, and the largest is kept. A READ unanswered while the loop was late by more than
  the read timeout proves nothing about the bookie.
- `describe_bookies`: at a liveness failure, each in-process bookie's read path (reads running
  and waiting per connection, paused writes, io_uring reads in the kernel, read-aheads in
  flight, read-thread jobs), the fences not yet durable (a recovery read fences: it waits for
  the fence's journal record) with its journals' queues, and each proxy's held frames. A read
  that never started or never finished shows there.

A loaded machine (ten runs on two cores) starves every run's loop at times: seeds 110033,
110091, 110098 and 110148 failed that way on a slow day (loop late by up to 3.7 s, a 4 s
recovery window spent without CPU) and pass alone. The checker's waits (the verifier's
recovery and replication windows, the run's time limit) are therefore budgets of the time the
loop had (`Budget`): each second the loop was late is added back, up to STARVED_CAP times the
budget in all. A bookie stuck for real leaves the loop on time (it waits, it does not spin),
so its run still fails within the budget; a loop held by a callback of bk's shows in the trace
as a late loop either way.
"""
from __future__ import annotations

import asyncio
import time

STALL_S = 0.25  # lateness of a 20 ms tick worth a line in the trace
TICK_S = 0.02
NOTED_STALLS = 20  # lines in the trace at most; the summary counts them all
STARVED_CAP = 3.0  # a budget stretches to at most this many times itself


class LoopLag:
    """A task that wakes every TICK_S and measures how late it woke."""

    def __init__(self, note=None) -> None:
        self.note = note  # set by whoever has a trace; a stall before that is counted, not noted
        self.max_s = 0.0
        self.stalls = 0
        self.late_s = 0.0  # all the lateness of the ticks so far: time the loop could not keep
        self._due: float | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> "LoopLag":
        self._task = asyncio.ensure_future(self._run())
        return self

    async def _run(self) -> None:
        while True:
            self._due = due = time.monotonic() + TICK_S
            await asyncio.sleep(TICK_S)
            late = max(0.0, time.monotonic() - due)
            self._due = None
            self.late_s += late
            if late > self.max_s:
                self.max_s = late
            if late > STALL_S:
                self.stalls += 1
                if self.stalls <= NOTED_STALLS and self.note is not None:
                    self.note(f"event loop {late * 1000:.0f} ms late (a callback held it, or the process got no CPU)")

    def late_now(self) -> float:
        """late_s, with the lateness of a tick that is overdue now (the loop may be just back)."""
        due = self._due
        return self.late_s + (max(0.0, time.monotonic() - due) if due is not None else 0.0)

    def budget(self, wait_s: float) -> "Budget":
        return Budget(self, wait_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def summary(self) -> str:
        return (f"event loop lateness: at most {self.max_s * 1000:.0f} ms, {self.stalls} time(s) over"
                f" {STALL_S * 1000:.0f} ms, {self.late_s:.1f} s in all")


class Budget:
    """`wait_s` of the time the loop had, from now: wall time, plus what the loop was late
    meanwhile, up to STARVED_CAP * wait_s. With no LoopLag, plain wall time."""

    def __init__(self, lag: LoopLag | None, wait_s: float) -> None:
        self.lag, self.wait_s = lag, wait_s
        self.started = time.monotonic()
        self._late0 = lag.late_now() if lag is not None else 0.0

    def starved_s(self) -> float:
        if self.lag is None:
            return 0.0
        return min(self.lag.late_now() - self._late0, (STARVED_CAP - 1) * self.wait_s)

    def remaining(self) -> float:
        return self.wait_s + self.starved_s() - (time.monotonic() - self.started)

    def expired(self) -> bool:
        return self.remaining() <= 0

    def describe(self) -> str:
        starved = self.starved_s()
        return f"{self.wait_s:g}s" + (f" (+{starved:.1f}s the loop was late)" if starved >= 0.05 else "")


def describe_bookies(cluster) -> list[str]:
    """The read path of every in-process bookie and the held frames of every proxy, one line
    each; nothing for a process cluster (its bookies are elsewhere). Never raises: it runs
    only to explain a failure."""
    out = []
    servers = getattr(cluster, "servers", None)
    if not isinstance(servers, dict):
        return out
    for i, server in sorted(servers.items()):
        try:
            out.append(f"bookie {i}: " + _read_path(server))
        except Exception as e:  # noqa: BLE001 - a diagnostic must not fail the run
            out.append(f"bookie {i}: cannot describe: {e!r}")
    for i, proxy in sorted(getattr(cluster, "proxies", {}).items()):
        try:
            out.append(f"proxy {i}: {len(proxy.connections())} connection(s), held {proxy.held_count()},"
                       f" blackhole {proxy._blackhole}, rules {len(proxy.rules)}")
        except Exception as e:  # noqa: BLE001
            out.append(f"proxy {i}: cannot describe: {e!r}")
    return out


def _read_path(server) -> str:
    conns = list(server.connections)
    running = sum(c._reads_running for c in conns)
    waiting = sum(len(c._reads_waiting) for c in conns)
    paused = sum(1 for c in conns if c._writing_paused)
    buffered = sum(c.transport.get_write_buffer_size() for c in conns if c.transport is not None)
    bookie = server.bookie
    ring = bookie._ring
    aheads = bookie._read_aheads
    in_aheads = sum(len(runs) for runs in aheads._by_ledger.values()) if aheads is not None else 0
    threads = bookie._read_threads
    queued = threads._jobs.qsize() if threads is not None else 0
    storage = bookie.storage
    fences = sorted(lid for lid in storage.ledger_ids()
                    if (d := storage.get_ledger(lid)) is not None and d.fence_pending is not None
                    and not d.fence_pending.done())
    journals = "; ".join(f"journal {j.index}: {j.queued_records()} queued, {j._taken - j._processed} being written,"
                         f" {'failed' if j._failed is not None else 'ok'},"
                         f" writer {'alive' if j._thread is not None and j._thread.is_alive() else 'gone'}"
                         for j in bookie.journals)
    return (f"{len(conns)} connection(s), reads running {running}, waiting {waiting}, writes paused on {paused},"
            f" {buffered} B unwritten; ring {'off' if ring is None else f'{ring.in_flight} in the kernel'};"
            f" read-aheads in flight {in_aheads}; read-thread jobs queued {queued}; limbo {sorted(bookie.limbo_ledgers())};"
            f" fences not yet durable {fences}; {journals}")
