"""bench.deferred: every row runs against an in-process bookie (v3: deferred sync) and is tabled."""
from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from bench import deferred  # noqa: E402
from bk.testing.inprocess import InProcessCluster  # noqa: E402


def test_every_row_runs_and_is_tabled(tmp_path):
    args = argparse.Namespace(rounds=1, duration_s=0.1, entry_size=100, in_flight=50, force_every=20, burst=5,
                              bookies=1, ensemble=1, write_quorum=1, ack_quorum=1, settle_s=0.0, seed=1)

    async def main():
        async with InProcessCluster(tmp_path, bookies=1) as cluster:
            return await deferred.run_rounds(cluster.metadata_uri, args)

    results = asyncio.run(main())
    assert all(len(v) == 1 and v[0] > 0 for v in results["rates"].values())
    assert all(results["samples"][row] for row in deferred.LATENCY_ROWS)
    summary = deferred.summarize(results, args)
    assert summary["rates"]["normal"]["ratio_to_normal"] == 1.0
    table = deferred.format_table(summary)
    assert all(row in table for row in deferred.RATE_ROWS + deferred.LATENCY_ROWS)
