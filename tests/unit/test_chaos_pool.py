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



class _Claim:
    def __init__(self, seed: int, port_slice: tuple[int, int], clash: bool):
        self.seed, self.port_slice, self.clash = seed, port_slice, clash

    def to_json(self) -> dict:
        return {"seed": self.seed, "ok": not self.clash, "slice": self.port_slice}


def _claim_port_slice(seed: int, options: dict) -> _Claim:
    """Hold this worker's port slice for a moment: a second live worker given the same slice
    finds the claim file there and fails its seed."""
    import os
    import time

    from bk.testing import ports
    port_slice = ports.worker_slice(10000, 32768)
    claim = os.path.join(options["dir"], "%d-%d" % port_slice)
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return _Claim(seed, port_slice, clash=True)
    time.sleep(0.02)
    os.close(fd)
    os.unlink(claim)
    return _Claim(seed, port_slice, clash=False)


def test_workers_alive_at_once_pick_ports_from_disjoint_slices(tmp_path, monkeypatch):
    # Seed 109795: two workers picked the same free port for bookies they were about to start;
    # the second bookie could not bind (EADDRINUSE). Each live worker now holds its own slice,
    # and a replacement takes the slice of the worker it replaces.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    out = list(run_supervised(range(60), {"dir": str(tmp_path)}, jobs=4, run_one=_claim_port_slice, hang_s=60,
                              mode_of=lambda s: "inprocess", replay_of=lambda s: f"replay {s}", tasks_per_worker=3))
    assert [r for r in out if not r.get("ok")] == []
    width = (32768 - 10000) // 4
    assert {tuple(r["slice"]) for r in out} == {(10000 + k * width, 10000 + (k + 1) * width) for k in range(4)}
