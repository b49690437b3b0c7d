"""bench.compare's read rows: bk's client reading from bk bookies and from Java bookies (issue 34).

Per cluster (bk-1 / java-bookie: one bookie, ledgers E1; bk-3 / java-bookie-3: three
bookies, ledgers E3/WQ2/AQ2), 1 KiB entries (`--read-size`), rows of `--read-entries` reads:

- `single` form: one READ_ENTRY per entry, `depth` of them in flight (a sliding window:
  a new READ as soon as one completes), over protocol v2 and v3. Issued here, entry by entry
  (`ReadEntryOp` of bk's client, the op its range reads run per entry), so no client setting
  decides between BATCH_READ and single READs and nothing test-only enters bk/.
- `batch` form (one-bookie clusters, and only where the bookie has BATCH_READ: bk, Java 4.17):
  `read_entries` of 100-entry ranges, 8 in flight, bk's client at its defaults (BATCH_READs
  of up to 64 entries).
- tiers, each row reading entries of its own:
  `write-cache`: a ledger written just before (bk: its write cache, flushed to the entry log
  every `flush_interval_ms`, 1 s by default, so part of a slow row may come from the entry
  log's pages; Java SortedLedgerStorage: its memtable, 64 MB, flushed by its checkpoint every
  60 s);
  `cold`: a slice of a ledger written at the start, pushed out of both write caches by a
  192 MiB filler ledger, its files fsynced and their page cache dropped just before the row;
  `read-cache`: the same slice read again right after (bk: its read cache; Java's
  SortedLedgerStorage has none: the OS page cache).
Latency per READ (per range in the batch form), p50/p99 in ms.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time

from .stats import latency_summary_ms, median_or_none, ratio

PROTOCOLS = ("v2", "v3")
DEPTHS = (8, 100)
TIERS = ("write-cache", "read-cache", "cold")
SLICE_GAP = 2000  # entries left unread between cold slices: a read-ahead past a slice warms none of the next
FILLER_BYTES = 192 * 1024 * 1024
FILLER_ENTRY = 64 * 1024
WRITE_WINDOW = 1000
BATCH_RANGE = 100
BATCH_RANGES_IN_FLIGHT = 8
# system -> (E, WQ, AQ) of its read ledgers
READ_QUORUMS = {"bk-1": (1, 1, 1), "java-bookie": (1, 1, 1), "bk-3": (3, 2, 2), "java-bookie-3": (3, 2, 2)}
PAIRS = (("bk-1", "java-bookie", 1), ("bk-3", "java-bookie-3", 3))


def payload(entry_id: int, pad: bytes) -> bytes:
    return entry_id.to_bytes(8, "big") + pad


async def write_ledger(bkc, quorum: tuple, count: int, size: int) -> int:
    """A closed ledger of `count` entries (entry id in the first 8 bytes), WRITE_WINDOW adds in flight."""
    lh = await bkc.create_ledger(*quorum, password=b"")
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    pad = os.urandom(max(0, size - 8))
    state = {"next": 0, "inflight": 0, "acked": 0, "error": None}

    def issue():
        while state["inflight"] < WRITE_WINDOW and state["next"] < count:
            state["inflight"] += 1
            state["next"] += 1
            lh.async_add_entry(payload(state["next"] - 1, pad), acked)

    def acked(entry_id, err):
        state["inflight"] -= 1
        state["acked"] += 1
        if err is not None and state["error"] is None:
            state["error"] = err
        if state["acked"] == count:
            if not done.done():
                done.set_result(None)
        elif state["error"] is None:
            issue()
        elif state["inflight"] == 0 and not done.done():
            done.set_result(None)

    issue()
    await done
    if state["error"] is not None:
        raise RuntimeError(f"writing ledger {lh.ledger_id}: {state['error']!r}")
    await lh.close()
    return lh.ledger_id


def sync_and_drop(path: str) -> int:
    """fsync every file under `path` (a Java bookie leaves its entry logs unsynced until its checkpoint),
    then drop their pages from the page cache (bench.reads.drop_page_cache): the next read goes to disk."""
    from .reads import drop_page_cache
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    return drop_page_cache(path)


async def single_reads(rh, first: int, count: int, depth: int) -> dict:
    """`count` READ_ENTRY requests for first.., `depth` in flight; every answer's entry id checked."""
    from bk.client.read_ops import ReadEntryOp, order_replicas
    pool, digest = rh._bk.pool, rh._digest
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    perf = time.perf_counter
    started = [0.0] * count
    latencies: list[float] = []
    st = {"next": first, "inflight": 0, "completed": 0, "errors": 0, "error": None}
    end = first + count

    def answered(entry_id, entry, err):
        latencies.append(perf() - started[entry_id - first])
        st["inflight"] -= 1
        st["completed"] += 1
        if err is not None or int.from_bytes(entry.data[:8], "big") != entry_id:
            st["errors"] += 1
            if st["error"] is None:
                st["error"] = repr(err) if err is not None else f"entry {entry_id}: wrong payload"
        if st["completed"] == count:
            if not done.done():
                done.set_result(None)
        else:
            issue()

    def issue():
        while st["inflight"] < depth and st["next"] < end:
            e = st["next"]
            st["next"] += 1
            st["inflight"] += 1
            started[e - first] = perf()
            ReadEntryOp(pool, digest, e, order_replicas(rh.replicas(e), pool), answered).start()

    t0 = perf()
    issue()
    await done
    return _row(count, perf() - t0, latencies, st["errors"], st["error"])


async def batch_reads(rh, first: int, count: int) -> dict:
    """`read_entries` of BATCH_RANGE-entry ranges, BATCH_RANGES_IN_FLIGHT outstanding."""
    perf = time.perf_counter
    latencies: list[float] = []
    st = {"errors": 0, "error": None}
    starts = iter(range(first, first + count, BATCH_RANGE))

    async def worker():
        for s in starts:
            last = min(first + count, s + BATCH_RANGE) - 1
            t = perf()
            try:
                entries = await rh.read_entries(s, last)
            except Exception as e:  # noqa: BLE001 - counted, the row says so
                st["errors"] += last - s + 1
                st["error"] = st["error"] or repr(e)
                continue
            latencies.append(perf() - t)
            bad = sum(1 for x in entries if int.from_bytes(x.data[:8], "big") != x.entry_id)
            if bad:
                st["errors"] += bad
                st["error"] = st["error"] or "wrong payload"

    t0 = perf()
    await asyncio.gather(*(worker() for _ in range(BATCH_RANGES_IN_FLIGHT)))
    return _row(count, perf() - t0, latencies, st["errors"], st["error"])


def _row(count: int, elapsed: float, latencies, errors: int, error) -> dict:
    lat = latency_summary_ms(latencies)
    return {"entries": count, "elapsed_s": elapsed, "reads_per_s": count / elapsed if elapsed > 0 else None,
            "p50_ms": lat["p50"], "p99_ms": lat["p99"], "errors": errors, "error": error}


class ReadTarget:
    """One cluster's read state across runs: its cold ledger and the next unread slice of it."""

    def __init__(self, system: str, metadata_uri: str, data_dir: str, batch: bool):
        self.system = system
        self.metadata_uri = metadata_uri
        self.data_dir = data_dir
        self.batch = batch  # BATCH_READ rows too (E == WQ and the bookie knows the op)
        self.quorum = READ_QUORUMS[system]
        self.cold_ledger: int | None = None
        self.next_slice = 0


def rows_per_run(target: ReadTarget) -> list[tuple]:
    """(form, protocol, depth) of every row a run makes on this target."""
    rows = [("single", p, d) for p in PROTOCOLS for d in DEPTHS]
    return rows + ([("batch", "v2", BATCH_RANGES_IN_FLIGHT)] if target.batch else [])


async def prepare(target: ReadTarget, runs: int, read_entries: int, size: int) -> None:
    """The cold ledger (a slice per row per run), then the filler that pushes it out of the caches,
    then a warm-up read (the Java bookie's JIT, bk's connections) not counted."""
    from bk.client import BookKeeper
    n = runs * len(rows_per_run(target)) * (read_entries + SLICE_GAP)
    async with BookKeeper(target.metadata_uri) as bkc:
        target.cold_ledger = await write_ledger(bkc, target.quorum, n, size)
        await write_ledger(bkc, target.quorum, FILLER_BYTES // FILLER_ENTRY, FILLER_ENTRY)
        warm = await write_ledger(bkc, target.quorum, min(read_entries, 5000), size)
        for protocol in PROTOCOLS:
            async with BookKeeper(target.metadata_uri, protocol=protocol) as rc:
                rh = await rc.open_ledger(warm, b"", recovery=False)
                await single_reads(rh, 0, min(read_entries, 5000), DEPTHS[-1])
    await asyncio.sleep(2.0)  # bk flushes its write cache every second


async def measure_run(target: ReadTarget, run: int, read_entries: int, size: int, log) -> list[dict]:
    """Every row of one run on `target`: per (form, protocol, depth) the write-cache row, then a cold
    slice and at once the same slice again (read-cache)."""
    from bk.client import BookKeeper
    out = []
    for form, protocol, depth in rows_per_run(target):
        async with BookKeeper(target.metadata_uri, protocol=protocol) as bkc:
            fresh = await write_ledger(bkc, target.quorum, read_entries, size)
            rh = await bkc.open_ledger(fresh, b"", recovery=False)
            reader = (lambda h, f, c: single_reads(h, f, c, depth)) if form == "single" else batch_reads
            first = target.next_slice * (read_entries + SLICE_GAP)
            target.next_slice += 1
            cold = await bkc.open_ledger(target.cold_ledger, b"", recovery=False)
            results = {"write-cache": await reader(rh, 0, read_entries)}
            sync_and_drop(target.data_dir)
            results["cold"] = await reader(cold, first, read_entries)
            results["read-cache"] = await reader(cold, first, read_entries)
            await bkc.delete_ledger(fresh)
        for tier in TIERS:
            r = results[tier]
            m = {"system": target.system, "run": run, "form": form, "protocol": protocol, "depth": depth,
                 "tier": tier, "entry_size": size, "loadavg_1m": os.getloadavg()[0], **r}
            out.append(m)
            log(f"reads run {run + 1} {target.system:13} {form:6} {protocol} depth {depth:3} {tier:11}"
                f" {r['reads_per_s'] or 0:>10,.0f} reads/s p50 {r['p50_ms'] or 0:.2f} p99 {r['p99_ms'] or 0:.2f} ms"
                + (f" ERRORS {r['errors']}: {r['error']}" if r["errors"] else ""))
    return out


def summarize_reads(measurements: list[dict]) -> list[dict]:
    """One row per (bookies, form, protocol, depth, tier): medians over runs of each side, bk ÷ Java."""
    by: dict = {}
    for m in measurements:
        by.setdefault((m["system"], m["form"], m["protocol"], m["depth"], m["tier"]), []).append(m)
    rows = []
    keys = sorted({k[1:] for k in by}, key=lambda k: (k[0] != "single", k[1], k[2], TIERS.index(k[3])))
    for bk_sys, java_sys, bookies in PAIRS:
        for key in keys:
            sides = {}
            for side, system in (("bk", bk_sys), ("java", java_sys)):
                ms = by.get((system, *key))
                if ms:
                    sides[side] = {"reads_per_s": median_or_none(m["reads_per_s"] for m in ms),
                                   "runs": [m["reads_per_s"] for m in ms],
                                   "p50_ms": median_or_none(m["p50_ms"] for m in ms),
                                   "p99_ms": median_or_none(m["p99_ms"] for m in ms),
                                   "errors": sum(m["errors"] for m in ms)}
            if not sides:
                continue
            form, protocol, depth, tier = key
            rows.append({"bookies": bookies, "form": form, "protocol": protocol, "depth": depth, "tier": tier,
                         **{f"{s}_{k}": v for s, d in sides.items() for k, v in d.items()},
                         "bk_over_java": ratio((sides.get("bk") or {}).get("reads_per_s"),
                                               (sides.get("java") or {}).get("reads_per_s"))})
    return rows


def render_reads(rows: list[dict]) -> str:
    from .stats import fmt_num, render_table
    headers = ["bookies", "read form", "proto", "in flight", "from", "Java reads/s", "p50/p99 ms",
               "bk reads/s", "p50/p99 ms", "bk÷Java"]

    def lat(r, side):
        p50, p99 = r.get(f"{side}_p50_ms"), r.get(f"{side}_p99_ms")
        return "-" if p50 is None else f"{p50:.2f}/{p99:.2f}"
    body = [[str(r["bookies"]), "single READ" if r["form"] == "single" else "BATCH_READ x100",
             r["protocol"], str(r["depth"]), r["tier"], fmt_num(r.get("java_reads_per_s")), lat(r, "java"),
             fmt_num(r.get("bk_reads_per_s")), lat(r, "bk"),
             "-" if r["bk_over_java"] is None else f"{r['bk_over_java']:.2f}"] for r in rows]
    return render_table(headers, body)
