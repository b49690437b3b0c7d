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
