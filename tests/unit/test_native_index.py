"""The index kernel: pure twin is the reference; the native build must agree."""
import random
import struct

import pytest

from bk._native import load_native, load_pure

PURE = load_pure("index")
NATIVE = load_native("index")
KERNELS = [pytest.param(PURE, id="pure"),
           pytest.param(NATIVE, id="native",
                        marks=pytest.mark.skipif(NATIVE is None, reason="native index not built"))]
MAX_ID = (1 << 63) - 1
MAX_LOC = (1 << 64) - 1


def _expected(lids, eids, locs):
    return [(struct.pack(">QQ", l, e), struct.pack(">Q", c)) for l, e, c in zip(lids, eids, locs)]


def _items(k, lids, eids, locs):
    """(list of (key, value), ascending) through both kernel calls."""
    packed, ascending = k.pack_locations(lids, eids, locs)
    assert len(packed) == k.RECORD_BYTES * len(lids)
    return list(k.location_items(packed, 0, len(lids))), ascending


@pytest.mark.parametrize("k", KERNELS)
def test_keys_values_and_order(k):
    lids, eids, locs = [1, 1, 2, MAX_ID], [5, 6, 0, MAX_ID], [7, 0, MAX_LOC, (3 << 32) | 1024]
    items, ascending = _items(k, lids, eids, locs)
    assert items == _expected(lids, eids, locs)
    assert all(type(i) is tuple and len(i) == 2 and type(i[0]) is bytes for i in items)
    assert ascending is True


@pytest.mark.parametrize("k", KERNELS)
def test_items_of_a_range_and_bad_ranges(k):
    lids, eids, locs = [1] * 10, list(range(10)), list(range(100, 110))
    packed, _ = k.pack_locations(lids, eids, locs)
    assert list(k.location_items(packed, 3, 7)) == _expected(lids, eids, locs)[3:7]
    assert list(k.location_items(memoryview(packed), 9, 10)) == _expected(lids, eids, locs)[9:]
    assert list(k.location_items(packed, 4, 4)) == []
    for start, stop in ((-1, 2), (5, 4), (0, 11)):
        with pytest.raises(ValueError):
            k.location_items(packed, start, stop)
    with pytest.raises(ValueError):
        k.location_items(packed[:-1], 0, 0)  # not whole records


@pytest.mark.parametrize("k", KERNELS)
def test_ascending_is_strict(k):
    assert k.pack_locations([], [], []) == (b"", True)
    assert k.pack_locations([3], [9], [1])[1] is True
    assert k.pack_locations([1, 1], [2, 2], [0, 0])[1] is False  # equal keys
    assert k.pack_locations([2, 1], [0, 5], [0, 0])[1] is False  # ledger goes down
    assert k.pack_locations([1, 1], [5, 4], [0, 0])[1] is False  # entry goes down
    assert k.pack_locations([1, 2], [5, 0], [0, 0])[1] is True


@pytest.mark.parametrize("k", KERNELS)
@pytest.mark.parametrize("bad, error", [
    (([1], [-1], [0]), ValueError), (([-1], [0], [0]), ValueError),
    (([MAX_ID + 1], [0], [0]), ValueError), (([0], [MAX_ID + 1], [0]), ValueError),
    (([0], [1 << 70], [0]), ValueError), (([0], [0], [-1]), ValueError), (([0], [0], [MAX_LOC + 1]), ValueError),
    (([1.0], [0], [0]), TypeError), (([0], ["1"], [0]), TypeError), (([0], [0], [None]), TypeError),
    (([1, 2], [0], [0]), ValueError), (([1], [0], []), ValueError),
])
def test_bad_input_raises(k, bad, error):
    with pytest.raises(error):
        k.pack_locations(*bad)


@pytest.mark.parametrize("k", KERNELS)
def test_index_types_count_as_ints(k):
    class Idx:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v
    items, _ = _items(k, [Idx(4), True], [Idx(2), 0], [Idx(9), 1])
    assert items == _expected([4, 1], [2, 0], [9, 1])


@pytest.mark.skipif(NATIVE is None, reason="native index not built")
def test_native_agrees_with_pure_on_random_input():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randrange(0, 60)
        lids = sorted(rng.choice([0, 1, 2, 77, MAX_ID, rng.randrange(1 << 63)]) for _ in range(n))
        eids = [rng.choice([0, 1, MAX_ID, rng.randrange(1 << 63)]) for _ in range(n)]
        if rng.random() < 0.5:
            eids.sort()
        locs = [rng.choice([0, MAX_LOC, rng.randrange(1 << 64)]) for _ in range(n)]
        if n and rng.random() < 0.2:  # one bad element somewhere
            col = rng.choice([lids, eids, locs])
            col[rng.randrange(n)] = rng.choice([-1, MAX_LOC + 1, 1 << 64, 2.5, None])
        outcome = []
        seed = rng.random()
        for kern in (PURE, NATIVE):
            rng_range = random.Random(seed)
            try:
                packed, ascending = kern.pack_locations(list(lids), list(eids), list(locs))
                start = rng_range.randrange(n + 1)
                stop = rng_range.randrange(start, n + 1)
                outcome.append((packed, ascending, list(kern.location_items(packed, start, stop))))
            except (TypeError, ValueError) as e:
                outcome.append(type(e))
        assert outcome[0] == outcome[1], (lids, eids, locs)
