"""`bk shell recover` as an operator runs it, against bookie processes and a real ZooKeeper
(AutoRecovery off): --query, --dry-run (nothing changes), the refusal without --yes off a
terminal, --ledger with --target, a target that cannot fit (non-zero exit naming the
ledger), --skip-open-ledgers, and the full recovery that fences and closes the open
ledger and deletes the cookie; the summary and the per-ledger lines; JSON output.
"""
from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest

from test_autorecovery_support import (autorecovery_process, check_recovered, index_of, make_cluster, shell, wipe,
                                       write_ledger)

from bk import eventloop
from bk.client import BookKeeper
from bk.errors import LedgerClosedError, LedgerFencedError
from bk.testing.cluster import run_shell

pytestmark = pytest.mark.integration


async def snapshot(bkc, ledger_ids) -> dict:
    return {lid: await bkc.ledger_manager.read_ledger_metadata(lid) for lid in ledger_ids}


async def recover_scenario(cluster) -> None:
    async with BookKeeper(cluster.metadata_uri, add_timeout_s=3) as bkc:
        ids = cluster.bookie_ids
        victim, a, b, c, t = ids
        closed = {}
        for k, ensemble in enumerate(([victim, a, b], [victim, b, c], [victim, a, c], [a, victim, t])):
            lh, data = await write_ledger(bkc, 120, seed=k, ensemble=ensemble)
            closed[lh.ledger_id] = data
        untouched, _ = await write_ledger(bkc, 10, seed=9, ensemble=[a, b, c])
        writer, open_data = await write_ledger(bkc, 40, close=False, seed=10, ensemble=[victim, b, c])
        all_ids = [*closed, writer.ledger_id]
        vi = index_of(cluster, victim)
        await asyncio.to_thread(cluster.stop_bookie, vi)
        wipe(cluster, vi)

        out = await shell(cluster, "recover", victim, "--query")
        assert out.returncode == 0, out.stderr
        assert sorted(int(line.split("\t")[0]) for line in out.stdout.strip().splitlines()) == sorted(all_ids)
        assert f"{writer.ledger_id}\tOPEN" in out.stdout

        before = await snapshot(bkc, all_ids)
        out = await shell(cluster, "recover", victim, "--dry-run")
        assert out.returncode == 0 and "nothing changed" in out.stdout and "fence and close first" in out.stdout
        out = await shell(cluster, "recover", victim)  # stdin is not a terminal, no --yes
        assert out.returncode == 1 and "--yes" in out.stderr
        assert await snapshot(bkc, all_ids) == before

        # one ledger, to a given target; then a target already in the segment fails, naming the ledger
        first = next(iter(closed))
        out = await shell(cluster, "recover", victim, "--ledger", str(first), "--target", t, "--yes")
        assert out.returncode == 0, out.stderr
        assert f"[1/1] ledger {first}: recovered" in out.stdout and f"to {t}" in out.stdout
        md = await bkc.get_ledger_metadata(first)
        assert md.segments[0][1] == (t, a, b)
        await check_recovered(bkc, first, closed[first], victim, last_entry_id=119)
        with_t = list(closed)[3]
        out = await shell(cluster, "recover", victim, "--ledger", str(with_t), "--target", t, "--yes")
        assert out.returncode == 1 and f"FAILED ledger {with_t}" in out.stdout
        assert "already in the segment" in out.stdout
        assert (await snapshot(bkc, [with_t])) == {with_t: before[with_t]}

        # everything closed, the open ledger left alone
        out = await shell(cluster, "recover", victim, "--skip-open-ledgers", "--yes", "--rate", "50MiB")
        assert out.returncode == 0, out.stderr
        assert f"ledger {writer.ledger_id}: skipped-open" in out.stdout
        assert f"skipped (not closed): {writer.ledger_id}" in out.stdout
        assert (await snapshot(bkc, [writer.ledger_id])) == {writer.ledger_id: before[writer.ledger_id]}
        for lid, data in closed.items():
            await check_recovered(bkc, lid, data, victim, last_entry_id=119)

        # the rest: the open ledger is fenced and closed, then recovered; the cookie goes
        out = await shell(cluster, "--json", "recover", victim, "--yes", "--delete-cookie")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["ok"] and result["recovered"] == [writer.ledger_id] and result["failed"] == []
        assert result["cookie_deleted"] and result["bytes_copied"] >= 0
        await check_recovered(bkc, writer.ledger_id, open_data, victim, last_entry_id=39)
        with pytest.raises((LedgerFencedError, LedgerClosedError)):
            await writer.add_entry(b"fenced out")
        assert victim not in await bkc.registration.known_bookies()
        assert (await bkc.get_ledger_metadata(untouched.ledger_id)).segments == ((0, (a, b, c)),)
        out = await shell(cluster, "recover", victim, "--yes")
        assert out.returncode == 0 and "nothing to recover" in out.stdout


def test_manual_recover_shell(zk_server, tmp_path):
    cluster = make_cluster(zk_server, tmp_path, autorecovery=False)
    with cluster:
        eventloop.run(recover_scenario(cluster))
        standalone_autorecovery(cluster)


def standalone_autorecovery(cluster) -> None:
    """`bk autorecovery --conf FILE` next to a bookie without its own AutoRecovery: it is elected
    auditor (nobody else votes), and SIGTERM stops it cleanly, withdrawing its vote."""
    bookie = cluster.bookies[1]
    with autorecovery_process(bookie) as (proc, _ready):
        deadline = time.monotonic() + 30
        while json.loads(run_shell(cluster.metadata_uri, "--json", "whoisauditor").stdout)["auditor"] is None:
            assert time.monotonic() < deadline, "no auditor elected"
            time.sleep(0.1)
        out = run_shell(cluster.metadata_uri, "autorecovery", "--status")
        assert f"auditor: {bookie.bookie_id}" in out.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    out = run_shell(cluster.metadata_uri, "whoisauditor")
    assert "no auditor is elected" in out.stdout
