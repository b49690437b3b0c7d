"""WriteCache: one half of the two-half write cache (sorted flush order, rewrites, sizes)."""
import random

import pytest

from bk.bookie.write_cache import ReadRuns, WriteCache


def _entry(lid: int, eid: int, tag: bytes = b"") -> bytes:
    return lid.to_bytes(8, "big") + eid.to_bytes(8, "big") + tag


def test_in_order_ledgers_come_out_sorted_by_ledger_then_entry():
    wc = WriteCache(1 << 20)
    for eid in range(5):
        for lid in (9, 3, 7):
            wc.put(lid, eid, _entry(lid, eid))
    lids, eids, entries = wc.sorted_columns()
    assert lids == [3] * 5 + [7] * 5 + [9] * 5
    assert eids == list(range(5)) * 3
    assert entries == [_entry(l, e) for l, e in zip(lids, eids)]
    assert wc.count == 15 and wc.size_bytes == 15 * 16


def test_out_of_order_ledger_is_sorted_and_rewrite_replaces_in_place():
    wc = WriteCache(1 << 20)
    for eid in (5, 6, 2, 9, 0):
        wc.put(1, eid, _entry(1, eid))
    wc.put(2, 0, _entry(2, 0))
    wc.put(2, 1, _entry(2, 1))
    wc.put(2, 0, _entry(2, 0, b"new"))  # rewrite: same place, new bytes, counted once
    assert wc.sorted_items() == [(1, 0, _entry(1, 0)), (1, 2, _entry(1, 2)), (1, 5, _entry(1, 5)),
                                 (1, 6, _entry(1, 6)), (1, 9, _entry(1, 9)),
                                 (2, 0, _entry(2, 0, b"new")), (2, 1, _entry(2, 1))]
    assert wc.count == 7 and wc.size_bytes == 7 * 16 + 3
    assert wc.last_entry_id(1) == 9 and wc.last_entry_id(2) == 1
    assert wc.get(2, 0) == _entry(2, 0, b"new") and wc.get(3, 0) is None


def test_delete_ledger_forgets_entries_sizes_and_order_state():
    wc = WriteCache(1 << 20)
    wc.put(4, 3, _entry(4, 3))
    wc.put(4, 1, _entry(4, 1))
    wc.delete_ledger(4)
    assert wc.count == 0 and wc.size_bytes == 0 and wc.last_entry_id(4) is None
    wc.put(4, 0, _entry(4, 0))
    wc.put(4, 1, _entry(4, 1))
    assert wc.sorted_columns() == ([4, 4], [0, 1], [_entry(4, 0), _entry(4, 1)])


def test_random_operations_match_a_plain_model():
    rng = random.Random(11)
    for _ in range(50):
        wc = WriteCache(1 << 30)
        model: dict = {}
        for _ in range(rng.randrange(1, 200)):
            lid = rng.randrange(4)
            if rng.random() < 0.03:
                wc.delete_ledger(lid)
                model = {k: v for k, v in model.items() if k[0] != lid}
                continue
            eid = rng.randrange(30) if rng.random() < 0.3 else max(
                [e for l, e in model if l == lid], default=-1) + 1
            data = _entry(lid, eid, bytes(rng.randrange(4)))
            wc.put(lid, eid, data)
            model[(lid, eid)] = data
        expect = [(l, e, model[(l, e)]) for l, e in sorted(model)]
        assert wc.sorted_items() == expect
        assert wc.count == len(model) and wc.size_bytes == sum(map(len, model.values()))
        for lid in range(4):
            ids = [e for l, e in model if l == lid]
            assert wc.last_entry_id(lid) == (max(ids) if ids else None)


def test_put_many_is_put_for_each_until_the_first_that_does_not_fit():
    cases = [(1, [0, 1, 2, 3]), (1, [4, 5, 6]), (1, [9, 7, 8]), (1, [5, 10]), (2, [3, 4]), (2, [0, 1, 2])]
    one, many = WriteCache(1 << 20), WriteCache(1 << 20)
    for lid, eids in cases:  # in order (fast path), out of order, rewrites, new ledgers
        entries = [_entry(lid, e, b"v%d" % len(eids)) for e in eids]
        assert many.put_many(lid, eids, entries) == len(eids)
        for e, entry in zip(eids, entries):
            assert one.put(lid, e, entry)
    assert many.sorted_items() == one.sorted_items() and many.size_bytes == one.size_bytes
    assert many.sorted_columns() == one.sorted_columns()
    small = WriteCache(100)
    assert small.put_many(1, [0, 1, 2], [b"x" * 40] * 3) == 2  # the third does not fit: a prefix
    assert small.put_many(2, [0], [b"y" * 30]) == 0 and small.size_bytes == 80
    empty = WriteCache(10)
    assert empty.put_many(1, [0, 1], [b"z" * 50, b"z"]) == 1  # an empty half takes any one entry


def test_storage_says_the_checkpoint_is_behind_once_the_active_half_is_half_full(tmp_path):
    """LedgerStorage tells its entry logger (which then takes bigger fdatasync steps)
    that a checkpoint is falling behind once the half taking adds is half full."""
    from bk.bookie.ledger_storage import LedgerStorage
    from bk.config import load_config
    config = load_config(env={}, overrides={"ledger_dirs": [str(tmp_path / "ledgers")],
                                            "journal_dirs": [str(tmp_path / "journal")],
                                            "write_cache_max_size_bytes": 2 << 20})  # halves of 1 MiB
    storage = LedgerStorage(config)
    try:
        assert storage.entry_logger.behind() is False
        storage.create_ledger(1)
        eid = 0
        while storage._active.size_bytes < (1 << 20) // 2 - (64 << 10):
            assert storage.put(1, eid, _entry(1, eid, bytes(64 << 10)))
            assert storage.entry_logger.behind() is False
            eid += 1
        storage.put(1, eid, _entry(1, eid, bytes(64 << 10)))
        assert storage.entry_logger.behind() is True
        storage.checkpoint()  # the half is written; a fresh active half is empty again
        assert storage.entry_logger.behind() is False
    finally:
        storage.stop()
        storage.close_index()


def test_a_read_racing_a_checkpoint_finds_the_entry_it_moved(tmp_path):
    """While a read is between its first cache lookup and its index lookup, the entry is
    added and a checkpoint moves it from the write cache to the index: the read's second
    cache lookup misses it too. It must still be found, never answered "not stored" (a BP-46
    repair copies an entry, checkpoints and clears limbo while reads of it are in flight)."""
    from bk.bookie.ledger_storage import LedgerStorage
    from bk.config import load_config
    config = load_config(env={}, overrides={"ledger_dirs": [str(tmp_path / "ledgers")],
                                            "journal_dirs": [str(tmp_path / "journal")]})
    storage = LedgerStorage(config)
    real = storage.index.get_location
    try:
        storage.create_ledger(1)
        calls = []

        def lookup_racing_a_checkpoint(ledger_id, entry_id):
            calls.append(entry_id)
            found = real(ledger_id, entry_id)
            if len(calls) == 1:  # this lookup ran before the copy was committed
                assert found is None
                assert storage.put(1, 0, _entry(1, 0, b"x" * 100))
                storage.checkpoint()
            return found
        storage.index.get_location = lookup_racing_a_checkpoint
        assert storage.read_from_storage(1, 0) == _entry(1, 0, b"x" * 100)
        assert len(calls) == 2
    finally:
        storage.index.get_location = real
        storage.stop()
        storage.close_index()


# ReadRuns: read-ahead only for misses that continue a sequential run, never over a span read
def test_first_miss_of_a_ledger_reads_ahead_then_only_misses_that_continue_a_run():
    runs = ReadRuns()
    assert runs.plan(1, 0, 16) == (16, False)     # first miss of ledger 1: reads ahead, no hint
    runs.ran(1, 0, 15)
    assert runs.plan(1, 16, 16) == (16, True)     # the read-ahead ran out: next miss 16 on, a scan
    runs.ran(1, 16, 31)
    assert runs.plan(1, 500, 16) == (1, False)    # a jump: random
    assert runs.plan(1, 10, 16) == (1, False)     # inside a span read ahead (evicted since): one entry
    assert runs.plan(1, 501, 16) == (16, True)    # right after the jump: a run again
    assert runs.plan(2, 900, 16) == (16, False)   # ledgers are tracked apart
    assert runs.plan(1, 32, 16) == (16, True)     # the first scan goes on beside the other
    assert runs.plan(1, 700, 16) == (1, False)
    assert runs.plan(1, 705, 16) == (1, False)    # near a random read, but not next to it: random


def test_a_scans_read_ahead_doubles_run_by_run_up_to_most_and_a_random_read_never_grows():
    runs = ReadRuns()
    assert runs.plan(1, 0, 10, 70) == (10, False)    # a first miss: the batch
    runs.ran(1, 0, 9)
    assert runs.ahead_count(1, 10, 10, 70) == 20     # asking plans nothing
    assert runs.plan(1, 10, 10, 70) == (20, True)    # follows a run of 10: twice that
    runs.ran(1, 10, 29)
    assert runs.plan(1, 30, 10, 70) == (40, True)
    runs.ran(1, 30, 69)
    assert runs.plan(1, 70, 10, 70) == (70, True)    # no more than one read holds
    runs.ran(1, 70, 139)
    assert runs.plan(1, 140, 10, 70) == (70, True)
    runs.ran(1, 140, 150)                            # a run cut short (another ledger's records)
    assert runs.plan(1, 151, 10, 70) == (70, True)   # the longest run it follows decides
    assert runs.plan(1, 5000, 10, 70) == (1, False)  # random: its one entry
    assert runs.plan(1, 5001, 10, 70) == (10, True)  # right after it: a new run starts at the batch
    assert runs.plan(2, 0, 10) == (10, False) and runs.plan(2, 10, 10) == (10, True)  # most = batch: no growth
    runs.plan(3, 0, 10, 70)
    runs.ran(3, 0, 9)
    runs.plan(3, 25, 1, 70)
    assert runs.plan(3, 10, 10, 70) == (15, True)    # cut short where the next span begins


def test_concurrent_range_reads_of_one_scan_read_each_byte_once():
    # A reader with ranges of 16 in flight; a read-ahead holds 15 of its 64 KiB entries
    # (LedgerStorage caps the batch by the ledger's record size).
    runs = ReadRuns()
    assert runs.plan(5, 0, 15) == (15, False)   # range 0..15: reads 0..14 ahead
    assert runs.plan(5, 16, 15) == (15, True)   # range 16..31 while 0..14 is read: follows it
    assert runs.plan(5, 17, 15) == (1, False)   # inside 16..30, still being read: its one entry
    runs.ran(5, 0, 14)
    runs.ran(5, 16, 30)
    assert runs.plan(5, 15, 15) == (1, False)   # the range's last entry: up to the next span only
    assert runs.plan(5, 20, 15) == (1, False)   # read ahead already (evicted, or a race): one entry
    assert runs.plan(5, 31, 15) == (15, True)   # the next range goes on from the newest span


def test_misses_while_a_read_ahead_is_in_flight_read_their_one_entry():
    """Single READs of one scan, 32 at once, all planned before the first read-ahead ends
    (so it goes through the bookie's io_uring): one read-ahead, the rest one entry each.
    Each used to follow the one before and read ahead the same bytes again."""
    runs = ReadRuns()
    plans = [runs.plan(9, e, 19) for e in range(32)]
    assert plans[0] == (19, False)
    assert plans[1:19] == [(1, False)] * 18            # inside the read-ahead in flight
    assert plans[19] == (19, True)                     # follows it: the scan's next read-ahead
    assert plans[20:] == [(1, False)] * 12


def test_concurrent_scans_of_one_ledger_keep_their_read_ahead():
    runs = ReadRuns()
    starts = [0, 1000, 2000, 3000]
    for s in starts:
        runs.plan(7, s, 10)
        runs.ran(7, s, s + 9)
    for step in range(1, 20):  # four readers interleaved, each 10 entries on per miss
        for s in starts:
            count, scanning = runs.plan(7, s + 10 * step, 10)
            assert count == 10 and scanning, (s, step)
            runs.ran(7, s + 10 * step, s + 10 * step + 9)


def test_spans_are_bounded_and_forget_drops_a_ledger():
    runs = ReadRuns()
    for e in range(0, 100 * (ReadRuns.STREAMS + 3), 100):
        runs.plan(3, e, 8)
    assert len(runs._spans[3]) == ReadRuns.STREAMS
    runs.ran(3, 50_000, 50_007)  # the bound dropped the span while it was read: kept, still bounded
    assert len(runs._spans[3]) == ReadRuns.STREAMS
    runs.forget(3)
    runs.ran(3, 0, 10)  # finished after the forget: nothing to extend
    assert runs.plan(3, 5, 8) == (8, False)  # a first miss again
    for lid in range(ReadRuns.MAX_LEDGERS + 5):
        runs.plan(lid + 10, 0, 8)
    assert len(runs._spans) <= ReadRuns.MAX_LEDGERS


def _storage_with(tmp_path, ledgers: list[int], count: int, size: int):
    """A LedgerStorage holding `count` entries of each ledger, written interleaved and checkpointed."""
    from bk.bookie.ledger_storage import LedgerStorage
    from bk.config import load_config
    config = load_config(env={}, overrides={"ledger_dirs": [str(tmp_path / "ledgers")],
                                            "journal_dirs": [str(tmp_path / "journal")]})
    storage = LedgerStorage(config)
    for lid in ledgers:
        storage.create_ledger(lid)
    for eid in range(count):
        for lid in ledgers:
            assert storage.put(lid, eid, _entry(lid, eid, bytes([eid % 251]) * size))
    storage.checkpoint()
    return storage


@pytest.mark.parametrize("ledgers,views", [([1], True), ([1, 2, 3], False)])
def test_read_ahead_caches_views_of_its_read_only_when_they_are_most_of_it(tmp_path, ledgers, views):
    # Views of one read keep the whole read alive: a ledger interleaved with others would pin
    # a 1 MiB read per few cached bytes, so its entries are copied; a ledger alone stays a view.
    storage = _storage_with(tmp_path, ledgers, 40, 4000)
    try:
        first = storage.read_from_storage(1, 0)
        assert first == _entry(1, 0, bytes([0]) * 4000)
        ahead = [storage.read_cache.get(1, e) for e in range(1, 10)]
        assert all(a is not None for a in ahead)
        assert [a == _entry(1, e, bytes([e]) * 4000) for e, a in zip(range(1, 10), ahead)] == [True] * 9
        kinds = {type(x) for x in [first, *ahead]}
        assert kinds == ({memoryview} if views else {bytes})
        if views:
            assert all(x.readonly for x in ahead)
    finally:
        storage.stop()
        storage.close_index()


@pytest.mark.parametrize("gap", [1, 50])
def test_a_read_ahead_caches_only_records_the_index_places_where_they_lie(tmp_path, gap):
    """A record's ids are its first bytes: one the index places elsewhere (a stale copy, a flipped
    id) or not at all is never cached by a read-ahead, whether its records are checked by one
    index walk over their ids (consecutive) or a lookup each (ids far apart: `gap`)."""
    from bk.formats.index import LOCATION_KEY, LOCATION_VALUE
    from bk.bookie.ledger_storage import LedgerStorage
    from bk.config import load_config
    config = load_config(env={}, overrides={"ledger_dirs": [str(tmp_path / "ledgers")],
                                            "journal_dirs": [str(tmp_path / "journal")]})
    storage = LedgerStorage(config)
    storage.create_ledger(1)
    ids = [gap * i for i in range(40)]
    for eid in ids:
        assert storage.put(1, eid, _entry(1, eid, bytes([eid % 251]) * 100))
    storage.checkpoint()
    try:
        index = storage.index
        with index._env.begin(db=index._locations, write=True) as txn:
            txn.delete(LOCATION_KEY.pack(1, ids[5]))  # not in the index
            txn.put(LOCATION_KEY.pack(1, ids[7]), LOCATION_VALUE.pack(index.get_location(1, ids[8])))  # elsewhere
        assert storage.read_from_storage(1, 0) == _entry(1, 0, bytes([0]) * 100)
        cached = {e for e in ids if storage.read_cache.get(1, e) is not None}
        assert cached == set(ids[:40]) - {ids[5], ids[7]}
    finally:
        storage.stop()
        storage.close_index()


def test_a_read_ahead_reads_what_its_records_need_not_the_whole_cap(tmp_path):
    # 100 records of ~1 KB read 1.25 MiB to keep 100 KB (and copied every kept entry out):
    # once the ledger's record size is known, a read-ahead reads count x that size.
    from bk.bookie.ledger_storage import READ_AHEAD_MAX_BYTES
    storage = _storage_with(tmp_path, [1], 2000, 1000)  # ~2 MB: more than the cap
    preads = []
    real = storage.entry_logger.pread
    storage.entry_logger.pread = lambda h, n, offset: (preads.append(n), real(h, n, offset))[1]
    try:
        assert storage.read_from_storage(1, 0) == _entry(1, 0, bytes([0]) * 1000)
        assert preads == [READ_AHEAD_MAX_BYTES]  # the first: the size is not known yet
        record = 4 + len(_entry(1, 0, bytes(1000)))
        assert storage.entry_logger.record_bytes(1) == record
        batch = storage.config.read_ahead_batch_size
        preads.clear()
        assert storage.read_from_storage(1, batch) == _entry(1, batch, bytes([batch % 251]) * 1000)
        assert preads == [2 * batch * record]  # a scan's second run: twice the first (ReadRuns)
        assert type(storage.read_cache.get(1, batch + 1)) is memoryview  # all of the read kept: views
    finally:
        storage.stop()
        storage.close_index()


@pytest.mark.parametrize("step", [1, 3, 7, 20, 51, 1000])
def test_sorted_chunks_are_the_sorted_columns_cut_into_steps_across_ledgers(step):
    """Issue 32: a flush takes a half one chunk at a time, never as lists of the whole half."""
    wc = WriteCache(1 << 20)
    rng = random.Random(step)
    for eid in range(20):
        wc.put(4, eid, _entry(4, eid))             # in order
    for eid in rng.sample(range(30), 30):
        wc.put(2, eid, _entry(2, eid, b"u"))       # out of order: sorted at flush
    wc.put(9, 0, _entry(9, 0))
    chunks = list(wc.sorted_chunks(step))
    whole = wc.sorted_columns()
    assert tuple(sum((list(c[k]) for c in chunks), []) for k in range(3)) == whole
    assert len(whole[0]) == 51 and whole[1][:3] == [0, 1, 2] and whole[0][0] == 2
    assert [len(c[2]) for c in chunks] == [step] * (51 // step) + ([51 % step] if 51 % step else [])
    assert all(len(c[0]) == len(c[1]) == len(c[2]) for c in chunks)
    assert list(WriteCache(1 << 20).sorted_chunks(step)) == []


def test_checkpoint_flushes_in_small_steps_releasing_the_gil_between(tmp_path, monkeypatch):
    """Issue 32: no step of a checkpoint is a C loop over a whole half: taking the entries out
    of their dicts, writing and indexing them, and freeing the half all go STEP_ENTRIES at a
    time with the pacer called between; every entry is indexed and readable after."""
    from bk.bookie import flush_pacing
    from bk.bookie.ledger_storage import LedgerStorage
    from bk.config import load_config
    yields = []
    monkeypatch.setattr(flush_pacing, "yield_gil", lambda: yields.append(1))
    monkeypatch.setattr(flush_pacing, "STEP_ENTRIES", 100)
    monkeypatch.setattr(flush_pacing, "GIL_BUDGET_S", 0.0)  # every pause hands the GIL over
    config = load_config(env={}, overrides={"ledger_dirs": [str(tmp_path / "ledgers")],
                                            "journal_dirs": [str(tmp_path / "journal")]})
    storage = LedgerStorage(config)
    try:
        for lid in (1, 2):
            storage.create_ledger(lid)
        for eid in range(450):
            for lid in (1, 2):
                assert storage.put(lid, eid, _entry(lid, eid, b"p"))
        storage.checkpoint()
        # 900 entries taken, written and indexed 100 at a time (9); after the commit each
        # ledger's dict emptied 100 at a time, then cleared (2 * (4 + 1))
        assert len(yields) == 9 + 2 * 5
        for lid in (1, 2):
            for eid in range(450):
                assert storage.index.get_location(lid, eid) is not None
                assert storage.read_from_storage(lid, eid) == _entry(lid, eid, b"p")
    finally:
        storage.stop()
        storage.close_index()


def test_the_flush_pacer_hands_the_gil_over_once_its_budget_is_spent_unless_the_flush_is_behind(monkeypatch):
    from bk.bookie import flush_pacing
    yields = []
    monkeypatch.setattr(flush_pacing, "yield_gil", lambda: yields.append(1))
    monkeypatch.setattr(flush_pacing, "GIL_BUDGET_S", 3600.0)
    pace = flush_pacing.GilPacer()
    for _ in range(100):
        pace()
    assert yields == []  # within the budget: no hand-over
    monkeypatch.setattr(flush_pacing, "GIL_BUDGET_S", 0.0)
    for _ in range(3):
        pace()
    assert len(yields) == 3
    behind = flush_pacing.GilPacer(lambda: True)  # adds wait for room: the flush goes on
    for _ in range(3):
        behind()
    assert len(yields) == 3


def test_release_in_steps_empties_every_ledger(monkeypatch):
    wc = WriteCache(1 << 20)
    for eid in range(250):
        wc.put(1, eid, _entry(1, eid))
    wc.put(2, 0, _entry(2, 0))
    pauses = []
    wc.release(100, lambda: pauses.append(1))
    # ledger 1: 250 -> 150 -> 50 popped in two steps, then cleared; ledger 2 cleared
    assert len(pauses) == 2 + 1 + 1
    assert wc.count == 0 and wc.size_bytes == 0 and wc.get(1, 0) is None and not wc.has_ledger(1)


def test_a_flush_chunk_is_whole_entry_log_frames_when_a_frame_holds_fewer_than_a_step(monkeypatch):
    from bk.bookie import flush_pacing
    monkeypatch.setattr(flush_pacing, "STEP_ENTRIES", 512)
    frame = 256 * 1024
    # 1 KiB entries (+ a 4-byte size field each): 255 records fill a frame, so two frames
    assert flush_pacing.chunk_entries(1024 * 1000, 1000, frame, 4) == 2 * (frame // 1028)
    # small entries: a frame holds more than a step; the step it is
    assert flush_pacing.chunk_entries(100 * 1000, 1000, frame, 4) == 512
    # entries bigger than a frame: one per frame, a step of them
    assert flush_pacing.chunk_entries(1 << 30, 1024, frame, 4) == 512
    assert flush_pacing.chunk_entries(0, 0, frame, 4) == 512
