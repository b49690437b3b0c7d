"""Journal and ledger directories on different file systems, as BookKeeper is deployed
(docs/OPERATIONS.md, "Journal and ledger devices"): the journal on tmpfs (/dev/shm), the
entry logs and the index on the disk under the test's tmp dir (ext4 here). A bookie adds,
checkpoints (journal files behind the mark recycled: journal_reuse_files), adds more
that only the journal holds, and loses power (bk.testing.powerloss, every unsynced write
on either file system lost); it restarts with every acknowledged entry. About 1 s."""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import uuid

from bk import eventloop
from bk.bookie import Bookie
from bk.journal import list_files
from bk.testing.engine_host import engine_config, expected_entry, ledger_key
from bk.testing.powerloss import halt_without_checkpoint, read_track_log, simulate_power_loss

SHM = "/dev/shm"


def test_journal_on_tmpfs_ledgers_on_disk_survive_a_power_cut(tmp_path, monkeypatch, caplog):
    journal_root = os.path.join(SHM, f"bk-test-journal-{uuid.uuid4().hex[:8]}")
    assert os.path.isdir(SHM), "this test needs /dev/shm (a tmpfs) for the journal"
    try:
        os.makedirs(journal_root)
        data = str(tmp_path / "bookie")
        os.makedirs(data)
        # two file systems, or the test proves nothing
        assert os.stat(journal_root).st_dev != os.stat(data).st_dev
        track = str(tmp_path / "fsync.track")
        monkeypatch.setenv("BK_FSYNC_TRACK_FILE", track)
        cfg = engine_config(data, journal_dirs=[journal_root], journal_max_size_bytes="64KiB",
                            journal_pre_alloc_size_mb=1, journal_reuse_files=True,
                            flush_interval_ms=3_600_000)
        n = 300

        async def fill() -> None:
            bookie = Bookie(cfg)
            await bookie.start()
            async def add(lid: int) -> None:  # in runs of 30: groups of ~30 KB, files of 64 KiB
                for first in range(0, n, 30):
                    await asyncio.gather(*(bookie.add_entry(lid, e, expected_entry(7, lid, e, 1000),
                                                            ledger_key(7, lid)) for e in range(first, first + 30)))
            await add(1)
            await asyncio.to_thread(bookie.storage.checkpoint)  # entry logs + index on the disk
            await add(2)  # only in the journal (on tmpfs); new files recycle those behind the mark
            await asyncio.to_thread(halt_without_checkpoint, bookie)

        async def check() -> tuple[list, list]:
            bookie = Bookie(cfg)
            await bookie.start()
            try:
                return bookie.missing_entries(1, range(n)), bookie.missing_entries(2, range(n))
            finally:
                await bookie.stop()

        with caplog.at_level(logging.INFO, logger="bk.journal.inplace"):
            eventloop.run(fill())
        assert "journal: recycled" in caplog.text, os.listdir(os.path.join(journal_root, "current"))
        log = read_track_log(track)
        # each file system's directories were fsynced by the bookie itself
        assert any(d.startswith(journal_root) for d in log.listings)
        assert any(d.startswith(data) for d in log.listings)
        print(simulate_power_loss(track, [journal_root, data]))
        assert eventloop.run(check()) == ([], [])
        assert list_files(journal_root)  # the journal stayed on tmpfs
    finally:
        shutil.rmtree(journal_root, ignore_errors=True)
