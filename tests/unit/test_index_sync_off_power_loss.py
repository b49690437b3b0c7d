"""index_sync = false: a checkpoint's log mark must be synced before the journal files behind it
are deleted. Found by the power-loss model of every file (bk.testing.powerloss: with
index_sync = false the index rolls back to its last Index.sync() at a power cut). About 2 s."""
from __future__ import annotations

import asyncio
import os
from bk import eventloop
from bk.bookie import Bookie
from bk.testing.engine_host import engine_config, expected_entry, ledger_key
from bk.testing.powerloss import halt_without_checkpoint, install_index_model, simulate_power_loss

ENTRIES = 200


def test_journal_files_go_only_once_the_checkpoint_that_covers_them_is_synced(tmp_path, monkeypatch):
    track = str(tmp_path / "fsync.track")
    monkeypatch.setenv("BK_FSYNC_TRACK_FILE", track)
    install_index_model()
    data = str(tmp_path / "bookie")
    cfg = engine_config(data, index_sync=False, journal_max_size_bytes="64KiB", flush_interval_ms=3_600_000)

    async def fill() -> None:
        bookie = Bookie(cfg)
        await bookie.start()
        # a group past journal_max_size_bytes, then a few more adds: they go to the next file
        for batch in (range(ENTRIES - 10), range(ENTRIES - 10, ENTRIES)):
            await asyncio.gather(*(bookie.add_entry(1, e, expected_entry(7, 1, e, 1000), ledger_key(7, 1))
                                   for e in batch))
        # commits the log mark, then deletes the journal files wholly behind it
        await asyncio.to_thread(bookie.storage.checkpoint)
        await asyncio.to_thread(halt_without_checkpoint, bookie)

    async def check() -> list:
        bookie = Bookie(cfg)
        await bookie.start()
        try:
            return bookie.missing_entries(1, range(ENTRIES))
        finally:
            await bookie.stop()

    eventloop.run(fill())
    assert not os.path.exists(os.path.join(data, "journal", "current", "1.txn"))  # gone with the checkpoint
    print(simulate_power_loss(track, [data]))
    assert eventloop.run(check()) == []
