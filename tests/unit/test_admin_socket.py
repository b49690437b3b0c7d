"""The admin socket's metadata op (bk.server.admin.metadata_ops): a fault drill that has the
metadata server expire the bookie's own session; the chaos runner's zk-expire on bookie
processes goes through it. (The GC ops are tested in test_gc_compaction.py.)"""
import asyncio

import pytest

from bk import eventloop
from bk.meta.memory import InMemoryStore
from bk.server.admin import AdminError, AdminServer, admin_call, metadata_ops


def test_expire_metadata_session_ends_the_session_and_drops_its_ephemerals(tmp_path):
    async def main():
        store = InMemoryStore()
        await store.create("/ledgers/available/b1", b"", ephemeral=True, make_parents=True)
        server = AdminServer(str(tmp_path / "a.sock"), metadata_ops(store, asyncio.get_running_loop()))
        assert await server.start()
        try:
            old = store.session_id
            out = await asyncio.to_thread(admin_call, server.path, "expire_metadata_session")
            assert out == {"old_session_id": old, "session_id": store.session_id}
            assert store.session_id != old
            assert await store.exists("/ledgers/available/b1") is None  # the old session's ephemeral
            with pytest.raises(AdminError, match="unknown op"):
                await asyncio.to_thread(admin_call, server.path, "expire_everything")
        finally:
            await server.stop()
            await store.close()
    eventloop.run(main())
