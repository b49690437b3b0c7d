"""Index: the bookie's LMDB environment (entry locations, ledger states, bookie state).

Threads: reads (get_*, last_entry_id, ledgers) from any thread, each in its own
short read transaction. Writes only through `write()`, one LMDB write transaction
per `with` block, on the calling thread (the flush thread): LMDB write
transactions belong to the thread that began them, and a second write() on the
same thread while one is open would deadlock on LMDB's writer lock, so it is
refused. No lmdb exception leaves this module: MapFullError becomes
IndexFullError (naming index_map_size_bytes), any other lmdb.Error StorageError.
"""
from __future__ import annotations

import array
import bisect
import itertools
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

import lmdb

from bk._native import load as _load_kernel
from bk.config import BookieConfig
from bk.errors import CorruptedStorageError, IndexFullError, StorageError
from bk.fileio import check_commit, ensure_dir, fsync_dir
from bk.formats import index as ix
from bk.index import state as st
from bk.index.state import LedgerState, LogMark

_MAX_READERS = 256
_kernel = _load_kernel("index")
_RECORD_BYTES = ix.LOCATION_RECORD_BYTES  # packed key then value
_KEY_BYTES = ix.LOCATION_KEY_BYTES


class Index:
    def __init__(self, path: str, config: BookieConfig, *, readonly: bool = False):
        """`readonly`: another process's index, opened for reads (tools; LMDB lets a
        reader process run next to the bookie that writes)."""
        self.path = path
        self._map_size_bytes = config.index_map_size_bytes
        self._local = threading.local()  # .writing: a write() is open on this thread
        self._closed = False
        self._env = None
        if not readonly:
            ensure_dir(path)
        try:
            self._env = lmdb.open(
                path, map_size=config.index_map_size_bytes, subdir=True, max_dbs=3,
                sync=config.index_sync, metasync=config.index_sync, lock=True,
                readahead=False, max_readers=_MAX_READERS, create=not readonly, readonly=readonly)
            self._locations = self._env.open_db(b"locations", create=not readonly)
            self._ledgers = self._env.open_db(b"ledgers", create=not readonly)
            self._state = self._env.open_db(b"state", create=not readonly)
        except lmdb.Error as e:
            if self._env is not None:
                self._env.close()
            raise self._error(e, "opening") from e
        if not readonly:
            # LMDB fsyncs its files, never their directory: without this, the names data.mdb and
            # lock.mdb of a new index are not durable and a power cut could take every commit
            # (log marks, locations, the unclean-shutdown flag) with them
            try:
                fsync_dir(path)
            except StorageError:
                self._env.close()
                raise

    # ------------------------------------------------------------ reads (any thread)
    def get_location(self, ledger_id: int, entry_id: int) -> int | None:
        if not (0 <= ledger_id <= ix.MAX_ID and 0 <= entry_id <= ix.MAX_ID):
            return None  # such ids are never stored
        key = ix.LOCATION_KEY.pack(ledger_id, entry_id)
        try:
            with self._env.begin(db=self._locations) as txn:
                value = txn.get(key)
        except lmdb.Error as e:
            raise self._error(e, "reading a location") from e
        if value is None:
            return None
        if len(value) != 8:
            raise CorruptedStorageError(
                f"index location of ledger {ledger_id} entry {entry_id} is {len(value)} bytes, expected 8",
                path=self.path, ledger_id=ledger_id, entry_id=entry_id)
        return ix.LOCATION_VALUE.unpack(value)[0]

    def last_entry_id(self, ledger_id: int) -> int | None:
        """Highest entry id with a stored location for the ledger, or None."""
        st.check_id("ledger id", ledger_id)
        try:
            with self._env.begin(db=self._locations) as txn:
                cur = txn.cursor()
                if ledger_id == ix.MAX_ID:
                    found = cur.last()
                elif cur.set_range(ix.LOCATION_KEY.pack(ledger_id + 1, 0)):
                    found = cur.prev()  # the last key before the next ledger's first
                else:
                    found = cur.last()  # no later ledger: the last key overall
                if not found:
                    return None
                lid, eid = st.split_location_key(cur.key(), self.path)
        except lmdb.Error as e:
            raise self._error(e, "reading the last entry id") from e
        return eid if lid == ledger_id else None

    def entry_ids(self, ledger_id: int) -> list[int]:
        """Every entry id with a stored location for the ledger, ascending (one cursor walk
        over the ledger's keys: the cost is what is stored, whatever the ids are)."""
        prefix = st.ledger_key(ledger_id)
        out = []
        try:
            with self._env.begin(db=self._locations) as txn:
                cur = txn.cursor()
                if cur.set_range(prefix):
                    for key in cur.iternext(values=False):
                        if key[:len(prefix)] != prefix:
                            break
                        out.append(st.split_location_key(key, self.path)[1])
        except lmdb.Error as e:
            raise self._error(e, "listing a ledger's entries") from e
        return out

    def get_ledger(self, ledger_id: int) -> LedgerState | None:
        key = st.ledger_key(ledger_id)
        try:
            with self._env.begin(db=self._ledgers) as txn:
                value = txn.get(key)
        except lmdb.Error as e:
            raise self._error(e, "reading a ledger") from e
        return None if value is None else LedgerState.decode(value, path=self.path, ledger_id=ledger_id)

    def ledgers(self) -> Iterator[tuple[int, LedgerState]]:
        """Every ledger in id order (collected in one read txn, then yielded)."""
        try:
            with self._env.begin(db=self._ledgers) as txn:
                raw = list(txn.cursor().iternext())
        except lmdb.Error as e:
            raise self._error(e, "listing ledgers") from e
        out = []
        for key, value in raw:
            lid = st.split_ledger_key(key, self.path)
            out.append((lid, LedgerState.decode(value, path=self.path, ledger_id=lid)))
        return iter(out)

    def get_flag(self, name: str) -> bool:
        key = st.flag_key(name)
        try:
            with self._env.begin(db=self._state) as txn:
                value = txn.get(key)
        except lmdb.Error as e:
            raise self._error(e, "reading a flag") from e
        return st.decode_flag(name, value, self.path)

    def get_log_mark(self, journal_index: int) -> LogMark | None:
        key = st.log_mark_key(journal_index)
        try:
            with self._env.begin(db=self._state) as txn:
                value = txn.get(key)
        except lmdb.Error as e:
            raise self._error(e, "reading a log mark") from e
        return None if value is None else st.decode_log_mark(value, self.path)

    def iter_locations(self, batch: int = 65536) -> Iterator[tuple[int, int, int]]:
        """Every (ledger_id, entry_id, location) in key order, read in batches of short
        read transactions (admin tools: the consistency check)."""
        start = b""
        while True:
            try:
                with self._env.begin(db=self._locations) as txn:
                    cur = txn.cursor()
                    if not (cur.set_range(start) if start else cur.first()):
                        return
                    rows = []
                    for key, value in cur:
                        if key == start:
                            continue
                        rows.append((key, value))
                        if len(rows) >= batch:
                            break
            except lmdb.Error as e:
                raise self._error(e, "listing locations") from e
            if not rows:
                return
            for key, value in rows:
                lid, eid = st.split_location_key(key, self.path)
                yield lid, eid, st.decode_location(value, self.path)
            start = rows[-1][0]

    def get_locations(self, keys) -> list[int | None]:
        """get_location for many (ledger_id, entry_id) pairs, in one read transaction."""
        out: list[int | None] = []
        try:
            with self._env.begin(db=self._locations) as txn:
                get, pack, unpack = txn.get, ix.LOCATION_KEY.pack, ix.LOCATION_VALUE.unpack
                for lid, eid in keys:
                    value = get(pack(lid, eid))
                    out.append(None if value is None or len(value) != 8 else unpack(value)[0])
        except lmdb.Error as e:
            raise self._error(e, "reading locations") from e
        return out

    def next_location(self, ledger_id: int, first: int, last: int) -> tuple[int, int] | None:
        """(entry id, location) of the ledger's first entry in first..last the index holds, or
        None: one cursor seek. A bookie of an ensemble wider than its write quorum holds some
        of a ledger's entries only (WQ of every E), so the entry after a read-ahead is often
        another bookie's; the next read-ahead starts at the next one this bookie stores."""
        if not (0 <= ledger_id <= ix.MAX_ID and 0 <= first <= last):
            return None
        pack, unpack_key, unpack = ix.LOCATION_KEY.pack, ix.LOCATION_KEY.unpack, ix.LOCATION_VALUE.unpack
        try:
            with self._env.begin(db=self._locations) as txn:
                cur = txn.cursor()
                if not cur.set_range(pack(ledger_id, first)):
                    return None
                key, value = cur.item()
        except lmdb.Error as e:
            raise self._error(e, "reading a location") from e
        lid, eid = unpack_key(key)
        if lid != ledger_id or eid > last or len(value) != 8:  # a damaged value is no location
            return None
        return eid, unpack(value)[0]

    def get_location_range(self, ledger_id: int, first: int, last: int) -> dict[int, int]:
        """The stored locations of the ledger's entries first..last, {entry_id: location}, from
        one cursor walk in one read transaction: a read-ahead checks hundreds of consecutive
        records, and a walk costs a quarter of a get per key (0.18 against 0.79 us here), which
        read threads otherwise spend holding the GIL the event loop waits for."""
        pack, unpack_key, unpack = ix.LOCATION_KEY.pack, ix.LOCATION_KEY.unpack, ix.LOCATION_VALUE.unpack
        end = pack(ledger_id, last)
        out: dict[int, int] = {}
        try:
            with self._env.begin(db=self._locations) as txn:
                cur = txn.cursor()
                if cur.set_range(pack(ledger_id, first)):
                    for key, value in cur:
                        if key > end:
                            break
                        if len(value) == 8:  # as get_locations: a damaged value is no location
                            out[unpack_key(key)[1]] = unpack(value)[0]
        except lmdb.Error as e:
            raise self._error(e, "reading locations") from e
        return out

    def locations_in_logs(self, log_ids) -> dict[int, list[tuple[int, int, int]]]:
        """Every stored (ledger_id, entry_id, location) that points into one of `log_ids`,
        by log id (each list in key order), materialised: for tests and small answers; GC
        and compaction stream (iter_locations_in_logs) or count (count_locations_in_logs)."""
        wanted = {int(i) for i in log_ids}
        out: dict[int, list[tuple[int, int, int]]] = {i: [] for i in wanted}
        for lid, eid, loc in self.iter_locations_in_logs(wanted):
            out[loc >> 32].append((lid, eid, loc))
        return out

    def iter_locations_in_logs(self, log_ids) -> Iterator[tuple[int, int, int]]:
        """Every stored (ledger_id, entry_id, location) that points into one of `log_ids`, in
        key order, from a walk of the whole location table in short read transactions
        (iter_locations): what is live in a log when its own records cannot be trusted to
        say (a damaged log, a missing one) is what the index names there, whichever ledgers
        those are. Streamed: a 1 GiB log of small entries holds millions of locations.
        Nothing new is ever placed in a closed log, so a walk spanning transactions misses
        none of its locations (a compaction's switch moves them out, never in)."""
        wanted = {int(i) for i in log_ids}
        if not wanted:
            return
        for lid, eid, loc in self.iter_locations():
            if loc >> 32 in wanted:
                yield lid, eid, loc

    def count_locations_in_logs(self, log_ids) -> dict[int, int]:
        """log id -> how many stored locations point into it (iter_locations_in_logs)."""
        out = {int(i): 0 for i in log_ids}
        for _lid, _eid, loc in self.iter_locations_in_logs(out):
            out[loc >> 32] += 1
        return out

    # -------- the BP-46 check of missing entry logs (bk.bookie.log_check); kept apart on purpose
    def locations_by_log(self, batch: int = 1 << 20) -> dict[int, tuple[int, int]]:
        """log id -> (how many stored locations point into it, the highest of them): which
        entry logs the index needs, and how far into each, from one walk of the location
        table (values only). Per batch the values are sorted in C and each log's run is
        found by bisection: about 0.3 us a location (2,000,000 in 0.56 s on the dev VM)."""
        out: dict[int, tuple[int, int]] = {}
        try:
            with self._env.begin(db=self._locations) as txn:
                values = txn.cursor().iternext(keys=False, values=True)
                while True:
                    chunk = list(itertools.islice(values, batch))
                    if not chunk:
                        break
                    if any(len(v) != 8 for v in chunk):
                        raise CorruptedStorageError(f"index location value of a length other than 8 in {self.path}",
                                                    path=self.path)
                    raw = array.array("Q", b"".join(chunk))
                    if sys.byteorder == "little":
                        raw.byteswap()  # stored big-endian (ix.LOCATION_VALUE)
                    locs = sorted(raw)
                    i = 0
                    while i < len(locs):
                        log_id = locs[i] >> 32
                        j = bisect.bisect_left(locs, (log_id + 1) << 32, i)
                        count, highest = out.get(log_id, (0, 0))
                        out[log_id] = (count + j - i, max(highest, locs[j - 1]))
                        i = j
        except lmdb.Error as e:
            raise self._error(e, "walking locations by log") from e
        return out

    def compacting_logs(self) -> list[int]:
        """Entry logs whose compaction started and did not finish (GC.md)."""
        out = []
        try:
            with self._env.begin(db=self._state) as txn:
                cur = txn.cursor()
                if cur.set_range(ix.COMPACTING_PREFIX):
                    for key in cur.iternext(values=False):
                        if not key.startswith(ix.COMPACTING_PREFIX):
                            break
                        log_id = st.parse_compacting_log_key(bytes(key))
                        if log_id is not None:
                            out.append(log_id)
        except lmdb.Error as e:
            raise self._error(e, "listing compacting logs") from e
        return out

    def location_count(self) -> int:
        try:
            with self._env.begin(db=self._locations) as txn:
                return txn.stat(self._locations)["entries"]
        except lmdb.Error as e:
            raise self._error(e, "counting locations") from e

    # ------------------------------------------------------------ writes (flush thread)
    @contextmanager
    def write(self) -> Iterator["IndexWriter"]:
        """One write transaction: committed when the block ends, aborted if it raises."""
        if getattr(self._local, "writing", False):
            raise RuntimeError("index write() is already open on this thread")
        try:
            txn = self._env.begin(write=True)
        except lmdb.Error as e:
            raise self._error(e, "starting a write") from e
        self._local.writing = True
        writer = IndexWriter(self, txn)
        try:
            try:
                yield writer
            except BaseException:
                writer._txn = None
                try:
                    txn.abort()
                except lmdb.Error:
                    pass
                raise
            writer._txn = None
            try:
                check_commit(self.path)  # an injected commit failure (tests) aborts below
            except BaseException:
                txn.abort()
                raise
            try:
                txn.commit()  # LMDB aborts the txn itself when commit fails
            except lmdb.Error as e:
                raise self._error(e, "committing") from e
        finally:
            self._local.writing = False

    def sync(self) -> None:
        """Force committed transactions to disk (useful with index_sync = false)."""
        try:
            self._env.sync(True)
        except lmdb.Error as e:
            raise self._error(e, "syncing") from e

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()

    def _error(self, e: lmdb.Error, what: str) -> StorageError:
        if isinstance(e, lmdb.MapFullError):
            return IndexFullError(
                f"LMDB index at {self.path} is full while {what}: raise index_map_size_bytes "
                f"(now {self._map_size_bytes} bytes)")
        if self._closed:
            return StorageError(f"LMDB index at {self.path} is closed ({what})")
        return StorageError(f"LMDB index at {self.path}: {what} failed: {e}")


class IndexWriter:
    """The batch writer of one `Index.write()` block; valid only inside the block."""

    def __init__(self, index: Index, txn):
        self._index = index
        self._txn = txn

    def _live(self):
        if self._txn is None:
            raise RuntimeError("index writer used outside its write() block")
        return self._txn

    def put_locations(self, locations) -> None:
        """Store (ledger_id, entry_id, location) triples, replacing existing ones."""
        if not isinstance(locations, list):
            locations = list(locations)
        if not locations:
            self._live()
            return
        try:
            ledger_ids, entry_ids, locs = map(list, zip(*locations, strict=True))
        except (TypeError, ValueError) as e:
            raise ValueError(f"bad location triple ({e}); each must be (ledger_id, entry_id, location)") from None
        self.put_location_lists(ledger_ids, entry_ids, locs)

    def put_location_lists(self, ledger_ids: list, entry_ids: list, locations: list) -> None:
        """Store locations given as three parallel lists, replacing existing ones.

        The index kernel validates and packs the whole batch in one call and says
        whether its keys ascend; LMDB then takes the records from an iterator, so
        the batch never becomes a list of per-location tuples. Ascending keys
        beyond the last stored key are appended (MDB_APPEND: no tree search per
        key, full pages); in a sorted flush that is the part of the batch past
        the highest stored key (usually the newest ledger's run), the rest is put
        normally."""
        txn = self._live()
        try:
            packed, ascending = _kernel.pack_locations(ledger_ids, entry_ids, locations)
        except (TypeError, ValueError) as e:
            raise ValueError(f"bad location ({e}); ids must be 0..2**63-1, locations 0..2**64-1") from None
        n = len(packed) // _RECORD_BYTES
        if not n:
            return
        items = _kernel.location_items
        idx = self._index
        try:
            cur = txn.cursor(db=idx._locations)
            if not ascending:
                cur.putmulti(items(packed, 0, n))
                return
            split = 0  # records [split, n) go past the last stored key
            if cur.last():
                split = bisect.bisect_right(range(n), cur.key(),
                                            key=lambda i: packed[i * _RECORD_BYTES:i * _RECORD_BYTES + _KEY_BYTES])
            if split:
                cur.putmulti(items(packed, 0, split))
            if split < n:
                consumed, added = cur.putmulti(items(packed, split, n), append=True)
                if added != n - split:  # cannot happen given the checks above
                    raise StorageError(f"LMDB index at {idx.path}: append stored {added} of {n - split} locations")
        except lmdb.Error as e:
            raise idx._error(e, "storing locations") from e

    def put_ledger(self, ledger_id: int, ledger_state: LedgerState) -> None:
        txn = self._live()
        key = st.ledger_key(ledger_id)
        value = ledger_state.encode()
        try:
            txn.put(key, value, db=self._index._ledgers)
        except lmdb.Error as e:
            raise self._index._error(e, "storing a ledger") from e

    def delete_ledger(self, ledger_id: int) -> int:
        """Remove the ledger's record and every location of it; returns how many locations."""
        txn = self._live()
        key = st.ledger_key(ledger_id)
        idx = self._index
        prefix = key
        removed = 0
        try:
            txn.delete(key, db=idx._ledgers)
            cur = txn.cursor(db=idx._locations)
            if cur.set_range(ix.LOCATION_KEY.pack(ledger_id, 0)):
                while cur.key()[:len(prefix)] == prefix:
                    removed += 1
                    if not cur.delete():  # delete moves to the next key; False at the end
                        break
        except lmdb.Error as e:
            raise idx._error(e, "deleting a ledger") from e
        return removed

    def switch_locations(self, moves) -> int:
        """Compaction's index switch: for each (ledger_id, entry_id, old, new), store
        `new` only where the index still holds `old` (an entry re-added or moved since
        keeps its newer location; a deleted one stays deleted). Returns how many moved."""
        txn = self._live()
        idx = self._index
        pack, u64 = ix.LOCATION_KEY.pack, ix.LOCATION_VALUE
        moved = 0
        try:
            for lid, eid, old, new in moves:
                key = pack(lid, eid)
                value = txn.get(key, db=idx._locations)
                if value is not None and len(value) == 8 and u64.unpack(value)[0] == old:
                    txn.put(key, u64.pack(new), db=idx._locations)
                    moved += 1
        except lmdb.Error as e:
            raise idx._error(e, "switching locations") from e
        return moved

    def set_compacting_log(self, log_id: int, pending: bool) -> None:
        """Set (pending=True) or clear the marker of an entry log being compacted."""
        self._set_state(st.compacting_log_key(log_id), b"" if pending else None, "a compacting-log marker")

    def set_flag(self, name: str, value: bool) -> None:
        self._set_state(st.flag_key(name), b"1" if value else None, "a flag")

    def _set_state(self, key: bytes, value: bytes | None, what: str) -> None:
        """Put `value` under `key` in the state database, or delete the key (None)."""
        txn = self._live()
        idx = self._index
        try:
            if value is not None:
                txn.put(key, value, db=idx._state)
            else:
                txn.delete(key, db=idx._state)
        except lmdb.Error as e:
            raise idx._error(e, f"storing {what}") from e

    def set_log_mark(self, journal_index: int, mark: LogMark) -> None:
        txn = self._live()
        key = st.log_mark_key(journal_index)
        value = st.encode_log_mark(mark)
        try:
            txn.put(key, value, db=self._index._state)
        except lmdb.Error as e:
            raise self._index._error(e, "storing a log mark") from e
