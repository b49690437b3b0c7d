"""bk's chaos runner: seeded fault runs with a history checker, replays and shrinking.

    python -m bk.testing.chaos --seeds 100 --jobs 2 --json chaos.json
    python -m bk.testing.chaos --seed 4242 --mode inprocess          # replay one seed
    python -m bk.testing.chaos --seed 4242 --mode inprocess --faults 1,3   # a shrunk schedule

Modules: scenario (a run as data, drawn from one seed), nemesis (the table of
fault kinds), clusters (in-process and process clusters behind one interface),
run (one run: workload, faults, heal), verify (recover, read, check), runner
(many seeds on worker processes, per-kind table, replay and ddmin shrinking).
docs/CHAOS.md has the scale run's figures and the commands.
"""
from .runner import ddmin, investigate, replay_command, run_many, run_one
from .scenario import Fault, LedgerPlan, Scenario, generate

__all__ = ["Fault", "LedgerPlan", "Scenario", "ddmin", "generate", "investigate", "replay_command", "run_many",
           "run_one"]
