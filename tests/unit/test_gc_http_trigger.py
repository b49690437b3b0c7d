"""PUT /api/v1/bookie/gc answers at once (BookKeeper's TriggerGCService) and the pass runs on
the GC's own executor, not the default one that serves the read path (issue 30, docs/GC.md)."""
from __future__ import annotations

import asyncio
import threading
import types

import aiohttp

from bk import eventloop
from bk.bookie import Bookie
from bk.server.http_admin import HttpAdminServer
from bk.server.http_routes import ROUTES
from bk.testing.engine_host import engine_config, expected_entry, ledger_key

SIZE = 1000
ENTRIES = 40


class HeldPolicy:
    """The metadata comparison of a pass waits until the test releases it (a slow pass)."""

    def __init__(self):
        self.entered = threading.Event()
        self.release = asyncio.Event()

    async def find_garbage(self, local, delete):
        self.entered.set()
        await asyncio.wait_for(self.release.wait(), 120)
        return {"ledgers": []}


async def wait_for(predicate, what: str, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await predicate():
        assert loop.time() < deadline, f"still waiting for {what}"
        await asyncio.sleep(0.05)


def test_put_gc_returns_before_the_pass_ends_and_reads_go_on(tmp_path):
    cfg = engine_config(str(tmp_path / "d"), http_server_port=0, http_server_mutations_enabled=True,
                        gc_wait_time_ms=3_600_000)

    async def main():
        async with Bookie(cfg) as b:
            for eid in range(ENTRIES):
                await b.add_entry(1, eid, expected_entry(1, 1, eid, SIZE), ledger_key(1, 1))
            await b.checkpoint()
            policy = HeldPolicy()
            b.gc.policy = policy
            server = types.SimpleNamespace(bookie=b, bookie_id="127.0.0.1:3181")
            http = await HttpAdminServer(server, cfg, ROUTES).start()
            try:
                async with aiohttp.ClientSession(http.url) as s:
                    async def in_force() -> str:
                        async with s.get("/api/v1/bookie/gc") as r:
                            assert r.status == 200
                            return (await r.json())["is_in_force_gc"]

                    assert await in_force() == "false"
                    # the pass is held in its metadata comparison until released below: the
                    # PUT must answer while it is held (before, it waited for the pass's end)
                    put = s.put("/api/v1/bookie/gc", json={"forceMajor": True},
                                timeout=aiohttp.ClientTimeout(total=30))
                    async with put as r:
                        assert r.status == 200, await r.text()
                        assert await r.json() == "Triggered GC on BookieServer: 127.0.0.1:3181"
                    assert await in_force() == "true"  # asked for: in force even before it starts
                    await asyncio.to_thread(policy.entered.wait, 60)
                    assert policy.entered.is_set() and b.gc.status()["running"]
                    assert await in_force() == "true"
                    for eid in range(ENTRIES):  # the read path is served during the pass
                        assert await b.read_entry(1, eid) == expected_entry(1, 1, eid, SIZE)
                    async with s.get("/api/v1/bookie/gc_details") as r:
                        assert (await r.json())[0]["passes"] == 0
                    async with s.put("/api/v1/bookie/gc", json={"forceMajor": "yes"}) as r:
                        assert r.status == 400
                    policy.release.set()

                    async def ended() -> bool:
                        return await in_force() == "false"
                    await wait_for(ended, "the triggered pass to end")
                    async with s.get("/api/v1/bookie/gc_details") as r:
                        details = (await r.json())[0]
                    assert details["passes"] == 1 and details["last_pass"]["ok"], details
                    assert details["last_pass"]["compaction"] == "major", details
            finally:
                policy.release.set()
                await http.stop()
    eventloop.run(main())


def test_admin_socket_gc_ops_wait_on_the_gc_executor(tmp_path):
    """bk shell triggergc still answers the pass's figures; its wait (and a compaction
    plan's) is on the GC's own executor, shared with the HTTP server, not the default one."""
    from bk.server.admin import gc_calls, gc_ops
    cfg = engine_config(str(tmp_path / "d"), gc_wait_time_ms=3_600_000)

    async def main():
        async with Bookie(cfg) as b:
            ops = gc_ops(b.gc)
            executor = gc_calls(b.gc).executor
            assert gc_calls(b.gc) is gc_calls(b.gc)
            assert ops["gc_trigger"].executor is executor and ops["gc_compact_logs"].executor is executor
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(executor, ops["gc_trigger"], {"force_minor": True})
            assert out["ok"] and out["ledgers_deleted"] == [] and "bytes_freed" in out, out
    eventloop.run(main())
