"""docs/CHAOS.md's run tables, generated from the summaries committed under docs/chaos-runs/.

    python -m bk.testing.chaos.report docs/chaos-runs/*.json                     # print the tables
    python -m bk.testing.chaos.report --write docs/CHAOS.md docs/chaos-runs/*.json  # rewrite them there
    python -m bk.testing.chaos.report --trim chaos.json docs/chaos-runs/NAME.json --note "command; load"

Every figure of the tables comes from a summary JSON (runner.run_many's `--json`, or
gc_runner's for `--mode gc`), so a table can never say more than a committed run measured;
tests/unit/test_chaos_report.py fails when CHAOS.md's section differs from what this prints.
The section sits between BEGIN and END below; nothing outside it is touched. Three kinds of
summary, told apart by their content:
- GC mode (`"mode": "gc"`): one engine per seed, with or without a GC break;
- a broken-bookie self-test (`options.test_break`): a failing run is a catch;
- every other cluster run (`drawn_for` without a break: a correct bookie on the
  scenarios drawn for a break, the self-test's clean half): a failing run is a failure.
The per-kind and excused-by-reason tables add up the plain cluster runs (no break, no
drawing for one). A run's journal and AutoRecovery are not in its summary, so no table splits
by them (redrawing the scenarios from the seeds would use today's generator, not the run's).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

BEGIN = "<!-- BEGIN chaos-runs tables (generated from docs/chaos-runs/*.json by bk.testing.chaos.report; do not edit) -->"
END = "<!-- END chaos-runs tables -->"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _n(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _rate(k: int, n: int) -> str:
    return f"{_n(k)} of {_n(n)} ({100.0 * k / n:.1f}%)" if n else "-"


def _revision(data: dict) -> str:
    rev = str(data.get("git_revision", "?")).split()[0]
    head, _, dirty = rev.partition("+")
    return head[:7] + ("+" + dirty if dirty else "")


def _seeds(data: dict) -> str:
    s = data.get("seeds")
    if isinstance(s, dict):
        return f"{s['first']}-{s['last']}"
    if isinstance(s, str) and s:
        return s
    seeds = [r["seed"] for r in data.get("results", [])]
    return f"{min(seeds)}-{max(seeds)}" if seeds else "-"


def _excused(by_reason: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(by_reason.items())) or "0"


def _kind(data: dict) -> str:
    if data.get("mode") == "gc":
        return "gc"
    return "break" if data.get("options", {}).get("test_break") else "cluster"


def load(paths) -> list[tuple[str, dict]]:
    out = []
    for path in sorted(paths):
        with open(path) as fh:
            out.append((os.path.basename(path), json.load(fh)))
    return out


def _cluster_tables(runs: list[tuple[str, dict]]) -> list[str]:
    lines = [_row(["summary", "seeds", "revision", "drawn for", "runs (in-process, processes)", "faults",
                   "acknowledged entries", "excused", "failed runs", "wall time"]), _row(["---"] * 10)]
    for name, d in runs:
        modes = d.get("modes", {})
        lines.append(_row([f"`{name}`", _seeds(d), _revision(d), d.get("drawn_for") or "-",
                           f"{_n(d['runs'])} ({_n(modes.get('inprocess', 0))}, {_n(modes.get('process', 0))})",
                           _n(d.get("faults_applied", 0)), _n(d.get("acked_entries", 0)),
                           _excused(d.get("excused_by_reason", {})), _rate(d["failed"], d["runs"]),
                           f"{d.get('wall_s', 0):.0f} s"]))
    plain = [d for _, d in runs if not d.get("drawn_for")]
    if not plain:
        return lines
    total = Counter()
    by_reason = Counter()
    kinds: dict[str, Counter] = {}
    for d in plain:
        total.update(runs=d["runs"], failed=d["failed"], acked=d.get("acked_entries", 0),
                     faults=d.get("faults_applied", 0))
        by_reason.update(d.get("excused_by_reason", {}))
        for kind, c in d.get("by_kind", {}).items():
            kinds.setdefault(kind, Counter()).update(c)
    lines.append(_row(["all plain runs", "", "", "", _n(total["runs"]), _n(total["faults"]), _n(total["acked"]),
                       _excused(by_reason), _rate(total["failed"], total["runs"]), ""]))
    lines += ["", "The plain runs above, by nemesis kind:", "",
              _row(["nemesis kind", "runs with it", "faults", "failed runs"]), _row(["---"] * 4)]
    for kind, c in sorted(kinds.items()):
        lines.append(_row([kind, _n(c.get("runs", 0)), _n(c["faults"]) if "faults" in c else "-",
                           _rate(c.get("failed_runs", 0), c.get("runs", 0))]))
    lines += ["", "Excused acknowledged entries of the plain runs, by reason:", "",
              _row(["excused reason", "acknowledged entries"]), _row(["---"] * 2)]
    lines += [_row([k, _n(n)]) for k, n in sorted(by_reason.items())] or [_row(["(none)", 0])]
    return lines + _checker_table(runs) + _client_table(runs) + _storage_tables(runs)


def _checker_table(runs: list[tuple[str, dict]]) -> list[str]:
    """What the checker judged again under newer metadata (runner.summarize's `checker`; summaries
    from before it counted have none and are left out): how often a race it once took for a
    failure (seed 133214) happens."""
    counted = [(name, d) for name, d in runs if "checker" in d]
    if not counted:
        return []
    lines = ["", "Answers the checker judged again because the metadata changed while it asked (seed 133214):", "",
             _row(["summary", "answers", "runs with one"]), _row(["---"] * 3)]
    for name, d in counted:
        for key, n in sorted(d["checker"].items()) or [("(none)", 0)]:
            lines.append(_row([f"`{name}` {key}", _n(n), _n(d.get("checker_runs", {}).get(key, 0))]))
    return lines


def _client_table(runs: list[tuple[str, dict]]) -> list[str]:
    """The client side each summary drew (runner.client_table; summaries from before issue 28's
    client draws have none and are left out)."""
    drawn = [(name, d["clients"]) for name, d in runs if d.get("clients", {}).get("runs")]
    if not drawn:
        return []
    lines = ["", "The client side those runs drew (long ledger: 1,000-4,000 entries; clients: every writer,"
             " tailing reader, recoverer and checker):", "",
             _row(["summary", "long-ledger runs (failed)", "long-ledger entries: planned (acknowledged)",
                   "TLS runs (failed)",
                   "clients v2 / v3", "client faults: runs with it (failed)"]), _row(["---"] * 6)]
    for name, c in drawn:
        protocols = c.get("protocols", {})
        faults = ", ".join(f"{k} {_n(v.get('runs', 0))} ({_n(v.get('failed_runs', 0))})"
                           for k, v in sorted(c.get("client_faults", {}).items())) or "-"
        lines.append(_row([f"`{name}`", f"{_n(c['long_ledger_runs'])} ({_n(c.get('long_ledger_failed', 0))})",
                           f"{_n(c.get('long_ledger_entries', 0))} ({_n(c.get('long_ledger_acked', '-'))})",
                           f"{_n(c['tls_runs'])} ({_n(c.get('tls_failed', 0))})",
                           f"{_n(protocols.get('v2', 0))} / {_n(protocols.get('v3', 0))}", faults]))
    return lines


# storage.storage_table's counters, as the table names them (total, then runs reaching it)
REACHED_COLUMNS = (("gc_passes", "GC passes"), ("gc_ledgers_deleted", "ledgers GC deleted"),
                   ("gc_logs_deleted", "logs GC deleted"), ("gc_logs_compacted", "logs compacted"),
                   ("entry_log_rotations", "entry-log rotations"), ("journal_rotations", "journal rotations"),
                   ("adds_throttled", "adds finding the write cache full"),
                   ("adds_rejected", "adds refused (cache still full)"))


def _storage_tables(runs: list[tuple[str, dict]]) -> list[str]:
    """What the bookies' storage reached in each summary's in-process runs (storage.reached) and
    its runs split by each storage draw (summaries from before issue 28's storage draw have none)."""
    drawn = [(name, d["storage"]) for name, d in runs if d.get("storage", {}).get("runs")]
    if not drawn:
        return []
    lines = ["", "What the bookies' storage reached in those runs (in-process runs; each cell: the bookies'"
             " counters summed, then the runs reaching it):", "",
             _row(["summary", "ledgers the clients deleted"] + [title for _, title in REACHED_COLUMNS]),
             _row(["---"] * (2 + len(REACHED_COLUMNS)))]
    for name, st in drawn:
        reached, reaching = st.get("reached", {}), st.get("runs_reaching", {})
        lines.append(_row([f"`{name}`", _n(st.get("client_deleted_ledgers", 0))]
                          + [f"{_n(reached.get(k, 0))} ({_n(reaching.get(k, 0))})" for k, _ in REACHED_COLUMNS]))
    lines += ["", "The same runs split by each storage draw (runs, failed runs, mean run time):", "",
              _row(["summary", "draw", "on", "off"]), _row(["---"] * 4)]
    for name, st in drawn:
        draws = st.get("draws", {})
        for key in sorted({k.rsplit(" ", 1)[0] for k in draws}):
            cells = []
            for side in ("on", "off"):
                c = draws.get(f"{key} {side}", {})
                cells.append(f"{_n(c.get('runs', 0))} runs, {_n(c.get('failed_runs', 0))} failed,"
                             f" {c.get('mean_run_s', 0):.2f} s")
            lines.append(_row([f"`{name}`", key.replace("_", " "), *cells]))
    return lines


def _break_table(runs: list[tuple[str, dict]]) -> list[str]:
    lines = [_row(["summary", "break", "drawn for it", "seeds", "revision", "caught", "caught by (runs per category)",
                   "wall time"]), _row(["---"] * 8)]
    for name, d in runs:
        options = d.get("options", {})
        brk = options["test_break"]
        drawn = d.get("drawn_for")  # recorded since issue 28's report; older summaries: not known
        cats = ", ".join(f"{k} {n}" for k, n in sorted(d.get("categories", {}).items())) or "-"
        lines.append(_row([f"`{name}`", brk, "not recorded" if drawn is None else "yes" if drawn == brk else "no",
                           _seeds(d), _revision(d),
                           _rate(d["failed"], d["runs"]), cats, f"{d.get('wall_s', 0):.0f} s"]))
    return lines


def _gc_table(runs: list[tuple[str, dict]]) -> list[str]:
    lines = [_row(["summary", "engine", "seeds", "revision", "seeds failing (caught)", "journal on / off",
                   "where the checker caught it", "entries checked at the end", "wall time"]), _row(["---"] * 9)]
    for name, d in runs:
        journal, failed_j = d.get("journal", {}), d.get("failed_by_journal", {})
        split = (f"{failed_j.get('on', 0)} of {journal.get('on', 0)} / "
                 f"{failed_j.get('off', 0)} of {journal.get('off', 0)}")
        where = ", ".join(f"{k} {n}" for k, n in sorted(d.get("caught_at_step", {}).items(),
                                                         key=lambda kv: (-kv[1], kv[0]))) or "-"
        lines.append(_row([f"`{name}`", d.get("break") or "correct", _seeds(d), _revision(d),
                           _rate(d["failed"], d["runs"]), split, where, _n(d.get("entries_checked", 0)),
                           f"{d.get('wall_s', 0):.1f} s"]))
    return lines


def tables(named: list[tuple[str, dict]]) -> str:
    """The generated section's body (between BEGIN and END) for these (file name, summary) pairs."""
    groups: dict[str, list] = {"cluster": [], "break": [], "gc": []}
    for name, d in named:
        groups[_kind(d)].append((name, d))
    lines = []
    if groups["cluster"]:
        lines += ["**Cluster runs** (a failing run is a failure; \"drawn for\": a correct bookie on the scenarios"
                  " drawn for that break, the self-test's clean half):", ""] + _cluster_tables(groups["cluster"])
    if groups["break"]:
        lines += ["", "**Broken-bookie self-tests** (`--break`; a failing run is a catch):", ""]
        lines += _break_table(groups["break"])
    if groups["gc"]:
        lines += ["", "**GC chaos** (`--mode gc`; with a break a failing seed is a catch):", ""]
        lines += _gc_table(groups["gc"])
    return "\n".join(lines).lstrip("\n")


def trim(data: dict, note: str) -> dict:
    """A cluster run's summary as docs/chaos-runs keeps it: every figure, each excused entry and
    each failing run's seed, categories, faults, first finding and replay command; not the
    per-run detail (`results`, traces). `note`: the command line and the load it ran under."""
    seeds = sorted(r["seed"] for r in data.get("results", []))
    out = {"seeds": {"first": seeds[0], "last": seeds[-1], "count": len(seeds)} if seeds else data.get("seeds"),
           "git_revision": data.get("git_revision"), "note": note}
    out.update((k, v) for k, v in data.items() if k not in ("results", "failures", "seeds", "note", "git_revision"))
    out["failures"] = [{"seed": r["seed"], "mode": r["mode"], "categories": r["categories"], "faults": r["faults"],
                        "first_failure": r["failures"][0] if r["failures"] else "", "replay": r["replay"]}
                       for r in data.get("failures", [])]
    return out


def section(named) -> str:
    return f"{BEGIN}\n\n{tables(named)}\n\n{END}"


def current_section(doc: str) -> str:
    """The generated section as it stands in `doc` (ValueError when its markers are missing)."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise ValueError("no generated chaos-runs section (its BEGIN/END markers) in the document")
    return doc[start:end + len(END)]


def rewrite(doc: str, named) -> str:
    return doc.replace(current_section(doc), section(named), 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bk.testing.chaos.report", description=__doc__.split("\n\n")[0])
    p.add_argument("summaries", nargs="*", help="summary JSON files (docs/chaos-runs/*.json)")
    p.add_argument("--write", metavar="DOC", help="rewrite the generated section of this markdown file")
    p.add_argument("--trim", nargs=2, metavar=("RUN_JSON", "OUT"),
                   help="write a cluster run's --json as docs/chaos-runs keeps it (no per-run detail)")
    p.add_argument("--note", default="", help="with --trim: the command line and the load it ran under")
    a = p.parse_args(argv)
    if a.trim:
        with open(a.trim[0]) as fh:
            data = json.load(fh)
        with open(a.trim[1], "w") as fh:
            json.dump(trim(data, a.note), fh, indent=None)
            fh.write("\n")
        return 0
    if not a.summaries:
        p.error("no summary files given")
    named = load(a.summaries)
    if not a.write:
        print(section(named))
        return 0
    with open(a.write) as fh:
        doc = fh.read()
    try:
        new = rewrite(doc, named)
    except ValueError as e:
        print(f"{a.write}: {e}; add the two marker lines where the tables go:\n{BEGIN}\n{END}", file=sys.stderr)
        return 2
    if new != doc:
        with open(a.write, "w") as fh:
            fh.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["BEGIN", "END", "current_section", "load", "rewrite", "section", "tables", "trim"]
