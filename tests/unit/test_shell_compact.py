"""`bk shell compact --plan`: reading a plan, bad plans refused clearly, routes, dry run."""
import json

import pytest

from bk.cli.main import main
from bk.cli.shell_compact import load_plan
from bk.errors import ConfigError


def write(tmp_path, doc) -> str:
    p = tmp_path / "summary.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


PLAN = {"plan": {"threshold": 0.35, "bytes_reclaimed": 10, "bytes_rewritten": 5,
                 "logs": [{"bookie_id": "b:1", "log_id": 3}, {"bookie_id": "a:1", "log_id": 9},
                          {"bookie_id": "b:1", "log_id": 1}, {"bookie_id": "b:1", "log_id": 3}]}}


def test_plan_grouped_by_bookie(tmp_path):
    assert load_plan(write(tmp_path, PLAN)) == (0.35, {"a:1": [9], "b:1": [1, 3]})


@pytest.mark.parametrize("doc, why", [
    ("not json", "not a bk analytics gc summary"),
    ({"bookies": []}, "not a bk analytics gc summary"),
    ({"plan": {"threshold": 0.2, "logs": [{"bookie_id": "a", "log_id": -4}]}}, "bad log id"),
    ({"plan": {"threshold": 0.2, "logs": [{"bookie_id": "a", "log_id": "7"}]}}, "bad log id"),
    ({"error": "2 entry logs could not be read", "plan": {"threshold": 0.2, "logs": []}}, "failed run"),
])
def test_bad_plans_are_refused(tmp_path, doc, why):
    with pytest.raises(ConfigError, match=why):
        load_plan(write(tmp_path, doc))
    with pytest.raises(ConfigError, match="cannot read"):
        load_plan(str(tmp_path / "missing.json"))


def test_dry_run_shows_each_bookie_its_list(tmp_path, capsys):
    path = write(tmp_path, PLAN)
    rc = main(["shell", "--json", "compact", "--plan", path, "--dry-run", "--url", "a:1=http://127.0.0.1:1",
               "--socket", "b:1=/nonexistent.sock"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bookies"]["a:1"] == {"log_ids": [9], "via": ["http", "http://127.0.0.1:1"]}
    assert out["bookies"]["b:1"] == {"log_ids": [1, 3], "via": ["socket", "/nonexistent.sock"]}


def test_an_unreachable_bookie_is_reported_not_hidden(tmp_path, capsys):
    path = write(tmp_path, PLAN)
    rc = main(["shell", "--json", "compact", "--plan", path, "--bookie", "b:1", "--socket",
               f"b:1={tmp_path / 'none.sock'}"])
    assert rc == 1
    out = json.loads(capsys.readouterr().out)
    assert not out["ok"] and "no admin socket" in out["bookies"]["b:1"]["error"]


@pytest.mark.parametrize("extra, why", [(["--remote", "--scan"], "--scan reads every byte"),
                                        (["--remote", "--threshold", "1.5"], "--threshold must be")])
def test_analytics_gc_refuses_bad_options_before_starting_spark(tmp_path, capsys, extra, why):
    rc = main(["analytics", "gc", "--metadata-uri", "zk://127.0.0.1:1/ledgers", "--out", str(tmp_path / "o"), *extra])
    assert rc == 1 and why in capsys.readouterr().err
