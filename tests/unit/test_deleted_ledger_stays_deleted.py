"""A ledger deleted durably never comes back after a crash, even when its master-key
journal record was still queued at the deletion (found by the GC chaos mode, seed 178:
journal off, the checkpoint's mark was read before that record was written, so the
crash's replay created the ledger again). Both delete paths wait for the journals to
write what they had queued (LedgerStorage.checkpoint_deletions)."""
import asyncio

import pytest

from bk import eventloop
from bk.bookie import Bookie
from bk.testing.diskfaults import DiskFaults
from bk.testing.engine_host import engine_config, expected_entry, ledger_key
from bk.testing.gc_host import DeletePolicy
from bk.testing.powerloss import halt_without_checkpoint


@pytest.fixture
def faults():
    f = DiskFaults.install()
    yield f
    DiskFaults.uninstall()


@pytest.mark.parametrize("path", ["bookie", "gc"])
@pytest.mark.parametrize("journal_off", [True, False], ids=["no-journal", "journal"])
def test_a_ledger_deleted_while_its_key_record_is_queued_stays_deleted(tmp_path, faults, path, journal_off):
    cfg = engine_config(str(tmp_path / "d"), journal_off, flush_interval_ms=60_000)

    async def main():
        b = Bookie(cfg)
        await b.start()
        await b.add_entry(1, 0, expected_entry(1, 1, 0, 100), ledger_key(1, 1))
        await b.checkpoint()
        rule = faults.hang(op="write", path_prefix=cfg.journal_dirs[0])  # the key record waits
        add = asyncio.ensure_future(b.add_entry(7, 0, expected_entry(1, 7, 0, 100), ledger_key(1, 7)))
        if journal_off:
            await add  # acknowledged without the journal
        else:
            await asyncio.sleep(0.05)
        assert b.ledger_exists(7)
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, faults.heal, rule)  # the journal writes on while the delete waits
        if path == "bookie":
            await b.delete_ledger(7)
        else:
            b.gc.policy = DeletePolicy([7])
            out = await asyncio.to_thread(b.gc.trigger)
            assert out["ledgers_deleted"] == [7], out
        assert not b.ledger_exists(7)
        if not journal_off:
            await add
        await asyncio.to_thread(halt_without_checkpoint, b)
        b = Bookie(cfg)
        await b.start()
        try:
            assert not b.ledger_exists(7), "a durably deleted ledger came back after the crash"
            assert await b.read_entry(1, 0) == expected_entry(1, 1, 0, 100)
        finally:
            await b.stop()
    eventloop.run(main())
