"""The recovery shell commands (bk.cli.shell_recovery) in-process, on fake bookies: the
confirmation rules of `recover`, its progress display (terminal bar / one line per ledger),
the switches, and that `bk shell` dispatches them next to its own commands.
"""
from __future__ import annotations

import asyncio
import io

import pytest

from test_client_support import FakeCluster, run_async
from test_replication import check_recovered, write_ledger

from bk.cli import shell_recovery
from bk.cli.main import build_parser
from bk.client import BookKeeper
from bk.errors import IncorrectParameterError
from bk.meta.underreplication import LedgerUnderreplicationManager
from bk.replication.bookie_recovery import LedgerResult, RecoveryProgress
from bk.replication.replicator import LedgerOutcome, SegmentResult


def shell_args(*argv):
    return build_parser().parse_args(["shell", "--metadata-uri", "mem://unused/ledgers", *argv])


def test_bk_shell_knows_the_recovery_commands_and_keeps_its_own():
    args = shell_args("recover", "127.0.0.1:3181", "--ledger", "7", "--target", "127.0.0.1:3182", "--dry-run")
    assert (args.shell_command, args.ledger, args.target, args.dry_run, args.yes) == (
        "recover", 7, "127.0.0.1:3182", True, False)
    assert shell_args("listunderreplicated", "--print-worker").print_worker
    assert shell_args("lostbookierecoverydelay", "--set", "5").set == 5
    assert shell_args("listledgers").shell_command == "listledgers"
    with pytest.raises(SystemExit):
        shell_args("autorecovery", "--enable", "--disable")


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_bar_on_a_terminal_and_lines_otherwise(monkeypatch, capsys):
    progress = RecoveryProgress(ledgers_total=2, ledgers_done=1, bytes_copied=3_000_000)
    outcome = LedgerOutcome(5, [SegmentResult(0, "a:1", "t:1", 10, 3_000_000, True)], fenced=True)
    result = LedgerResult(5, "recovered", None, outcome)
    shell_recovery._Progress(quiet=False).ledger(progress, result)
    assert capsys.readouterr().out == ("[1/2] ledger 5: recovered (1 segment(s), 10 entries, 3.0 MB to t:1)"
                                       " [fenced and closed]\n")
    fake_err = Tty()
    monkeypatch.setattr("sys.stderr", fake_err)
    show = shell_recovery._Progress(quiet=False)
    show.bar(progress)
    show.ledger(progress, LedgerResult(6, "failed", "no replica could be read"))
    show.done()
    assert "1/2 [" in fake_err.getvalue() and "3.0 MB copied" in fake_err.getvalue()  # tqdm's bar
    assert capsys.readouterr().out == "ledger 6: failed: no replica could be read\n"
    quiet = shell_recovery._Progress(quiet=True)
    quiet.ledger(progress, result)
    assert capsys.readouterr().out == ""


def recover_args(bookie, *extra):
    return shell_args("recover", bookie, *extra)


@run_async
async def test_recover_asks_first_and_refuses_without_a_terminal(monkeypatch):
    async with FakeCluster(4) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        ids = [b.bookie_id for b in cluster.bookies]
        lh, data = await write_ledger(bkc, 20, ensemble=ids[:3])
        await cluster.kill(cluster.bookies[0])
        before = await bkc.ledger_manager.read_ledger_metadata(lh.ledger_id)
        uri = cluster.metadata_uri
        monkeypatch.setattr("sys.stdin", io.StringIO())  # not a terminal
        with pytest.raises(IncorrectParameterError, match="--yes"):
            await shell_recovery.cmd_recover(uri, recover_args(ids[0]))
        monkeypatch.setattr("sys.stdin", Tty())
        answers = iter(["n", "yes"])
        monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
        result = await shell_recovery.cmd_recover(uri, recover_args(ids[0]))
        assert result == {"ok": False, "text": "nothing changed"}
        assert await bkc.ledger_manager.read_ledger_metadata(lh.ledger_id) == before
        result = await shell_recovery.cmd_recover(uri, recover_args(ids[0]))
        assert result["ok"] and result["recovered"] == [lh.ledger_id]
        assert "recovered 1 of 1 ledger(s)" in result["text"]
        await check_recovered(bkc, lh.ledger_id, data, ids[0], last_entry_id=19)


@run_async
async def test_switches_delay_listing_and_trigger():
    async with FakeCluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bkc:
        uri = cluster.metadata_uri
        urm = LedgerUnderreplicationManager(bkc.store)
        out = await shell_recovery.cmd_autorecovery(uri, shell_args("autorecovery", "--disable"))
        assert not out["enabled"] and "DISABLED" in out["text"] and out["auditor"] is None
        assert not await urm.is_ledger_replication_enabled()
        out = await shell_recovery.cmd_autorecovery(uri, shell_args("autorecovery", "--enable"))
        assert out["enabled"]
        out = await shell_recovery.cmd_lostbookierecoverydelay(uri, shell_args("lostbookierecoverydelay", "--set",
                                                                               "12"))
        assert out["lost_bookie_recovery_delay_s"] == 12
        with pytest.raises(IncorrectParameterError):
            await shell_recovery.cmd_lostbookierecoverydelay(uri, shell_args("lostbookierecoverydelay", "--set",
                                                                             "-1"))
        await urm.mark_ledger_underreplicated(3, ["x:1"])
        await urm.mark_ledger_underreplicated(4, ["y:1", "x:1"])
        assert await urm.acquire_ledger_lock(4, "w:1")
        out = await shell_recovery.cmd_listunderreplicated(uri, shell_args(
            "listunderreplicated", "--missing-replica", "y:1", "--print-missing-replicas", "--print-worker"))
        assert out["text"] == "4\tmissing: y:1, x:1\tworker: w:1"
        changed = asyncio.Event()
        _, fut = await urm.lost_bookie_recovery_delay_watched()
        fut.add_done_callback(lambda f: changed.set())
        out = await shell_recovery.cmd_triggeraudit(uri, shell_args("triggeraudit"))
        assert "no auditor" in out["text"]
        await asyncio.wait_for(changed.wait(), 10)  # the same value was written again: the trigger
        assert await urm.get_lost_bookie_recovery_delay() == 12
        out = await shell_recovery.cmd_whoisauditor(uri, shell_args("whoisauditor"))
        assert out["auditor"] is None
        with pytest.raises(IncorrectParameterError, match="stop it"):
            await shell_recovery.cmd_decommissionbookie(uri, shell_args("decommissionbookie",
                                                                        cluster.bookies[0].bookie_id))
        await urm.close()

