"""What the storage engine does on disk faults (docs/DISK-FAULTS.md), with faults injected
at bk.fileio (bk.testing.diskfaults): fsyncgate (no acknowledgement and no durability
claim after a failed fsync), full disks, failed index commits, read errors and corrupt
records. Runs with the native kernels and again with BK_NO_NATIVE=1."""
import asyncio
import errno
import hashlib
import os

import pytest

from bk.bookie import UNCLEAN_SHUTDOWN, Bookie
from bk.config import load_config
from bk.entrylog import EntryLogger
from bk.errors import (BookieReadOnlyError, CorruptedStorageError, DiskFullError, NoSuchEntryError, StorageError,
                       SyncFailedError)
from bk.index import Index
from bk.testing.diskfaults import DiskFaults, flip_entry_bit, truncate_entry

KEY = hashlib.sha1(b"diskfaults").digest()


def entry(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    payload = (f"payload-{ledger_id}-{entry_id}-".encode() * (size // 10 + 1))[:size]
    return (ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big", signed=True)
            + (-1).to_bytes(8, "big", signed=True) + len(payload).to_bytes(8, "big") + payload)


def make_config(tmp_path, **kw):
    base = dict(journal_dirs=[str(tmp_path / "journal")], ledger_dirs=[str(tmp_path / "ledgers")],
                flush_interval_ms=60_000, write_cache_max_size_bytes="4MiB")
    base.update(kw)
    return load_config(overrides=base, env={})


@pytest.fixture
def faults():
    f = DiskFaults.install()
    yield f
    DiskFaults.uninstall()


def run(coro):
    return asyncio.run(coro)


async def started(cfg) -> Bookie:
    b = Bookie(cfg)
    await b.start()
    return b


def with_bookie(cfg, body):
    """Start a bookie, `await body(b)`, stop it; returns what body returned."""
    async def main():
        b = await started(cfg)
        try:
            return await body(b)
        finally:
            await b.stop()
    return run(main())


async def add_range(b, ledger_id: int, entries, size: int = 100) -> None:
    for e in entries:
        await b.add_entry(ledger_id, e, entry(ledger_id, e, size), KEY)


async def settle(b, timeout_s: float = 10.0):
    """Until the storage threads' report reached the loop (the bookie turned read-only);
    bounded, never a fixed sleep: a loaded machine may schedule the writer thread late."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not b.read_only and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------ entry logger
def test_entry_log_whose_fsync_failed_is_never_fsynced_again(tmp_path, faults):
    d = str(tmp_path / "l")
    el = EntryLogger([d], make_config(tmp_path, ledger_dirs=[d]))
    first = el.add_entries([entry(1, 0)])
    el.flush()
    poisoned = el.current_log_id
    second = el.add_entries([entry(1, 1)])
    rule = faults.fail(op="fsync", path_prefix=d, count=1)
    with pytest.raises(SyncFailedError):
        el.flush()
    assert el.current_log_id == poisoned and el._current is None  # abandoned
    # the retry writes again, into a new log, and only that one is fsynced
    again = el.add_entries([entry(1, 1)])
    el.flush()
    assert faults.hits(rule) == 1
    assert el.current_log_id != poisoned and again[0] >> 32 == el.current_log_id
    assert el.read_entry(1, 0, first[0]) == entry(1, 0)  # synced before the failure: still there
    assert el.read_entry(1, 1, again[0]) == entry(1, 1)
    # what the failed fsync covered is gone (dropped page cache): a reader of the old
    # location gets an error, never wrong bytes
    with pytest.raises(CorruptedStorageError):
        el.read_entry(1, 1, second[0])
    assert poisoned in el.closed_log_ids()
    el.close()


def test_entry_log_fsync_failure_at_rotation_and_full_disk_at_create(tmp_path, faults):
    d = str(tmp_path / "l")
    cfg = make_config(tmp_path, ledger_dirs=[d], entry_log_size_limit_bytes="64KiB")
    el = EntryLogger([d], cfg)
    el.add_entries([entry(1, 0, 30_000)])
    faults.fail(op="fsync", path_prefix=d, count=1)  # the close of the full log
    with pytest.raises(SyncFailedError):
        el.add_entries([entry(1, 1, 30_000), entry(1, 2, 30_000)])
    assert not el._unsynced  # no fsync is owed to a poisoned log
    full = faults.full_disk(d)
    with pytest.raises(DiskFullError):
        el.add_entries([entry(1, 3)])
    faults.heal(full)
    locs = el.add_entries([entry(1, 3)])  # the id of the failed create is not reused
    el.flush()
    assert el.read_entry(1, 3, locs[0]) == entry(1, 3)
    el.close()


def test_failed_directory_fsync_at_log_creation_does_not_stop_checkpoints(tmp_path, faults):
    """Regression: a failed fsync of the log directory while creating a new entry log
    escaped as a raw OSError (the flush thread catches StorageError only, so it died: no
    checkpoint ever again), and left the new file behind, so every later attempt to create
    that log id failed with EEXIST. Now it is a SyncFailedError, and the id is skipped."""
    d = str(tmp_path / "l")
    el = EntryLogger([d], make_config(tmp_path, ledger_dirs=[d]))
    el.add_entries([entry(1, 0)])
    el.flush()
    log_dir = os.path.join(d, "current")
    rule = faults.fail(op="fsync", path_prefix=log_dir, after=1, count=1)  # the close's fsync passes
    with pytest.raises(StorageError):
        el._rotate()  # close the current log, create the next: its directory fsync fails
    assert faults.hits(rule) == 1
    locs = el.add_entries([entry(1, 1)])
    el.flush()
    assert el.read_entry(1, 1, locs[0]) == entry(1, 1)
    el.close()


# ------------------------------------------------------------------ journal
def test_journal_fsync_eio_no_ack_and_read_only_for_good(tmp_path, faults):
    cfg = make_config(tmp_path)

    async def main():
        b = await started(cfg)
        try:
            await b.add_entry(1, 0, entry(1, 0), KEY)
            rule = faults.fail(op="fsync", errno=errno.EIO, path_prefix=cfg.journal_dirs[0], count=1)
            with pytest.raises(StorageError):
                await b.add_entry(1, 1, entry(1, 1), KEY)
            assert faults.hits(rule) == 1
            await settle(b)
            assert b.read_only and b.storage_failure and "journal 0" in b.read_only_reason
            # the fault is gone, but a journal whose fsync failed acknowledges nothing again,
            # and neither the disk checker nor the operator makes the bookie writable
            b.set_read_only(False)
            assert b.read_only
            with pytest.raises(BookieReadOnlyError):
                await b.add_entry(1, 2, entry(1, 2), KEY)
            with pytest.raises(StorageError):  # a recovery add still goes to the dead journal
                await b.add_entry(1, 2, entry(1, 2), KEY, recovery=True)
            assert await b.read_entry(1, 0) == entry(1, 0)  # acknowledged data is served
        finally:
            await b.stop()
    run(main())
    # a clean stop checkpointed everything; the acknowledged entry survives a restart

    async def again(b):
        assert not b.was_unclean_shutdown and not b.read_only
        assert await b.read_entry(1, 0) == entry(1, 0)
    with_bookie(cfg, again)


def test_journal_full_disk_read_only_then_writable_and_nothing_lost(tmp_path, faults):
    cfg = make_config(tmp_path)

    async def main():
        b = await started(cfg)
        try:
            await add_range(b, 1, range(5))
            rule = faults.fail(op="write", errno=errno.ENOSPC, path_prefix=cfg.journal_dirs[0], count=1,
                               partial_bytes=11)
            with pytest.raises(DiskFullError):
                await b.add_entry(1, 5, entry(1, 5), KEY)
            await settle(b)
            assert faults.hits(rule) == 1
            assert b.read_only and b.disk_full and b.storage_failure is None
            with pytest.raises(BookieReadOnlyError):
                await b.add_entry(1, 6, entry(1, 6), KEY)
            b.set_read_only(False)  # the disk checker saw room again
            assert not b.read_only
            for e in range(5, 10):
                await b.add_entry(1, e, entry(1, e), KEY)
        finally:
            await b.stop()
    run(main())

    async def again(b):  # replay sees no hole where the short write was cut away
        for e in range(10):
            assert await b.read_entry(1, e) == entry(1, e)
    with_bookie(cfg, again)


# ------------------------------------------------------------------ checkpoint
@pytest.mark.parametrize("journal", [True, False], ids=["journal", "no-journal"])
def test_checkpoint_fsync_failure_never_claims_lost_entries(tmp_path, faults, journal):
    """fsyncgate at the checkpoint: the entry-log fsync fails and the page cache drops the
    data it covered. The half is kept and written again, into a new log (that file is
    never fsynced again); every acknowledged entry reads back, before and after a restart,
    and the stop after the good retry is clean."""
    cfg = make_config(tmp_path, journal_write_data=journal)

    async def main():
        b = await started(cfg)
        try:
            await add_range(b, 7, range(50), 500)
            rule = faults.fail(op="fsync", path_prefix=cfg.ledger_dirs[0], count=1)
            with pytest.raises(SyncFailedError):
                await b.checkpoint()
            await settle(b)
            assert faults.hits(rule) == 1
            assert b.read_only and "checkpoint" in b.storage_failure
            await b.checkpoint()  # the retry
            for e in range(50):
                assert await b.read_entry(7, e) == entry(7, e, 500)
        finally:
            await b.stop()
    run(main())

    async def again(b):
        assert not b.was_unclean_shutdown  # the final checkpoint succeeded
        for e in range(50):
            assert await b.read_entry(7, e) == entry(7, e, 500)
    with_bookie(cfg, again)


def test_checkpoint_that_never_succeeds_leaves_the_unclean_flag_set(tmp_path, faults):
    """Journal off (BP-46): acknowledged entries held only in memory when the final
    checkpoint fails. The stop must not claim a clean shutdown: the next start runs
    the integrity check (limbo), which never answers 'no such entry' for them."""
    cfg = make_config(tmp_path, journal_write_data=False)

    async def main():
        b = await started(cfg)
        for e in range(10):
            await b.add_entry(3, e, entry(3, e), KEY)
        faults.fail(op="fsync", path_prefix=cfg.ledger_dirs[0], count=None)
        await b.stop()  # logs the failure, does not raise
    run(main())
    faults.heal()
    index = Index(cfg.resolved_index_dir, cfg)
    try:
        assert index.get_flag(UNCLEAN_SHUTDOWN) is True
    finally:
        index.close()

    async def again(b):
        assert b.was_unclean_shutdown
    with_bookie(cfg, again)


def test_a_write_failing_in_a_later_chunk_of_a_checkpoint_keeps_the_half_and_the_retry_stores_it_all(
        tmp_path, faults, monkeypatch):
    """A checkpoint writes a half in chunks (issue 32); a write that fails after some chunks
    went out (here the 4th of 6) fails the checkpoint as a whole: nothing of the half is
    indexed (one transaction, aborted), the half is kept and served, and the retry writes it
    all again (the torn log is abandoned). Every entry reads back, also after a restart."""
    from bk.bookie import flush_pacing
    monkeypatch.setattr(flush_pacing, "STEP_ENTRIES", 10)
    monkeypatch.setattr(flush_pacing, "GIL_BUDGET_S", 0.0)
    monkeypatch.setattr(flush_pacing, "yield_gil", lambda: None)
    cfg = make_config(tmp_path)
    chunks = []

    async def main():
        b = await started(cfg)
        logger = b.storage.entry_logger
        plain = logger.add_entries
        monkeypatch.setattr(logger, "add_entries", lambda entries: (chunks.append(len(entries)), plain(entries))[1])
        try:
            await add_range(b, 5, range(30), 300)
            await add_range(b, 6, range(30), 300)
            rule = faults.fail(op="write", path_prefix=cfg.ledger_dirs[0], after=3, count=1)
            with pytest.raises(StorageError):
                await b.checkpoint()
            await settle(b)
            assert faults.hits(rule) == 1 and chunks == [10, 10, 10, 10]
            assert b.read_only and b.storage_failure
            for lid in (5, 6):
                assert all(b.storage.index.get_location(lid, e) is None for e in range(30))
                for e in range(30):  # still served, from the kept half
                    assert await b.read_entry(lid, e) == entry(lid, e, 300)
            chunks.clear()
            await b.checkpoint()
            assert chunks == [10] * 6
            for lid in (5, 6):
                for e in range(30):
                    assert b.storage.index.get_location(lid, e) is not None
                    assert await b.read_entry(lid, e) == entry(lid, e, 300)
        finally:
            await b.stop()
    run(main())

    async def again(b):
        for lid in (5, 6):
            for e in range(30):
                assert await b.read_entry(lid, e) == entry(lid, e, 300)
    with_bookie(cfg, again)


def test_index_commit_failure_read_only_and_retry_keeps_everything(tmp_path, faults):
    cfg = make_config(tmp_path)

    async def main():
        b = await started(cfg)
        try:
            await add_range(b, 2, range(20))
            faults.fail(op="commit", errno=errno.EIO, count=1)
            with pytest.raises(StorageError):
                await b.checkpoint()
            await settle(b)
            assert b.read_only and b.storage_failure
            for e in range(20):  # still served, from the write cache
                assert await b.read_entry(2, e) == entry(2, e)
            await b.checkpoint()
            for e in range(20):
                assert await b.read_entry(2, e) == entry(2, e)
        finally:
            await b.stop()
    run(main())


def test_checkpoint_full_disk_read_only_until_room(tmp_path, faults):
    cfg = make_config(tmp_path, journal_dirs=[str(tmp_path / "journal")])

    async def main():
        b = await started(cfg)
        try:
            await add_range(b, 4, range(20))
            full = faults.full_disk(cfg.ledger_dirs[0])
            with pytest.raises(DiskFullError):
                await b.checkpoint()
            await settle(b)
            assert b.read_only and b.disk_full and b.storage_failure is None
            faults.heal(full)
            await b.checkpoint()
            b.set_read_only(False)
            assert not b.read_only
            await b.add_entry(4, 20, entry(4, 20), KEY)
            for e in range(21):
                assert await b.read_entry(4, e) == entry(4, e)
        finally:
            await b.stop()
    run(main())


# ------------------------------------------------------------------ reads
@pytest.mark.parametrize("read_io", ["ring", "threads"])
@pytest.mark.parametrize("damage", ["ids", "size", "truncate", "read-eio"])
def test_damaged_entry_is_an_error_never_no_such_entry(tmp_path, faults, damage, read_io, request):
    if read_io == "ring":
        request.getfixturevalue("io_uring_reads")
    cfg = make_config(tmp_path, read_ahead_batch_size=1, read_io=read_io)

    with_bookie(cfg, lambda b: add_range(b, 9, range(10)))
    victim = 9 if damage == "truncate" else 4  # truncation cuts the log: the last entry
    if damage == "truncate":
        truncate_entry(cfg.ledger_dirs, 9, victim)
    elif damage == "read-eio":
        faults.fail(op="read", errno=errno.EIO, path_prefix=cfg.ledger_dirs[0], count=None)
    else:
        flip_entry_bit(cfg.ledger_dirs, 9, victim, part=damage)

    async def read(b):
        with pytest.raises(StorageError) as ei:
            await b.read_entry(9, victim)
        assert not isinstance(ei.value, NoSuchEntryError)
        if damage == "truncate":  # "the last entry" is the damaged one too
            with pytest.raises(StorageError):
                await b.read_entry(9, -1)
        if damage != "read-eio":
            for e in range(10):
                if e != victim:
                    assert await b.read_entry(9, e) == entry(9, e)
    with_bookie(cfg, read)
    assert os.path.isdir(cfg.ledger_dirs[0])


def test_record_with_flipped_ids_never_shadows_a_healthy_entry(tmp_path):
    """Regression: read-ahead cached every record of the run under the ids the record
    claims. Entry 4 with its id bit flipped claims to be entry 5: a read of entry 3 put
    entry 4's bytes in the read cache as entry 5 (the read cache keeps the first copy),
    and the healthy entry 5 was then served wrong. Read-ahead now caches only records
    the index places where they were read."""
    cfg = make_config(tmp_path)

    with_bookie(cfg, lambda b: add_range(b, 9, range(10)))
    flip_entry_bit(cfg.ledger_dirs, 9, 4, part="ids", bit=0)  # entry id 4 -> 5

    async def read(b):
        assert await b.read_entry(9, 3) == entry(9, 3)  # reads ahead over the damaged record
        assert await b.read_entry(9, 5) == entry(9, 5)
        with pytest.raises(CorruptedStorageError):
            await b.read_entry(9, 4)
    with_bookie(cfg, read)


def test_unexpected_error_in_a_checkpoint_does_not_kill_the_flush_thread(tmp_path):
    """Regression (found with the directory-fsync fault, where a raw OSError escaped): the
    flush thread caught StorageError only, so any other exception ended it and no
    checkpoint ran again. Now it lives on, retries, and the bookie turns read-only."""
    cfg = make_config(tmp_path, flush_interval_ms=50)

    async def body(b):
        await add_range(b, 6, range(10))
        real = b.storage.entry_logger.add_entries
        b.storage.entry_logger.add_entries = lambda entries: (_ for _ in ()).throw(OSError(5, "raw"))
        for _ in range(500):  # bounded (10 s): a loaded machine is slow
            await asyncio.sleep(0.02)
            if b.storage.last_checkpoint_error is not None:
                break
        await settle(b)
        assert b.read_only and "unexpected error" in b.storage_failure
        assert b.storage._thread.is_alive()
        b.storage.entry_logger.add_entries = real
        done = b.storage.checkpoints
        for _ in range(500):  # the flush thread's own retry succeeds (bounded, 10 s)
            await asyncio.sleep(0.02)
            if b.storage.checkpoints > done:
                break
        assert b.storage.checkpoints > done and b.storage.last_checkpoint_error is None
        for e in range(10):
            assert await b.read_entry(6, e) == entry(6, e)
    with_bookie(cfg, body)
