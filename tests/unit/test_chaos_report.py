"""docs/CHAOS.md's run tables are generated from the summaries committed in docs/chaos-runs/
(bk/testing/chaos/report.py): the document's section must be exactly what the report prints
from those files, and the summaries say what the scenarios were drawn for. Well under 1 s."""
from __future__ import annotations

import glob
import json
import os

from bk.testing.chaos import report, runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_summary_records_the_break_its_scenarios_were_drawn_for(tmp_path, monkeypatch):
    """A --break run draws its scenarios for the break unless --draw-for says otherwise; the
    summary says which (a run of clock-timed faults must not pass for one drawn for it)."""
    monkeypatch.setattr(runner, "run_supervised", lambda *a, **k: iter(()))
    drawn = {}
    for name, options in {"default": {"test_break": "ack-before-fsync"},
                          "clean half": {"draw_for": "ack-before-fsync"},
                          "not drawn": {"test_break": "ack-before-fsync", "draw_for": ""},
                          "plain": {}}.items():
        path = str(tmp_path / f"{len(drawn)}.json")
        runner.run_many(range(1, 3), options, json_path=path, progress=False, shrink_limit=0)
        with open(path) as fh:
            drawn[name] = json.load(fh)["drawn_for"]
    assert drawn == {"default": "ack-before-fsync", "clean half": "ack-before-fsync", "not drawn": "",
                     "plain": ""}


def test_chaos_md_tables_are_the_committed_summaries():
    """docs/CHAOS.md's generated section is exactly what the report prints from
    docs/chaos-runs/*.json: a summary added, removed or changed without regenerating the
    section (python -m bk.testing.chaos.report --write docs/CHAOS.md docs/chaos-runs/*.json)
    fails here, as does a hand edit of a generated table."""
    from bk.testing.chaos import report
    named = report.load(glob.glob(os.path.join(ROOT, "docs", "chaos-runs", "*.json")))
    assert named, "no committed summaries"
    with open(os.path.join(ROOT, "docs", "CHAOS.md")) as fh:
        doc = fh.read()
    assert report.current_section(doc) == report.section(named), \
        "docs/CHAOS.md's chaos-runs tables are stale: python -m bk.testing.chaos.report --write docs/CHAOS.md" \
        " docs/chaos-runs/*.json"


def test_the_tables_say_what_each_kind_of_summary_measured(tmp_path):
    """A break run's failures are its catches, a plain run's are failures, a correct bookie on
    scenarios drawn for a break is not added to the plain runs, and GC runs get their own table;
    --write replaces only the marked section."""
    from bk.testing.chaos import report

    def cluster(failed, runs, **extra):
        return {"runs": runs, "failed": failed, "modes": {"inprocess": runs}, "faults_applied": 2 * runs,
                "acked_entries": 10 * runs, "excused_by_reason": {"journal-off-crash": failed},
                "by_kind": {"crash": {"runs": runs, "faults": runs, "failed_runs": failed}},
                "categories": {"inv1": failed} if failed else {}, "git_revision": "0123456789abcdef",
                "results": [{"seed": 1}, {"seed": runs}], "wall_s": 5.0, **extra}

    named = [("break-x.json", cluster(9, 40, options={"test_break": "ack-before-fsync"},
                                      drawn_for="ack-before-fsync")),
             ("cluster-a.json", cluster(1, 200, options={}, drawn_for="")),
             ("drawn-x.json", cluster(3, 40, options={"draw_for": "ack-before-fsync"}, drawn_for="ack-before-fsync")),
             ("gc-x.json", {"mode": "gc", "break": "gc-dead-from-memory", "runs": 200, "failed": 109,
                            "seeds": "1-200", "git_revision": "1756957a", "journal": {"on": 134, "off": 66},
                            "failed_by_journal": {"on": 74, "off": 35}, "caught_at_step": {"commit": 109},
                            "entries_checked": 30374, "wall_s": 14.3})]
    text = report.tables(named)
    assert "| `break-x.json` | ack-before-fsync | yes | 1-40 | 0123456 | 9 of 40 (22.5%) | inv1 9 |" in text
    assert "| all plain runs |  |  |  | 200 | 400 | 2,000 | 1 journal-off-crash | 1 of 200 (0.5%) |  |" in text
    assert "| crash | 200 | 200 | 1 of 200 (0.5%) |" in text  # the drawn-for runs are not in the plain sums
    assert "| `drawn-x.json` | 1-40 | 0123456 | ack-before-fsync | 40 (40, 0) |" in text
    assert "| `gc-x.json` | gc-dead-from-memory | 1-200 | 1756957 | 109 of 200 (54.5%) | 74 of 134 / 35 of 66 |" in text
    doc = f"# title\n\nbefore\n\n{report.BEGIN}\nstale\n{report.END}\n\nafter\n"
    new = report.rewrite(doc, named)
    assert new.startswith("# title\n\nbefore\n\n") and new.endswith("\n\nafter\n") and "stale" not in new
    assert report.current_section(new) == report.section(named)


def test_a_run_is_kept_without_its_per_run_detail():
    from bk.testing.chaos import report
    run = {"runs": 2, "failed": 1, "git_revision": "abc", "drawn_for": "", "excused": [[1, 0, 3, "bitflip"]],
           "results": [{"seed": 5, "trace": ["..."]}, {"seed": 6}],
           "failures": [{"seed": 6, "mode": "inprocess", "categories": ["inv1"], "faults": ["crash"],
                         "failures": ["inv1: lost", "inv2: short"], "replay": "python -m bk.testing.chaos --seed 6",
                         "trace": ["long"]}]}
    kept = report.trim(run, "the command; load 3")
    assert kept["seeds"] == {"first": 5, "last": 6, "count": 2} and kept["note"] == "the command; load 3"
    assert "results" not in kept and kept["excused"] == run["excused"] and kept["runs"] == 2
    assert kept["failures"] == [{"seed": 6, "mode": "inprocess", "categories": ["inv1"], "faults": ["crash"],
                                 "first_failure": "inv1: lost", "replay": "python -m bk.testing.chaos --seed 6"}]


def test_the_storage_draw_and_what_it_reached_are_summed_and_shown():
    """runner.summarize sums each run's `reached` counters and splits runs by each storage draw
    (storage.storage_table); the report shows both, and nothing for summaries without them."""
    from bk.testing.chaos import report

    def run(seed, ok, gc, throttled, duration):
        return {"seed": seed, "ok": ok, "mode": "inprocess", "faults": [], "faults_applied": 0, "acked": 5,
                "lost_excused": 0, "categories": [] if ok else ["inv1"], "duration_s": duration,
                "storage": {"gc": gc, "small_logs": True, "small_cache": False, "two_dirs": gc, "journal": True,
                            "deletes": 2, "deleted": 2},
                "reached": {"gc_passes": 4 if gc else 0, "gc_ledgers_deleted": 2 if gc else 0,
                            "adds_throttled": throttled, "entry_log_rotations": 3}}
    results = [run(1, True, True, 0, 1.0), run(2, False, False, 7, 3.0), {**run(3, True, True, 1, 2.0), "reached": {}}]
    summary = runner.summarize(results, 10.0, 3)
    st = summary["storage"]
    assert st["runs"] == 3 and st["reached_runs"] == 2 and st["client_deleted_ledgers"] == 6
    assert st["reached"]["gc_passes"] == 4 and st["reached"]["adds_throttled"] == 7
    assert st["runs_reaching"]["entry_log_rotations"] == 2 and st["runs_reaching"]["adds_throttled"] == 1
    assert st["draws"]["gc on"] == {"runs": 2, "failed_runs": 0, "mean_run_s": 1.5}
    assert st["draws"]["gc off"] == {"runs": 1, "failed_runs": 1, "mean_run_s": 3.0}
    text = report.tables([("s.json", dict(summary, results=results, git_revision="abc", drawn_for=""))])
    assert "| `s.json` | 6 | 4 (1) | 2 (1) |" in text
    assert "| `s.json` | gc | 2 runs, 0 failed, 1.50 s | 1 runs, 1 failed, 3.00 s |" in text
    old = {k: v for k, v in summary.items() if k != "storage"}
    assert "storage reached" not in report.tables([("o.json", dict(old, results=results, drawn_for=""))])


def test_the_answers_the_checker_judged_again_are_summed_and_tabled():
    """Seed 133214's race (a share moved while the checker asked) is counted per run, summed per
    batch and tabled in CHAOS.md, so a long run says how often it happens."""
    results = [{"seed": s, "mode": "inprocess", "ok": True, "failures": [], "categories": [], "faults": [],
                "faults_applied": 0, "acked": 1, "lost_excused": 0, "duration_s": 1.0,
                "checker": c} for s, c in [(1, {}), (2, {"restarted_negative_metadata_changed": 2}),
                                           (3, {"restarted_negative_metadata_changed": 1})]]
    summary = runner.summarize(results, 3.0, 3)
    assert summary["checker"] == {"restarted_negative_metadata_changed": 3}
    assert summary["checker_runs"] == {"restarted_negative_metadata_changed": 2}
    lines = report._checker_table([("x.json", summary)])
    assert "| `x.json` restarted_negative_metadata_changed | 3 | 2 |" in lines
    assert report._checker_table([("old.json", {"runs": 1})]) == []
