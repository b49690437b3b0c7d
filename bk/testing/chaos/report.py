"""Markdown tables from a chaos run's JSON (`python -m bk.testing.chaos --report chaos.json`).

The per-kind table counts, for each nemesis kind, the runs whose schedule had it, the
faults of that kind, and the failing runs among them; the cluster table splits the runs by
mode, journal and AutoRecovery (redrawn from each seed: a scenario is a function of its
seed and the run's options). A run in progress writes its JSON every few seconds, so a
report of a partial run works too (it says so).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict

from .scenario import generate


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _rate(failed: int, runs: int) -> str:
    return f"{failed} ({100.0 * failed / runs:.2f}%)" if runs else "0"


def markdown(data: dict) -> str:
    results = data["results"]
    runs = len(results)
    failed = [r for r in results if not r["ok"]]
    options = data.get("options", {})
    lines = [f"{'Complete' if data.get('complete') else 'PARTIAL'}: {runs} of {data.get('planned', runs)} runs,"
             f" {len(failed)} failed, wall time {data.get('wall_s', 0):.0f} s with {data.get('jobs', '?')} jobs"
             f" (mean run {data.get('mean_run_s', 0):.2f} s), {data.get('faults_applied', 0)} faults applied,"
             f" {data.get('acked_entries', 0)} acknowledged entries checked,"
             f" {data.get('lost_excused', 0)} excused BP-46 losses.", ""]
    lines += [_row(["nemesis kind", "runs with it", "faults", "failed runs"]), _row(["---"] * 4)]
    for kind, c in data["by_kind"].items():
        lines.append(_row([kind, c.get("runs", 0), c.get("faults", "-"), _rate(c.get("failed_runs", 0),
                                                                                 c.get("runs", 0))]))
    clusters: dict[tuple, Counter] = defaultdict(Counter)
    for r in results:
        s = generate(r["seed"], mode=r["mode"], process_share=options.get("process_share", 0.02),
                     test_break=options.get("test_break", ""))
        key = (s.mode, "on" if s.journal else "off (BP-46)", "on" if s.autorecovery else "off")
        clusters[key]["runs"] += 1
        clusters[key]["failed"] += not r["ok"]
        clusters[key]["acked"] += r["acked"]
    lines += ["", _row(["cluster", "journal", "AutoRecovery", "runs", "acknowledged entries", "failed runs"]),
              _row(["---"] * 6)]
    for (mode, journal, ar), c in sorted(clusters.items()):
        lines.append(_row([mode, journal, ar, c["runs"], c["acked"], _rate(c["failed"], c["runs"])]))
    cats = Counter(c for r in failed for c in r["categories"])
    if cats:
        lines += ["", _row(["failure category", "runs"]), _row(["---"] * 2)]
        lines += [_row([k, n]) for k, n in cats.most_common()]
        lines += ["", "Failing seeds:", ""]
        lines += [f"- seed {r['seed']} ({r['mode']}, faults {r['faults']}): {r['failures'][0][:300]}"
                  f" -- `{r['replay']}`" for r in failed[:40]]
    for inv in data.get("investigated", []):
        lines.append(f"- seed {inv['seed']}: replayed {inv['replayed_same']}/{inv['replays']} to the same failure;"
                     f" shrunk to `{inv.get('shrunk_replay', '-')}` ({inv.get('shrunk_faults')})")
    return "\n".join(lines)


def report_file(path: str) -> str:
    with open(path) as fh:
        return markdown(json.load(fh))


__all__ = ["markdown", "report_file"]
