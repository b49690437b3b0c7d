"""The HTTP admin server's large answers are paged (BookKeeper's `page`) and streamed, ledger/list
reads metadata in concurrent batches; BookKeeper's compaction suspend/resume, runtime settings,
gc_details and last_log_mark shapes (issue 30; docs/OPERATIONS.md). In-process bookie and an
in-memory metadata store: no ZooKeeper."""
from __future__ import annotations

import asyncio
import json
import types

import aiohttp

from bk import eventloop
from bk.bookie import Bookie
from bk.meta.ledger_manager import LedgerManager
from bk.meta.ledger_metadata import LedgerMetadata
from bk.meta.memory import InMemoryStore
from bk.server import http_admin, http_handlers
from bk.server.http_admin import HttpAdminServer
from bk.server.http_routes import ROUTES
from bk.testing.engine_host import engine_config, expected_entry, ledger_key

LEDGERS = 250


class CountingStore(InMemoryStore):
    """Counts how many reads are in flight at once (each read takes a little while)."""

    def __init__(self):
        super().__init__()
        self.in_flight = 0
        self.most = 0
        self.fail_after: int | None = None  # reads that succeed before every read fails


    async def get(self, path, *args, **kwargs):
        if self.fail_after is not None:
            if self.fail_after <= 0:
                raise OSError("the metadata store broke")
            self.fail_after -= 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.001)
            return await super().get(path, *args, **kwargs)
        finally:
            self.in_flight -= 1


def run_with_server(tmp_path, body, ledgers: int = LEDGERS, **cfg_extra):
    cfg = engine_config(str(tmp_path / "d"), http_server_port=0, http_server_mutations_enabled=True,
                        gc_wait_time_ms=3_600_000, **cfg_extra)

    async def main():
        store = CountingStore()
        lm = LedgerManager(store)
        for i in range(ledgers):
            await lm.create_ledger_metadata(i, LedgerMetadata.new(["127.0.0.1:3181"], 1, 1))
        async with Bookie(cfg) as b:
            server = types.SimpleNamespace(bookie=b, bookie_id="127.0.0.1:3181", store=store, config=cfg)
            http = await HttpAdminServer(server, cfg, ROUTES).start()
            try:
                async with aiohttp.ClientSession(http.url) as s:
                    await body(s, b, store)
            finally:
                await http.stop()
                await store.close()
    eventloop.run(main())


async def get(s, path):
    async with s.get(path) as r:
        text = await r.text()
        return r.status, r.headers, (json.loads(text) if text else None)


async def put(s, path, body):
    async with s.put(path, json=body) as r:
        return r.status, await r.json()


def test_ledger_list_is_paged_streamed_and_reads_metadata_in_concurrent_batches(tmp_path):
    async def body(s, b, store):
        status, headers, everything = await get(s, "/api/v1/ledger/list")
        assert status == 200 and list(everything) == [str(i) for i in range(LEDGERS)]
        assert headers.get("Transfer-Encoding") == "chunked"  # streamed, not built whole
        assert set(everything.values()) == {None}
        status, _, page = await get(s, "/api/v1/ledger/list?page=2")
        assert status == 200 and list(page) == [str(i) for i in range(100, 200)]
        status, _, last = await get(s, "/api/v1/ledger/list?print_metadata=true&page=3")
        assert status == 200 and list(last) == [str(i) for i in range(200, LEDGERS)]
        assert last["249"]["ledger_id"] == 249 and last["249"]["ensemble_size"] == 1, last["249"]
        assert (await get(s, "/api/v1/ledger/list?page=4"))[2] == {}
        async with s.head("/api/v1/ledger/list") as r:  # headers only, the connection stays usable
            assert r.status == 200 and await r.read() == b""
        assert (await get(s, "/api/v1/ledger/list?page=3"))[0] == 200
        for bad in ("page=0", "page=x", "page=-1"):
            status, _, err = await get(s, "/api/v1/ledger/list?" + bad)
            assert status == 400 and "page" in err["error"], err
        store.most = 0
        status, _, everything = await get(s, "/api/v1/ledger/list?print_metadata=true")
        assert status == 200 and len(everything) == LEDGERS
        assert all(isinstance(v, dict) for v in everything.values())
        # BookKeeper's batches: up to PAGE_SIZE reads at once, never one ledger at a time
        assert 1 < store.most <= http_admin.PAGE_SIZE, store.most
    run_with_server(tmp_path, body)


def test_a_stream_that_fails_midway_is_cut_not_a_wellformed_partial_answer(tmp_path):
    async def body(s, b, store):
        store.fail_after = 0  # before anything is sent: a JSON error
        status, _, err = await get(s, "/api/v1/ledger/list?print_metadata=true")
        assert status == 500 and "the metadata store broke" in err["error"], err
        store.fail_after = 550  # the sixth batch fails after the first five (> 64 KiB) went out
        try:
            async with s.get("/api/v1/ledger/list?print_metadata=true") as r:
                assert r.status == 200  # the headers were sent before the failure
                text = await r.text()
            json.loads(text)
            raise AssertionError(f"a partial answer was well-formed: {len(text)} chars")
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ValueError):
            pass  # cut: never a partial list passed off as the whole
        store.fail_after = None
        status, _, everything = await get(s, "/api/v1/ledger/list?print_metadata=true")
        assert status == 200 and len(everything) == 600  # the server goes on
    run_with_server(tmp_path, body, ledgers=600)


def test_entry_log_usage_is_paged(tmp_path, monkeypatch):
    monkeypatch.setattr(http_admin, "PAGE_SIZE", 2, raising=False)
    monkeypatch.setattr(http_handlers, "PAGE_SIZE", 2, raising=False)

    async def body(s, b, store):
        for eid in range(400):  # 400 x 1000 B over 64 KiB logs: several logs
            await b.add_entry(1, eid, expected_entry(1, 1, eid, 1000), ledger_key(1, 1))
        await b.checkpoint()
        status, headers, whole = await get(s, "/api/v1/bookie/entry_log_usage")
        assert status == 200 and whole["bookie_id"] == "127.0.0.1:3181"
        (d, rows), = whole["ledger_dirs"].items()
        ids = [r["log_id"] for r in rows]
        assert len(ids) >= 3, ids
        status, _, first = await get(s, "/api/v1/bookie/entry_log_usage?page=1")
        assert status == 200 and [r["log_id"] for r in first["ledger_dirs"][d]] == ids[:2]
        assert first["ledger_dirs"][d] == rows[:2]
        status, _, second = await get(s, "/api/v1/bookie/entry_log_usage?page=2")
        assert [r["log_id"] for r in second["ledger_dirs"][d]] == ids[2:4]
        status, _, past = await get(s, f"/api/v1/bookie/entry_log_usage?page={len(ids)}")
        assert status == 200 and past["ledger_dirs"] == {d: []}
        assert (await get(s, "/api/v1/bookie/entry_log_usage?page=0"))[0] == 400
    run_with_server(tmp_path, body, ledgers=0, entry_log_size_limit_bytes="64KiB")


def test_compaction_suspend_and_resume_drive_the_gc_thread(tmp_path):
    async def body(s, b, store):
        path = "/api/v1/bookie/gc/suspend_compaction"
        assert (await get(s, path))[2] == {"isMajorGcSuspended": "false", "isMinorGcSuspended": "false"}
        status, said = await put(s, path, {"suspendMajor": True, "suspendMinor": True})
        assert status == 200 and said == ("Suspend majorGC on BookieServer: 127.0.0.1:3181, "
                                          "Suspend minorGC on BookieServer: 127.0.0.1:3181"), said
        assert (await get(s, path))[2] == {"isMajorGcSuspended": "true", "isMinorGcSuspended": "true"}
        out = await asyncio.to_thread(b.gc.trigger, force_major=True, force_minor=True)
        assert out["ok"] and out["compaction"] is None, out  # forced, but suspended: none
        status, said = await put(s, "/api/v1/bookie/gc/resume_compaction", {"resumeMajor": True})
        assert status == 200 and said == "Resume majorGC on BookieServer: 127.0.0.1:3181"
        assert (await get(s, path))[2] == {"isMajorGcSuspended": "false", "isMinorGcSuspended": "true"}
        out = await asyncio.to_thread(b.gc.trigger, force_major=True)
        assert out["compaction"] == "major", out
        status, _, details = await get(s, "/api/v1/bookie/gc_details")
        d = details[0]
        assert d["majorCompactionCounter"] == 1 and d["minorCompactionCounter"] == 0, d
        assert d["lastMajorCompactionTime"] > 0 and d["lastMinorCompactionTime"] == 0, d
        assert d["forceCompacting"] is False and d["majorCompacting"] is False, d
        assert d["ledgerDir"] == b.config.ledger_dirs[0] and d["passes"] == 2, d
        assert (await put(s, path, {}))[0] == 400
        assert (await put(s, path, {"suspendMajor": "yes"}))[0] == 400
        assert (await put(s, "/api/v1/bookie/gc/resume_compaction", {}))[0] == 400
    run_with_server(tmp_path, body, ledgers=0)


def test_server_config_put_changes_only_runtime_settings(tmp_path):
    async def body(s, b, store):
        path = "/api/v1/config/server_config"
        status, said = await put(s, path, {"gc_wait_time_ms": 5000, "majorCompactionThreshold": 0.9})
        assert status == 200 and said == "Success set server config.", said
        cfg = (await get(s, path))[2]
        assert cfg["gc_wait_time_ms"] == 5000 and cfg["major_compaction_threshold"] == 0.9
        assert b.gc.status()["settings"]["gc_wait_time_ms"] == 5000  # the GC thread's own view
        status, err = await put(s, path, {"gc_wait_time_ms": 7000, "ledger_dirs": ["/x"], "bookie_port": 1})
        assert status == 400 and "bookie_port, ledger_dirs" in err["error"], err
        status, err = await put(s, path, {"minor_compaction_threshold": 0.95})  # above major: refused
        assert status == 400 and "minor_compaction_threshold" in err["error"], err
        status, err = await put(s, path, {"gc_wait_time_ms": "soon"})
        assert status == 400, err
        cfg = (await get(s, path))[2]
        assert cfg["gc_wait_time_ms"] == 5000 and cfg["minor_compaction_threshold"] == 0.2  # unchanged
    run_with_server(tmp_path, body, ledgers=0)


def test_last_log_mark_has_bookkeepers_shape(tmp_path):
    async def body(s, b, store):
        await b.add_entry(1, 0, expected_entry(1, 1, 0, 100), ledger_key(1, 1))
        status, _, marks = await get(s, "/api/v1/bookie/last_log_mark")
        (key, value), = marks.items()
        mark = b.journals[0].last_mark()
        assert key == f"LastLogMark: Journal Id - {mark.file_id}({mark.file_id:x}.txn)", key
        assert value == f"Pos - {mark.offset}" and mark.offset > 0, value
    run_with_server(tmp_path, body, ledgers=0)
