"""The fuzz targets (fuzz/, docs/FUZZING.md) in the suite:
- every seed of the corpus and every saved regression input satisfies its target's contract
  (in process, and the regressions again under the fuzzers' memory limit, where an allocation
  sized by a corrupt field fails the way it failed the fuzzer);
- each target runs under atheris for a fixed number of executions (corpus plus mutations,
  libFuzzer seed 1): any contract breach, crash, hang or out-of-memory fails the test.
Regression test ids are the saved inputs' names (fuzz/regressions/<target>/<name>)."""
import os
import subprocess
import sys

import pytest

import fuzz
from fuzz.__main__ import run

ROOT = os.path.dirname(fuzz.HERE)
TARGETS = fuzz.targets()
# per-target executions for the suite: about 3-5 s each on this machine (shared, 2 cores)
SUITE_RUNS = {"v2_request": 4000, "v2_response": 6000, "v3_request": 2500, "v3_response": 2500, "journal": 4000,
              "entrylog": 3000, "index": 2500, "cookie": 8000, "ledger_metadata": 8000, "gc_usage": 3000}



def _with_target(root):
    return [pytest.param(target, name, data, id=f"{target}/{name}") for target in fuzz.target_names()
            for name, data in fuzz.inputs(os.path.join(root, target))]


def test_every_target_has_a_seed_corpus():
    assert sorted(TARGETS) == sorted(fuzz.target_names())
    for target in fuzz.target_names():
        seeds = fuzz.inputs(os.path.join(fuzz.CORPUS_DIR, target))
        assert seeds, f"no seed corpus for {target}"
        assert sum(len(d) for _, d in seeds) < 16384, f"{target}'s seed corpus should stay small"


@pytest.mark.parametrize("target,name,data", _with_target(fuzz.CORPUS_DIR))
def test_seed(target, name, data):
    TARGETS[target](data)


@pytest.mark.parametrize("target,name,data", _with_target(fuzz.REGRESSIONS_DIR))
def test_regression(target, name, data):
    TARGETS[target](data)


def test_regressions_under_the_fuzzers_memory_limit():
    """The out-of-memory inputs only fail where an allocation is refused: replay every saved
    input in a child with the fuzzers' address-space limit."""
    for target in fuzz.target_names():
        d = os.path.join(fuzz.REGRESSIONS_DIR, target)
        if not os.path.isdir(d):
            continue
        paths = [os.path.join(d, n) for n in sorted(os.listdir(d))]
        out = subprocess.run([sys.executable, "-m", "fuzz", "replay", target, *paths], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("target", fuzz.target_names())
def test_fuzz_budget(target, tmp_path):
    result = run(target, runs=SUITE_RUNS[target], seed=1, work=str(tmp_path), quiet=True)
    assert result["returncode"] == 0, result["output"][-6000:]
    assert result["execs"] >= SUITE_RUNS[target] * 0.9, result["output"][-2000:]
