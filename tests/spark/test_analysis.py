"""The plan, what-if and recommendation rules on hand-made per-log rows (no Spark session)."""
from spark import analysis as A


def log(bookie, log_id, total, live, closed=True, source="map"):
    return {"bookie_id": bookie, "log_id": log_id, "total_bytes": total, "live_bytes": live,
            "usage": live / total if total else 1.0, "closed": closed, "source": source}


LOGS = [log("a", 1, 100, 0), log("a", 2, 100, 30), log("a", 3, 100, 90), log("b", 1, 200, 20),
        log("b", 2, 100, 10, closed=False, source="scan")]  # b/2 is being written: never planned


def test_plan_takes_closed_logs_under_the_threshold():
    plan = A.plan(LOGS, 0.35)
    assert [(r["bookie_id"], r["log_id"]) for r in plan] == [("a", 1), ("a", 2), ("b", 1)]
    assert sum(r["total_bytes"] - r["live_bytes"] for r in plan) == 100 + 70 + 180
    assert A.plan(LOGS, 0.05) == [LOGS[0]], "usage 0: deleted whole, nothing rewritten"


def test_what_if_curves_add_up():
    per_bookie, total = A.what_if(LOGS)
    assert [r["threshold"] for r in total] == list(A.THRESHOLDS) and len(total) == 19
    at = {r["threshold"]: r for r in total}
    assert at[0.05] == {"threshold": 0.05, "logs": 1, "bytes_reclaimed": 100, "bytes_rewritten": 0}
    assert at[0.95] == {"threshold": 0.95, "logs": 4, "bytes_reclaimed": 100 + 70 + 10 + 180,
                        "bytes_rewritten": 30 + 90 + 20}
    for i, t in enumerate(A.THRESHOLDS):
        assert total[i]["bytes_reclaimed"] == sum(per_bookie[b][i]["bytes_reclaimed"] for b in per_bookie)
    assert A.usage_histogram(LOGS)["a"][0] == 1 and A.usage_histogram(LOGS)["a"][18] == 1


def test_recommendation():
    _, total = A.what_if(LOGS)
    # 0.5 reclaims 350; 0.35 already reaches 350 (>= 90%), 0.3 reaches 280 + ... = 280 < 315
    assert A.recommend(total) == 0.35
    _, nothing = A.what_if([log("a", 1, 100, 100)])
    assert A.recommend(nothing) == A.DEFAULT_THRESHOLD


def test_under_replicated_per_segment_with_a_scan_and_per_ledger_without(spark):
    """Ledger 7, E=3 WQ=2, segments [0..9] and [10..19] both on a, b, c. Bookie c holds its share
    of the first segment only: a full scan names (7, 10, c); ledgers maps cannot (c holds bytes
    of ledger 7). Ledger 8's one-entry segment is due on a and b only (entry 0 -> indexes 0, 1):
    c holding none of it is no gap. Bookie d is named but never analysed: not judged."""
    from spark.metadata import LEDGERS_META_DDL

    seg = lambda first, last, bookies: {"first_entry_id": first, "last_entry_id": last, "bookies": bookies}  # noqa
    base = {"state": "CLOSED", "ensemble_size": 3, "write_quorum_size": 2, "ack_quorum_size": 2, "length": 0,
            "ctime_ms": 0, "digest_type": "CRC32C", "custom_metadata": {}, "owner": None}
    ledgers = spark.createDataFrame([
        {**base, "ledger_id": 7, "last_entry_id": 19, "segments": [seg(0, 9, ["a", "b", "c"]), seg(10, 19, ["a", "b", "c"])]},
        {**base, "ledger_id": 8, "last_entry_id": 0, "segments": [seg(0, 0, ["a", "b", "c"])]},
        {**base, "ledger_id": 9, "last_entry_id": 4, "segments": [seg(0, 4, ["a", "b", "d"])]},
    ], LEDGERS_META_DDL)
    held = {"a": [(7, e) for e in range(20) if e % 3 in (0, 2)] + [(8, 0), (9, 0)],
            "b": [(7, e) for e in range(20) if e % 3 in (0, 1)] + [(8, 0), (9, 1)],
            "c": [(7, e) for e in range(10) if e % 3 in (1, 2)]}
    entries = spark.createDataFrame(
        [(b, lid, eid, "ok") for b, items in held.items() for lid, eid in items],
        "bookie_id string, ledger_id bigint, entry_id bigint, status string")
    rows = entries.groupBy("bookie_id", "ledger_id").count().withColumnRenamed("count", "bytes")
    by_scan = [tuple(r) for r in A.under_replicated(rows, ledgers, entries).collect()]
    assert by_scan == [(7, 10, 19, "c")]
    assert A.under_replicated(rows, ledgers).collect() == [], "ledger-level: c holds bytes of ledger 7"
