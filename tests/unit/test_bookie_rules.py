"""The bookie's admission rules in one place (LedgerDescriptor.check_access / check_writable,
as BookKeeper's checkAccess / isFenced) for every path that changes a ledger; the AddRun the
server hands the bookie."""
from __future__ import annotations

import asyncio
import hashlib

import pytest

from bk.bookie import Add, AddRun, Bookie
from bk.config import load_config
from bk.errors import BadRequestError, LedgerFencedError, UnauthorizedAccessError
from bk.proto import FLAG_RECOVERY_ADD

KEY = hashlib.sha1(b"rules").digest()
OTHER = hashlib.sha1(b"other").digest()


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
