"""Many seeds on N worker processes, the per-kind table, replays and shrinking.

    summary = run_many(range(1, 10_001), jobs=2, json_path="chaos.json")

Workers (pool.py: forked, supervised, a hung run's stacks dumped and its worker
replaced) each run one scenario at a time: a fresh event loop and a fresh cluster
per seed, under a private work directory, on /dev/shm when it exists. A process-mode run needs ZooKeeper: the worker starts
one the first time it needs it (bk.testing.zookeeper) and gives each run its own
root on it, unless a connect string is given.

A failing seed: its replay command is printed; then it is replayed (`REPLAYS`
times: a run's interleaving depends on timing, so "replays to the same failure"
is measured, not assumed) and its schedule is shrunk by delta debugging
(Zeller's ddmin over the active faults' indices, the rest of the scenario fixed
by the seed): a subset "still fails" when one of `SHRINK_TRIES` runs of it fails
in one of the original failure's categories. The shrunk replay command names
the faults kept (`--faults 1,3`).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict

from .gc_runner import git_revision
from .pool import run_supervised
from .diagnose import STARVED_CAP
from .run import RUN_LIMIT_S, RunResult, run_scenario
from .scenario import generate
from .storage import storage_table

REPLAYS = 3
SHRINK_TRIES = 3
_ZK = {"server": None, "connect": None}


def work_root() -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return os.path.join(base, f"bk-chaos-{os.getuid()}")


def replay_command(scenario) -> str:
    return " ".join(["python -m bk.testing.chaos", *(shlex.quote(a) for a in scenario.replay_args())])


def _zk_connect(options: dict) -> str | None:
    if options.get("zk_connect"):
        return options["zk_connect"]
    if _ZK["connect"] is None:
        from bk.testing.zookeeper import LocalZooKeeper
        server = LocalZooKeeper(tempfile.mkdtemp(prefix="bk-chaos-zk-", dir=work_root()))
        server.start()  # ZooKeeperLaunchError when Java/ZooKeeper are missing: the run fails, loudly
        _ZK["server"], _ZK["connect"] = server, server.connect_string
    return _ZK["connect"]


def stop_zookeeper() -> None:
    server, _ZK["server"], _ZK["connect"] = _ZK["server"], None, None
    if server is not None:
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)  # its own temp dir (made in _zk_connect)


def scenario_for(seed: int, options: dict):
    s = generate(seed, mode=options.get("mode"), process_share=options.get("process_share", 0.02),
                 test_break=options.get("test_break", ""), draw_for=options.get("draw_for"))
    keep = options.get("keep")
    return s if keep is None else s.keeping(keep)


def matching_seeds(seeds, options: dict, where: dict) -> list[int]:
    """The seeds whose drawn scenario has every `where` field's value (drawing is cheap: no run)."""
    scenario_options = {k: v for k, v in options.items() if k != "where"}
    return [seed for seed in seeds
            if all(getattr(scenario_for(seed, scenario_options), k) == v for k, v in where.items())]


def run_one(seed: int, options: dict, keep=None) -> RunResult:
    """Run `seed` (with `keep`, only those faults) in this process."""
    s = scenario_for(seed, {**options, "keep": keep if keep is not None else options.get("keep")})
    os.makedirs(work_root(), exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix=f"seed{seed}-", dir=work_root())
    zk = _zk_connect(options) if s.mode == "process" else None
    result = run_scenario(s, work_dir, zk_connect=zk, keep_dir=options.get("keep_dir", False),
                          time_limit_s=options.get("time_limit_s"))
    result.replay = replay_command(s)
    return result


# ------------------------------------------------------------ shrinking
def still_fails(seed: int, options: dict, keep, categories: set, tries: int = SHRINK_TRIES) -> RunResult | None:
    for _ in range(tries):
        r = run_one(seed, options, keep=frozenset(keep))
        if not r.ok and set(r.categories) & categories:
            return r
    return None


def ddmin(items: list, fails) -> list:
    """Zeller's delta debugging: a 1-minimal sublist of `items` for which `fails` holds."""
    n = 2
    while len(items) >= 2:
        chunk = max(1, len(items) // n)
        subsets = [items[i:i + chunk] for i in range(0, len(items), chunk)]
        reduced = False
        for sub in subsets:
            if fails(sub):
                items, n, reduced = sub, 2, True
                break
        if not reduced:
            for sub in subsets:
                rest = [x for x in items if x not in sub]
                if rest and fails(rest):
                    items, n, reduced = rest, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(items):
                break
            n = min(len(items), n * 2)
    if len(items) == 1 and fails([]):
        return []
    return items


def investigate(result: dict, options: dict, *, shrink: bool = True, log=print) -> dict:
    """Replay a failure `REPLAYS` times, then shrink its schedule; returns what was found."""
    seed, categories = result["seed"], set(result["categories"])
    opts = {**options, "mode": result["mode"]}
    replays = [run_one(seed, opts) for _ in range(REPLAYS)]
    same = sum(1 for r in replays if not r.ok and set(r.categories) & categories)
    log(f"seed {seed}: replayed {same}/{REPLAYS} times to the same failure ({', '.join(sorted(categories))})")
    found = {"seed": seed, "categories": sorted(categories), "replayed_same": same, "replays": REPLAYS,
             "replay": result["replay"]}
    if not shrink:
        return found
    s = scenario_for(seed, opts)
    active = [f.index for f in s.active_faults]
    calls = [0]

    def fails(sub) -> bool:
        calls[0] += 1
        return still_fails(seed, opts, sub, categories) is not None
    kept = ddmin(active, fails) if active else []
    shrunk = s.keeping(kept)
    found.update(shrunk_faults=[f.describe() for f in shrunk.active_faults], shrink_runs=calls[0],
                 shrunk_replay=replay_command(shrunk))
    log(f"seed {seed}: shrunk {len(active)} faults to {len(kept)} in {calls[0]} trials:"
        f" {replay_command(shrunk)}")
    for f in shrunk.active_faults:
        log(f"    {f.describe()}")
    return found


# ------------------------------------------------------------ many seeds
def table(results: list[dict]) -> dict:
    """Per nemesis kind: runs with it, faults injected, failing runs with it; plus totals."""
    kinds: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        for k, n in Counter(r["faults"]).items():
            kinds[k]["runs"] += 1
            kinds[k]["faults"] += n
            kinds[k]["failed_runs"] += 0 if r["ok"] else 1
    none = [r for r in results if not r["faults"]]
    kinds["(no fault)"].update(runs=len(none), failed_runs=sum(not r["ok"] for r in none))
    return {k: dict(v) for k, v in sorted(kinds.items())}


def summarize(results: list[dict], wall_s: float, total: int) -> dict:
    failures = [r for r in results if not r["ok"]]
    return {"runs": len(results), "planned": total, "ok": len(results) - len(failures), "failed": len(failures),
            "wall_s": round(wall_s, 1), "modes": dict(Counter(r["mode"] for r in results)),
            "faults_applied": sum(r["faults_applied"] for r in results),
            "acked_entries": sum(r["acked"] for r in results),
            "lost_excused": sum(r["lost_excused"] for r in results),
            # every excused entry (excuse.py says which reasons there are), by reason and one by one
            "excused_by_reason": dict(sorted(sum((Counter(r.get("excused_by_reason", {})) for r in results),
                                                 Counter()).items())),
            "excused": [[r["seed"], x["ledger"], x["entry"], x["reason"]] for r in results
                        for x in r.get("excused", [])],
            "categories": dict(Counter(c for r in failures for c in r["categories"])),
            # what the checker judged again under newer metadata (verify.py), summed, and its runs
            "checker": dict(sorted(sum((Counter(r.get("checker", {})) for r in results), Counter()).items())),
            "checker_runs": dict(sorted(Counter(k for r in results for k, v in r.get("checker", {}).items()
                                                if v).items())),
            "mean_run_s": round(sum(r["duration_s"] for r in results) / max(1, len(results)), 3),
            "by_kind": table(results), "clients": client_table(results), "storage": storage_table(results),
            "failures": failures}


def client_table(results: list[dict]) -> dict:
    """What the runs drew for their client side (run.client_draws): long ledgers and their
    entries, TLS runs, clients per wire protocol, client faults by kind (runs and failed runs)."""
    drawn = [(r, r["clients"]) for r in results if r.get("clients")]
    faults: dict[str, Counter] = defaultdict(Counter)
    for r, c in drawn:
        for kind, n in Counter(c.get("client_faults", [])).items():
            faults[kind].update(runs=1, faults=n, failed_runs=0 if r["ok"] else 1)
    long_runs = [(r, c) for r, c in drawn if c.get("long_ledger")]
    return {"runs": len(drawn), "long_ledger_runs": len(long_runs),
            "long_ledger_failed": sum(not r["ok"] for r, _ in long_runs),
            "long_ledger_entries": sum(max(c.get("entries") or [0]) for _, c in long_runs),
            "max_entries": max((max(c.get("entries") or [0]) for _, c in drawn), default=0),
            "tls_runs": sum(bool(c.get("tls")) for _, c in drawn),
            "tls_failed": sum(bool(c.get("tls")) and not r["ok"] for r, c in drawn),
            "protocols": dict(sorted(sum((Counter(c.get("protocols", {}).values()) for _, c in drawn),
                                         Counter()).items())),
            "client_faults": {k: dict(v) for k, v in sorted(faults.items())},
            # acknowledged entries of the long ledgers (a run's last ledger), when every run recorded them
            **({"long_ledger_acked": sum(c["acked"][-1] for _, c in long_runs)}
               if all(c.get("acked") for _, c in long_runs) else {})}


def run_many(seeds, options: dict, *, jobs: int = 1, json_path: str | None = None, progress=True,
             shrink_limit: int = 3, out=sys.stderr) -> dict:
    seeds = list(seeds)
    revision = git_revision()  # the code the runs ran on, for the evidence kept in docs/chaos-runs
    started = time.monotonic()
    results: list[dict] = []
    last_report = [0.0]

    def report(final: bool = False) -> dict:
        summary = summarize(results, time.monotonic() - started, len(seeds))
        summary["options"] = {k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in options.items()}
        summary["jobs"] = jobs
        summary["git_revision"] = revision
        # the break the scenarios were drawn for (by default --break's; "" none): the evidence's
        # report (report.py) must not take a run of clock-timed faults for one drawn for a break
        summary["drawn_for"] = scenario_for(seeds[0], options).draw_for if seeds else ""
        if json_path:
            tmp = json_path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump({**summary, "complete": final, "results": results}, fh, indent=None)
            os.replace(tmp, json_path)
        return summary

    def progress_line(r: dict) -> None:
        now = time.monotonic()
        if not r["ok"]:
            print(f"FAIL seed {r['seed']} ({r['mode']}): {'; '.join(r['failures'][:3])}\n  replay: {r['replay']}",
                  file=out, flush=True)
        if progress and (now - last_report[0] > 5 or len(results) == len(seeds)):
            last_report[0] = now
            done, wall = len(results), now - started
            failed = sum(not x["ok"] for x in results)
            eta = (len(seeds) - done) * wall / max(1, done)
            print(f"[{done}/{len(seeds)}] {failed} failed, {done / max(wall, 1e-9):.2f} runs/s,"
                  f" {wall:.0f}s elapsed, eta {eta:.0f}s", file=out, flush=True)
            if json_path:
                report()

    limit = options.get("time_limit_s") or max(RUN_LIMIT_S.values())
    # a run's limit stretches by what its loop was late, to STARVED_CAP times (diagnose.Budget)
    for r in run_supervised(seeds, options, jobs=max(1, jobs), run_one=run_one, hang_s=limit * STARVED_CAP + 60,
                            mode_of=lambda seed: scenario_for(seed, options).mode,
                            replay_of=lambda seed: replay_command(scenario_for(seed, options)),
                            on_exit=stop_zookeeper):
        results.append(r)
        progress_line(r)
    results.sort(key=lambda r: r["seed"])
    summary = report()
    investigated = []
    for r in summary["failures"][:shrink_limit]:
        investigated.append(investigate(r, options, log=lambda m: print(m, file=out, flush=True)))
    summary["investigated"] = investigated
    stop_zookeeper()  # the one investigate() may have started in this process
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({**summary, "complete": True, "results": results}, fh, indent=None)
    return summary


# ------------------------------------------------------------ reports (`--report FILE`)
# The per-kind table counts, for each nemesis kind, the runs whose schedule had it, the faults
# of that kind and the failing runs among them; the cluster table splits the runs by mode,
# journal and AutoRecovery (redrawn from each seed: a scenario is a function of its seed and
# the run's options). A run in progress writes its JSON every few seconds: a partial report
# says so.
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
             f" {data.get('lost_excused', 0)} excused losses.", ""]
    lines += [_row(["nemesis kind", "runs with it", "faults", "failed runs"]), _row(["---"] * 4)]
    for kind, c in data["by_kind"].items():
        lines.append(_row([kind, c.get("runs", 0), c.get("faults", "-"), _rate(c.get("failed_runs", 0),
                                                                                 c.get("runs", 0))]))
    clusters: dict[tuple, Counter] = defaultdict(Counter)
    for r in results:
        s = generate(r["seed"], mode=r["mode"], process_share=options.get("process_share", 0.02),
                     test_break=options.get("test_break", ""), draw_for=options.get("draw_for"))
        key = (s.mode, "on" if s.journal else "off (BP-46)", "on" if s.autorecovery else "off")
        clusters[key]["runs"] += 1
        clusters[key]["failed"] += not r["ok"]
        clusters[key]["acked"] += r["acked"]
    lines += ["", _row(["cluster", "journal", "AutoRecovery", "runs", "acknowledged entries", "failed runs"]),
              _row(["---"] * 6)]
    for (mode, journal, ar), c in sorted(clusters.items()):
        lines.append(_row([mode, journal, ar, c["runs"], c["acked"], _rate(c["failed"], c["runs"])]))
    excused = data.get("excused_by_reason")
    if excused is not None:  # summaries before the per-reason listing have only lost_excused
        lines += ["", _row(["excused reason", "acknowledged entries"]), _row(["---"] * 2)]
        lines += [_row([k, n]) for k, n in sorted(excused.items())] or [_row(["(none)", 0])]
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



__all__ = ["ddmin", "investigate", "markdown", "replay_command", "report_file", "run_many", "run_one", "summarize",
           "table"]
