"""The GC analytics as DataFrame transformations (docs/ANALYTICS.md has the definitions).

Inputs: ledgers-map rows (spark.logs.LEDGERS_SCHEMA, from disk or from the bookies'
HTTP endpoint) and ledger metadata (spark.metadata.LEDGERS_META_SCHEMA).

A ledger's bytes on a bookie are
    live            the ledger exists in the metadata (whatever its ensembles say: the
                    bookie keeps them until its own GC proves otherwise);
    deleted         the ledger is not in the metadata: deleted, not yet reclaimed;
                    rows with no ledger id (bytes a bookie's GC already forgot) count here;
    over-replicated live, but no ensemble of the ledger names this bookie any more
                    (reported apart; the bookie's GC frees them only after
                    gc_over_replicated_ledger_wait_time_ms).
reclaimable = total - live. A log's usage = live / total (1.0 for a log with no bytes).
A compaction plan at threshold t takes the CLOSED logs (with their ledgers map; never a
log being written) with usage < t: bytes_reclaimed = their total - live,
bytes_rewritten = their live bytes (compaction copies those).
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05 .. 0.95
RECOMMEND_MAX = 0.5     # above it a compaction rewrites more bytes than it frees
RECOMMEND_SHARE = 0.9   # ... and the smallest threshold getting this share of what 0.5 gets
DEFAULT_THRESHOLD = 0.2  # BookKeeper's minor compaction threshold, when nothing is reclaimable
TOP_N = 20


def classify(usage: DataFrame, ledgers: DataFrame) -> DataFrame:
    """usage rows + exists / live / deleted / over_replicated flags and the ledger's owner."""
    meta = ledgers.select(
        "ledger_id", "state", "owner",
        F.flatten(F.transform("segments", lambda s: s["bookies"])).alias("named_bookies"))
    u = usage.join(F.broadcast(meta), "ledger_id", "left")
    exists = F.col("state").isNotNull()
    return u.select(
        "bookie_id", "log_id", "ledger_id", "bytes", "source", "closed", "file_bytes", "scan_status",
        "invalid_bytes", "state", "owner",
        exists.alias("live"),
        (~exists).alias("deleted"),
        (exists & ~F.array_contains("named_bookies", F.col("bookie_id"))).alias("over_replicated"))


def _sum_if(cond, col="bytes"):
    return F.sum(F.when(cond, F.col(col)).otherwise(F.lit(0))).cast("long")


def per_log(rows: DataFrame) -> DataFrame:
    g = rows.groupBy("bookie_id", "log_id").agg(
        F.sum("bytes").cast("long").alias("total_bytes"),
        _sum_if(F.col("live")).alias("live_bytes"),
        _sum_if(F.col("deleted")).alias("deleted_bytes"),
        _sum_if(F.col("over_replicated")).alias("over_replicated_bytes"),
        F.countDistinct("ledger_id").alias("ledgers"),
        F.min("closed").alias("closed"),
        F.first("source").alias("source"),
        F.max("file_bytes").alias("file_bytes"),
        F.max("scan_status").alias("scan_status"),
        F.max("invalid_bytes").alias("invalid_bytes"))
    return g.withColumn("usage", F.when(F.col("total_bytes") > 0, F.col("live_bytes") / F.col("total_bytes"))
                        .otherwise(F.lit(1.0)))


def per_bookie(logs: DataFrame) -> DataFrame:
    return logs.groupBy("bookie_id").agg(
        F.sum("total_bytes").cast("long").alias("total_bytes"),
        F.sum("live_bytes").cast("long").alias("live_bytes"),
        (F.sum("total_bytes") - F.sum("live_bytes")).cast("long").alias("reclaimable_bytes"),
        F.sum("deleted_bytes").cast("long").alias("deleted_bytes"),
        F.sum("over_replicated_bytes").cast("long").alias("over_replicated_bytes"),
        F.count("*").alias("entry_logs"),
        F.sum(F.when(~F.col("closed"), 1).otherwise(0)).alias("open_logs"),
        F.sum("file_bytes").cast("long").alias("file_bytes"),
        F.sum("invalid_bytes").cast("long").alias("invalid_bytes"),
    ).orderBy("bookie_id")


def is_candidate(log: dict) -> bool:
    return bool(log["closed"]) and log["source"] == "map"


def what_if(logs: list[dict]) -> tuple[dict[str, list[dict]], list[dict]]:
    """(per bookie, total): for each threshold, the logs under it, bytes reclaimed and rewritten.
    Over the collected per-log rows (one per entry log: small next to the ledger rows)."""
    zero = lambda t: {"threshold": t, "logs": 0, "bytes_reclaimed": 0, "bytes_rewritten": 0}  # noqa: E731
    per_bookie = {b: [zero(t) for t in THRESHOLDS] for b in sorted({r["bookie_id"] for r in logs})}
    total = [zero(t) for t in THRESHOLDS]
    for r in logs:
        if not is_candidate(r):
            continue
        for i, t in enumerate(THRESHOLDS):
            if r["usage"] < t:
                for cell in (per_bookie[r["bookie_id"]][i], total[i]):
                    cell["logs"] += 1
                    cell["bytes_reclaimed"] += r["total_bytes"] - r["live_bytes"]
                    cell["bytes_rewritten"] += r["live_bytes"]
    return per_bookie, total


def recommend(total_rows: list[dict]) -> float:
    """The smallest threshold <= RECOMMEND_MAX that reclaims RECOMMEND_SHARE of what RECOMMEND_MAX does
    (past 0.5 each byte freed costs more than one byte rewritten)."""
    by_t = {round(r["threshold"], 2): r["bytes_reclaimed"] for r in total_rows}
    best = by_t.get(RECOMMEND_MAX, 0)
    if best <= 0:
        return DEFAULT_THRESHOLD
    for t in THRESHOLDS:
        if t <= RECOMMEND_MAX and by_t.get(t, 0) >= RECOMMEND_SHARE * best:
            return t
    return RECOMMEND_MAX


def plan(logs: list[dict], threshold: float) -> list[dict]:
    return sorted((r for r in logs if is_candidate(r) and r["usage"] < threshold),
                  key=lambda r: (r["bookie_id"], r["usage"], r["log_id"]))


def top_ledgers(rows: DataFrame, n: int = TOP_N) -> DataFrame:
    return rows.where(F.col("ledger_id").isNotNull()).groupBy("ledger_id").agg(
        F.sum("bytes").cast("long").alias("bytes"),
        F.countDistinct("bookie_id").alias("bookies"),
        F.first("state", ignorenulls=True).alias("state"),
        F.first("owner", ignorenulls=True).alias("owner"),
        F.max("deleted").alias("deleted"),
        _sum_if(F.col("over_replicated")).alias("over_replicated_bytes"),
    ).orderBy(F.desc("bytes"), "ledger_id").limit(n)


def top_owners(rows: DataFrame, n: int = TOP_N) -> DataFrame:
    owner = (F.when(F.col("ledger_id").isNull(), F.lit("(already collected by the bookie's GC)"))
             .when(F.col("deleted"), F.lit("(deleted ledgers)"))
             .otherwise(F.coalesce(F.col("owner"), F.lit("(no owner in custom metadata)"))))
    return rows.withColumn("owner_name", owner).groupBy("owner_name").agg(
        F.sum("bytes").cast("long").alias("bytes"),
        _sum_if(F.col("live")).alias("live_bytes"),
        F.countDistinct("ledger_id").alias("ledgers"),
    ).withColumnRenamed("owner_name", "owner").orderBy(F.desc("bytes"), "owner").limit(n)


def under_replicated(rows: DataFrame, ledgers: DataFrame, entries: DataFrame | None = None) -> DataFrame:
    """(ledger, segment, bookie) where an analysed bookie is named by a segment's ensemble,
    should hold some of its entries (the write set: entry e goes to ensemble indexes
    (e + k) % E, k < write quorum) and holds none of them. With a full scan (`entries`)
    that is judged per segment, from the entry ids the bookie holds; from ledgers maps
    alone, per ledger (the bookie holds no byte of the ledger at all). Open-ended
    segments (the last of an open ledger) are not judged."""
    seg = ledgers.select("ledger_id", "ensemble_size", "write_quorum_size", F.explode("segments").alias("s")) \
        .select("ledger_id", "ensemble_size", "write_quorum_size", F.col("s.first_entry_id").alias("first_entry_id"),
                F.col("s.last_entry_id").alias("last_entry_id"), F.posexplode("s.bookies").alias("idx", "bookie_id"))
    n = F.col("last_entry_id") - F.col("first_entry_id") + 1
    expected = seg.where(F.col("last_entry_id").isNotNull() & (n >= 1) &
                         (F.pmod(F.col("idx") - F.col("first_entry_id"), F.col("ensemble_size"))
                          <= n + F.col("write_quorum_size") - 2))
    analysed = rows.select("bookie_id").distinct()
    expected = expected.join(F.broadcast(analysed), "bookie_id")
    if entries is None:
        present = rows.where(F.col("ledger_id").isNotNull() & (F.col("bytes") > 0)) \
            .select("bookie_id", "ledger_id").distinct()
        missing = expected.join(present, ["bookie_id", "ledger_id"], "left_anti")
    else:
        held = entries.where(F.col("status") == "ok").select("bookie_id", "ledger_id", "entry_id").alias("h")
        e = expected.alias("x")
        missing = e.join(held, (F.col("x.bookie_id") == F.col("h.bookie_id")) &
                         (F.col("x.ledger_id") == F.col("h.ledger_id")) &
                         F.col("h.entry_id").between(F.col("x.first_entry_id"), F.col("x.last_entry_id")),
                         "left_anti")
    return missing.select("ledger_id", "first_entry_id", "last_entry_id", "bookie_id") \
        .orderBy("ledger_id", "first_entry_id", "bookie_id")


def scan_stats(entries: DataFrame) -> DataFrame:
    """Per bookie, from a full scan: entries, bytes, digest failures, torn or garbage tails."""
    ok = F.col("status") == "ok"
    return entries.groupBy("bookie_id").agg(
        F.sum(F.when(ok, 1).otherwise(0)).alias("entries"),
        _sum_if(ok, "size").alias("entry_bytes"),
        F.sum(F.when(ok & (F.col("checksum_valid") == F.lit(False)), 1).otherwise(0)).alias("checksum_failures"),
        F.sum(F.when(ok & F.col("checksum_valid").isNull(), 1).otherwise(0)).alias("unchecked_entries"),
        F.sum(F.when(~ok, 1).otherwise(0)).alias("bad_tails"),
        _sum_if(~ok, "size").alias("bad_tail_bytes"),
    ).orderBy("bookie_id")


def usage_histogram(logs: list[dict], bins: int = 20) -> dict[str, list[int]]:
    """Per bookie, closed logs counted by usage bin (usage 1.0 falls in the last)."""
    out: dict[str, list[int]] = {}
    for r in logs:
        if is_candidate(r):
            out.setdefault(r["bookie_id"], [0] * bins)[min(int(r["usage"] * bins), bins - 1)] += 1
    return out
