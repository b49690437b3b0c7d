"""The shell commands on one bookie's files: `ledger` (the index dump of one ledger, -m for
its record), `activeledgers` (the ledgers of an entry log that the metadata store still
has) and listfilesondisc's BookKeeper switches (-txn journal, -log entry log, -idx index
files). A bookie engine writes ledgers 2 and 3 in-process; the shell runs through
bk.cli.main as an operator runs it, with and without --json.
"""
import asyncio
import json
import os

from bk import eventloop
from bk.bookie import Bookie
from bk.cli.main import main as bk_main
from bk.meta import open_store
from bk.meta.ledger_manager import LedgerManager
from bk.meta.ledger_metadata import LedgerMetadata
from bk.testing.engine_host import engine_config, expected_entry, ledger_key

COUNT = 5


def bookie_files(tmp_path):
    cfg = engine_config(str(tmp_path / "d"), flush_interval_ms=60_000)

    async def write():
        async with Bookie(cfg) as b:
            for lid in (2, 3):
                for eid in range(COUNT):
                    await b.add_entry(lid, eid, expected_entry(1, lid, eid, 100), ledger_key(1, lid))
            await b.checkpoint()
    asyncio.run(write())
    return cfg, ["--ledger-dirs", *cfg.ledger_dirs, "--index-dir", cfg.resolved_index_dir]


def run(capsys, *argv):
    code = bk_main(["shell", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ledger_dumps_index_entries_and_record(tmp_path, capsys):
    cfg, dirs = bookie_files(tmp_path)
    code, out, _ = run(capsys, "--json", "ledger", "2", "-m", *dirs)
    assert code == 0
    d = json.loads(out)
    assert [e["entry_id"] for e in d["entries"]] == list(range(COUNT))
    assert all(e["log_id"] is not None and e["offset"] > 0 for e in d["entries"])
    assert len({e["offset"] for e in d["entries"]}) == COUNT
    assert d["meta"] == {"master_key": ledger_key(1, 2).hex(), "fenced": False, "limbo": False,
                         "explicit_lac": False, "entries": COUNT}
    code, out, _ = run(capsys, "ledger", "3", *dirs)
    assert code == 0 and out.startswith("===== LEDGER: 3 =====")
    assert f"entry 0\t:\t(log: {d['entries'][0]['log_id']:x}, pos: " in out and f"entry {COUNT}\t" not in out
    code, _, err = run(capsys, "ledger", "99", *dirs)
    assert code == 1 and "ledger 99 is not in this bookie's index" in err
    code, _, err = run(capsys, "ledger", "2", "--ledger-dirs", str(tmp_path / "none"))
    assert code == 1 and "no such ledger dir" in err


def test_activeledgers_lists_ledgers_the_metadata_store_has(tmp_path, capsys):
    cfg, dirs = bookie_files(tmp_path)
    uri = f"mem://active-{os.getpid()}-{id(tmp_path)}/ledgers"

    async def only_ledger_3():
        store = await open_store(uri)
        try:
            await LedgerManager(store).create_ledger_metadata(3, LedgerMetadata(1, 1, 1, ((0, ("b:1",)),)))
        finally:
            await store.close()
    eventloop.run(only_ledger_3())
    code, out, _ = run(capsys, "--json", "listfilesondisc", *dirs)
    log_id = json.loads(out)["entry_logs"][0]["log_id"]
    code, out, err = run(capsys, "--metadata-uri", uri, "--json", "activeledgers", "-logId", str(log_id), *dirs)
    assert code == 0, err
    d = json.loads(out)
    assert (d["active"], d["deleted"]) == ([3], [2])
    code, out, _ = run(capsys, "--metadata-uri", uri, "activeledgers", "-l", hex(log_id), *dirs)
    assert code == 0 and f"active ledgers on entry log {log_id}" in out and "\n3\n" in out + "\n"
    code, _, err = run(capsys, "--metadata-uri", uri, "activeledgers", "-logId", "4242", *dirs)
    assert code == 1 and "no entry log 4242" in err


def test_listfilesondisc_switches(tmp_path, capsys):
    cfg, dirs = bookie_files(tmp_path)
    jdirs = ["--journal-dirs", *cfg.journal_dirs]
    code, out, _ = run(capsys, "--json", "listfilesondisc", "-txn", "-log", "-idx", *dirs, *jdirs)
    assert code == 0
    d = json.loads(out)
    assert d["journal_files"] and all(p.endswith(".txn") for p in d["journal_files"])
    assert d["entrylog_files"] and all(p.endswith(".log") for p in d["entrylog_files"])
    assert os.path.realpath(os.path.join(cfg.resolved_index_dir, "data.mdb")) in d["index_files"]
    code, out, _ = run(capsys, "listfilesondisc", "--entrylog", *dirs)
    assert code == 0 and "EntryLog Files" in out and "Journal Files" not in out
    assert out.split("\n")[1:-1] == d["entrylog_files"]
    # without a switch: the usage table as before
    code, out, _ = run(capsys, "listfilesondisc", *dirs)
    assert code == 0 and "live bytes" in out
