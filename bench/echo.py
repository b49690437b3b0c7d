"""The platform's floor for add latency: a Python echo pair on loopback, no disk.

    python -m bench.echo --rate 80000 --entry-size 1024 --duration-s 5

A uvloop echo server in one process and a paced, open-loop client in another
(the same schedule as `bench.load --rate`: message n is due at t0 + n / rate,
sent in small bursts because the loop's timers tick in 1 ms) exchange messages
of the entry size over loopback TCP. Each message's latency is taken from when
it left (and, like bench.load, from when it was due) to when its echo arrived.

Nothing here touches a disk, parses a request or fsyncs. What it measures is
what any two Python processes on this machine pay per round trip at this rate:
scheduling on the machine's CPUs, the event loops, the loopback socket. An add
latency percentile below this one is out of reach for any Python bookie and
client pair on the same host; docs/BENCHMARKS.md sets it beside bk's p99 at
half the peak.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np

from .load import PACE_MIN_SLEEP_S  # the loop's timers have ~1 ms resolution: bench.load's schedule
from .stats import fmt_num, latency_summary_ms, parse_size, positive_float

DRAIN_S = 2.0  # after the last send, how long to wait for the remaining echoes


def _serve(port_queue, stop_after_s: float) -> None:
    from bk import eventloop

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 20):
            writer.write(data)
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port_queue.put(server.sockets[0].getsockname()[1])
        await asyncio.sleep(stop_after_s)

    eventloop.run(main())


class _Client(asyncio.Protocol):
    def __init__(self, size: int):
        self.size = size
        self.pending = 0  # bytes of a partly received echo
        self.sent: list[float] = []
        self.latency: list[float] = []
        self.done = asyncio.get_running_loop().create_future()
        self.expected = -1  # set when the last message has left

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.pending += len(data)
        n, self.pending = divmod(self.pending, self.size)
        k = len(self.latency)
        self.latency.extend(now - t for t in self.sent[k:k + n])
        if len(self.latency) == self.expected and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _paced_client(port: int, rate: float, size: int, duration_s: float) -> dict:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_connection(lambda: _Client(size), "127.0.0.1", port)
    message = os.urandom(size)
    interval = 1.0 / rate
    lag: list[float] = []
    t0 = time.perf_counter()
    seq = 0
    while True:
        now = time.perf_counter()
        if now - t0 >= duration_s:
            break
        due = t0 + seq * interval
        if due > now:
            await asyncio.sleep(max(due - now, PACE_MIN_SLEEP_S))
            continue
        burst = 0
        while due <= now:  # everything due by now leaves in one write, as a batching client would
            proto.sent.append(now)
            lag.append(now - due)
            burst += 1
            seq += 1
            due = t0 + seq * interval
        transport.write(message * burst)
    proto.expected = seq
    if len(proto.latency) < seq:
        try:
            await asyncio.wait_for(asyncio.shield(proto.done), DRAIN_S)
        except asyncio.TimeoutError:
            pass
    transport.close()
    got = len(proto.latency)
    service = np.asarray(proto.latency, dtype=np.float64)
    from_due = service + np.asarray(lag[:got], dtype=np.float64)
    return {"rate": rate, "entry_size": size, "duration_s": duration_s, "sent": seq, "echoed": got,
            "latency_ms": latency_summary_ms(service), "from_due_ms": latency_summary_ms(from_due),
            "pacing_lag_ms": latency_summary_ms(lag)}


def run(rate: float, size: int, duration_s: float) -> dict:
    """Start the echo server process, run the paced client here, return the summary."""
    from bk import eventloop

    ctx = mp.get_context("spawn")
    ports = ctx.Queue()
    server = ctx.Process(target=_serve, args=(ports, duration_s + DRAIN_S + 30.0), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=30)
        return eventloop.run(_paced_client(port, rate, size, duration_s))
    finally:
        server.terminate()
        server.join(5)


def format_summary(s: dict) -> str:
    lat, due = s["latency_ms"], s["from_due_ms"]
    return (f"echo: {s['echoed']} of {s['sent']} {s['entry_size']} B messages at {s['rate']:,.0f}/s over loopback"
            f" (two Python processes, uvloop, no disk)\n"
            f"  from when each left to its echo: ms p50 {fmt_num(lat['p50'], 2)} p99 {fmt_num(lat['p99'], 2)}"
            f" p999 {fmt_num(lat['p999'], 2)} max {fmt_num(lat['max'], 2)}\n"
            f"  from when each was due:           ms p50 {fmt_num(due['p50'], 2)} p99 {fmt_num(due['p99'], 2)}"
            f" p999 {fmt_num(due['p999'], 2)} max {fmt_num(due['max'], 2)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.echo", description=__doc__.split("\n\n")[0],
                                epilog="Set beside `python -m bench.load --rate R`: the same schedule, no bookie.")
    p.add_argument("--rate", type=positive_float, default=80_000.0, help="messages/s (default 80000)")
    p.add_argument("--entry-size", type=parse_size, default=1024, help="bytes per message (default 1024)")
    p.add_argument("--duration-s", type=positive_float, default=5.0, help="how long to send (default 5)")
    p.add_argument("--json", metavar="PATH", help="write the summary as JSON here")
    args = p.parse_args(argv)
    if args.entry_size < 1:
        p.error("--entry-size must be at least 1 byte")
    summary = run(args.rate, args.entry_size, args.duration_s)
    print(format_summary(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    if summary["echoed"] < summary["sent"]:
        print(f"error: {summary['sent'] - summary['echoed']} messages were not echoed back", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
