"""Bookies broken on purpose, for the chaos runner's self-test (bk.testing.chaos, docs/CHAOS.md).

The runner must prove it catches a bookie that breaks a promise, so these break one each,
by injection into one Bookie before it starts (nothing in bk/bookie or bk/journal knows
about them, as bk/fileio.py knows nothing of bk.testing.diskfaults' faults):

- ack-before-fsync: the bookie's journals acknowledge 63 groups of 64 before any fsync
  covers them (AckBeforeFsyncJournal, given to the Bookie as its `journal_class`), and
  skip the idle zero-ahead fsync of format-2 journals, which would make the unsynced
  groups durable after all. Caught by power loss: a seed drawn for it (the chaos runner's
  scenario.py, `_drawn_for`) cuts the whole cluster right after an acknowledgement, before
  a checkpoint (which fsyncs entry logs and index) makes the unsynced entries durable.
- forget-fence: a fence is answered (its key admitted as usual) but never applied, so the
  old writer's adds keep landing. Caught by the fence check.

`apply(bookie, name)` breaks one Bookie (in-process clusters: InProcessCluster's
`prepare_bookie`); a `bk bookie` process breaks its own when the environment holds
BK_TEST_BREAK=<name> (bk.cli.bookie, `apply_from_env`; the chaos runner's process cluster
sets it). BK_TEST_BREAK is no setting: bk.config ignores it.
"""
from __future__ import annotations

import os

from bk.journal import Journal

BREAKS = ("ack-before-fsync", "forget-fence")
ENV = "BK_TEST_BREAK"


class AckBeforeFsyncJournal(Journal):
    """BROKEN ON PURPOSE: acknowledges 63 groups of 64 before any fsync covers them."""

    _groups_unsynced = 0

    def _write_group(self, items: list, buffers: list, group_bytes: int, oldest: float = 0.0) -> None:
        self._groups_unsynced = (self._groups_unsynced + 1) % 64
        sync, self._sync_data = self._sync_data, self._sync_data and self._groups_unsynced == 0
        try:
            super()._write_group(items, buffers, group_bytes, oldest)
        finally:
            self._sync_data = sync

    def _zero_ahead(self) -> bool:
        return False  # its fsync would make the unsynced groups durable after all


def _forget_fences(bookie) -> None:
    async def fence_ledger(ledger_id: int, master_key: bytes) -> None:
        bookie._admitted(ledger_id, master_key)  # a wrong key is still refused; the fence is not applied
    bookie.fence_ledger = fence_ledger


def apply(bookie, name: str) -> None:
    """Break this Bookie (not started yet) as `name` says ("" leaves it correct)."""
    if not name:
        return
    if name not in BREAKS:
        raise ValueError(f"unknown test break {name!r}; one of {BREAKS}")
    if name == "ack-before-fsync":
        bookie.journal_class = AckBeforeFsyncJournal
    else:
        _forget_fences(bookie)


def apply_from_env(bookie) -> None:
    """apply(bookie, $BK_TEST_BREAK): how a `bk bookie` process of a chaos run is broken."""
    apply(bookie, os.environ.get(ENV, ""))
