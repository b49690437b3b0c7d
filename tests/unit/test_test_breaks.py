"""The chaos runner's broken bookies live in bk/testing only (bk.testing.breaks), injected
into one Bookie before it starts: no production module holds them, no setting reaches them."""
from __future__ import annotations

import asyncio
import hashlib
import os
import pathlib

import pytest

from bk.bookie import Bookie
from bk.config import load_config
from bk.errors import ConfigError, LedgerFencedError, UnauthorizedAccessError

KEY = hashlib.sha1(b"breaks").digest()
OTHER = hashlib.sha1(b"other").digest()
ROOT = pathlib.Path(__file__).resolve().parents[2]


def entry(ledger_id: int, entry_id: int, lac: int = -1) -> bytes:
    return ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big") + lac.to_bytes(8, "big", signed=True) + b"x"


def config(tmp_path, **kw):
    return load_config(overrides=dict(journal_dirs=[str(tmp_path / "j")], ledger_dirs=[str(tmp_path / "l")],
                                      metadata_service_uri="mem://breaks/ledgers", flush_interval_ms=100, **kw), env={})


def run(coro):
    return asyncio.run(coro)


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
