"""Redis as a durable log, for comparison: `appendonly yes`, `appendfsync always`.

    python -m bench.redisbench --entry-size 1024 --in-flight 1000 --duration-s 5

`RedisServer` starts Debian's `redis-server` on a free loopback port with its
data under <repo>/.bench-tmp (`--appendonly yes --appendfsync always --save ''`,
AOF rewrite off so no background fork competes with the measured writes) and
stops it afterwards. Two Redis figures, each labelled where it is reported:

- `redis-resp` (run_resp_load): this module's minimal RESP client over asyncio
  streams on uvloop, Python like the bk client, one connection per
  `connections` with the in-flight depth split among them, keeping a sliding
  window of `in_flight` commands outstanding, exactly as the bk load generator
  does. Each command is `XADD <stream> MAXLEN ~ <n> * d <payload>`: a log
  append (XADD, with approximate trimming so the server's memory stays bounded;
  every XADD still goes to the AOF and is fsynced before its reply). Latency
  is per command: issue to the moment its reply was parsed.
- `redis-benchmark` (run_redis_benchmark): the C tool from redis-tools with
  `-t set -d <entry size> -P <in_flight> -c <connections>`. Its pipelining is
  batch-wise (send P commands, wait for all P replies), not a sliding window,
  and it is a C client, so it shows what Redis does with a faster client. Its
  p99 is the tool's own (per request).

With `appendfsync always` Redis writes and fsyncs the AOF once per event-loop
iteration before it replies, so commands read in one iteration share an fsync.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np

from bk.testing.ports import free_port

from . import scratch_dir
from .stats import MB, human_size, latency_summary_ms, parse_size, positive_float, positive_int, rate

REDIS_MISSING = ("redis-server not found: install it with `apt-get install redis-server`"
                 " (redis-benchmark comes with redis-tools, which redis-server pulls in); skipping Redis")
REDIS_BENCHMARK_MISSING = "redis-benchmark not found: `apt-get install redis-tools`; skipping that figure"
STREAM_MAX_BYTES = 64 * 1024 * 1024  # XADD trims the stream to about this many payload bytes


class RedisMissingError(RuntimeError):
    """redis-server (or redis-benchmark) is not installed."""


class RespError(RuntimeError):
    """Redis answered a command with an error reply, or the stream was not RESP."""


# ---------------------------------------------------------------- RESP
def encode_command(*args) -> bytes:
    """A RESP array of bulk strings: encode_command(b"SET", b"k", b"v")."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, int):
            a = str(a).encode()
        parts.append(b"$%d\r\n" % len(a))
        parts.append(a)
        parts.append(b"\r\n")
    return b"".join(parts)


class RespParser:
    """Incremental RESP2 reply parser: feed() bytes as they arrive, get whole replies.

    Replies come back as Python values: simple strings and bulk strings as
    bytes, integers as int, nil as None, arrays as lists; an error reply is a
    RespError *value* (returned, not raised, so one failed command does not
    hide the replies after it)."""

    def __init__(self):
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> list:
        self._buf += data
        out = []
        while True:
            start = self._pos
            try:
                value = self._parse()
            except IndexError:  # incomplete: wait for more bytes
                self._pos = start
                break
            out.append(value)
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        return out

    def _line(self) -> bytes:
        end = self._buf.find(b"\r\n", self._pos)
        if end < 0:
            raise IndexError
        line = bytes(self._buf[self._pos:end])
        self._pos = end + 2
        return line

    def _parse(self):
        if self._pos >= len(self._buf):
            raise IndexError
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            return RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            if self._pos + n + 2 > len(self._buf):
                raise IndexError
            value = bytes(self._buf[self._pos:self._pos + n])
            if self._buf[self._pos + n:self._pos + n + 2] != b"\r\n":
                raise RespError("bulk string not followed by CRLF")
            self._pos += n + 2
            return value
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._parse() for _ in range(n)]
        raise RespError(f"not a RESP reply: {line[:40]!r}")


# ---------------------------------------------------------------- server
class RedisServer:
    """redis-server on 127.0.0.1:<free port>, durable AOF, data in a scratch dir (removed on stop)."""

    def __init__(self, binary: str | None = None, port: int | None = None):
        self.binary = binary or shutil.which("redis-server")
        if not self.binary:
            raise RedisMissingError(REDIS_MISSING)
        self.port = port or free_port()
        self.dir: str | None = None
        self.proc: subprocess.Popen | None = None

    def command_line(self) -> list[str]:
        return [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                "--auto-aof-rewrite-percentage", "0", "--daemonize", "no", "--logfile", "redis.log",
                "--protected-mode", "yes"]

    def start(self, timeout_s: float = 20.0) -> "RedisServer":
        self.dir = scratch_dir("redis")
        self.proc = subprocess.Popen(self.command_line(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace")
                self.stop()
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err[-2000:]}")
            if self.ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"redis-server did not answer PING on port {self.port} within {timeout_s} s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(encode_command("PING"))
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def log_tail(self, max_bytes: int = 1500) -> str:
        """The end of redis-server's log (while it has its directory)."""
        try:
            with open(os.path.join(self.dir, "redis.log"), "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - max_bytes))
                return fh.read().decode(errors="replace")
        except (OSError, TypeError):
            return ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # redis fsyncs the AOF and exits
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------- RESP load
def split_depth(in_flight: int, connections: int) -> list[int]:
    """The in-flight depth over `connections` (each at least 1)."""
    if connections < 1 or in_flight < connections:
        raise ValueError(f"need 1 <= connections <= in_flight, got {connections} and {in_flight}")
    base, extra = divmod(in_flight, connections)
    return [base + (1 if i < extra else 0) for i in range(connections)]


async def _connection_load(port: int, command: bytes, depth: int, deadline: float, count: int | None) -> dict:
    perf = time.perf_counter
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    parser = RespParser()
    issue_t: list[float] = []
    done_t: list[float] = []
    errors, first_error = 0, None
    sent = 0
    limit = count if count is not None else float("inf")
    try:
        while True:
            now = perf()
            # Keep `depth` commands outstanding: top the window up, then read.
            room = min(depth - (sent - len(done_t) - errors), limit - sent)
            if now < deadline and room > 0:
                writer.writelines([command] * room)
                issue_t.extend([now] * room)
                sent += room
                await writer.drain()
            if sent == len(done_t) + errors:
                break  # nothing outstanding and nothing more to send
            data = await reader.read(1 << 20)
            if not data:
                raise RespError("redis closed the connection")
            replies = parser.feed(data)
            t = perf()
            for r in replies:
                if isinstance(r, RespError):
                    errors += 1
                    first_error = first_error or str(r)
                else:
                    done_t.append(t)
    finally:
        writer.close()
    ok_issue = np.asarray(issue_t[:len(done_t) + errors], dtype=np.float64)
    return {"entries": len(done_t), "errors": errors, "error": first_error,
            "t_start": issue_t[0] if issue_t else perf(), "t_end": done_t[-1] if done_t else perf(),
            # errors are rare (none expected); their slots are dropped from the latency pairs
            "latency_s": np.asarray(done_t, dtype=np.float64) - ok_issue[:len(done_t)]}


async def run_resp_load_async(port: int, entry_size: int, in_flight: int, duration_s: float | None = None,
                              count: int | None = None, connections: int = 1) -> dict:
    payload = os.urandom(entry_size)
    maxlen = max(1000, STREAM_MAX_BYTES // entry_size)
    command = encode_command("XADD", "bklog", "MAXLEN", "~", maxlen, "*", "d", payload)
    depths = split_depth(in_flight, connections)
    cpu0 = time.process_time()
    deadline = time.perf_counter() + duration_s if duration_s is not None else float("inf")
    counts = [None] * connections
    if count is not None:
        base, extra = divmod(count, connections)
        counts = [base + (1 if i < extra else 0) for i in range(connections)]
    parts = await asyncio.gather(*(_connection_load(port, command, d, deadline, c) for d, c in zip(depths, counts)))
    cpu_s = time.process_time() - cpu0
    entries = sum(p["entries"] for p in parts)
    elapsed = max(p["t_end"] for p in parts) - min(p["t_start"] for p in parts)
    return {"system": "redis-resp", "command": "XADD", "entry_size": entry_size, "in_flight": in_flight,
            "connections": connections, "entries": entries, "bytes": entries * entry_size, "elapsed_s": elapsed,
            "entries_per_s": rate(entries, elapsed), "mb_per_s": rate(entries * entry_size, elapsed) / MB,
            "latency_ms": latency_summary_ms(np.concatenate([p["latency_s"] for p in parts])),
            "errors": sum(p["errors"] for p in parts), "error": next((p["error"] for p in parts if p["error"]), None),
            "client_cpu_pct": 100.0 * rate(cpu_s, elapsed)}


def run_resp_load(port: int, entry_size: int, in_flight: int, duration_s: float | None = None,
                  count: int | None = None, connections: int = 1) -> dict:
    from bk import eventloop
    return eventloop.run(run_resp_load_async(port, entry_size, in_flight, duration_s, count, connections))


# ---------------------------------------------------------------- redis-benchmark
def parse_redis_benchmark_csv(text: str) -> dict:
    """redis-benchmark --csv output -> {'rps': float, 'p99_latency_ms': float, ...} of its first test."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    if len(rows) < 2:
        raise ValueError(f"no CSV result from redis-benchmark: {text[:300]!r}")
    header, values = rows[0], rows[1]
    out = {"test": values[0]}
    for key, value in zip(header[1:], values[1:]):
        try:
            out[key] = float(value)
        except ValueError:
            out[key] = value
    if "rps" not in out:
        raise ValueError(f"redis-benchmark CSV has no rps column: {header}")
    return out


def whole_batches(requests: int, pipeline: int, connections: int) -> int:
    """`requests` rounded up to whole pipelines on every connection. redis-benchmark counts
    a pipeline's replies as they arrive, so a last partial batch overshoots the total;
    its 250 ms timer then sees no live client and finished != requests and aborts with
    "All clients disconnected" (redis-benchmark.c, showThroughput)."""
    step = pipeline * connections
    return max(step, -(-requests // step) * step)


def run_redis_benchmark(port: int, entry_size: int, in_flight: int, requests: int, connections: int = 1,
                        timeout_s: float = 300.0) -> dict:
    """`redis-benchmark -t set` with -P in_flight/connections per connection, `requests` in total."""
    binary = shutil.which("redis-benchmark")
    if not binary:
        raise RedisMissingError(REDIS_BENCHMARK_MISSING)
    pipeline = max(1, in_flight // connections)
    requests = whole_batches(requests, pipeline, connections)
    cmd = [binary, "-h", "127.0.0.1", "-p", str(port), "-c", str(connections), "-P", str(pipeline),
           "-n", str(requests), "-d", str(entry_size), "-t", "set", "--csv"]
    import resource
    before, wall0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    wall_s = time.perf_counter() - wall0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # only redis-benchmark was reaped in between
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        raise RuntimeError(f"redis-benchmark failed ({out.returncode}): {out.stderr[-1000:]}")
    r = parse_redis_benchmark_csv(out.stdout)
    rps = r["rps"]
    return {"system": "redis-benchmark", "command": "SET", "entry_size": entry_size, "in_flight": in_flight,
            "pipeline": pipeline, "connections": connections, "entries": requests, "bytes": requests * entry_size,
            "elapsed_s": rate(requests, rps), "entries_per_s": rps, "mb_per_s": rps * entry_size / MB,
            "latency_ms": {"p50": r.get("p50_latency_ms"), "p99": r.get("p99_latency_ms"),
                           "p999": None, "mean": r.get("avg_latency_ms"), "max": r.get("max_latency_ms")},
            "errors": 0, "error": None, "client_cpu_pct": 100.0 * rate(cpu_s, wall_s)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.redisbench", description=__doc__.split("\n\n")[0])
    p.add_argument("--entry-size", type=parse_size, default=1024)
    p.add_argument("--in-flight", type=positive_int, default=1000)
    p.add_argument("--duration-s", type=positive_float, default=5.0)
    p.add_argument("--connections", type=positive_int, default=1)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.connections > args.in_flight:
        p.error("--connections cannot exceed --in-flight")
    try:
        server = RedisServer()
    except RedisMissingError as e:
        print(e, file=sys.stderr)
        return 2
    with server:
        results = [run_resp_load(server.port, args.entry_size, args.in_flight, args.duration_s,
                                 connections=args.connections)]
        n = int(min(max(results[0]["entries_per_s"] * args.duration_s, 1000), 5_000_000))
        try:
            results.append(run_redis_benchmark(server.port, args.entry_size, args.in_flight, n, args.connections))
        except RedisMissingError as e:
            print(e, file=sys.stderr)
        except RuntimeError as e:
            print(f"{e}; redis log ends: {server.log_tail()!r}", file=sys.stderr)
    for r in results:
        lat = r["latency_ms"]
        p99 = "-" if lat["p99"] is None else f"{lat['p99']:.2f}"
        print(f"{r['system']} ({r['command']}, {human_size(args.entry_size)}, {args.in_flight} in flight):"
              f" {r['entries_per_s']:,.0f} entries/s, {r['mb_per_s']:.1f} MB/s, p99 {p99} ms")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
