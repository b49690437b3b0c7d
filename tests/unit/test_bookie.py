"""Bookie facade + LedgerStorage: adds, reads, keys, fences, LAC, limbo, restart."""
import asyncio
import hashlib
import os
import threading

import pytest

from bk.bookie import UNCLEAN_SHUTDOWN, Bookie
from bk.config import load_config
from bk.proto import FLAG_RECOVERY_ADD, AddRequest
from bk.testing.powerloss import halt_without_checkpoint
from bk.errors import (BadRequestError, BookieReadOnlyError, LedgerFencedError, LedgerLimboError,
                       NoSuchEntryError, NoSuchLedgerError, StorageError, TooManyRequestsError,
                       UnauthorizedAccessError)

KEY = hashlib.sha1(b"ledger" + b"pw").digest()
OTHER_KEY = hashlib.sha1(b"ledger" + b"other").digest()


def entry(ledger_id: int, entry_id: int, payload: bytes = b"", lac: int = -1) -> bytes:
    payload = payload or f"payload-{ledger_id}-{entry_id}".encode()
    return (ledger_id.to_bytes(8, "big", signed=True) + entry_id.to_bytes(8, "big", signed=True)
            + lac.to_bytes(8, "big", signed=True) + len(payload).to_bytes(8, "big") + payload)


def make_config(tmp_path, **kw):
    base = dict(journal_dirs=[str(tmp_path / "journal")], ledger_dirs=[str(tmp_path / "ledgers")],
                flush_interval_ms=60_000, write_cache_max_size_bytes="4MiB")
    base.update(kw)
    return load_config(overrides=base, env={})


def run(coro):
    return asyncio.run(coro)


async def started(cfg) -> Bookie:
    b = Bookie(cfg)
    await b.start()
    return b


def test_add_read_roundtrip_from_cache_and_entry_log(tmp_path):
    async def main():
        b = await started(make_config(tmp_path))
        try:
            for eid in range(50):
                await b.add_entry(1, eid, entry(1, eid), KEY)
            assert await b.read_entry(1, 7) == entry(1, 7)  # from the write cache
            await b.checkpoint()
            assert await b.read_entry(1, 8) == entry(1, 8)  # from the entry log
            assert await b.read_entry(1, 9) == entry(1, 9)  # read-ahead hit
            assert b.storage.read_cache.hits >= 1
            assert await b.read_entry(1, -1) == entry(1, 49)
            with pytest.raises(NoSuchEntryError):
                await b.read_entry(1, 50)
            with pytest.raises(NoSuchLedgerError):
                await b.read_entry(2, 0)
            with pytest.raises(BadRequestError):
                await b.read_entry(1, -2)
        finally:
            await b.stop()
    run(main())


def test_restart_after_clean_stop_keeps_everything(tmp_path):
    cfg = make_config(tmp_path)

    async def write():
        b = await started(cfg)
        assert b.storage.get_flag(UNCLEAN_SHUTDOWN)
        for lid in (3, 4):
            for eid in range(20):
                await b.add_entry(lid, eid, entry(lid, eid), KEY)
        await b.fence_ledger(4, KEY)
        await b.stop()

    async def check():
        b = await started(cfg)
        try:
            assert not b.was_unclean_shutdown
            for lid in (3, 4):
                for eid in range(20):
                    assert await b.read_entry(lid, eid) == entry(lid, eid)
            assert b.is_fenced(4) and not b.is_fenced(3)
            with pytest.raises(UnauthorizedAccessError):
                await b.add_entry(3, 20, entry(3, 20), OTHER_KEY)
        finally:
            await b.stop()
    run(write())
    run(check())


def test_master_key_set_once_and_mismatch_changes_nothing(tmp_path):
    async def main():
        b = await started(make_config(tmp_path))
        try:
            await b.add_entry(1, 0, entry(1, 0), KEY)
            with pytest.raises(UnauthorizedAccessError):
                await b.add_entry(1, 1, entry(1, 1), OTHER_KEY)
            with pytest.raises(NoSuchEntryError):
                await b.read_entry(1, 1)
            with pytest.raises(UnauthorizedAccessError):
                await b.fence_ledger(1, OTHER_KEY)
            assert not b.is_fenced(1)
            with pytest.raises(UnauthorizedAccessError):
                await b.write_lac(1, OTHER_KEY, b"x" * 20)
            assert b.read_lac(1) is None
            with pytest.raises(UnauthorizedAccessError):  # not the stored key, whatever its length
                await b.add_entry(1, 1, entry(1, 1), b"short")
            with pytest.raises(BadRequestError):  # a first key must be 20 bytes
                await b.add_entry(2, 0, entry(2, 0), b"short")
            assert "KEY" not in repr(b.storage.get_ledger(1)).upper().replace("HAS_KEY", "")
        finally:
            await b.stop()
    run(main())


def test_bad_requests_store_nothing(tmp_path):
    async def main():
        b = await started(make_config(tmp_path))
        try:
            with pytest.raises(BadRequestError):
                await b.add_entry(1, -5, entry(1, -5), KEY)
            with pytest.raises(BadRequestError):
                await b.add_entry(1, 0, entry(2, 0), KEY)  # body names another ledger
            with pytest.raises(BadRequestError):
                await b.add_entry(1, 0, entry(1, 1), KEY)  # body names another entry
            with pytest.raises(BadRequestError):
                await b.add_entry(1, 0, b"tiny", KEY)
            assert not b.ledger_exists(1) and not b.ledger_exists(2)
            with pytest.raises(NoSuchLedgerError):
                await b.read_entry(1, 0)
        finally:
            await b.stop()
    run(main())


def test_fence_blocks_normal_adds_but_not_recovery_adds(tmp_path):
    async def main():
        b = await started(make_config(tmp_path))
        try:
            await b.add_entry(5, 0, entry(5, 0), KEY)
            await b.fence_ledger(5, KEY)
            await b.fence_ledger(5, KEY)  # idempotent
            with pytest.raises(LedgerFencedError):
                await b.add_entry(5, 1, entry(5, 1), KEY)
            await b.add_entry(5, 1, entry(5, 1), KEY, recovery=True)
            assert await b.read_entry(5, 1) == entry(5, 1)
            # fencing an unknown ledger creates it, fenced
            await b.fence_ledger(77, KEY)
            assert b.ledger_exists(77) and b.is_fenced(77)
            with pytest.raises(NoSuchEntryError):
                await b.read_entry(77, -1)
            with pytest.raises(LedgerFencedError):
                await b.add_entry(77, 0, entry(77, 0), KEY)
        finally:
            await b.stop()
    run(main())


def test_add_racing_a_fence_is_not_acknowledged_after_it(tmp_path):
    """Adds issued before a fence complete no later than the fence; after it, EFENCED."""
    async def main():
        b = await started(make_config(tmp_path))
        try:
            order = []

            async def add(eid):
                try:
                    await b.add_entry(6, eid, entry(6, eid), KEY)
                    order.append(("ack", eid))
                except LedgerFencedError:
                    order.append(("fenced", eid))

            async def fence():
                await b.fence_ledger(6, KEY)
                order.append(("fence", None))

            tasks = [asyncio.ensure_future(add(e)) for e in range(20)]
            tasks.append(asyncio.ensure_future(fence()))
            tasks += [asyncio.ensure_future(add(e)) for e in range(20, 40)]
            await asyncio.gather(*tasks)
            fence_at = order.index(("fence", None))
            acked_after = [e for kind, e in order[fence_at:] if kind == "ack"]
            assert acked_after == []
            assert sorted(e for k, e in order if k == "fenced") == list(range(20, 40))
        finally:
            await b.stop()
    run(main())


def test_fence_and_key_survive_restart_without_checkpoint(tmp_path):
    """Stop the journals without a final checkpoint: replay must bring back entries,
    key and fence (the unclean-shutdown flag stays set)."""
    cfg = make_config(tmp_path)

    async def write():
        b = await started(cfg)
        for eid in range(30):
            await b.add_entry(8, eid, entry(8, eid, lac=eid - 1), KEY)
        await b.fence_ledger(8, KEY)
        await b.write_lac(8, KEY, b"explicit-lac-buffer")
        # crash-like: journals drained and closed, nothing checkpointed
        halt_without_checkpoint(b)

    async def check():
        b = await started(cfg)
        try:
            assert b.was_unclean_shutdown
            assert b.replayed_records >= 30
            for eid in range(30):
                assert await b.read_entry(8, eid) == entry(8, eid, lac=eid - 1)
            assert b.is_fenced(8)
            assert b.read_lac(8) == b"explicit-lac-buffer"
            assert b.last_add_confirmed(8) == 28
            with pytest.raises(UnauthorizedAccessError):
                await b.fence_ledger(8, OTHER_KEY)
        finally:
            await b.stop()
    run(write())
    run(check())


def test_explicit_and_piggybacked_lac(tmp_path):
    async def main():
        b = await started(make_config(tmp_path))
        try:
            for eid in range(5):
                await b.add_entry(9, eid, entry(9, eid, lac=eid - 1), KEY)
            assert b.last_add_confirmed(9) == 3
            assert b.read_lac(9) is None
            await b.write_lac(9, KEY, b"lacbuf")
            assert b.read_lac(9) == b"lacbuf"
            with pytest.raises(NoSuchLedgerError):
                b.read_lac(10)
        finally:
            await b.stop()
    run(main())


def test_limbo_turns_negatives_into_unknown(tmp_path):
    cfg = make_config(tmp_path)

    async def main():
        b = await started(cfg)
        try:
            await b.add_entry(11, 0, entry(11, 0), KEY)
            assert await b.mark_for_integrity_check([(11, None), (12, KEY)]) == 2
            assert b.needs_integrity_check
            assert await b.read_entry(11, 0) == entry(11, 0)  # what it has, it serves
            with pytest.raises(LedgerLimboError):
                await b.read_entry(11, 1)
            with pytest.raises(LedgerLimboError):
                await b.read_entry(11, -1)
            with pytest.raises(LedgerLimboError):
                b.last_add_confirmed(11)
            with pytest.raises(LedgerLimboError):
                b.read_lac(11)
            # a ledger phase one created: limbo and fenced, with the metadata's key
            with pytest.raises(LedgerLimboError):
                await b.read_entry(12, 0)
            with pytest.raises(LedgerFencedError):
                await b.add_entry(12, 0, entry(12, 0), KEY)
            with pytest.raises(UnauthorizedAccessError):
                await b.add_entry(12, 0, entry(12, 0), b"k" * 20, recovery=True)
            assert b.missing_entries(11, range(3)) == [1, 2]
            with pytest.raises(LedgerFencedError):
                await b.add_entry(11, 1, entry(11, 1), KEY)
            await b.add_entry(11, 1, entry(11, 1), KEY, recovery=True)
        finally:
            await b.stop()
        b = await started(cfg)
        try:
            assert b.is_limbo(11) and b.is_fenced(11) and b.needs_integrity_check
            assert b.missing_entries(11, range(3)) == [2]  # the recovery add was kept
            assert sorted(b.limbo_ledgers()) == [11, 12]
            await b.clear_limbo([11])
            with pytest.raises(NoSuchEntryError):
                await b.read_entry(11, 2)
            assert b.is_fenced(11) and b.limbo_ledgers() == [12]
            await b.finish_integrity_check()
            assert not b.needs_integrity_check
        finally:
            await b.stop()
    run(main())


def test_delete_ledger(tmp_path):
    cfg = make_config(tmp_path)

    async def main():
        b = await started(cfg)
        try:
            for eid in range(10):
                await b.add_entry(12, eid, entry(12, eid), KEY)
            await b.checkpoint()
            await b.add_entry(12, 10, entry(12, 10), KEY)
            assert await b.delete_ledger(12)
            with pytest.raises(NoSuchLedgerError):
                await b.read_entry(12, 3)
            assert not await b.delete_ledger(12)
        finally:
            await b.stop()
        b = await started(cfg)
        try:
            assert not b.ledger_exists(12)
        finally:
            await b.stop()
    run(main())


def test_journal_off_mode_acks_from_cache_and_keeps_meta_in_journal(tmp_path):
    cfg = make_config(tmp_path, journal_write_data=False)

    async def main():
        b = await started(cfg)
        for eid in range(10):
            await b.add_entry(13, eid, entry(13, eid), KEY)
        await b.fence_ledger(13, KEY)
        journal_records = []
        # Entries never reached the journal; the key and the fence did.
        halt_without_checkpoint(b)
        from bk.journal import Journal, LogMark
        Journal(cfg.journal_dirs[0], cfg).replay(LogMark(0, 0), lambda l, e, body: journal_records.append(e))
        assert all(e < 0 for e in journal_records) and len(journal_records) == 2
        b2 = await started(cfg)
        try:
            assert b2.is_fenced(13)
            with pytest.raises(NoSuchEntryError):  # lost with the cache: BP-46's problem
                await b2.read_entry(13, 0)
        finally:
            await b2.stop()
    run(main())


def test_read_only_refuses_adds(tmp_path):
    async def main():
        b = await started(make_config(tmp_path))
        try:
            b.set_read_only(True)
            with pytest.raises(BookieReadOnlyError):
                await b.add_entry(1, 0, entry(1, 0), KEY)
            await b.fence_ledger(1, KEY)  # fences still work
            b.set_read_only(False)
            with pytest.raises(LedgerFencedError):
                await b.add_entry(1, 0, entry(1, 0), KEY)
        finally:
            await b.stop()
    run(main())


def _with_failing_checkpoints(tmp_path, add_all) -> None:
    """A bookie with a 2 MiB write cache whose checkpoints cannot finish (a stalled
    entry-log disk; a failing one would turn the bookie read-only, test_diskfault_storage):
    `await add_all(b, payload)` adds 60 KB entries of ledger 14 until the cache is full
    and returns (acked entry ids, the first refused id). Then the disk recovers: every
    acked entry is readable after a checkpoint, the refused one was never stored, and it
    can be added now."""
    import threading
    cfg = make_config(tmp_path, write_cache_max_size_bytes="2MiB", write_cache_full_wait_ms=200,
                      flush_interval_ms=50)

    async def main():
        b = await started(cfg)
        stalled = threading.Event()
        try:
            real = b.storage.entry_logger.add_entries

            def stalls(entries):
                stalled.wait()
                return real(entries)
            b.storage.entry_logger.add_entries = stalls
            payload = b"x" * 60_000
            acked, refused = await add_all(b, payload)
            stalled.set()  # the disk recovers
            b.storage.entry_logger.add_entries = real
            await b.checkpoint()
            assert not b.read_only
            for eid in acked:
                assert await b.read_entry(14, eid) == entry(14, eid, payload)
            with pytest.raises(NoSuchEntryError):
                await b.read_entry(14, refused)
            await b.add_entry(14, refused, entry(14, refused, payload), KEY)
        finally:
            stalled.set()
            await b.stop()
    run(main())


def test_write_cache_full_waits_then_too_many_requests_and_loses_nothing(tmp_path):
    async def add_all(b, payload):
        acked, refused = [], []
        for eid in range(60):  # 3.6 MB > both halves
            try:
                await b.add_entry(14, eid, entry(14, eid, payload), KEY)
                acked.append(eid)
            except TooManyRequestsError:
                refused.append(eid)
        assert acked and refused
        return acked, refused[0]
    _with_failing_checkpoints(tmp_path, add_all)


def test_adds_waiting_for_room_are_not_a_task_each_and_all_are_answered(tmp_path):
    # issue 17's add flood: each add that found the write cache full got a task (~3 KiB),
    # so a connection's 20,000 waiting small adds held far more than their bytes.
    async def add_all(b, payload):
        outcome = {}

        def done(eid, err):
            outcome[eid] = err
        for eid in range(40):  # 2.4 MB: the cache (2 MiB) fills and checkpoints fail
            b.add_entry_cb(14, eid, entry(14, eid, payload), KEY, False, done, eid)
        tasks_before = len(asyncio.all_tasks())
        for eid in range(40, 1040):
            b.add_entry_cb(14, eid, entry(14, eid, payload), KEY, False, done, eid)
        assert len(asyncio.all_tasks()) <= tasks_before + 1  # one retrier, not a task per add
        while len(outcome) < 1040:
            await asyncio.sleep(0.01)
        assert set(map(type, outcome.values())) <= {type(None), TooManyRequestsError}
        acked = sorted(eid for eid, err in outcome.items() if err is None)
        refused = sorted(eid for eid, err in outcome.items() if err is not None)
        assert acked and refused
        return acked, refused[0]
    _with_failing_checkpoints(tmp_path, add_all)


def test_many_ledgers_large_volume_and_rotation(tmp_path):
    cfg = make_config(tmp_path, entry_log_size_limit_bytes="256KiB", journal_max_size_bytes="256KiB",
                      write_cache_max_size_bytes="2MiB", flush_interval_ms=100)

    async def main():
        b = await started(cfg)
        expected = {}
        try:
            futs = []
            for i in range(3000):
                lid, eid = i % 7, i // 7
                data = entry(lid, eid, os.urandom(200 + (i % 5) * 100))
                expected[(lid, eid)] = data
                futs.append(b.add_entry(lid, eid, data, KEY))
            await asyncio.gather(*futs)
        finally:
            await b.stop()
        assert len(b.storage.entry_logger.log_ids()) > 1
        b2 = await started(cfg)
        try:
            for (lid, eid), data in expected.items():
                assert await b2.read_entry(lid, eid) == data
            journal_files = os.listdir(os.path.join(cfg.journal_dirs[0], "current"))
            assert len([f for f in journal_files if f.endswith(".txn")]) <= 3
        finally:
            await b2.stop()
    run(main())


# ---------------------------------------------------------------- batches (Bookie.add_entries_cb)
def req(ledger_id, entry_id, key=KEY, body=None, flags=0):
    return AddRequest(flags, key, ledger_id, entry_id, entry(ledger_id, entry_id) if body is None else body)


class Answers:
    """add_entries_cb completions; every request must be answered exactly once."""

    def __init__(self):
        self.got: list = []  # (request, error) in completion order
        self.calls = 0

    def cb(self, ctx, reqs, err):
        self.calls += 1
        self.got += [(r, err) for r in reqs]

    async def wait(self, reqs):
        while len(self.got) < len(reqs):
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)  # nothing more may arrive
        assert sorted(map(id, (r for r, _ in self.got))) == sorted(map(id, reqs))
        err_of = {id(r): err for r, err in self.got}
        return [type(err_of[id(r)]) if err_of[id(r)] else None for r in reqs]


def test_batch_mixed_valid_and_invalid_adds(tmp_path):
    async def main():
        b = await started(make_config(tmp_path))
        try:
            reqs = [req(1, 0), req(1, 1, body=entry(1, 2)), req(1, -1), req(1, 1, body=b"tiny" * 3),
                    req(1, 1, body=entry(2, 1)), req(1, 1), req(2, 0, body=bytearray(entry(2, 0))), req(1, 2)]
            a = Answers()
            b.add_entries_cb(reqs, a.cb, None)
            assert await a.wait(reqs) == [None] + [BadRequestError] * 4 + [None, None, None]
            assert [await b.read_entry(1, e) for e in range(3)] == [entry(1, e) for e in range(3)]
            assert await b.read_entry(2, 0) == entry(2, 0)  # a bytearray body went alone, as add_entry_cb
            assert b.storage.last_entry_id(1) == 2
        finally:
            await b.stop()
    run(main())


@pytest.mark.parametrize("journals", [1, 2])
def test_batch_two_ledgers_interleaved_journal_key_first_and_survive_a_crash(tmp_path, journals):
    cfg = make_config(tmp_path, journal_dirs=[str(tmp_path / f"journal{i}") for i in range(journals)])
    reqs = [req(lid, eid, body=entry(lid, eid, lac=eid - 1)) for eid in range(10) for lid in (10, 11)]

    async def write():
        b = await started(cfg)
        a = Answers()
        b.add_entries_cb(reqs, a.cb, None)
        assert await a.wait(reqs) == [None] * 20 and a.calls == journals  # one run and completion per journal
        assert b.last_add_confirmed(10) == b.last_add_confirmed(11) == 8
        halt_without_checkpoint(b)

    async def check():
        from bk.journal import MASTER_KEY, Journal, LogMark
        records = []
        for d in cfg.journal_dirs:
            Journal(d, cfg).replay(LogMark(0, 0), lambda l, e, body: records.append((l, e)))
        for lid in (10, 11):  # the key record first, then the entries in order
            assert [e for l, e in records if l == lid] == [MASTER_KEY] + list(range(10))
        b = await started(cfg)
        try:
            for lid, eid in ((10, 9), (11, 0), (11, 9)):
                assert await b.read_entry(lid, eid) == entry(lid, eid, lac=eid - 1)
            with pytest.raises(UnauthorizedAccessError):
                await b.add_entry(10, 10, entry(10, 10), OTHER_KEY)
        finally:
            await b.stop()
    run(write())
    run(check())


def test_batch_wrong_key_in_the_middle_stores_nothing_for_it(tmp_path):
    async def main():
        b = await started(make_config(tmp_path))
        try:
            await b.add_entry(1, 0, entry(1, 0), KEY)
            equal_key = bytes(bytearray(KEY))  # equal, another object: compared again
            reqs = [req(1, 1), req(1, 2, OTHER_KEY), req(1, 3, equal_key), req(1, 4, OTHER_KEY), req(1, 5),
                    req(3, 0, b"short"), req(3, 1), req(3, 2, OTHER_KEY)]  # ledger 3: first key 5 bytes
            a = Answers()
            b.add_entries_cb(reqs, a.cb, None)
            eua = UnauthorizedAccessError
            assert await a.wait(reqs) == [None, eua, None, eua, None, BadRequestError, None, eua]
            for eid in (2, 4):
                with pytest.raises(NoSuchEntryError):
                    await b.read_entry(1, eid)
            assert await b.read_entry(1, 5) == entry(1, 5)
            await b.fence_ledger(3, KEY)  # the second request's key became ledger 3's key
        finally:
            await b.stop()
    run(main())


def test_batch_fenced_ledger_refuses_all_but_recovery_adds(tmp_path):
    async def main():
        b = await started(make_config(tmp_path))
        try:
            await b.add_entry(5, 0, entry(5, 0), KEY)
            await b.fence_ledger(5, KEY)
            rec = FLAG_RECOVERY_ADD
            reqs = [req(5, 1), req(5, 1, flags=rec), req(5, 2), req(5, 2, flags=rec), req(5, 3)]
            a = Answers()
            b.add_entries_cb(reqs, a.cb, None)
            fenced = LedgerFencedError
            assert await a.wait(reqs) == [fenced, None, fenced, None, fenced]
            assert [await b.read_entry(5, e) for e in (1, 2)] == [entry(5, 1), entry(5, 2)]
            with pytest.raises(NoSuchEntryError):
                await b.read_entry(5, 3)
        finally:
            await b.stop()
    run(main())


def test_batch_journal_failure_fails_the_whole_run(tmp_path, monkeypatch):
    from bk.fileio import DurableFile

    async def main():
        b = await started(make_config(tmp_path, journal_buffered_writes_threshold_bytes=1024))
        try:
            await b.add_entry(1, 0, entry(1, 0), KEY)

            def boom(self, *a):
                raise StorageError(f"I/O error while writing {self.path}")
            monkeypatch.setattr(DurableFile, "write", boom)
            monkeypatch.setattr(DurableFile, "writev", boom)
            reqs = [req(1, eid) for eid in range(1, 21)]  # spans several 1 KiB groups
            a = Answers()
            b.add_entries_cb(reqs, a.cb, None)
            assert await a.wait(reqs) == [StorageError] * 20 and a.calls == 1
            with pytest.raises((StorageError, BookieReadOnlyError)):  # nothing after it is acknowledged
                await b.add_entry(1, 21, entry(1, 21), KEY)
            monkeypatch.undo()
            for _ in range(1000):  # the writer thread's report reaches the loop (bounded, 10 s)
                if b.read_only:
                    break
                await asyncio.sleep(0.01)
            assert b.read_only and "journal 0" in b.read_only_reason  # and it says why
        finally:
            await b.stop()
    run(main())


def test_batch_write_cache_full_mid_run_waits_then_refuses_each(tmp_path):
    async def add_all(b, payload):
        reqs = [req(14, eid, body=entry(14, eid, payload)) for eid in range(60)]  # 3.6 MB > both halves
        a = Answers()
        b.add_entries_cb(reqs, a.cb, None)
        answers = await a.wait(reqs)
        acked = [r.entry_id for r, err in zip(reqs, answers) if err is None]
        assert acked == list(range(len(acked))) and 0 < len(acked) < 60
        assert set(answers[len(acked):]) == {TooManyRequestsError}
        return acked, len(acked)
    _with_failing_checkpoints(tmp_path, add_all)


def test_batch_journal_off_answers_at_once_and_read_only_refuses(tmp_path):
    async def main():
        b = await started(make_config(tmp_path, journal_write_data=False))
        try:
            reqs = [req(1, 0), req(1, 1, OTHER_KEY), req(1, 1)]
            a = Answers()
            b.add_entries_cb(reqs, a.cb, None)
            assert len(a.got) == 3  # no journal to wait for
            assert await a.wait(reqs) == [None, UnauthorizedAccessError, None]
            b.set_read_only(True)
            reqs = [req(1, 2), req(1, 3, body=entry(1, 4)), req(1, 4)]
            a = Answers()
            b.add_entries_cb(reqs, a.cb, None)
            assert await a.wait(reqs) == [BookieReadOnlyError, BadRequestError, BookieReadOnlyError]
            assert b.storage.last_entry_id(1) == 1
        finally:
            await b.stop()
    run(main())


def test_seeds_4602_10023_8468_8663_read_racing_limbo_clear_never_answers_no_such_entry(tmp_path):
    """Journal-off random test, seeds 4602 (CI) and 10023; chaos seeds 8468 and 8663: a read of a missing entry began while the ledger
    was in limbo; while its lookup ran in a read thread the BP-46 repair stored the copy and
    cleared limbo, and the read answered ENOENTRY for an entry the bookie now held.
    The race needs a lookup off the loop, so this runs the read threads (read_io=threads);
    through the ring the lookup runs on the loop (test_read_ring has that case)."""
    cfg = make_config(tmp_path, read_io="threads")

    async def main():
        b = await started(cfg)
        try:
            await b.add_entry(7, 0, entry(7, 0), KEY)
            await b.mark_for_integrity_check([(7, KEY)])
            storage = b.storage
            real = storage.read_from_storage
            in_lookup, repaired = threading.Event(), threading.Event()

            def slow_lookup(ledger_id, entry_id):
                result = real(ledger_id, entry_id)  # misses: the copy is not there yet
                in_lookup.set()
                repaired.wait(10)
                return result

            storage.read_from_storage = slow_lookup
            reading = asyncio.ensure_future(b.read_entry(7, 1))
            await asyncio.to_thread(in_lookup.wait, 10)
            # the repair: the copy as a recovery add, then limbo cleared (in memory first)
            await b.add_entry(7, 1, entry(7, 1), KEY, recovery=True)
            clearing = asyncio.ensure_future(b.clear_limbo([7]))
            await asyncio.sleep(0)
            assert not b.is_limbo(7)
            storage.read_from_storage = real
            repaired.set()
            assert await reading == entry(7, 1)
            await clearing
            with pytest.raises(NoSuchEntryError):  # limbo clear before the lookup: a real miss
                await b.read_entry(7, 2)
        finally:
            await b.stop()
    run(main())


def test_a_stop_before_phase_one_completed_keeps_the_unclean_shutdown_flag(tmp_path):
    """BP-46: a journal-off bookie that crashed must run phase one before it may forget the
    crash. A start that failed in phase one (metadata store down) or was stopped by SIGTERM
    before it completed stops cleanly, and the next start must still see an unclean stop."""
    cfg = make_config(tmp_path, journal_write_data=False)
    assert cfg.data_integrity_checking

    async def main():
        b = await started(cfg)
        await b.add_entry(3, 0, entry(3, 0), KEY)
        halt_without_checkpoint(b)  # the crash
        b = await started(cfg)
        assert b.was_unclean_shutdown and b.phase_one_due
        await b.stop()  # phase one never ran: the server's start failed before it
        b = await started(cfg)
        assert b.was_unclean_shutdown, "a clean stop before phase one must not clear the flag"
        await b.mark_for_integrity_check([(3, KEY)])
        assert not b.phase_one_due
        await b.stop()
        b = await started(cfg)
        try:
            assert not b.was_unclean_shutdown and b.needs_integrity_check and b.is_limbo(3)
        finally:
            await b.stop()
    run(main())


def test_seed180_a_start_that_fails_after_opening_the_storage_lets_go_of_it(tmp_path):
    """Chaos seed 180: the first checkpoint of a start failed (an injected index-commit
    error), the start raised with the index's LMDB environment still open, and the next
    start in the same process could not open it again."""
    import errno

    from bk.testing.diskfaults import DiskFaults

    cfg = make_config(tmp_path)

    async def main():
        b = await started(cfg)
        await b.add_entry(4, 0, entry(4, 0), KEY)
        halt_without_checkpoint(b)
        faults = DiskFaults.install()
        try:
            rule = faults.fail(op="commit", errno=errno.EIO, after=1, count=1)  # not the flag: the first checkpoint
            failed = Bookie(cfg)
            with pytest.raises(StorageError):
                await failed.start()
            assert faults.hits(rule) == 1
            assert failed.storage.index._closed, "the failed start left the LMDB environment open"
            assert all(j._thread is None for j in failed.journals)
        finally:
            DiskFaults.uninstall()
        b = await started(cfg)
        try:
            assert b.was_unclean_shutdown  # the failed start did not pass for a clean stop
            assert await b.read_entry(4, 0) == entry(4, 0)
        finally:
            await b.stop()
    run(main())


def test_a_random_cold_read_reads_one_entry_and_a_scan_reads_ahead(tmp_path):
    async def main():
        b = await started(make_config(tmp_path, read_ahead_batch_size=8))
        try:
            for eid in range(200):
                await b.add_entry(1, eid, entry(1, eid, b"x" * 100), KEY)
            await b.checkpoint()
            cache = b.storage.read_cache
            assert await b.read_entry(1, 0) == entry(1, 0, b"x" * 100)  # first miss: reads ahead
            assert cache.get(1, 1) is not None and cache.get(1, 7) is not None
            assert await b.read_entry(1, 100) == entry(1, 100, b"x" * 100)  # a jump: this entry only
            assert cache.get(1, 101) is None
            assert await b.read_entry(1, 101) == entry(1, 101, b"x" * 100)  # continues: reads ahead
            assert cache.get(1, 102) is not None and cache.get(1, 108) is not None
            for eid in range(200):  # whatever the guesses, every read is right
                assert await b.read_entry(1, (eid * 37) % 200) == entry(1, (eid * 37) % 200, b"x" * 100)
        finally:
            await b.stop()
    run(main())
