"""The bookie's admission rules in one place (LedgerDescriptor.check_access / check_writable,
as BookKeeper's checkAccess / isFenced) for every path that changes a ledger; the AddRun the
server hands the bookie; the chaos runner's broken bookies living in bk/testing only
(bk.testing.breaks), injected into one Bookie before it starts: no production module holds
them, no setting reaches them."""
from __future__ import annotations

import asyncio
import hashlib
import os
import pathlib

import pytest

from bk.bookie import Add, AddRun, Bookie
from bk.config import load_config
from bk.errors import BadRequestError, ConfigError, LedgerFencedError, UnauthorizedAccessError
from bk.proto import FLAG_RECOVERY_ADD

KEY = hashlib.sha1(b"rules").digest()
OTHER = hashlib.sha1(b"other").digest()
ROOT = pathlib.Path(__file__).resolve().parents[2]


def entry(ledger_id: int, entry_id: int, lac: int = -1) -> bytes:
    return ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big") + lac.to_bytes(8, "big", signed=True) + b"x"


def config(tmp_path, **kw):
    return load_config(overrides=dict(journal_dirs=[str(tmp_path / "j")], ledger_dirs=[str(tmp_path / "l")],
                                      metadata_service_uri="mem://rules/ledgers", flush_interval_ms=100, **kw), env={})


def run(coro):
    return asyncio.run(coro)


async def answers(b: Bookie, adds: list, deferred: bool = False) -> list:
    """Each add's outcome (None or the error's type), in the order given."""
    got: dict = {}
    done = asyncio.get_running_loop().create_future()

    def cb(ctx, part, err):
        for a in part:
            got[id(a)] = None if err is None else type(err)
        if len(got) == len(adds) and not done.done():
            done.set_result(None)
    b.add_run(AddRun(adds, deferred), cb, None)
    await asyncio.wait_for(done, 10)
    return [got[id(a)] for a in adds]


def test_every_path_admits_through_the_descriptor(tmp_path):
    """A single add, a run, a fence and a LAC write give the same answers for the same key
    and fence state: a key of another length on a keyed ledger is EUA everywhere (the fence
    and LAC paths answered EBADREQ for it before), a first key of the wrong length EBADREQ."""
    async def main():
        b = Bookie(config(tmp_path))
        await b.start()
        try:
            await b.add_entry(1, 0, entry(1, 0), KEY)
            short = KEY[:5]
            with pytest.raises(UnauthorizedAccessError):
                await b.add_entry(1, 1, entry(1, 1), short)
            assert await answers(b, [Add(0, short, 1, 1, entry(1, 1))]) == [UnauthorizedAccessError]
            with pytest.raises(UnauthorizedAccessError):
                await b.fence_ledger(1, short)
            with pytest.raises(UnauthorizedAccessError):
                await b.write_lac(1, short, entry(1, 0)[:16])
            with pytest.raises(BadRequestError):  # a first key must be 20 bytes, on every path
                await b.fence_ledger(2, short)
            assert await answers(b, [Add(0, short, 3, 0, entry(3, 0))]) == [BadRequestError]
            assert not b.ledger_exists(2) or b.storage.get_ledger(2).master_key is None
            await b.fence_ledger(1, KEY)
            rec = FLAG_RECOVERY_ADD
            assert await answers(b, [Add(0, KEY, 1, 1, entry(1, 1)), Add(rec, KEY, 1, 1, entry(1, 1)),
                                     Add(rec, OTHER, 1, 2, entry(1, 2))]) == [
                LedgerFencedError, None, UnauthorizedAccessError]
            with pytest.raises(LedgerFencedError):
                await b.add_entry(1, 2, entry(1, 2), KEY)
        finally:
            await b.stop()
    run(main())


def test_a_deferred_run_is_acknowledged_before_its_fsync_and_forced_after(tmp_path):
    """AddRun.deferred_sync is the server's word (v3 writeFlags); the bookie reads no wire flag."""
    async def main():
        b = Bookie(config(tmp_path))
        await b.start()
        try:
            adds = [Add(0, KEY, 4, e, entry(4, e)) for e in range(5)]
            assert await answers(b, adds, deferred=True) == [None] * 5
            await asyncio.wait_for(b.force_ledger(4), 10)
            assert await b.read_entry(4, 4) == entry(4, 4)
        finally:
            await b.stop()
    run(main())


def test_production_modules_hold_no_broken_bookie():
    """The broken variants live in bk/testing only; no setting switches them on."""
    named = [str(p.relative_to(ROOT)) for p in (ROOT / "bk").rglob("*.py")
             if "testing" not in p.parts and ("forget-fence" in p.read_text() or "ack-before-fsync" in p.read_text())]
    assert named == []
    with pytest.raises(ConfigError):
        load_config(overrides={"test_break": "forget-fence"}, env={})


def test_forget_fence_breaks_only_the_bookie_it_is_applied_to(tmp_path):
    from bk.testing import breaks

    async def main():
        broken, sound = Bookie(config(tmp_path / "a")), Bookie(config(tmp_path / "b"))
        breaks.apply(broken, "forget-fence")
        for b in (broken, sound):
            await b.start()
        try:
            for b in (broken, sound):
                await b.add_entry(1, 0, entry(1, 0), KEY)
                await b.fence_ledger(1, KEY)
            await broken.add_entry(1, 1, entry(1, 1), KEY)  # the fence was answered, never applied
            with pytest.raises(LedgerFencedError):
                await sound.add_entry(1, 1, entry(1, 1), KEY)
            with pytest.raises(UnauthorizedAccessError):  # its key check still holds
                await broken.fence_ledger(1, OTHER)
        finally:
            for b in (broken, sound):
                await b.stop()
    run(main())


def test_ack_before_fsync_acknowledges_groups_no_fsync_covered(tmp_path, monkeypatch):
    from bk.fileio import DurableFile
    from bk.testing import breaks

    fsyncs = []
    real = DurableFile.fsync
    monkeypatch.setattr(DurableFile, "fsync", lambda self: (fsyncs.append(self.path), real(self))[1])

    async def acked_groups(b: Bookie) -> tuple[int, int]:
        await b.start()
        try:
            for e in range(20):  # one add at a time: one journal group each
                await b.add_entry(1, e, entry(1, e), KEY)
            journal_dir = os.path.abspath(b.config.journal_dirs[0])
            return b.journals[0].groups_written, sum(p.startswith(journal_dir) for p in fsyncs)
        finally:
            await b.stop()

    async def main():
        sound = Bookie(config(tmp_path / "a"))
        groups, synced = await acked_groups(sound)
        assert synced >= groups >= 20
        broken = Bookie(config(tmp_path / "b"))
        breaks.apply(broken, "ack-before-fsync")
        fsyncs.clear()
        groups, synced = await acked_groups(broken)
        assert groups >= 20 and synced < 20 // 2  # at most the file's own fsyncs, not one per group
        with pytest.raises(ValueError):
            breaks.apply(sound, "no-such-break")
    run(main())
