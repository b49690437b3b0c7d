"""LedgerDescriptor: a bookie's in-memory state for one ledger.

Holds what the index persists (master key, fenced, limbo, explicit LAC) plus
what only lives in memory (the LAC learnt from piggybacked entries, the pending
fence completion). Mutated only on the owner (event loop) thread; the flush
thread persists snapshots (`state()`) taken under LedgerStorage's lock.

Master keys are set once and compared in constant time; they never appear in
a repr, a log line or an error message.
"""
from __future__ import annotations

import hmac

from bk.errors import BadRequestError, LedgerFencedError, UnauthorizedAccessError
from bk.index import LedgerState

MASTER_KEY_BYTES = 20


class LedgerDescriptor:
    __slots__ = ("ledger_id", "master_key", "fenced", "limbo", "explicit_lac", "lac", "fence_pending")

    def __init__(self, ledger_id: int, state: LedgerState | None = None):
        self.ledger_id = ledger_id
        self.master_key: bytes | None = state.master_key if state else None
        self.fenced: bool = state.fenced if state else False
        self.limbo: bool = state.limbo if state else False
        self.explicit_lac: bytes | None = state.explicit_lac if state else None
        self.lac: int = -1  # highest LAC seen piggybacked on an entry
        self.fence_pending = None  # future of a fence not yet durable

    def __repr__(self) -> str:  # no key material
        return (f"LedgerDescriptor({self.ledger_id}, fenced={self.fenced}, limbo={self.limbo}, "
                f"has_key={self.master_key is not None})")

    def state(self) -> LedgerState:
        return LedgerState(fenced=self.fenced, limbo=self.limbo, master_key=self.master_key,
                           explicit_lac=self.explicit_lac)

    def check_key(self, master_key: bytes) -> bool:
        """Compare against the stored key; True when the key is new and must be stored.

        Raises UnauthorizedAccessError on mismatch (EUA): the request changes nothing.
        """
        if len(master_key) != MASTER_KEY_BYTES:
            raise BadRequestError(f"master key must be {MASTER_KEY_BYTES} bytes", ledger_id=self.ledger_id)
        stored = self.master_key
        if stored is None:
            return True
        if not hmac.compare_digest(stored, master_key):
            raise UnauthorizedAccessError(ledger_id=self.ledger_id)
        return False

    def check_writable(self, recovery: bool) -> None:
        if self.fenced and not recovery:
            raise LedgerFencedError(ledger_id=self.ledger_id)

    def learn_lac(self, entry: bytes) -> None:
        # The digest-framed entry carries the writer's LAC at bytes 16..24.
        if len(entry) >= 24:
            lac = int.from_bytes(entry[16:24], "big", signed=True)
            if lac > self.lac:
                self.lac = lac
