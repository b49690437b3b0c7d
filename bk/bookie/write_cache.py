"""WriteCache and ReadCache: the bookie's in-memory entry caches.

WriteCache is one *half* of LedgerStorage's two-half write cache: entries wait
here until a checkpoint sorts them by (ledger, entry) into the entry log. It is
written only by the owner (event loop) thread; the flush thread reads a half
only after it was swapped out, when nobody writes it any more.

ReadCache holds entries read from the entry logs (including read-ahead). It is
bounded by bytes with two generations: new entries go into the young one; when
it holds half the budget, the old generation is dropped and the young one ages.
That is cheaper than an LRU in Python and keeps the bound.
"""
from __future__ import annotations

import threading


class WriteCache:
    """Entries by ledger then entry id; sizes counted in payload bytes."""

    __slots__ = ("max_size_bytes", "size_bytes", "count", "_ledgers", "_last")

    def __init__(self, max_size_bytes: int):
        self.max_size_bytes = max_size_bytes
        self.size_bytes = 0
        self.count = 0
        self._ledgers: dict[int, dict[int, bytes]] = {}
        self._last: dict[int, int] = {}

    def has_room(self, nbytes: int) -> bool:
        # An empty half accepts any single entry, so an entry larger than a half
        # (possible with tiny caches) can still be stored.
        return self.size_bytes + nbytes <= self.max_size_bytes or self.count == 0

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        entries = self._ledgers.get(ledger_id)
        if entries is None:
            entries = self._ledgers[ledger_id] = {}
            self._last[ledger_id] = entry_id
        elif entry_id > self._last[ledger_id]:
            self._last[ledger_id] = entry_id
        if entry_id in entries:  # a rewrite (recovery add) replaces the bytes
            self.size_bytes -= len(entries[entry_id])
            self.count -= 1
        entries[entry_id] = entry
        self.size_bytes += len(entry)
        self.count += 1

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        entries = self._ledgers.get(ledger_id)
        return None if entries is None else entries.get(entry_id)

    def last_entry_id(self, ledger_id: int) -> int | None:
        return self._last.get(ledger_id)

    def has_ledger(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers

    def delete_ledger(self, ledger_id: int) -> None:
        entries = self._ledgers.pop(ledger_id, None)
        if entries:
            self.size_bytes -= sum(len(e) for e in entries.values())
            self.count -= len(entries)
        self._last.pop(ledger_id, None)

    def sorted_items(self) -> list[tuple[int, int, bytes]]:
        """Every entry as (ledger_id, entry_id, entry), in (ledger, entry) order."""
        out = []
        for ledger_id in sorted(self._ledgers):
            entries = self._ledgers[ledger_id]
            out.extend((ledger_id, eid, entries[eid]) for eid in sorted(entries))
        return out

    def ledger_ids(self) -> list[int]:
        return list(self._ledgers)


class ReadCache:
    """Entries read from entry logs; thread-safe; bounded by bytes."""

    def __init__(self, max_size_bytes: int):
        self.max_size_bytes = max_size_bytes
        self._lock = threading.Lock()
        self._young: dict[tuple[int, int], bytes] = {}
        self._old: dict[tuple[int, int], bytes] = {}
        self._young_bytes = 0
        self._old_bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._young_bytes + self._old_bytes

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        key = (ledger_id, entry_id)
        entry = self._young.get(key)
        if entry is None:
            entry = self._old.get(key)
        if entry is None:
            self.misses += 1
        else:
            self.hits += 1
        return entry

    def put_many(self, items) -> None:
        """items: iterable of (ledger_id, entry_id, entry)."""
        if self.max_size_bytes <= 0:
            return
        half = self.max_size_bytes // 2
        with self._lock:
            for ledger_id, entry_id, entry in items:
                key = (ledger_id, entry_id)
                if key in self._young:
                    continue
                if self._young_bytes + len(entry) > half and self._young:
                    self._old, self._old_bytes = self._young, self._young_bytes
                    self._young, self._young_bytes = {}, 0
                if len(entry) > half:
                    continue  # larger than a generation: never cache it
                self._young[key] = entry
                self._young_bytes += len(entry)

    def delete_ledger(self, ledger_id: int) -> None:
        with self._lock:
            for gen in (self._young, self._old):
                for key in [k for k in gen if k[0] == ledger_id]:
                    size = len(gen.pop(key))
                    if gen is self._young:
                        self._young_bytes -= size
                    else:
                        self._old_bytes -= size
