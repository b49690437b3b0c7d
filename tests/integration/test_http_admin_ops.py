"""BookKeeper's sanity check and storage expansion over HTTP on a real `bk bookie` process and a
real ZooKeeper (issue 30; docs/OPERATIONS.md). One bookie, mutations on, a bearer token."""
from __future__ import annotations

import json
import os
import tomllib
import urllib.error
import urllib.request
import uuid

import pytest

from bk import eventloop
from bk.meta.cookie import read_directory_cookie
from bk.testing.cluster import LocalCluster, write_toml

pytestmark = pytest.mark.integration
TOKEN = "ops-token"


def call(cluster, path: str, method: str = "GET", body=None, token: str | None = TOKEN):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(cluster.bookies[0].http_url + path, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def ledger_ids(cluster) -> list[int]:
    from bk.client import BookKeeper

    async def go():
        async with BookKeeper(cluster.metadata_uri) as bkc:
            return sorted(await bkc.list_ledgers())
    return eventloop.run(go())


def test_sanity_writes_and_reads_a_ledger_then_expand_storage_adds_a_dir(zk_server, tmp_path):
    c = LocalCluster(str(tmp_path), bookies=0, zk_connect=f"{zk_server}/ops-{uuid.uuid4().hex[:8]}")
    c.start()
    try:
        b = c.add_bookie(0, http_server_mutations_enabled=True, http_server_token=TOKEN)
        before = ledger_ids(c)
        assert call(c, "/api/v1/bookie/sanity", token=None)[0] == 401  # the token, as every endpoint
        assert call(c, "/api/v1/bookie/sanity") == (200, {"passed": True, "readOnly": False})
        assert ledger_ids(c) == before  # its test ledger is deleted again
        assert "bookie sanity check failed" not in open(b.log_path).read()
        # read-only: no test, as BookKeeper's
        assert call(c, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": True})[0] == 200
        assert call(c, "/api/v1/bookie/sanity") == (200, {"passed": False, "readOnly": True})
        assert call(c, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": False})[0] == 200

        # expand_storage: a new, empty ledger dir added to the config file
        with open(b.conf_path, "rb") as fh:
            values = tomllib.load(fh)
        old_dirs = list(values["ledger_dirs"])
        new_dir = os.path.join(c.data_dir, "bookie-0", "ledgers-2")
        status, err = call(c, "/api/v1/bookie/expand_storage", "PUT")
        assert status == 200 and err == "Success expand storage"  # nothing new: nothing to do
        values["ledger_dirs"] = [new_dir]  # the old dir replaced, not added to
        write_toml(b.conf_path, values)
        status, err = call(c, "/api/v1/bookie/expand_storage", "PUT")
        assert status == 400 and "drops ledger dirs" in err["error"], err
        values["ledger_dirs"] = old_dirs + [new_dir]
        write_toml(b.conf_path, values)
        assert call(c, "/api/v1/bookie/expand_storage", "PUT", token=None)[0] == 401
        assert call(c, "/api/v1/bookie/expand_storage", "PUT") == (200, "Success expand storage")
        cookie = read_directory_cookie(new_dir)
        assert cookie is not None and list(cookie.ledger_dirs) == old_dirs + [new_dir]
        assert list(read_directory_cookie(old_dirs[0]).ledger_dirs) == old_dirs + [new_dir]
        # the running bookie goes on with its dirs; restarted with the file, it takes the new one
        assert call(c, "/api/v1/config/server_config")[1]["ledger_dirs"] == old_dirs
        assert call(c, "/api/v1/bookie/sanity")[1]["passed"] is True
        c.stop_bookie(0)
        c.start_bookie(0)
        assert call(c, "/api/v1/config/server_config")[1]["ledger_dirs"] == old_dirs + [new_dir]
        assert call(c, "/api/v1/bookie/sanity") == (200, {"passed": True, "readOnly": False})
    finally:
        c.stop()
