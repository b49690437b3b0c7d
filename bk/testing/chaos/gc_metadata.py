"""The metadata store of the GC chaos mode, with its faults (bk.testing.chaos.gc_chaos).

Each seed's engine runs the bookie's own scan-and-compare policy
(bk.server.gc_policy.ScanAndCompareGarbageCollector) against an in-memory store that
holds the metadata of the live ledgers only (a delete removes it), so a GC pass must
prove a ledger dead through the same listing and re-read a bookie does. Around that
store (bk.testing.slow_store.SlowStore: the faults are injected, nothing in bk/server
knows) each GC pass (but the commit step's first, whose fault is the full disk) draws,
from a generator of its own seeded by the run's seed (the schedule's draws are not
disturbed), one of:

  none       the store answers everything
  lagging    the listing omits 1-2 live ledgers (a ZooKeeper follower behind the writes
             the clients made elsewhere): they are candidates, and their re-read finds
             the metadata, so they are kept
  lost       the listing omits 1-2 live ledgers, then the connection is lost: every
             metadata read of the pass fails (apache/bookkeeper#4607's situation); a
             ledger whose read failed must be kept, live or deleted
  flaky      each ledger's read fails with probability 1/2 (decided once per ledger
             for the pass); the listing is whole, so it hits deleted ledgers only,
             which must then wait for a later pass
  down       every call fails, the listing too: the pass deletes nothing

The correct engine deletes only ledgers whose metadata read answered "no such ledger":
under every fault the live ledgers stay whole. The break gc-metadata-error-as-deleted
(bk.testing.chaos.gc_breaks) takes a failed read for "no such ledger": a `lost` pass
deletes a live ledger the listing omitted, and the checker finds it gone.
"""
from __future__ import annotations

import random

from bk.meta.ledger_manager import LedgerManager
from bk.meta.ledger_metadata import LedgerMetadata
from bk.meta.memory import InMemoryStore, MemoryTree
from bk.meta.store import join_path
from bk.server.gc_policy import ScanAndCompareGarbageCollector
from bk.testing.slow_store import SlowStore

BOOKIE_ID = "gc-chaos:3181"
# Drawn per GC pass; weights sum to 1.
FAULTS = {"none": 0.45, "lagging": 0.15, "lost": 0.25, "flaky": 0.1, "down": 0.05}


class _LaggingStore(SlowStore):
    """SlowStore whose children() listing leaves out the nodes in `hidden` (paths)."""

    def __init__(self, inner, fail):
        super().__init__(inner, fail=fail)
        self.hidden: set[str] = set()

    async def children(self, path: str, watch=None):
        names = await super().children(path, watch)
        return [n for n in names if join_path(path, n) not in self.hidden] if self.hidden else names


class ChaosMetadata:
    """The run's store, the policy over it, and the fault of the current pass."""

    def __init__(self, seed: int, config):
        self.rng = random.Random(f"gc-metadata-{seed}")  # str seeds are stable across processes
        self.tree = MemoryTree(f"gc-chaos-{seed}")
        self.fault = "none"
        self._fail_all = False
        self._fail_paths: set[str] = set()
        self.store = _LaggingStore(InMemoryStore(self.tree), fail=self._fails)
        self.ledgers = LedgerManager(InMemoryStore(self.tree))  # the clients' view: never faulty
        self.policy = ScanAndCompareGarbageCollector(self.store, config, BOOKIE_ID)
        self.counts: dict[str, int] = {}

    def _fails(self, op: str, path: str) -> bool:
        return self._fail_all or path in self._fail_paths

    async def create(self, ledger_id: int) -> None:
        await self.ledgers.create_ledger_metadata(ledger_id, LedgerMetadata.new([BOOKIE_ID], 1, 1))

    async def remove(self, ledger_id: int) -> None:
        await self.ledgers.remove_ledger_metadata(ledger_id)

    def arm(self, live: list[int], doomed: list[int]) -> str:
        """Draw the next pass's fault (`live`, `doomed`: ledger ids, sorted); a line for the trace."""
        rng = self.rng
        kind = rng.choices(list(FAULTS), list(FAULTS.values()))[0]
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.fault, line = kind, kind
        path = self.ledgers.path
        if kind in ("lagging", "lost") and live:
            hidden = rng.sample(live, min(len(live), rng.randint(1, 2)))
            self.store.hidden = {path(lid) for lid in hidden}
            line += f": listing without live {sorted(hidden)}"
        if kind == "lost":
            self._fail_paths = {path(lid) for lid in live + doomed}
            line += ", every metadata read fails"
        elif kind == "flaky":
            failing = [lid for lid in live + doomed if rng.random() < 0.5]
            self._fail_paths = {path(lid) for lid in failing}
            line += f": metadata reads of {failing} fail"
        elif kind == "down":
            self._fail_all = True
        return line

    def heal(self) -> None:
        self.fault, self._fail_all = "none", False
        self._fail_paths, self.store.hidden = set(), set()
