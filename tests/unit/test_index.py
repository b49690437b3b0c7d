"""Index over LMDB: locations, ledger states, flags, log marks, errors."""
import random
import threading

import lmdb
import pytest

from bk.config import load_config
from bk.errors import CorruptedStorageError, IndexFullError, StorageError
from bk.index import NEEDS_INTEGRITY_CHECK, UNCLEAN_SHUTDOWN, Index, LedgerState, LogMark
from bk.formats.index import LOCATION_KEY
from bk.index import state as st

MAX_ID = (1 << 63) - 1


def cfg(**kw):
    return load_config(env={}, overrides=kw)


@pytest.fixture
def index(tmp_path):
    idx = Index(str(tmp_path / "index"), cfg(index_map_size_bytes="64MiB"))
    yield idx
    idx.close()


def test_a_location_range_is_what_a_get_of_each_id_says(index):
    """Index.get_location_range (a read-ahead's check of its records): the ledger's ids in the
    range that the index holds, no other ledger's, no id outside it, no damaged value."""
    with index.write() as w:
        w.put_locations([(lid, e, (lid << 40) | e) for lid in (6, 7, 8) for e in range(0, 300, 3)])
    with index._env.begin(db=index._locations, write=True) as txn:  # a damaged value: 3 bytes
        txn.put(LOCATION_KEY.pack(7, 150), b"bad")
    got = index.get_location_range(7, 10, 200)
    want = {e: loc for e, loc in zip(range(10, 201), index.get_locations([(7, e) for e in range(10, 201)]))
            if loc is not None}
    assert got == want and 150 not in got and min(got) == 12 and max(got) == 198
    assert index.get_location_range(7, 301, 900) == {} and index.get_location_range(9, 0, 10) == {}
    assert index.get_location_range(8, 0, 0) == {0: 8 << 40}


def test_the_next_location_is_the_ledgers_first_held_entry_in_the_range(index):
    """Index.next_location (where a read-ahead after another bookie's entry starts): the
    ledger's first id in first..last the index holds, never another ledger's, none past last."""
    with index.write() as w:
        w.put_locations([(lid, e, (lid << 40) | e) for lid in (6, 7, 8) for e in range(0, 300, 3)])
    with index._env.begin(db=index._locations, write=True) as txn:  # a damaged value: 3 bytes
        txn.put(LOCATION_KEY.pack(7, 150), b"bad")
    assert index.next_location(7, 10, 20) == (12, (7 << 40) | 12)
    assert index.next_location(7, 12, 12) == (12, (7 << 40) | 12)
    assert index.next_location(7, 13, 14) is None  # 15 is past last
    assert index.next_location(7, 298, 10_000) is None  # 297 is the ledger's last: not ledger 8's 0
    assert index.next_location(7, 148, 200) is None  # a damaged value is no location
    assert index.next_location(9, 0, 10) is None and index.next_location(-1, 0, 10) is None
    assert index.next_location(7, 20, 10) is None


def test_put_and_get_locations(index):
    with index.write() as w:
        w.put_locations([(1, e, (1 << 32) | (1024 + e)) for e in range(100)])
    assert index.get_location(1, 0) == (1 << 32) | 1024
    assert index.get_location(1, 99) == (1 << 32) | 1123
    assert index.get_location(1, 100) is None
    assert index.get_location(2, 0) is None
    assert index.get_location(-1, 0) is None and index.get_location(1, -5) is None
    assert index.location_count() == 100
    # unsorted input, keys below the last one, and overwrites all take the slow path
    rng = random.Random(3)
    triples = [(rng.randrange(0, 5), rng.randrange(0, 1000), rng.randrange(1 << 64)) for _ in range(500)]
    with index.write() as w:
        w.put_locations(triples)
    expect = {(1, e): (1 << 32) | (1024 + e) for e in range(100)}
    expect.update({(l, e): loc for l, e, loc in triples})
    for (l, e), loc in expect.items():
        assert index.get_location(l, e) == loc
    assert index.location_count() == len(expect)


def test_sorted_batches_append_and_interleave(index):
    # sorted and beyond the last key (append), then sorted but below it (plain put)
    with index.write() as w:
        w.put_locations([(10, e, e) for e in range(1000)])
    with index.write() as w:
        w.put_locations([(11, e, e + 5) for e in range(1000)])
    with index.write() as w:
        w.put_locations([(5, e, e + 7) for e in range(0, 1000, 2)])
    with index.write() as w:
        w.put_locations([(10, 500, 1), (10, 2000, 2)])  # sorted, starts below the last key
    assert index.get_location(10, 999) == 999 and index.get_location(11, 999) == 1004
    assert index.get_location(5, 998) == 1005 and index.get_location(5, 999) is None
    assert index.get_location(10, 500) == 1 and index.get_location(10, 2000) == 2
    assert index.location_count() == 1000 + 1000 + 500 + 1
    with index.write() as w:  # any iterable
        w.put_locations((12, e, e) for e in range(3))
        w.put_locations([])
    assert index.last_entry_id(12) == 2


def test_last_entry_id_with_neighbour_ledgers(index):
    with index.write() as w:
        w.put_locations([(1, e, 1) for e in (0, 1, 2)])
        w.put_locations([(2, e, 2) for e in (5, 900, 77)])
        w.put_locations([(5, 0, 5)])
        w.put_locations([(MAX_ID, 3, 9), (MAX_ID, MAX_ID, 9)])
    assert index.last_entry_id(1) == 2
    assert index.last_entry_id(2) == 900
    assert index.last_entry_id(0) is None  # before every ledger
    assert index.last_entry_id(3) is None and index.last_entry_id(4) is None  # gap
    assert index.last_entry_id(5) == 0
    assert index.last_entry_id(6) is None
    assert index.last_entry_id(MAX_ID) == MAX_ID
    with index.write() as w:
        w.delete_ledger(MAX_ID)
    assert index.last_entry_id(6) is None  # no later ledger at all
    assert index.last_entry_id(MAX_ID) is None
    with pytest.raises(ValueError):
        index.last_entry_id(-1)


def test_last_entry_id_on_empty_index(index):
    assert index.last_entry_id(0) is None
    assert index.last_entry_id(MAX_ID) is None


@pytest.mark.parametrize("state", [
    LedgerState(),
    LedgerState(fenced=True),
    LedgerState(limbo=True, master_key=b"k" * 20),
    LedgerState(fenced=True, limbo=True, master_key=b"\x00" * 255, explicit_lac=b"lac" * 1000),
    LedgerState(explicit_lac=b"\x01"),
])
def test_ledger_state_round_trip(index, state):
    assert LedgerState.decode(state.encode()) == state
    with index.write() as w:
        w.put_ledger(42, state)
    assert index.get_ledger(42) == state


def test_ledger_state_encoding_is_the_documented_layout():
    s = LedgerState(fenced=True, master_key=b"ab", explicit_lac=b"xyz")
    assert s.encode() == bytes([1 | 2, 2]) + b"ab" + (3).to_bytes(4, "big") + b"xyz"
    assert LedgerState(limbo=True).encode() == bytes([1 | 4, 0, 0, 0, 0, 0])
    assert LedgerState(master_key=b"", explicit_lac=b"") == LedgerState()  # empty means none
    with pytest.raises(ValueError):
        LedgerState(master_key=b"k" * 256)
    with pytest.raises(Exception):
        LedgerState().fenced = True  # frozen


@pytest.mark.parametrize("raw", [
    b"", b"\x01\x00\x00\x00\x00",  # too short
    b"\x00\x00\x00\x00\x00\x00",  # exists bit missing
    b"\x09\x00\x00\x00\x00\x00",  # unknown flag
    b"\x01\x05ab\x00\x00\x00\x00",  # key runs past
    b"\x01\x00\x00\x00\x00\x02x",  # LAC short
    b"\x01\x00\x00\x00\x00\x00z",  # trailing byte
])
def test_malformed_ledger_state_is_corruption(raw):
    with pytest.raises(CorruptedStorageError):
        LedgerState.decode(raw, ledger_id=7)


def test_ledgers_listing_and_delete_ledger(index):
    with index.write() as w:
        for lid in (3, 1, 2):
            w.put_ledger(lid, LedgerState(master_key=bytes([lid]) * 20))
            w.put_locations([(lid, e, lid * 1000 + e) for e in range(50)])
    assert [lid for lid, _ in index.ledgers()] == [1, 2, 3]
    with index.write() as w:
        assert w.delete_ledger(2) == 50
        assert w.delete_ledger(2) == 0
        assert w.delete_ledger(99) == 0
    assert index.get_ledger(2) is None
    assert all(index.get_location(2, e) is None for e in range(50))
    assert index.last_entry_id(2) is None
    assert index.last_entry_id(1) == 49 and index.last_entry_id(3) == 49  # neighbours intact
    assert index.get_location(3, 0) == 3000 and index.get_location(1, 49) == 1049
    assert [lid for lid, _ in index.ledgers()] == [1, 3]
    with index.write() as w:
        assert w.delete_ledger(3) == 50  # the last ledger of the database
    assert index.location_count() == 50


def test_flags(index):
    assert index.get_flag(UNCLEAN_SHUTDOWN) is False
    with index.write() as w:
        w.set_flag(UNCLEAN_SHUTDOWN, True)
        w.set_flag(NEEDS_INTEGRITY_CHECK, True)
    assert index.get_flag(UNCLEAN_SHUTDOWN) and index.get_flag(NEEDS_INTEGRITY_CHECK)
    with index.write() as w:
        w.set_flag(UNCLEAN_SHUTDOWN, False)
        w.set_flag("never_set", False)
    assert not index.get_flag(UNCLEAN_SHUTDOWN) and index.get_flag(NEEDS_INTEGRITY_CHECK)
    for bad in ("", "Bad", "logmark/0", "x" * 100, 5):
        with pytest.raises(ValueError):
            index.get_flag(bad)
    # a stored value other than b"1" is corruption, not False
    with index._env.begin(write=True, db=index._state) as txn:
        txn.put(b"unclean_shutdown", b"yes")
    with pytest.raises(CorruptedStorageError):
        index.get_flag(UNCLEAN_SHUTDOWN)


def test_log_marks(index):
    assert index.get_log_mark(0) is None
    with index.write() as w:
        w.set_log_mark(0, LogMark(3, 4096))
        w.set_log_mark(1, LogMark(7, 16))
    assert index.get_log_mark(0) == LogMark(3, 4096) and index.get_log_mark(1) == LogMark(7, 16)
    with index.write() as w:
        w.set_log_mark(0, LogMark(4, 0))
    assert index.get_log_mark(0) == LogMark(4, 0)
    with index._env.begin(db=index._state) as txn:
        assert txn.get(b"logmark/0") == (4).to_bytes(8, "big") + bytes(8)
    with pytest.raises(ValueError):
        index.get_log_mark(-1)
    with index._env.begin(write=True, db=index._state) as txn:
        txn.put(b"logmark/5", b"short")
    with pytest.raises(CorruptedStorageError):
        index.get_log_mark(5)


def test_log_mark_is_the_journals():
    from bk.journal import LogMark as JournalLogMark
    assert LogMark is JournalLogMark


def test_persistence_across_reopen(tmp_path):
    path = str(tmp_path / "idx")
    idx = Index(path, cfg())
    with idx.write() as w:
        w.put_locations([(9, e, e * 3) for e in range(1000)])
        w.put_ledger(9, LedgerState(fenced=True, master_key=b"m" * 20))
        w.set_flag(UNCLEAN_SHUTDOWN, True)
        w.set_log_mark(0, LogMark(2, 99))
    idx.close()
    idx.close()  # idempotent
    with pytest.raises(StorageError):
        idx.get_location(9, 1)
    idx = Index(path, cfg())
    assert idx.get_location(9, 999) == 2997 and idx.last_entry_id(9) == 999
    assert idx.get_ledger(9) == LedgerState(fenced=True, master_key=b"m" * 20)
    assert idx.get_flag(UNCLEAN_SHUTDOWN) and idx.get_log_mark(0) == LogMark(2, 99)
    idx.close()


def test_abort_on_exception_leaves_nothing(index):
    with index.write() as w:
        w.put_locations([(1, 0, 10)])
    with pytest.raises(KeyError):
        with index.write() as w:
            w.put_locations([(1, e, 20) for e in range(100)])
            w.put_ledger(1, LedgerState(fenced=True))
            w.set_flag(UNCLEAN_SHUTDOWN, True)
            w.set_log_mark(0, LogMark(1, 1))
            w.delete_ledger(1)
            raise KeyError("boom")
    assert index.get_location(1, 0) == 10 and index.get_location(1, 50) is None
    assert index.get_ledger(1) is None and not index.get_flag(UNCLEAN_SHUTDOWN)
    assert index.get_log_mark(0) is None
    with index.write() as w:  # the index still takes writes
        w.put_locations([(1, 1, 11)])
    assert index.last_entry_id(1) == 1


def test_bad_input_is_rejected_and_aborts(index):
    for bad in ([(-1, 0, 1)], [(1, -1, 1)], [(1 << 63, 0, 1)], [(1, 1 << 63, 1)], [(1, 0, -1)],
                [(1, 0, 1 << 64)], [(1, 0, "x")], [(1, 0, 5), (0, "a", 1)]):
        with pytest.raises(ValueError):
            with index.write() as w:
                w.put_locations([(0, 0, 0)])
                w.put_locations(bad)
        assert index.get_location(0, 0) is None
    with pytest.raises(ValueError):
        with index.write() as w:
            w.put_ledger(-3, LedgerState())


def test_write_misuse(index):
    with index.write() as w:
        with pytest.raises(RuntimeError):
            with index.write():
                pass
    with pytest.raises(RuntimeError):
        w.put_locations([(1, 1, 1)])
    with index.write() as w:  # and the thread can write again
        w.put_locations([(1, 1, 1)])


def test_map_full_is_index_full_error_naming_the_setting(tmp_path):
    idx = Index(str(tmp_path / "small"), cfg(index_map_size_bytes="1MiB"))
    with idx.write() as w:
        w.put_locations([(0, e, e) for e in range(100)])
    committed = 0
    with pytest.raises(IndexFullError) as ei:
        for batch in range(1, 1000):
            with idx.write() as w:
                w.put_locations([(batch, e, e) for e in range(2000)])
            committed = batch
    msg = str(ei.value)
    assert "index_map_size_bytes" in msg and str(1024 * 1024) in msg
    assert not isinstance(ei.value.__cause__, IndexFullError) and isinstance(ei.value.__cause__, lmdb.Error)
    failed = committed + 1
    assert idx.get_location(failed, 0) is None  # the failed txn left nothing
    assert idx.last_entry_id(committed) == 1999 and idx.get_location(0, 99) == 99
    idx.close()
    # the remedy the message names: a bigger map on the same environment
    idx = Index(str(tmp_path / "small"), cfg(index_map_size_bytes="4MiB"))
    with idx.write() as w:
        w.put_locations([(failed, e, e) for e in range(2000)])
    assert idx.last_entry_id(failed) == 1999 and idx.last_entry_id(committed) == 1999
    idx.close()


def test_lmdb_errors_do_not_escape(tmp_path):
    afile = tmp_path / "not-a-dir"
    afile.write_bytes(b"x")
    with pytest.raises(StorageError) as ei:
        Index(str(afile), cfg())
    assert not isinstance(ei.value, lmdb.Error)


def test_reads_from_other_threads_during_writes(index):
    errors = []
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                last = index.last_entry_id(1)
                if last is not None:
                    assert index.get_location(1, last) == last + 100
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for b in range(50):
        with index.write() as w:
            w.put_locations([(1, e, e + 100) for e in range(b * 100, (b + 1) * 100)])
    stop.set()
    for t in threads:
        t.join()
    assert errors == [] and index.last_entry_id(1) == 4999


def test_key_layout_sorts_by_ledger_then_entry():
    keys = [st.location_key(l, e) for l, e in [(0, 5), (1, 0), (1, 1 << 40), (256, 0), (MAX_ID, 0)]]
    assert keys == sorted(keys)
    assert st.location_key(1, 2) == (1).to_bytes(8, "big") + (2).to_bytes(8, "big")
