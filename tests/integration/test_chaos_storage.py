"""Cluster chaos runs reach the storage code that loses data in BookKeeper's history (issue 28;
bk/testing/chaos/storage.py): fixed seeds whose storage draw has GC every few hundred ms with
ledgers deleted while others are written, small entry logs and journals, small write caches
and two ledger dirs. The bookies' own counters (each run's `reached`) show GC deleting ledgers
and compacting logs, both kinds of log rotating and adds finding the write cache full, and every
invariant holds (every acknowledged entry of the live ledgers read back, no deleted ledger back
in the metadata). In-process only; about 10 s on two cores."""
from __future__ import annotations

import pytest

from bk.testing.chaos import run_many
from bk.testing.chaos.storage import draw_storage

pytestmark = pytest.mark.integration

# Picked from seeds 60001-60080 (2026-11-27): the three that reached all five below in one run
# (60017 also adds refused); their draws: GC on, small logs and a small write cache, deletes.
SEEDS = [60017, 60033, 60053]
MUST_REACH = ("gc_ledgers_deleted", "gc_logs_compacted", "entry_log_rotations", "journal_rotations", "adds_throttled")


def _explain(summary: dict) -> str:
    return "\n".join(f"seed {r['seed']}: {r['failures']}\n  replay: {r['replay']}\n  " + "\n  ".join(r.get("trace", []))
                     for r in summary["failures"])


@pytest.mark.timeout(180)
def test_runs_reach_gc_compaction_rotation_and_a_full_write_cache_and_keep_every_invariant():
    assert all(draw_storage(s).gc and draw_storage(s).small_logs and draw_storage(s).small_cache for s in SEEDS)
    summary = run_many(SEEDS, {"mode": "inprocess"}, jobs=2, progress=False, shrink_limit=0)
    assert not summary["failures"], _explain(summary)
    st = summary["storage"]
    assert st["runs"] == st["reached_runs"] == len(SEEDS)
    assert st["client_deleted_ledgers"] > 0
    reached = st["reached"]
    assert all(reached[k] > 0 for k in MUST_REACH), reached
    assert st["draws"]["two_dirs on"]["runs"] + st["draws"]["two_dirs off"]["runs"] == len(SEEDS)
