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


@pytest.mark.parametrize("k", KERNELS)
def test_keys_values_and_order(k):
    lids, eids, locs = [1, 1, 2, MAX_ID], [5, 6, 0, MAX_ID], [7, 0, MAX_LOC, (3 << 32) | 1024]
    items, ascending = k.location_items(lids, eids, locs)
    assert items == _expected(lids, eids, locs)
    assert all(type(i) is tuple and len(i) == 2 for i in items)
    assert ascending is True


@pytest.mark.parametrize("k", KERNELS)
def test_ascending_is_strict(k):
    assert k.location_items([], [], []) == ([], True)
    assert k.location_items([3], [9], [1])[1] is True
    assert k.location_items([1, 1], [2, 2], [0, 0])[1] is False  # equal keys
    assert k.location_items([2, 1], [0, 5], [0, 0])[1] is False  # ledger goes down
    assert k.location_items([1, 1], [5, 4], [0, 0])[1] is False  # entry goes down
    assert k.location_items([1, 2], [5, 0], [0, 0])[1] is True


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
        k.location_items(*bad)


@pytest.mark.parametrize("k", KERNELS)
def test_index_types_count_as_ints(k):
    class Idx:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v
    items, _ = k.location_items([Idx(4), True], [Idx(2), 0], [Idx(9), 1])
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
        for kern in (PURE, NATIVE):
            try:
                outcome.append(kern.location_items(list(lids), list(eids), list(locs)))
            except (TypeError, ValueError) as e:
                outcome.append(type(e))
        assert outcome[0] == outcome[1], (lids, eids, locs)
