"""Progress of the long shell commands: `compact` moves a bar over the plan's logs as each
bookie finishes (a plain line per bookie without a terminal), `triggergc` shows a tqdm line
with the pass's figures (polled from gc_status) while the pass runs on a terminal; --json
output stays one clean JSON document either way.
"""
import json
import sys
import time

from bk.cli import shell_compact, shell_gc
from bk.cli.main import main

PLAN = {"plan": {"threshold": 0.5, "logs": [{"bookie_id": "a:1", "log_id": 1}, {"bookie_id": "b:1", "log_id": 2},
                                            {"bookie_id": "b:1", "log_id": 3}]}}


def fake_compaction(monkeypatch):
    def via_socket(path, log_ids, timeout_s):
        return {"ok": True, "plan": {str(i): "compacted" for i in log_ids}, "bytes_freed": 100 * len(log_ids)}
    monkeypatch.setattr(shell_compact, "_via_socket", via_socket)


def compact(tmp_path, *extra):
    plan = tmp_path / "summary.json"
    plan.write_text(json.dumps(PLAN))
    return main(["shell", *extra, "compact", "--plan", str(plan), "--socket", "a:1=/a.sock", "--socket",
                 "b:1=/b.sock"])


def test_compact_reports_each_bookie_as_it_ends(tmp_path, capsys, monkeypatch):
    fake_compaction(monkeypatch)
    assert compact(tmp_path) == 0
    out = capsys.readouterr().out.splitlines()
    first, second = sorted(out[:2], key=lambda line: "2/2 bookies" in line)
    assert first in ("compaction: a:1 done (1/2 bookies, 1/3 logs)", "compaction: b:1 done (1/2 bookies, 2/3 logs)")
    assert second.endswith("done (2/2 bookies, 3/3 logs)") and second.split()[1] != first.split()[1]
    assert "  total freed 300 bytes" in out
    assert compact(tmp_path, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["bytes_freed"] == 300 and list(doc["bookies"]) == ["a:1", "b:1"]


def test_compact_bar_on_a_terminal(tmp_path, capsys, monkeypatch):
    fake_compaction(monkeypatch)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert compact(tmp_path) == 0
    captured = capsys.readouterr()
    assert "compaction: 100%" in captured.err and "3/3" in captured.err and "300 bytes freed" in captured.err


def fake_gc(monkeypatch):
    import bk.server.admin as admin

    def call(args, op, **kw):
        assert op == "gc_trigger"
        time.sleep(1.2)
        return {"ok": True, "start_ms": 1, "duration_ms": 1200, "ledgers_deleted": [4], "logs_deleted": [],
                "logs_compacted": [], "bytes_freed": 7}
    monkeypatch.setattr(shell_gc, "_call", call)
    monkeypatch.setattr(admin, "admin_call", lambda path, op, timeout_s=None, **kw: (
        {"running": True, "compacting_logs": 2, "candidates_left": 5} if op == "gc_status" else {}))


def test_triggergc_shows_the_pass_on_a_terminal(capsys, monkeypatch):
    fake_gc(monkeypatch)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["shell", "triggergc", "--socket", "/x.sock"]) == 0
    captured = capsys.readouterr()
    assert "GC pass" in captured.err and "compacting 2 logs, 5 deleted-ledger candidates left" in captured.err
    assert "ledgers deleted   1" in captured.out
    assert main(["shell", "--json", "triggergc", "--socket", "/x.sock"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["bytes_freed"] == 7 and "GC pass" not in captured.err
