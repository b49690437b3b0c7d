"""bench.single_reads: its pipelined READ client against a real in-process bookie (v2 and v3,
one connection and several), every answer checked; and its tables."""
from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from bench import single_reads  # noqa: E402
from bk.client import BookKeeper  # noqa: E402
from bk.testing.inprocess import InProcessCluster  # noqa: E402


def test_the_client_reads_every_entry_over_both_protocols_and_the_table_shows_them(tmp_path):
    async def main():
        async with InProcessCluster(tmp_path, bookies=1) as cluster:
            async with BookKeeper(cluster.metadata_uri) as bkc:
                ledger = await single_reads.write_ledger(bkc, b"x" * 100, 400, 50)
            port = cluster.ports[0]
            out = {}
            for version in (2, 3):
                for shape in ("1x8", "8x8"):
                    out[("write-cache", f"v{version}", shape)] = await single_reads.read_pass(
                        "127.0.0.1", port, ledger, 0, 400, version, shape, 100)
            with pytest.raises(AssertionError):  # an answer shorter than the entry is no success
                await single_reads.read_pass("127.0.0.1", port, ledger, 0, 16, 2, "1x8", 1000)
            return out
    out = asyncio.run(main())
    assert all(r["reads"] == 400 and r["reads_per_s"] > 0 for r in out.values())
    for r in out.values():
        r["server_cpu_us_per_read"] = 1.0
    rows = single_reads.summarize([out], list(out), "bk")
    table = single_reads.format_table(rows, {k: r for k, r in zip(out, rows)})
    assert "v3" in table and "8x8" in table and "bk/Java" in table
