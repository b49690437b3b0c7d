"""bench.forms: every add and read form runs against fake bookies and is tabled against the callback form."""
from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from test_client_support import FakeCluster, run_async  # noqa: E402

from bench import forms  # noqa: E402


@run_async
async def test_every_form_adds_and_reads_back_through_the_fake_bookies():
    args = argparse.Namespace(forms=list(forms.ADD_FORMS), reads=True, rounds=2, duration_s=0.05, entry_size=100,
                              in_flight=300, bookies=1, ensemble=1, write_quorum=1, ack_quorum=1, tune_gc=False,
                              settle_s=0.0, seed=1)
    async with FakeCluster(1) as cluster:
        results = await forms.run_rounds(cluster.metadata_uri, args)
    assert set(results) == set(forms.ADD_FORMS) | set(forms.READ_FORMS)
    assert all(len(rates) == 2 and min(rates) > 0 for rates in results.values())
    summary = forms.summarize(results, args)
    assert summary["forms"]["callback"]["median_ratio"] == 1.0
    assert summary["forms"]["read-ranges"]["median_ratio"] == 1.0
    table = forms.format_table(summary)
    assert all(f in table for f in forms.ADD_FORMS + forms.READ_FORMS)
