"""docs/CHAOS.md's run tables are generated from the summaries committed in docs/chaos-runs/
(bk/testing/chaos/report.py): the document's section must be exactly what the report prints
from those files, and the summaries say what the scenarios were drawn for. Well under 1 s."""
from __future__ import annotations

import glob
import json
import os

from bk.testing.chaos import runner

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
