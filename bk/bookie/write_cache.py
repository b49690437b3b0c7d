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
from collections import deque
from itertools import islice, repeat, starmap
from typing import Iterator


class WriteCache:
    """Entries by ledger then entry id; sizes counted in payload bytes.

    Per ledger a record `[entries, last]`: a dict entry_id -> bytes in arrival
    order and the highest entry id. Adds usually arrive in entry order: then the
    dict's keys are already sorted and a flush takes them as they are. A ledger
    gets into `_unordered` only when an entry arrives below its highest one (a
    rewrite of an existing entry keeps its place, so it does not count); only
    those ledgers are sorted at flush time. `put` is the add path's hottest
    Python: one dict get and a few list/dict stores in the usual case.
    """

    __slots__ = ("max_size_bytes", "size_bytes", "_ledgers", "_unordered")

    def __init__(self, max_size_bytes: int):
        self.max_size_bytes = max_size_bytes
        self.size_bytes = 0
        self._ledgers: dict[int, list] = {}  # ledger_id -> [dict entry_id -> entry, highest entry_id]
        self._unordered: set[int] = set()  # ledgers whose dict order is not entry order

    @property
    def count(self) -> int:
        return sum(len(rec[0]) for rec in self._ledgers.values())

    def has_room(self, nbytes: int) -> bool:
        # An empty half accepts any single entry, so an entry larger than a half
        # (possible with tiny caches) can still be stored.
        return self.size_bytes + nbytes <= self.max_size_bytes or not self._ledgers

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> bool:
        """Store an entry; False (nothing stored) when the half has no room for it.

        An empty half accepts any single entry (see has_room). The room check
        lives here, not in the caller, so an add costs one Python call."""
        size = self.size_bytes + len(entry)
        if size > self.max_size_bytes and self._ledgers:
            return False
        rec = self._ledgers.get(ledger_id)
        if rec is not None and entry_id > rec[1]:  # the usual case: in order, a new entry
            rec[0][entry_id] = entry
            rec[1] = entry_id
            self.size_bytes = size
            return True
        self._put_other(rec, ledger_id, entry_id, entry)
        return True

    def put_many(self, ledger_id: int, entry_ids: list, entries: list) -> int:
        """Store entries of one ledger in order until one does not fit; returns how many
        were stored (a prefix). Same result as `put` for each in turn, stopping at the
        first False. A run of consecutive new ids above the ledger's highest that fits
        as a whole (the add batch's usual case) is stored with one dict update."""
        n = len(entries)
        if not n:
            return 0
        total = sum(map(len, entries))
        rec = self._ledgers.get(ledger_id)
        first, last = entry_ids[0], entry_ids[-1]
        if (self.size_bytes + total <= self.max_size_bytes and (rec is None or first > rec[1])
                and last - first == n - 1 and entry_ids == list(range(first, last + 1))):
            if rec is None:
                self._ledgers[ledger_id] = [dict(zip(entry_ids, entries)), last]
            else:
                rec[0].update(zip(entry_ids, entries))
                rec[1] = last
            self.size_bytes += total
            return n
        put = self.put
        for i, (entry_id, entry) in enumerate(zip(entry_ids, entries)):
            if not put(ledger_id, entry_id, entry):
                return i
        return n

    def _put_other(self, rec, ledger_id: int, entry_id: int, entry: bytes) -> None:
        """A new ledger, an entry below the highest one, or a rewrite."""
        if rec is None:
            self._ledgers[ledger_id] = [{entry_id: entry}, entry_id]
            self.size_bytes += len(entry)
            return
        entries = rec[0]
        old = entries.get(entry_id)
        if old is None:
            self._unordered.add(ledger_id)
            self.size_bytes += len(entry)
        else:  # a rewrite (recovery add) replaces the bytes, in place
            self.size_bytes += len(entry) - len(old)
        entries[entry_id] = entry

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        rec = self._ledgers.get(ledger_id)
        return None if rec is None else rec[0].get(entry_id)

    def entry_ids(self, ledger_id: int) -> list[int]:
        """The ledger's entry ids held here (any order; owner thread)."""
        rec = self._ledgers.get(ledger_id)
        return list(rec[0]) if rec is not None else []

    def last_entry_id(self, ledger_id: int) -> int | None:
        rec = self._ledgers.get(ledger_id)
        return None if rec is None else rec[1]

    def has_ledger(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers

    def delete_ledger(self, ledger_id: int) -> None:
        rec = self._ledgers.pop(ledger_id, None)
        if rec is not None:
            self.size_bytes -= sum(map(len, rec[0].values()))
        self._unordered.discard(ledger_id)

    def sorted_columns(self) -> tuple[list[int], list[int], list[bytes]]:
        """Every entry as three parallel lists (ledger_ids, entry_ids, entries), in
        (ledger, entry) order."""
        return next(self.sorted_chunks(max(self.count, 1)), ([], [], []))

    def sorted_chunks(self, step: int) -> Iterator[tuple[list[int], list[int], list[bytes]]]:
        """Every entry in (ledger, entry) order, as chunks of `step` entries (the last may
        be shorter) spanning ledgers: three parallel lists (ledger_ids, entry_ids, entries)
        per chunk. No per-entry Python step for ledgers filled in order.

        A flush consumes a half this way, one chunk written and indexed at a time (issue 32):
        three lists of a whole half (150k entries each) were one C loop of ~1-6 ms with the
        GIL held to build, another to free, and while young every collection of the cyclic
        GC's generation 0 walked them (2-4 ms per collection, in whichever thread allocated).
        The half must not change while a caller iterates (a pending half never does)."""
        lids: list[int] = []
        eids: list[int] = []
        out: list[bytes] = []
        unordered = self._unordered
        for ledger_id in sorted(self._ledgers):
            entries = self._ledgers[ledger_id][0]
            if ledger_id in unordered:
                ordered = sorted(entries)
                keys, values = iter(ordered), map(entries.__getitem__, ordered)
            else:
                keys, values = iter(entries.keys()), iter(entries.values())
            left = len(entries)
            while left > 0:
                n = min(step - len(out), left)
                eids += islice(keys, n)
                out += islice(values, n)
                lids += [ledger_id] * n
                left -= n
                if len(out) >= step:
                    yield lids, eids, out
                    lids, eids, out = [], [], []
        if out:
            yield lids, eids, out

    def release(self, step: int = 0, pause=None) -> None:
        """Drop every entry (the flush thread, once the half is flushed and no longer
        published). With step > 0 each ledger's dict is emptied `step` entries at a time,
        `pause()` called between: one clear() of a 150k-entry dict is a C loop that held the
        GIL for ~2-4 ms (issue 32); the entries are freed here, the dicts being their last
        holders once a flush's chunks are gone."""
        for record in self._ledgers.values():
            entries = record[0]
            if step > 0:
                while len(entries) > step:  # popitem() from the end, `step` calls in one C loop
                    deque(starmap(entries.popitem, repeat((), step)), 0)
                    if pause is not None:
                        pause()
            entries.clear()
            if pause is not None:
                pause()
        self._ledgers = {}
        self._unordered = set()
        self.size_bytes = 0

    def sorted_items(self) -> list[tuple[int, int, bytes]]:
        """Every entry as (ledger_id, entry_id, entry), in (ledger, entry) order."""
        return list(zip(*self.sorted_columns()))

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


class ReadRuns:
    """How far an entry-log read reads ahead: the read-ahead plan.

    A read that misses both caches reads ahead (up to `read_ahead_batch_size` entries,
    at most ledger_storage.READ_AHEAD_MAX_BYTES) only when it looks sequential: the ledger's first miss, or a miss that
    follows a span read earlier, by at most that span's length (a reader scanning on,
    whose read-ahead ran out). Other misses read their one entry: a random 64 KiB read
    that read 1 MiB ahead read 16 times the bytes it needed (docs/BENCHMARKS.md, sixth
    round), and a wider "follows" (100 entries) still took one random read in eight of a
    6,000-entry ledger for a scan.

    Per ledger the plan keeps the newest STREAMS spans (first, last) of entry ids read
    (or being read: `last` is known once the read is done, `ran`). Concurrent readers of
    one ledger - several scans, or one scan with several range reads in flight - must not
    read the same bytes twice, so a miss inside a span reads only its entry (the span is
    in flight, or was evicted), and a read-ahead stops where the next span begins. Before
    this, a range of 16 x 64 KiB entries missed twice (1 MiB holds 15) and each miss read
    1 MiB that a neighbour range was reading too: 1.7 bytes read per byte served.

    Any thread (the bookie's read workers). The plan is a heuristic: a race between readers
    can only cost or save one read-ahead, never change what is read; so each update
    replaces a ledger's tuple of spans whole instead of locking.
    """

    STREAMS = 32
    MAX_LEDGERS = 4096  # forgotten all at once beyond this: the next miss of each starts a run

    __slots__ = ("_spans",)

    def __init__(self):
        self._spans: dict[int, tuple[tuple[int, int], ...]] = {}

    def plan(self, ledger_id: int, entry_id: int, batch: int, most: int | None = None) -> tuple[int, bool]:
        """Record a miss at entry_id: (entries to read from it on, whether the read continues
        a scan - then the bytes after it are worth asking the kernel for too). A scan's
        read-ahead grows (`_ahead_count`) up to `most` entries (default `batch`: no growth)."""
        spans = self._spans.get(ledger_id)
        if spans is None:
            if len(self._spans) >= self.MAX_LEDGERS:
                self._spans.clear()
            self._spans[ledger_id] = ((entry_id, entry_id + max(batch, 1) - 1),)
            return batch, False
        count = _ahead_count(spans, entry_id, batch, most)
        if count == 0:  # inside a span: its one entry
            return 1, False
        # the newest STREAMS spans are kept: a scan leaves its read spans behind it, so the
        # misses of its own slower range reads still find them. A read-ahead's span is what
        # it plans to read until `ran` says what it read: the misses that arrive while it is
        # in flight (concurrent reads of one scan: through the io_uring all of them are
        # planned before the first read-ahead ends) fall inside it and read their one entry,
        # instead of each starting a read-ahead of the same bytes. Those overlapping
        # read-aheads pinned 1.25 MiB buffers through a cached entry or two each: a bookie
        # with a 16 MiB read cache held 134 MiB of them.
        self._spans[ledger_id] = (spans[1 - self.STREAMS:] if len(spans) >= self.STREAMS else spans) \
            + ((entry_id, entry_id + count - 1),)
        return count, count > 1

    def ahead_count(self, ledger_id: int, entry_id: int, batch: int, most: int | None = None) -> int:
        """The entries plan(ledger_id, entry_id, batch, most) would read now, 1 for its one
        entry only (asking changes nothing)."""
        spans = self._spans.get(ledger_id)
        return batch if spans is None else max(1, _ahead_count(spans, entry_id, batch, most))

    def read_on_from(self, ledger_id: int, entry_id: int) -> int | None:
        """A reader got entry_id from a read-ahead: the entry after that read-ahead's span when
        entry_id is past the span's middle (a scan that will soon need what follows), else None.
        Whether a read-ahead would start there is ahead_count's to say."""
        for first, last in self._spans.get(ledger_id, ()):
            if first <= entry_id <= last:
                # a span of one entry is a random read's, not a read-ahead: nothing follows it
                return last + 1 if last > first and 2 * (entry_id - first) >= last - first else None
        return None

    def ran(self, ledger_id: int, first: int, last: int) -> None:
        """A read-ahead from `first` got entries up to `last`."""
        spans = self._spans.get(ledger_id)
        if spans is None:
            return  # forgotten meanwhile (deleted ledger, or the bound): nothing to extend
        for i, (f, _) in enumerate(spans):
            if f == first:
                self._spans[ledger_id] = spans[:i] + ((first, last),) + spans[i + 1:]
                return
        # the bound dropped the span while it was read: it is the newest now
        self._spans[ledger_id] = (spans[1 - self.STREAMS:] if len(spans) >= self.STREAMS else spans) \
            + ((first, last),)

    def forget(self, ledger_id: int) -> None:
        self._spans.pop(ledger_id, None)


def _ahead_count(spans, entry_id: int, batch: int, most: int | None = None) -> int:
    """ReadRuns' rule for a miss at entry_id against a ledger's spans: 0 inside a span (its one
    entry, the span is read or being read); when a span ends within its own length before it (a
    scan), twice the longest such span's entries, at least `batch` and at most `most` (default
    `batch`), cut short where the next span begins; else 1.

    The doubling is the kernel's readahead window, for the same reason: a scan's reads arrive
    faster than a read-ahead of `batch` entries comes back from a cold disk (each run is one
    job: an index lookup per record and a pread), so with one run read ahead at a time a fast
    scan waits for every run; twice the entries per run, up to what one read holds, keep it
    fed (cold single READs at 8 in flight: read_ahead_batch_size 400 gave 1.6x the reads/s of
    100). A random read never grows: it follows no span."""
    follows, next_first = 0, None  # the longest span that ends just before; the first span after
    for first, last in spans:
        if first <= entry_id <= last:
            return 0
        if last < entry_id <= 2 * last - first + 1 and last - first + 1 > follows:
            follows = last - first + 1
        if first > entry_id and (next_first is None or first < next_first):
            next_first = first
    if not follows:
        return 1
    count = batch if most is None or most <= batch else min(most, max(batch, 2 * follows))
    return count if next_first is None else min(count, next_first - entry_id)
