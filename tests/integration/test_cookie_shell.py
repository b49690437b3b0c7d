"""`bk shell cookie show|update|delete|generate` as an operator runs them: subprocesses against
two `bk bookie` processes on a real ZooKeeper, each with and without --json; refusals exit 1
with the reason on stderr and change nothing; a bookie moved to a new address, and given a new
ledger directory, with `cookie update` starts again under its new cookie."""
from __future__ import annotations

import json
import os
import tomllib
import uuid

import pytest

from bk.meta.cookie import Cookie, cookie_file, read_directory_cookie
from bk.testing.cluster import LocalCluster, run_shell, write_toml
from bk.testing.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def cluster(zk_server, tmp_path):
    c = LocalCluster(str(tmp_path), bookies=2, zk_connect=f"{zk_server}/cookies-{uuid.uuid4().hex[:8]}")
    c.start()
    yield c
    c.stop()


def cookie_cmd(cluster, *args: str):
    return run_shell(cluster.metadata_uri, "cookie", *args)


def as_json(out) -> dict:
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert "text" not in doc  # machine fields only
    return doc


def refused(out, *needles: str) -> None:
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "error:" in out.stderr
    for needle in needles:
        assert needle in out.stderr, out.stderr


def conf_of(cluster, i: int) -> str:
    return cluster.bookies[i].conf_path


def load(path: str) -> dict:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def zk_cookie(cluster, bookie_id: str) -> dict | None:
    out = cookie_cmd(cluster, "show", bookie_id, "--json")
    if out.returncode != 0:
        assert "has no cookie" in out.stderr, out.stderr
        return None
    return json.loads(out.stdout)


def wait_unregistered(cluster, bookie_id: str) -> None:
    for _ in range(200):
        doc = json.loads(run_shell(cluster.metadata_uri, "--json", "listbookies", "--all").stdout)
        if bookie_id not in doc["writable"] + doc["readonly"]:
            return
        import time
        time.sleep(0.1)
    raise AssertionError(f"{bookie_id} still registered")


def test_show_and_generate(cluster):
    b0 = cluster.bookies[0]
    conf = load(conf_of(cluster, 0))
    out = cookie_cmd(cluster, "show", b0.bookie_id)
    assert out.returncode == 0, out.stderr
    assert f"bookie host   {b0.bookie_id}" in out.stdout and "registered    writable" in out.stdout
    assert ", ".join(conf["ledger_dirs"]) in out.stdout
    doc = as_json(cookie_cmd(cluster, "show", b0.bookie_id, "--json"))
    assert doc["cookie"]["bookie_host"] == b0.bookie_id and doc["registered"] == "writable"
    assert doc["cookie"]["journal_dirs"] == conf["journal_dirs"] and doc["zk_version"] == 0
    assert "directories" not in doc  # only with --conf

    # with --conf (which also gives the bookie id and the metadata URI): every directory checked
    out = run_shell(cluster.metadata_uri, "--json", "cookie", "show", "--conf", conf_of(cluster, 0))
    doc = as_json(out)
    dirs = [d["directory"] for d in doc["directories"]]
    assert dirs == conf["journal_dirs"] + conf["ledger_dirs"]
    assert doc["all_match"] and all(d["matches_zookeeper"] for d in doc["directories"])
    out = cookie_cmd(cluster, "show", "--conf", conf_of(cluster, 0))
    assert "matches ZooKeeper" in out.stdout and "all match" in out.stdout, out.stdout

    # a directory whose cookie differs is named
    lost = conf["ledger_dirs"][0]
    saved = read_directory_cookie(lost)
    os.remove(cookie_file(lost))
    out = cookie_cmd(cluster, "show", "--conf", conf_of(cluster, 0))
    assert out.returncode == 0 and f"{lost}: NO COOKIE" in out.stdout and "MISMATCH" in out.stdout
    doc = as_json(cookie_cmd(cluster, "show", "--conf", conf_of(cluster, 0), "--json"))
    assert not doc["all_match"] and [d["directory"] for d in doc["directories"] if not d["matches_zookeeper"]] == [lost]
    with open(cookie_file(lost), "wb") as fh:
        fh.write(saved.to_bytes())

    refused(cookie_cmd(cluster, "show", "127.0.0.1:1"), "has no cookie")
    out = cookie_cmd(cluster, "show", "127.0.0.1:1", "--json")
    assert out.returncode == 1 and json.loads(out.stdout)["ok"] is False and "has no cookie" in out.stderr
    refused(cookie_cmd(cluster, "show", "not-an-id"), "bad bookie id")

    # generate: the same cookie the bookie has, from its configuration; nothing is touched
    out = cookie_cmd(cluster, "generate", "--conf", conf_of(cluster, 0))
    assert out.returncode == 0, out.stderr
    generated = Cookie.parse(out.stdout)
    assert not generated.differences(read_directory_cookie(conf["journal_dirs"][0]))
    doc = as_json(cookie_cmd(cluster, "generate", "--conf", conf_of(cluster, 0), "--json"))
    assert doc["cookie"]["bookie_host"] == b0.bookie_id and Cookie.parse(doc["text_form"]) == generated
    target = os.path.join(cluster.data_dir, "cookie.txt")
    out = cookie_cmd(cluster, "generate", "10.0.0.9:3181", "--journal-dirs", "/j", "--ledger-dirs", "/l1,/l2",
                     "--instance-id", "abc", "--output", target)
    assert out.returncode == 0 and target in out.stdout
    with open(target) as fh:
        written = Cookie.parse(fh.read())
    assert (written.bookie_host, written.journal_dirs, written.ledger_dirs, written.instance_id) == (
        "10.0.0.9:3181", ("/j",), ("/l1", "/l2"), "abc")
    refused(cookie_cmd(cluster, "generate", "10.0.0.9:3181", "--journal-dirs", "/j", "--ledger-dirs", "/l",
                       "--output", target), "exists")
    refused(cookie_cmd(cluster, "generate", "10.0.0.9:3181"), "--journal-dirs")
    assert zk_cookie(cluster, "10.0.0.9:3181") is None  # generate never writes ZooKeeper
    assert zk_cookie(cluster, b0.bookie_id)["zk_version"] == 0


def test_update_moves_a_stopped_bookie_and_adds_a_directory(cluster):
    b0 = cluster.bookies[0]
    old_id, conf_path = b0.bookie_id, conf_of(cluster, 0)
    conf = load(conf_path)
    refused(cookie_cmd(cluster, "update", old_id, "--ledger-dirs", "/elsewhere"), "registered as available",
            "stop the bookie")
    assert zk_cookie(cluster, old_id)["zk_version"] == 0

    cluster.stop_bookie(0)
    wait_unregistered(cluster, old_id)
    new_port = free_port()
    new_id = f"127.0.0.1:{new_port}"
    # the configuration still names the old port: the moved bookie could not start, so refuse
    refused(cookie_cmd(cluster, "update", old_id, "--new-bookie-id", new_id, "--conf", conf_path),
            "does not describe the updated cookie", "bookie_host")
    assert zk_cookie(cluster, new_id) is None and zk_cookie(cluster, old_id)["zk_version"] == 0

    write_toml(conf_path, {**conf, "bookie_port": new_port})
    doc = as_json(cookie_cmd(cluster, "update", old_id, "--new-bookie-id", new_id, "--conf", conf_path, "--json"))
    assert doc["changed"] and doc["new_bookie_id"] == new_id
    assert doc["directories_stamped"] == conf["journal_dirs"] + conf["ledger_dirs"]
    assert zk_cookie(cluster, old_id) is None and zk_cookie(cluster, new_id)["cookie"]["bookie_host"] == new_id
    for d in conf["journal_dirs"] + conf["ledger_dirs"]:
        assert read_directory_cookie(d).bookie_host == new_id
    assert as_json(cookie_cmd(cluster, "show", "--conf", conf_path, "--json"))["all_match"]
    moved = cluster.add_bookie(0)  # same directories, the port from the edited configuration
    assert moved.bookie_id == new_id
    assert zk_cookie(cluster, new_id)["registered"] == "writable"

    # a new, empty ledger directory: the configuration first, then the cookie, then the bookie
    cluster.stop_bookie(0)
    wait_unregistered(cluster, new_id)
    extra = os.path.join(cluster.data_dir, "bookie-0", "ledgers-2")
    conf = load(conf_path)
    write_toml(conf_path, {**conf, "ledger_dirs": conf["ledger_dirs"] + [extra]})
    out = cookie_cmd(cluster, "update", new_id, "--dirs-from-conf", "--conf", conf_path)
    assert out.returncode == 0, out.stderr
    assert "ledger_dirs" in out.stdout and "stamped 3 directories" in out.stdout
    assert read_directory_cookie(extra).ledger_dirs == (*conf["ledger_dirs"], extra)
    # taking a directory away would hide its data: refused, nothing changes
    before = zk_cookie(cluster, new_id)
    refused(cookie_cmd(cluster, "update", new_id, "--ledger-dirs", extra), "would leave the cookie")
    assert zk_cookie(cluster, new_id) == before
    cluster.add_bookie(0, ledger_dirs=conf["ledger_dirs"] + [extra])  # (add_bookie rewrites the file)
    assert zk_cookie(cluster, new_id)["registered"] == "writable"


def test_update_without_conf_then_delete(cluster):
    b1 = cluster.bookies[1]
    bookie_id, conf_path = b1.bookie_id, conf_of(cluster, 1)
    refused(cookie_cmd(cluster, "delete", bookie_id), "is registered as available (writable)", "--force")
    assert zk_cookie(cluster, bookie_id) is not None
    cluster.stop_bookie(1)
    wait_unregistered(cluster, bookie_id)

    # ZooKeeper only: the directories keep the old cookie, and `show --conf` says so
    ledgers = load(conf_path)["ledger_dirs"]
    out = cookie_cmd(cluster, "update", bookie_id, "--ledger-dirs", ",".join([*ledgers, "/srv/more"]))
    assert out.returncode == 0 and "directories NOT touched" in out.stdout, out.stderr
    doc = as_json(cookie_cmd(cluster, "show", "--conf", conf_path, "--json"))
    assert doc["zk_version"] == 1 and doc["cookie"]["ledger_dirs"] == [*ledgers, "/srv/more"]
    assert not doc["all_match"] and not doc["config_matches_zookeeper"]
    # going back removes /srv/more from the cookie: refused, unless forced
    refused(cookie_cmd(cluster, "update", bookie_id, "--ledger-dirs", ",".join(ledgers)), "/srv/more")
    doc = as_json(cookie_cmd(cluster, "update", bookie_id, "--ledger-dirs", ",".join(ledgers), "--force", "--json"))
    assert doc["forced"] and doc["directories_stamped"] == []
    assert doc["changes"] == [f"ledger_dirs: [{', '.join([*ledgers, '/srv/more'])}] -> [{', '.join(ledgers)}]"]
    assert as_json(cookie_cmd(cluster, "show", "--conf", conf_path, "--json"))["all_match"]
    refused(cookie_cmd(cluster, "update", "127.0.0.1:2", "--index-dir", "/x"), "has no cookie")

    out = cookie_cmd(cluster, "delete", bookie_id)
    assert out.returncode == 0 and f"deleted the cookie of bookie {bookie_id}" in out.stdout, out.stderr
    assert zk_cookie(cluster, bookie_id) is None
    assert read_directory_cookie(load(conf_path)["journal_dirs"][0]) is not None  # directories untouched
    refused(cookie_cmd(cluster, "delete", bookie_id), "has no cookie")
    # --force deletes even a running bookie's cookie (and --json reports it)
    b0 = cluster.bookies[0]
    doc = as_json(cookie_cmd(cluster, "delete", b0.bookie_id, "--force", "--json"))
    assert doc["deleted"] and doc["was_registered"] == "writable"
