"""The GC chaos mode (bk.testing.chaos.gc_chaos) and its broken-bookie self-test (issue 27).

A fixed set of seeds passes with the correct engine; each injected break (a defect of
issue 27 re-introduced, bk.testing.chaos.gc_breaks) is caught within a fixed small set
of seeds. The catcher sets were measured: each of their seeds caught its break in four
runs of seeds 1-40 out of four (docs/CHAOS.md "GC chaos"). A seed's schedule is a
function of the seed; only thread timing (a GC pass at start) varies, hence "4 of 5".
On c6a7cd48 (before the two defects were fixed) the correct-engine test fails: 48 of
seeds 1-60 fail there, 8 of the 12 below.

Every GC pass also draws a metadata fault (bk.testing.chaos.gc_metadata: a listing
that omits live ledgers, reads that fail with a connection loss, a store that is down)
from a generator of its own; gc-metadata-error-as-deleted (a failed read taken for "no
such ledger", apache/bookkeeper#4607) caught 11 of seeds 1-12 (all but seed 1) in each
of three runs.
"""
import json

import pytest

from bk.testing.chaos.__main__ import main
from bk.testing.chaos.gc_runner import run_many, run_seed

CORRECT_SEEDS = range(1, 13)  # journal on in 9 of them, off in 3
CATCHERS = {
    "gc-trust-partial-scan": (3, 5, 8, 9, 11),
    "gc-dead-from-memory": (1, 3, 8, 9, 10),
    "gc-metadata-error-as-deleted": (6, 8, 9, 10, 12),  # caught at a delete, a gc, a commit
}
# What a catch looks like: an entry whose log was deleted under it answers "entry log
# ... does not exist" / "no entry log" (a live ledger's, or a failed delete's ledger back
# after the restart); a live ledger deleted whole answers "no such ledger".
SIGNATURE = {"gc-trust-partial-scan": "entry log", "gc-dead-from-memory": "entry log",
             "gc-metadata-error-as-deleted": "answered NoSuchLedgerError"}


def test_the_correct_engine_passes_a_fixed_set_of_seeds():
    summary = run_many(CORRECT_SEEDS)
    assert summary["failed"] == 0, summary
    # the schedules reached every destructive path the mode is about
    steps = summary["steps"]
    assert all(steps.get(k) for k in ("damage", "commit", "crash", "delete", "gc")), steps
    assert summary["ledgers_deleted"] > 0 and summary["garbled_live_entries"] > 0, summary
    assert summary["journal"] == {"on": 9, "off": 3}
    # the passes met every metadata fault: the correct engine kept what it could not read
    faults = summary["gc_passes_by_metadata_fault"]
    assert all(faults.get(k) for k in ("none", "lagging", "lost", "flaky", "down")), faults


def test_a_kept_doomed_ledger_may_lose_what_no_checkpoint_covered_in_a_journal_off_crash():
    """Seed 118 (journal off): ledger 2's 34 entries, never checkpointed, lose their
    metadata; the pass's reads fail (kept, as they must be); the crash then takes the 34
    entries. Allowed (nobody adds them again: the ledger is deleted); the checker of
    f739673 called it "neither whole nor gone" (4 of seeds 1-200 failed so)."""
    r = run_seed(118)
    assert r.ok, r.failures
    assert any("ledger 2 (metadata gone, not deleted): the crash took 34 entries" in line for line in r.trace), r.trace


@pytest.mark.parametrize("name", sorted(CATCHERS))
def test_each_break_is_caught_within_its_catcher_seeds(name):
    results = [run_seed(seed, name) for seed in CATCHERS[name]]
    caught = [r for r in results if not r.ok]
    assert len(caught) >= 4, [(r.seed, r.ok) for r in results]
    for r in caught:  # found by the checker, not an error the schedule did not expect
        assert r.finding, r.failures
        assert SIGNATURE[name] in r.failures[0], r.failures


def test_command_line(tmp_path, capsys):
    out = tmp_path / "gc.json"
    assert main(["--mode", "gc", "--seeds", "2", "--start", "3", "--json", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())
    assert data["mode"] == "gc" and data["runs"] == 2 and [r["seed"] for r in data["results"]] == [3, 4]
    assert json.loads(capsys.readouterr().out)["ok"] == 2
    assert main(["--mode", "gc", "--seed", "8", "--break", "gc-trust-partial-scan"]) == 1
    printed = capsys.readouterr().out
    assert "FAILED" in printed and "--mode gc --seed 8 --break gc-trust-partial-scan" in printed
    assert main(["--mode", "gc", "--seed", "1", "--break", "forget-fence"]) == 2  # a cluster break
    with pytest.raises(SystemExit):
        main(["--seed", "1", "--break", "gc-dead-from-memory"])  # a GC break needs --mode gc
