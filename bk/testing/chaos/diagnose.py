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
"""
from __future__ import annotations

import asyncio
import time

STALL_S = 0.25  # lateness of a 20 ms tick worth a line in the trace
TICK_S = 0.02
NOTED_STALLS = 20  # lines in the trace at most; the summary counts them all


class LoopLag:
    """A task that wakes every TICK_S and measures how late it woke."""

    def __init__(self, note) -> None:
        self._note = note
        self.max_s = 0.0
        self.stalls = 0
        self._task: asyncio.Task | None = None

    def start(self) -> "LoopLag":
        self._task = asyncio.ensure_future(self._run())
        return self

    async def _run(self) -> None:
        while True:
            due = time.monotonic() + TICK_S
            await asyncio.sleep(TICK_S)
            late = time.monotonic() - due
            if late > self.max_s:
                self.max_s = late
            if late > STALL_S:
                self.stalls += 1
                if self.stalls <= NOTED_STALLS:
                    self._note(f"event loop {late * 1000:.0f} ms late (a callback held it, or the process got no CPU)")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def summary(self) -> str:
        return f"event loop lateness: at most {self.max_s * 1000:.0f} ms, {self.stalls} time(s) over {STALL_S * 1000:.0f} ms"


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
