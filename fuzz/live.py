"""Live fuzzing of a running bookie: malformed frames over many connections, then a good
client's read-back and the bookie's memory (docs/FUZZING.md).

    python -m fuzz live [--frames 1000000] [--concurrency 16] [--seed 1] [--zk HOST:PORT]

1. Start ZooKeeper (or use --zk) and one real `bk bookie` process (bk.testing.cluster).
2. A good client writes a ledger (ensemble 1) and closes it.
3. Warm-up (100,000 frames, then a settle): the baseline RSS is read after it, so the
   allocator's and caches' one-time growth is not mistaken for a leak; the RSS right after
   the good write is reported too.
4. `--concurrency` workers, each a loop of connections until `--frames` frames are sent. A
   connection speaks v2 or v3 (a v3 one starts with v3 frames: the bookie picks the protocol
   from the first frame) and sends batches of frames mutated from valid requests (bit flips,
   byte changes, cut or grown bodies with a matching length prefix, swapped ops, random
   garbage), reading and discarding answers as they come. Most connections end with a close
   after their frames; some end with a framing error that the bookie must answer by closing:
   a negative or oversized length, a length beyond the frame limit, or a frame cut short by EOF.
   Mutations never carry the good ledger's master key, so no frame is an authorised write to it.
5. After a settle period: the bookie is alive, the good client reads the ledger back byte for
   byte, and the RSS (VmRSS of /proc/<pid>/status) is within --rss-tolerance of the baseline.
   Peak RSS is sampled during the run (and VmHWM read).
Prints one JSON summary line; exit 1 when any check fails.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import struct
import sys
import tempfile
import time

from bk.client import BookKeeper
from bk.proto import codec, messages as m, v3
from bk.proto.digest import DigestManager, DigestType
from bk.formats.wire import DEFAULT_MAX_FRAME_SIZE_BYTES, FLAG_DO_FENCING, FLAG_RECOVERY_ADD
from bk.proto.masterkey import master_key
from bk.testing.cluster import LocalCluster

GOOD_PASSWORD = b"good-client"
FUZZ_KEY = master_key(b"fuzzer")  # never the good ledger's key
_i32 = struct.Struct(">i")


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


# ---------------------------------------------------------------- frames
def _entry(ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C, b"fuzzer").frame_entry(entry_id, entry_id - 1,
                                                                                len(payload), payload)


def valid_frames(good_ledger: int, rng: random.Random) -> tuple[list[bytes], list[bytes]]:
    """(v2 frames, v3 frames) of every request kind, on the good ledger and on fuzz ledgers."""
    v2, v3_frames = [], []
    for lid in (good_ledger, good_ledger + 1, 1 << 40, 7):
        e = rng.randrange(0, 50)
        add = codec.encode_request(m.AddRequest(0, FUZZ_KEY, lid, e, _entry(lid, e, rng.randbytes(rng.randrange(64)))))
        v2 += [add,
               codec.encode_request(m.AddRequest(FLAG_RECOVERY_ADD, FUZZ_KEY, lid, e + 1, _entry(lid, e + 1, b"r"))),
               codec.encode_request(m.ReadRequest(0, lid, e)), codec.encode_request(m.ReadRequest(0, lid, -1)),
               codec.encode_request(m.ReadRequest(FLAG_DO_FENCING, lid, e, FUZZ_KEY)),
               codec.encode_request(m.BatchReadRequest(0, lid, 0, rng.randrange(1 << 30), 20, 1 << 16)),
               codec.encode_request(m.ReadLacRequest(0, lid)), codec.encode_request(m.GetBookieInfoRequest(0, 3))]
        lac_buf = lid.to_bytes(8, "big") + (e).to_bytes(8, "big") + b"\0" * 4
        v2.append(codec.encode_request(m.WriteLacRequest(0, FUZZ_KEY, lid, e, lac_buf)))
        v3_frames.append(v3.v3_add_request_from_v2(add, rng.randrange(1 << 32)))
        for op, name, fields in ((v3.OperationType.READ_ENTRY, "readRequest", dict(ledgerId=lid, entryId=e)),
                                 (v3.OperationType.READ_LAC, "readLacRequest", dict(ledgerId=lid)),
                                 (v3.OperationType.GET_BOOKIE_INFO, "getBookieInfoRequest", dict(requested=3)),
                                 (v3.OperationType.GET_LIST_OF_ENTRIES_OF_LEDGER, "getListOfEntriesOfLedgerRequest",
                                  dict(ledgerId=lid)),
                                 (v3.OperationType.FORCE_LEDGER, "forceLedgerRequest", dict(ledgerId=lid))):
            req = v3.Request()
            req.header.version, req.header.operation, req.header.txnId = 3, op, rng.randrange(1 << 32)
            body = getattr(req, name)
            for k, v in fields.items():
                setattr(body, k, v)
            v3_frames.append(v3.frame(req))
    return v2, v3_frames


# A malformed AUTH closes its connection (auth.py): rare, or it would end most connections early.
AUTH_FRAME = codec.encode_request(m.AuthRequest(0, b"\x00\x04test"))


def mutate(frame: bytes, rng: random.Random) -> bytes:
    """A mutated frame whose length prefix matches its body (the stream stays in step)."""
    body = bytearray(frame[4:])
    for _ in range(rng.choice((1, 1, 2, 3, 8))):
        kind = rng.randrange(7)
        if kind == 0 and body:  # bit flip
            i = rng.randrange(len(body))
            body[i] ^= 1 << rng.randrange(8)
        elif kind == 1 and body:  # byte set to an interesting value
            body[rng.randrange(len(body))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif kind == 2 and body:  # cut the body
            del body[rng.randrange(len(body)):]
        elif kind == 3:  # grow the body
            body[rng.randrange(len(body) + 1):0] = rng.randbytes(rng.randrange(1, 64))
        elif kind == 4 and len(body) >= 4:  # header: another op / version / flags
            body[rng.randrange(4)] = rng.randrange(256)
        elif kind == 5 and len(body) >= 12:  # an id field to an extreme
            pos = rng.randrange(0, len(body) - 8)
            body[pos:pos + 8] = rng.choice((b"\xff" * 8, b"\x7f" + b"\xff" * 7, b"\x80" + b"\0" * 7, b"\0" * 8))
        elif kind == 6:  # garbage body
            body = bytearray(rng.randbytes(rng.randrange(0, 128)))
    return _i32.pack(len(body)) + bytes(body)


def framing_error(frame: bytes, rng: random.Random, max_frame: int) -> bytes:
    """Bytes that must end the connection: a bad length prefix, or a frame cut short by EOF."""
    kind = rng.randrange(4)
    if kind == 0:
        return _i32.pack(rng.choice((-1, -(1 << 31), -rng.randrange(1, 1 << 20)))) + frame[4:]
    if kind == 1:
        return _i32.pack(rng.choice((max_frame + 1, (1 << 31) - 1, max_frame + rng.randrange(1, 1 << 20))))
    if kind == 2:
        return frame[:rng.randrange(1, len(frame))]  # truncated, then EOF
    return _i32.pack(len(frame) + rng.randrange(1, 4096)) + frame[4:]  # promises more than comes


# ---------------------------------------------------------------- traffic
class Stats:
    def __init__(self):
        self.frames = self.connections = self.framing_errors = self.answer_bytes = self.refused = self.answers = 0
        self.read_frames = 0  # frames before any the bookie closes the connection for (the client's count)
        self.peak_rss = 0


async def _drain(reader: asyncio.StreamReader, stats: Stats, seen: list) -> None:
    """Read answers until EOF, counting their frames (v2 and v3 answers are both length-prefixed);
    seen[0] is the time of the last byte."""
    pending = b""
    try:
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                return
            seen[0] = time.monotonic()
            stats.answer_bytes += len(chunk)
            pending += chunk
            pos = 0
            while len(pending) - pos >= 4:
                (ln,) = _i32.unpack_from(pending, pos)
                if len(pending) - pos - 4 < ln:
                    break
                pos += 4 + ln
                stats.answers += 1
            pending = pending[pos:]
    except (ConnectionError, OSError):
        return


async def _connection(port: int, frames: list[bytes], stats: Stats, quiet_s: float = 0.3) -> None:
    """Send the frames, then wait for answers until the bookie closes or goes quiet for quiet_s.
    No half-close: a bookie (like BookKeeper's) closes on EOF and drops answers still owed."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        stats.refused += 1
        return
    stats.connections += 1
    seen = [time.monotonic()]
    drain = asyncio.ensure_future(_drain(reader, stats, seen))
    try:
        for i in range(0, len(frames), 64):
            writer.write(b"".join(frames[i:i + 64]))
            await writer.drain()
            stats.frames += len(frames[i:i + 64])
        seen[0] = time.monotonic()
        while not drain.done() and time.monotonic() - seen[0] < quiet_s:
            await asyncio.sleep(quiet_s / 4)
    except (ConnectionError, OSError):
        pass
    finally:
        drain.cancel()
        writer.close()


def closes_connection(frame: bytes) -> bool:
    """A v2 frame the bookie answers by closing: an AUTH (op 3) it cannot parse or answer."""
    if len(frame) < 8:
        return False
    return frame[4:8] == b"\0\0\0\3" if frame[4] == 0 else frame[5] == 3


async def _worker(port: int, seed: int, target: int, v2: list, v3f: list, stats: Stats, max_frame: int) -> None:
    rng = random.Random(seed)
    while stats.frames < target:  # frames the bookie's socket took, not frames made
        n = min(target - stats.frames, rng.choice((1, 5, 50, 200, 1000, 3000)))
        pool = v3f if rng.random() < 0.3 else v2
        batch = [rng.choice(v3f)] if pool is v3f else []  # a v3 connection: its first frame is v3
        while len(batch) < n:
            r = rng.random()
            if r < 0.75:
                frame = mutate(rng.choice(pool), rng)
                if closes_connection(frame) and rng.random() < 0.99:  # else few frames would be read
                    continue
                batch.append(frame)
            elif r < 0.9:
                batch.append(rng.choice(pool))
            elif r < 0.9995:
                frame = _i32.pack(k := rng.randrange(0, 96)) + rng.randbytes(k)
                if not closes_connection(frame) or rng.random() < 0.01:
                    batch.append(frame)
            else:
                batch.append(mutate(AUTH_FRAME, rng))
        if rng.random() < 0.2:
            batch[-1] = framing_error(rng.choice(pool), rng, max_frame)
            stats.framing_errors += 1
        # the frames the bookie reads: those before the first one it closes the connection for
        stats.read_frames += next((i + 1 for i, f in enumerate(batch) if closes_connection(f)), len(batch))
        await _connection(port, batch, stats)


async def _sample_rss(pid: int, stats: Stats, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            stats.peak_rss = max(stats.peak_rss, rss_bytes(pid))
        except (OSError, RuntimeError):
            return
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except asyncio.TimeoutError:
            pass


async def blast(port: int, pid: int, frames: int, concurrency: int, seed: int, good_ledger: int,
                max_frame: int = DEFAULT_MAX_FRAME_SIZE_BYTES) -> Stats:
    """Send `frames` fuzzed frames over `concurrency` parallel loops of connections."""
    stats = Stats()
    v2, v3f = valid_frames(good_ledger, random.Random(seed))
    stop = asyncio.Event()
    sampler = asyncio.ensure_future(_sample_rss(pid, stats, stop))
    await asyncio.gather(*(_worker(port, seed * 1000 + i, frames, v2, v3f, stats, max_frame)
                           for i in range(concurrency)))
    stop.set()
    await sampler
    return stats


# ---------------------------------------------------------------- the good client
async def write_ledger(uri: str, entries: int, seed: int) -> tuple[int, list[bytes]]:
    rng = random.Random(seed)
    data = [rng.randbytes(rng.choice((1, 100, 1000, 5000))) for _ in range(entries)]
    async with BookKeeper(uri) as bkc:
        lh = await bkc.create_ledger(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                                     password=GOOD_PASSWORD)
        for d in data:
            await lh.add_entry(d)
        await lh.close()
        return lh.ledger_id, data


async def read_ledger(uri: str, ledger_id: int) -> list[bytes]:
    async with BookKeeper(uri) as bkc:
        rh = await bkc.open_ledger(ledger_id, password=GOOD_PASSWORD)
        got = await rh.read_entries(0, rh.last_add_confirmed)
        return [e.data for e in got]


# ---------------------------------------------------------------- the whole run
def run_live(frames: int, concurrency: int = 16, seed: int = 1, zk: str | None = None, settle_s: float = 10.0,
             warmup_frames: int = 100000, rss_tolerance: float = 0.10, data_dir: str | None = None,
             entries: int = 200) -> dict:
    """Start ZooKeeper (unless `zk`) and one bookie process, fuzz it (fuzz_bookie), stop them."""
    with tempfile.TemporaryDirectory(prefix="bk-live-fuzz-") as tmp:
        cluster = LocalCluster(data_dir or tmp, bookies=1, zk_connect=zk)
        cluster.start()
        try:
            return fuzz_bookie(cluster, frames, concurrency, seed, settle_s, warmup_frames, rss_tolerance, entries)
        finally:
            cluster.stop()


def fuzz_bookie(cluster: LocalCluster, frames: int, concurrency: int = 16, seed: int = 1, settle_s: float = 10.0,
                warmup_frames: int = 100000, rss_tolerance: float = 0.10, entries: int = 200) -> dict:
    """Steps 2-5 of the module docstring against bookie 0 of a started cluster."""
    bookie = cluster.bookies[0]
    pid = bookie.proc.pid
    port = int(bookie.bookie_id.rsplit(":", 1)[1])
    ledger_id, data = asyncio.run(write_ledger(cluster.metadata_uri, entries, seed))
    rss_after_write = rss_bytes(pid)
    if warmup_frames:
        asyncio.run(blast(port, pid, warmup_frames, concurrency, seed + 7919, ledger_id))
        time.sleep(settle_s)
    rss_before = rss_bytes(pid)
    anon_before, file_before = rss_bytes(pid, "RssAnon"), rss_bytes(pid, "RssFile")
    start = time.monotonic()
    stats = asyncio.run(blast(port, pid, frames, concurrency, seed, ledger_id))
    duration = time.monotonic() - start
    time.sleep(settle_s)
    alive = bookie.alive
    rss_after = rss_bytes(pid) if alive else 0
    read_ok = alive and asyncio.run(read_ledger(cluster.metadata_uri, ledger_id)) == data
    result = {"frames": stats.frames, "frames_before_a_closing_frame": stats.read_frames, "connections": stats.connections, "framing_errors": stats.framing_errors,
              "refused_connections": stats.refused, "answers": stats.answers, "answer_bytes": stats.answer_bytes,
              "duration_s": round(duration, 1), "frames_per_s": round(stats.frames / max(duration, 1e-9)),
              "concurrency": concurrency, "seed": seed, "warmup_frames": warmup_frames, "settle_s": settle_s,
              "rss_after_good_write_mib": round(rss_after_write / 2**20, 1),
              "rss_before_mib": round(rss_before / 2**20, 1), "rss_peak_mib": round(stats.peak_rss / 2**20, 1),
              "rss_hwm_mib": round(rss_bytes(pid, "VmHWM") / 2**20, 1) if alive else 0,
              "rss_after_mib": round(rss_after / 2**20, 1),
              "rss_anon_before_after_mib": [round(anon_before / 2**20, 1),
                                            round(rss_bytes(pid, "RssAnon") / 2**20, 1) if alive else 0],
              "rss_file_before_after_mib": [round(file_before / 2**20, 1),
                                            round(rss_bytes(pid, "RssFile") / 2**20, 1) if alive else 0],
              "bookie_alive": alive, "read_back_equal": read_ok,
              "rss_within_tolerance": alive and rss_after <= rss_before * (1 + rss_tolerance)}
    result["ok"] = bool(alive and read_ok and result["rss_within_tolerance"])
    if not result["ok"]:
        result["bookie_log_tail"] = bookie._log_tail()
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fuzz live", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=1_000_000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--zk", help="an existing ZooKeeper HOST:PORT (default: start one)")
    ap.add_argument("--settle-s", type=float, default=10.0)
    ap.add_argument("--warmup-frames", type=int, default=100000)
    args = ap.parse_args(argv)
    result = run_live(args.frames, args.concurrency, args.seed, args.zk, args.settle_s, args.warmup_frames)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
