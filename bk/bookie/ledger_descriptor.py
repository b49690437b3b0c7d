"""LedgerDescriptor: a bookie's in-memory state for one ledger.

Holds what the index persists (master key, fenced, limbo, explicit LAC) plus
what only lives in memory (the LAC learnt from piggybacked entries, the pending
fence completion). Mutated only on the owner (event loop) thread; the flush
thread persists snapshots (`state()`) taken under LedgerStorage's lock.

Master keys are set once and compared in constant time; they never appear in
a repr, a log line or an error message.

LAC watchers (BookKeeper's waitForLastAddConfirmedUpdate / cancelWaitForLastAddConfirmedUpdate):
a v3 long poll registers a callable here with the LAC it already knows and is called once,
with the new LAC, the moment `lac` passes it; it is then no longer registered. Nothing
polls: a ledger without watchers pays one attribute test per LAC move. Watchers are
called inside the bookie's add path (before the add is journaled), so they must only hand
the work on (bk.server.v3 queues the answer for the next loop iteration) and never raise.
"""
from __future__ import annotations

import hmac
import logging

from bk.errors import BadRequestError, LedgerFencedError, UnauthorizedAccessError
from bk.formats.entry import ENTRY_IDS_LAC, LAC_HEADER, LAC_HEADER_LENGTH, MASTER_KEY_LENGTH
from bk.index import LedgerState

log = logging.getLogger(__name__)


def _stored_lac(ledger_id: int, lac_buf: bytes | None) -> int:
    """The LAC of a stored explicit LAC buffer (`ledger_id(8) lac(8) digest`) naming this ledger, else -1."""
    if lac_buf is None or len(lac_buf) < LAC_HEADER_LENGTH:
        return -1
    buf_ledger_id, lac = LAC_HEADER.unpack_from(lac_buf)
    return max(-1, lac) if buf_ledger_id == ledger_id else -1


class LedgerDescriptor:
    __slots__ = ("ledger_id", "master_key", "fenced", "limbo", "explicit_lac", "_lac", "fence_pending", "watchers")

    def __init__(self, ledger_id: int, state: LedgerState | None = None):
        self.ledger_id = ledger_id
        self.master_key: bytes | None = state.master_key if state else None
        self.fenced: bool = state.fenced if state else False
        self.limbo: bool = state.limbo if state else False
        self.explicit_lac: bytes | None = state.explicit_lac if state else None
        # highest LAC seen piggybacked on an entry or in a WRITE_LAC (the `lac` property); a loaded
        # ledger starts at its stored explicit LAC: a clean restart replays no EXPLICIT_LAC record,
        # and without it a long poll would wait for an add an idle writer never sends
        self._lac: int = _stored_lac(ledger_id, self.explicit_lac)
        self.fence_pending = None  # future of a fence not yet durable
        self.watchers: dict | None = None  # watcher -> the LAC it waits to see passed (None: none yet)

    def __repr__(self) -> str:  # no key material
        return (f"LedgerDescriptor({self.ledger_id}, fenced={self.fenced}, limbo={self.limbo}, "
                f"has_key={self.master_key is not None})")

    def state(self) -> LedgerState:
        return LedgerState(fenced=self.fenced, limbo=self.limbo, master_key=self.master_key,
                           explicit_lac=self.explicit_lac)

    # Admission (BookKeeper's LedgerDescriptorImpl.checkAccess / isFenced): every add, fence
    # and LAC write asks these two, in this order, before it changes anything. A request
    # refused here stored nothing.
    def check_access(self, master_key: bytes) -> bool:
        """Compare against the stored key in constant time; True when the ledger has no key
        yet, so `master_key` is its first and the caller must store (and journal) it before
        anything of the request. A first key must be MASTER_KEY_LENGTH long (BADREQ); a key
        that differs from the stored one, whatever its length, is EUA."""
        stored = self.master_key
        if stored is None:
            if len(master_key) != MASTER_KEY_LENGTH:
                raise BadRequestError(f"master key must be {MASTER_KEY_LENGTH} bytes", ledger_id=self.ledger_id)
            return True
        if not hmac.compare_digest(stored, master_key):
            raise UnauthorizedAccessError(ledger_id=self.ledger_id)
        return False

    def check_writable(self, recovery: bool) -> None:
        """EFENCED for a plain add to a fenced ledger; recovery adds (recovery, re-replication,
        BP-46 repair) still land."""
        if self.fenced and not recovery:
            raise LedgerFencedError(ledger_id=self.ledger_id)

    def learn_lac(self, entry: bytes) -> None:
        # The digest-framed entry carries the writer's LAC after its two ids.
        if len(entry) >= ENTRY_IDS_LAC.size:
            lac = ENTRY_IDS_LAC.unpack_from(entry)[2]
            if lac > self._lac:
                self.lac = lac

    @property
    def lac(self) -> int:
        return self._lac

    @lac.setter
    def lac(self, value: int) -> None:
        """Set only upwards (the bookie compares first); wakes the watchers it passes."""
        self._lac = value
        if self.watchers:
            self._notify(value)

    def wait_for_lac_update(self, previous_lac: int, watcher) -> bool:
        """Call `watcher(lac)` once the LAC passes previous_lac; False (not registered) when it
        already has. A watcher is registered at most once."""
        if self._lac > previous_lac:
            return False
        watchers = self.watchers
        if watchers is None:
            watchers = self.watchers = {}
        watchers[watcher] = previous_lac
        return True

    def cancel_wait_for_lac_update(self, watcher) -> None:
        """Forget `watcher` (a timeout or a closed connection); nothing if already woken."""
        watchers = self.watchers
        if watchers:
            watchers.pop(watcher, None)

    def _notify(self, lac: int) -> None:
        watchers = self.watchers
        woken = [w for w, previous in watchers.items() if previous < lac]
        for w in woken:
            del watchers[w]
        for w in woken:
            try:
                w(lac)
            except Exception:  # a bug in a watcher must not fail the add that moved the LAC
                log.exception("ledger %d: a LAC watcher failed", self.ledger_id)
