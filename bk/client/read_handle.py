"""ReadHandle: reading a ledger without writing it (a tailing reader when the ledger is open).

A ReadHandle never fences and never changes metadata. What it may read:
- a CLOSED ledger: `0..lastEntryId`;
- an OPEN (or IN_RECOVERY) ledger: `0..last_add_confirmed`, where the LAC is
  learnt from the bookies of the last segment (`read_last_add_confirmed`) and
  only grows.

Why the metadata is re-read after learning a LAC: a writer puts a new segment
into the metadata store before it acknowledges any entry of that segment, and
an entry's piggybacked LAC names only acknowledged entries. So metadata read
after the LAC answers arrived describes every entry up to that LAC. A new
segment also bounds the LAC from below: the writer starts it at its LAC + 1.

Sticky reads (`sticky_reads_enabled`, BookKeeper's stickyReadsEnabled, off by default): where
every bookie holds every entry (E == WQ), all reads of the handle go first to one bookie of
the ensemble, picked at random per handle, so that its read-ahead and caches serve them; a
failed answer from it (error, timeout, explicit negative, bad digest) moves the handle on to
the next bookie of the ensemble. Other replicas are still asked when it fails or is slow
(speculative reads). Elsewhere (E > WQ) entries are striped and reads follow write sets.
"""
from __future__ import annotations

import logging
import random
from bisect import bisect_right

from bk.errors import BookieIOError, IncorrectParameterError
from bk.meta.ledger_metadata import LedgerMetadata
from bk.proto import DigestManager

from .read_iter import DEFAULT_POLL_INTERVAL_S, DEFAULT_READ_AHEAD_CHUNKS, EntryIterator
from . import tailing
from .lac_ops import read_lac_quorum
from .read_ops import LedgerEntry, ReadRangeOp

log = logging.getLogger(__name__)


def check_entry_id(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise IncorrectParameterError(f"{name} must be an int, got {value!r}")
    return value


class ReadHandle:
    def __init__(self, bk, ledger_id: int, metadata: LedgerMetadata, version: int, digest: DigestManager,
                 master_key: bytes):
        self._bk = bk
        self.ledger_id = ledger_id
        self._set_metadata(metadata)
        self._version = version
        self._digest = digest
        self._master_key = master_key
        self._lac = metadata.last_entry_id if metadata.is_closed else -1
        # Sticky reads: the ensemble index every read asks first (None: follow write sets).
        self._sticky_index = (random.randrange(metadata.ensemble_size)
                              if bk.sticky_reads_enabled and metadata.ensemble_size == metadata.write_quorum_size
                              else None)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(ledger_id={self.ledger_id}, state={self.metadata.state.name},"
                f" lac={self._lac})")

    # ------------------------------------------------------------ state
    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def is_closed(self) -> bool:
        """True once the ledger is closed in the metadata this handle knows."""
        return self.metadata.is_closed

    @property
    def length(self) -> int | None:
        """A closed ledger's final payload length; None while the ledger is open."""
        return self.metadata.length if self.metadata.is_closed else None

    @property
    def digest_type(self):
        return self._digest.digest_type

    def _last_readable(self) -> int:
        return self.metadata.last_entry_id if self.metadata.is_closed else self._lac

    def _set_metadata(self, metadata: LedgerMetadata) -> None:
        self.metadata = metadata
        self._segment_firsts = [first for first, _ in metadata.segments]

    def _update_metadata(self, metadata: LedgerMetadata, version: int) -> None:
        if version >= self._version:
            self._set_metadata(metadata)
            self._version = version
            if metadata.is_closed:
                self._lac = metadata.last_entry_id

    def _batch_end(self, entry_id: int) -> int | None:
        """Last entry id of entry_id's segment when every bookie of it holds every entry (E == WQ)."""
        md = self.metadata
        if md.ensemble_size != md.write_quorum_size:
            return None
        index = bisect_right(self._segment_firsts, entry_id)
        return self._segment_firsts[index] - 1 if index < len(self._segment_firsts) else self._last_readable()

    def replicas(self, entry_id: int) -> list[str]:
        """The write set of `entry_id` (bookie ids) in preference order."""
        md = self.metadata
        ensemble = md.segments[bisect_right(self._segment_firsts, entry_id) - 1][1]
        size = md.ensemble_size
        first = entry_id if self._sticky_index is None else self._sticky_index  # E == WQ: any order is a write set
        return [ensemble[(first + i) % size] for i in range(md.write_quorum_size)]

    def _read_failed_on(self, bookie: str) -> None:
        """Sticky reads: the sticky bookie failed an answer, so move to the next one (once per
        failure of the current sticky bookie: failures of requests in flight do not move it twice)."""
        index = self._sticky_index
        if index is not None and any(ensemble[index] == bookie for _, ensemble in self.metadata.segments):
            self._sticky_index = (index + 1) % self.metadata.ensemble_size
            log.debug("ledger %d: sticky reads move from %s to ensemble index %d", self.ledger_id, bookie,
                      self._sticky_index)

    def _range_op(self, first: int, last: int) -> ReadRangeOp:
        """The read of `first..last` with this client's read settings (read_entries, read_iter)."""
        bk = self._bk
        return ReadRangeOp(bk.pool, self._digest, first, last, self.replicas, bk.read_window_entries,
                           batch_end=self._batch_end, batch_entries=bk.batch_read_entries,
                           max_frame_size_bytes=bk.max_frame_size_bytes, speculative=bk.speculative_read_policy,
                           on_error=None if self._sticky_index is None else self._read_failed_on)

    # ------------------------------------------------------------ reads
    async def read_entries(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries `first..last` (inclusive), in order, digest-verified.

        Reading past the LAC of an open ledger, or past lastEntryId of a closed
        one, raises IncorrectParameterError: those ids may never exist."""
        first = check_entry_id("first_entry_id", first_entry_id)
        last = check_entry_id("last_entry_id", last_entry_id)
        if first < 0 or last < first:
            raise IncorrectParameterError(
                f"ledger {self.ledger_id}: bad entry range {first}..{last} (need 0 <= first <= last)")
        bound = self._last_readable()
        if last > bound:
            what = "lastEntryId" if self.metadata.is_closed else "last add confirmed"
            raise IncorrectParameterError(
                f"ledger {self.ledger_id}: cannot read entries {first}..{last}: its {what} is {bound}"
                + ("" if self.metadata.is_closed else " (read_last_add_confirmed() learns a newer one)"))
        return await self._range_op(first, last).start()

    def read_entries_iter(self, first_entry_id: int = 0, last_entry_id: int | None = None, *,
                          chunk_entries: int | None = None, read_ahead: int = DEFAULT_READ_AHEAD_CHUNKS,
                          poll_interval_s: float = DEFAULT_POLL_INTERVAL_S) -> EntryIterator:
        """`async for entry in rh.read_entries_iter(first, last)`: the entries in order, read ahead
        in chunks; `last=None` is the last readable entry now, a `last` past the LAC of an open
        ledger tails it (bk/client/read_iter.py)."""
        first = check_entry_id("first_entry_id", first_entry_id)
        last = None if last_entry_id is None else check_entry_id("last_entry_id", last_entry_id)
        return EntryIterator(self, first, last, chunk_entries=chunk_entries, read_ahead=read_ahead,
                             poll_interval_s=poll_interval_s)

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        return (await self.read_entries(entry_id, entry_id))[0]

    async def read_last_add_confirmed(self) -> int:
        """Learn the LAC from the bookies of the last segment (closed ledger: lastEntryId).

        BookKeeper's readLastAddConfirmed: READ of entry -1 to every bookie of the last segment,
        done once the answers that know something cover the ensemble (E - AQ + 1; lac_ops), so
        a dead or paused bookie does not hold it up. The answer never goes backwards. Raises a
        BookieIOError-type error only when no bookie of the last segment could be asked at all."""
        if self.metadata.is_closed:
            return self.metadata.last_entry_id
        lm = self._bk.ledger_manager
        for _ in range(3):
            first, ensemble = self.metadata.last_segment
            answers = await read_lac_quorum(self._bk.pool, self._digest, ensemble, self.metadata.ack_quorum_size)
            metadata, version = await lm.read_ledger_metadata(self.ledger_id)
            self._update_metadata(metadata, version)
            if self.metadata.is_closed:
                return self._lac
            floor = self.metadata.last_segment[0] - 1
            if answers.lac is not None or answers.negative:
                self._lac = max(self._lac, floor, answers.lac if answers.lac is not None else -1)
                return self._lac
            if self.metadata.last_segment == (first, ensemble):
                self._lac = max(self._lac, floor)
                if floor >= 0 or not answers.errors:
                    return self._lac
                detail = "; ".join(f"{b}: {e}" for b, e in answers.errors)
                raise BookieIOError(f"ledger {self.ledger_id}: no bookie of the last segment answered ({detail})",
                                    ledger_id=self.ledger_id)
            # The writer moved to a new segment meanwhile: ask its bookies.
        return self._lac

    # ------------------------------------------------------------ BookKeeper's tailing reads (tailing.py)
    def _learn_lac(self, lac: int) -> None:
        """A LAC a bookie reported (a lower bound of the writer's): the handle's LAC only grows."""
        if lac > self._lac and not self.metadata.is_closed:
            self._lac = lac

    async def _read_range(self, first: int, last: int) -> list[LedgerEntry]:
        return await self._range_op(first, last).start()

    async def read_unconfirmed(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """BookKeeper's readUnconfirmed: entries first..last without the LAC bound (see tailing.py)."""
        return await tailing.read_unconfirmed(self, first_entry_id, last_entry_id)

    async def try_read_last_add_confirmed(self) -> int:
        """BookKeeper's tryReadLastAddConfirmed: the first bookie's LAC above this handle's, no quorum."""
        return await tailing.try_read_last_add_confirmed(self)

    async def read_explicit_lac(self) -> int:
        """BookKeeper's readExplicitLastConfirmed: READ_LAC, explicit and piggybacked LACs, quorum."""
        return await tailing.read_explicit_lac(self)

    async def read_last_add_confirmed_and_entry(self, entry_id: int, timeout_ms: int, parallel: bool = False):
        """BookKeeper's readLastAddConfirmedAndEntry: (LAC, entry or None), a v3 long poll (v2: polling)."""
        return await tailing.read_last_add_confirmed_and_entry(self, entry_id, timeout_ms, parallel)

    def tail(self, from_entry: int = 0, **options) -> "tailing.TailingReader":
        """`async for entry in rh.tail(from_entry)`: every entry from `from_entry` on, once, in order, as
        it is confirmed; ends after the ledger is closed and its last entry was handed out."""
        return tailing.TailingReader(self, from_entry, **options)

    async def close(self) -> None:
        """A read handle holds nothing on the bookies: closing it only forgets it."""

    async def __aenter__(self) -> "ReadHandle":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
