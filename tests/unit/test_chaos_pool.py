"""The chaos runner's worker pool (bk.testing.chaos.pool.run_supervised): a worker that retires
after its share of seeds exits normally with its last results still queued, possibly behind
other workers' messages; they must be read, not taken for a dead worker (seed 81867 of a
10-job run was reported "harness: worker died with exit code 0" and its real result dropped).
One task per worker makes every worker retire after each seed: before the fix, 400 of 400 in a run of 400
seeds failed that way. About 3-8 s (120 forks)."""
from __future__ import annotations

from bk.testing.chaos.pool import run_supervised


class _Result:
    def __init__(self, seed: int):
        self.seed = seed

    def to_json(self) -> dict:
        return {"seed": self.seed, "ok": True}


def _run_one(seed: int, options: dict) -> _Result:
    return _Result(seed)


def test_a_worker_that_retires_normally_has_its_last_result_read_not_called_dead():
    out = list(run_supervised(range(120), {}, jobs=6, run_one=_run_one, hang_s=60, mode_of=lambda s: "inprocess",
                              replay_of=lambda s: f"replay {s}", tasks_per_worker=1))
    assert [r for r in out if not r.get("ok")] == []
    assert sorted(r["seed"] for r in out) == list(range(120))  # each seed answered once
