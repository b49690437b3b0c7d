"""Synthetic bookie directories: a cluster's storage at sizes this machine cannot hold.

    python -m spark.synth --out /tmp/synth --bookies 30 --logs 10000 --log-bytes 1GiB \\
        --metadata-uri zk://127.0.0.1:2181/ledgers --deleted 0.3 [--mode sparse|real]

Writes `<out>/bookie-<i>/ledgers/current/<hex>.log` entry logs in bk's format (header,
records, ledgers map, CRC32C-framed entries: bk.formats), a cookie naming each bookie
(`127.0.0.<i>:3181`-style ids), the live ledgers' metadata into the store (closed
ledgers, Pulsar-style custom metadata naming a topic), and `<out>/manifest.json`
with the figures the generator put in (per bookie: total, live, deleted,
over-replicated bytes), which an analysis must find again.

How the bytes are laid out, like a real cluster: ledgers are created over time,
sizes log-normal; each ledger is written to an ensemble of `--ensemble` bookies
(write quorum = ensemble) in a few chunks interleaved with the ledgers written
around the same time; each bookie's stream of chunks fills logs of `--log-bytes`.
Deleted ledgers (no metadata): mostly the oldest (retention), some at random.
`--over-replicated` of the ledgers have a segment moved to another bookie in the
metadata (the old bookie still holds the bytes); `--under-replicated` name a bookie
in their ensemble that never got the data.

Mode sparse (default): each log holds only its header and ledgers map; the records
are a hole (apparent size as if full): for ledgers-map analysis. Mode real: every
record is written (CRC32C-framed entries of `--entry-bytes`), for full scans.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random

from bk.formats import entrylog as fmt
from bk.formats.entry import DIGEST_LENGTH_BY_TYPE, ENTRY_HEADER_LENGTH, DigestType, crc32c_entry
from bk.meta import open_store
from bk.meta.cookie import Cookie, write_directory_cookie
from bk.meta.ledger_manager import LedgerManager
from bk.meta.ledger_metadata import LedgerMetadata

UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
ENTRY_OVERHEAD_BYTES = fmt.LOG_SIZE_FIELD_BYTES + ENTRY_HEADER_LENGTH + DIGEST_LENGTH_BY_TYPE[DigestType.CRC32C]


def parse_bytes(text: str) -> int:
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    return int(float(t[:-1]) * UNITS[t[-1]]) if t and t[-1] in UNITS else int(t)


def bookie_ids(n: int) -> list[str]:
    return [f"10.0.{i // 250}.{i % 250 + 1}:3181" for i in range(n)]


def plan_cluster(bookies: int, logs: int, log_bytes: int, deleted: float, ensemble: int, seed: int,
                 over_replicated: float = 0.0, under_replicated: float = 0.0, entry_bytes: int = 0):
    """The layout without writing it: (bookie ids, ledgers, per-bookie logs). ledgers: id ->
    dict(ensemble (what the metadata names), holders (who has the bytes), bytes, deleted);
    logs: bookie index -> [[(ledger, bytes)] per log]."""
    rng = random.Random(seed)
    ids = bookie_ids(bookies)
    total = logs * log_bytes * (1 - 0.002)  # what the bookies hold, replicas included
    per_ledger = total / ensemble
    mean = max(log_bytes // 8, 1 << 16)
    ledgers: dict[int, dict] = {}
    lid, made = 1, 0.0
    while made < per_ledger:
        size = int(min(rng.lognormvariate(0, 1.0) * mean, 8 * log_bytes)) + (64 << 10)
        if entry_bytes:
            size = max(1, size // (entry_bytes + ENTRY_OVERHEAD_BYTES)) * (entry_bytes + ENTRY_OVERHEAD_BYTES)
        holders = rng.sample(range(bookies), ensemble)
        ledgers[lid] = {"holders": holders, "ensemble": list(holders), "bytes": size, "deleted": False}
        made += size
        lid += 1
    n = len(ledgers)
    for i, led in enumerate(ledgers.values()):
        age = 1 - i / n  # 1 = oldest
        led["deleted"] = rng.random() < deleted * (1.6 * age if age > 0.5 else 0.4 * age + 0.2)
    for led in ledgers.values():
        if led["deleted"]:
            continue
        r = rng.random()
        if r < over_replicated:  # AutoRecovery moved the segment: the old holder keeps the bytes
            spare = [b for b in range(bookies) if b not in led["holders"]]
            if spare:
                led["ensemble"][0] = rng.choice(spare)
        elif r < over_replicated + under_replicated:  # a holder that never got the data
            led["holders"] = led["holders"][1:]
    # each bookie's stream: chunks of ledgers written around the same time, interleaved
    streams: list[list[tuple[int, int]]] = [[] for _ in range(bookies)]
    window = 8
    order = list(ledgers)
    for start in range(0, len(order), window):
        chunks = []
        for lid in order[start:start + window]:
            led = ledgers[lid]
            parts = rng.randint(1, 4)
            unit = (entry_bytes + ENTRY_OVERHEAD_BYTES) if entry_bytes else 1
            units = led["bytes"] // unit
            cuts = sorted(rng.sample(range(1, units), min(parts - 1, max(units - 1, 0)))) if units > 1 else []
            prev = 0
            for c in cuts + [units]:
                chunks.append((lid, (c - prev) * unit))
                prev = c
        rng.shuffle(chunks)
        for lid, nbytes in chunks:
            for b in ledgers[lid]["holders"]:
                streams[b].append((lid, nbytes))
    per_bookie_logs: dict[int, list] = {}
    for b, stream in enumerate(streams):
        out, cur, used = [], [], 0
        for lid, nbytes in stream:
            while nbytes > 0:
                take = min(nbytes, log_bytes - used)
                if entry_bytes:
                    unit = entry_bytes + ENTRY_OVERHEAD_BYTES
                    take = max(unit, take // unit * unit)
                cur.append((lid, take))
                used += take
                nbytes -= take
                if used >= log_bytes - (ENTRY_OVERHEAD_BYTES + entry_bytes if entry_bytes else 0):
                    out.append(cur)
                    cur, used = [], 0
        if cur:
            out.append(cur)
        per_bookie_logs[b] = out
    return ids, ledgers, per_bookie_logs


def write_log(path: str, log_id: int, contents: list[tuple[int, int]], mode: str, entry_bytes: int,
              next_entry: dict[int, int]) -> int:
    """One closed entry log; returns its records' bytes. In real mode every record is a
    CRC32C-framed entry of entry_bytes payload (ids continue per ledger via next_entry)."""
    usage: dict[int, int] = {}
    with open(path, "wb") as fh:
        fh.write(fmt.encode_header(log_id))
        if mode == "sparse":
            for lid, n in contents:
                usage[lid] = usage.get(lid, 0) + n
            fh.seek(fmt.LOG_HEADER_BYTES + sum(usage.values()))
        else:
            payload = (os.urandom(61) * (entry_bytes // 61 + 1))[:entry_bytes]
            unit = ENTRY_OVERHEAD_BYTES + entry_bytes
            size_field = fmt.LOG_SIZE_FIELD.pack(unit - fmt.LOG_SIZE_FIELD_BYTES)
            buf = bytearray()
            for lid, n in contents:
                for _ in range(n // unit):
                    eid = next_entry.get(lid, 0)
                    next_entry[lid] = eid + 1
                    buf += size_field + crc32c_entry(lid, eid, eid - 1, (eid + 1) * entry_bytes, payload)
                    if len(buf) >= 8 << 20:
                        fh.write(buf)
                        buf.clear()
                usage[lid] = usage.get(lid, 0) + n // unit * unit
            fh.write(buf)
        map_offset = fh.tell()
        fh.write(fmt.encode_ledgers_map(usage))
        fh.seek(fmt.header_map_fields_offset())
        fh.write(fmt.encode_map_fields(map_offset, len(usage)))
    return sum(usage.values())


async def write_metadata(uri: str, ids: list[str], ledgers: dict[int, dict], entry_bytes: int) -> None:
    store = await open_store(uri)
    try:
        manager = LedgerManager(store)
        live = [lid for lid, led in ledgers.items() if not led["deleted"]]

        async def one(lid: int) -> None:
            led = ledgers[lid]
            topic = f"tenant-{lid % 7}/ns-{lid % 3}/persistent/topic-{lid % 97}"
            md = LedgerMetadata.new([ids[b] for b in led["ensemble"]], len(led["ensemble"]), 2,
                                    custom_metadata={"application": b"pulsar", "component": b"managed-ledger",
                                                     "pulsar/managed-ledger": topic.encode()})
            unit = ENTRY_OVERHEAD_BYTES + entry_bytes if entry_bytes else 1 << 10
            entries = max(1, led["bytes"] // unit)
            md = md.with_closed(entries - 1, entries * (entry_bytes or unit))
            await manager.create_ledger_metadata(lid, md)
        for start in range(0, len(live), 256):
            await asyncio.gather(*(one(lid) for lid in live[start:start + 256]))
    finally:
        await store.close()


def generate(out: str, bookies: int, logs: int, log_bytes: int, deleted: float, metadata_uri: str | None,
             mode: str = "sparse", ensemble: int = 3, seed: int = 1, entry_bytes: int = 4096,
             over_replicated: float = 0.01, under_replicated: float = 0.01) -> dict:
    ids, ledgers, per_bookie = plan_cluster(bookies, logs, log_bytes, deleted, ensemble, seed,
                                            over_replicated, under_replicated,
                                            entry_bytes if mode == "real" else 0)
    manifest = {"bookies": {}, "ledgers": len(ledgers), "deleted_ledgers": sum(v["deleted"] for v in ledgers.values()),
                "mode": mode, "log_bytes": log_bytes, "entry_bytes": entry_bytes if mode == "real" else None}
    next_entry: dict[int, int] = {}
    for b, blogs in per_bookie.items():
        ledger_dir = os.path.join(out, f"bookie-{b}", "ledgers")
        write_directory_cookie(ledger_dir, Cookie(ids[b], (os.path.join(out, f"bookie-{b}", "journal"),),
                                                  (ledger_dir,)))
        figures = {"total_bytes": 0, "live_bytes": 0, "deleted_bytes": 0, "over_replicated_bytes": 0, "logs": 0}
        for i, contents in enumerate(blogs):
            log_id = i + 1
            write_log(os.path.join(fmt.log_dir(ledger_dir), fmt.log_file_name(log_id)), log_id, contents, mode,
                      entry_bytes, next_entry.setdefault(b, {}))
            figures["logs"] += 1
            for lid, n in contents:
                if mode == "real":
                    unit = ENTRY_OVERHEAD_BYTES + entry_bytes
                    n = n // unit * unit
                led = ledgers[lid]
                figures["total_bytes"] += n
                if led["deleted"]:
                    figures["deleted_bytes"] += n
                else:
                    figures["live_bytes"] += n
                    if b not in led["ensemble"]:
                        figures["over_replicated_bytes"] += n
        manifest["bookies"][ids[b]] = figures
    if metadata_uri:
        asyncio.run(write_metadata(metadata_uri, ids, ledgers, entry_bytes if mode == "real" else 0))
    with open(os.path.join(out, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1)
    return manifest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark.synth", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--bookies", type=int, default=30)
    p.add_argument("--logs", type=int, default=10000, help="entry logs in all (spread over the bookies)")
    p.add_argument("--log-bytes", type=parse_bytes, default=1 << 30)
    p.add_argument("--deleted", type=float, default=0.3, help="fraction of ledgers deleted")
    p.add_argument("--metadata-uri", help="write the live ledgers' metadata here (an initialised cluster)")
    p.add_argument("--mode", choices=("sparse", "real"), default="sparse")
    p.add_argument("--entry-bytes", type=parse_bytes, default=4096, help="payload per entry (real mode)")
    p.add_argument("--ensemble", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    m = generate(a.out, a.bookies, a.logs, a.log_bytes, a.deleted, a.metadata_uri, a.mode, a.ensemble, a.seed,
                 a.entry_bytes)
    logs = sum(f["logs"] for f in m["bookies"].values())
    total = sum(f["total_bytes"] for f in m["bookies"].values())
    print(f"synth: {len(m['bookies'])} bookies, {logs} entry logs, {total / 1e12:.2f} TB represented, "
          f"{m['ledgers']} ledgers ({m['deleted_ledgers']} deleted) in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
