"""Choosing bookies for ensemble positions under per-write-quorum rules: an exhaustive search.

An ensemble of E bookies is a ring: entry e is written to the WQ consecutive
positions e, e+1, ... (mod E) (RoundRobinDistributionSchedule), so the write
quorums are the E windows of WQ consecutive positions, wrapping. A rule is a
predicate over the locations of one window; `fill` assigns bookies to the free
positions so that every window containing a free position satisfies every
rule, or answers None when no assignment does.

Why the answer None means "impossible" (the fallback may only be taken then):
the search is a depth-first search over all assignments, pruned only by
(1) rules that are already false for a partly filled window and can no longer
become true (each rule gets the locations assigned so far and the number of
window positions still free, and answers False only when no completion can
satisfy it), and (2) symmetry: two candidates with the same location are
interchangeable for every rule, so at one position each location is tried
once (its first candidate in the order below). Neither prune discards a solution. A node budget bounds pathological
inputs; exhausting it is logged and treated as "not found".

Which solution is found: at each position the candidates are tried in the
caller's preference order (`rank` per bookie, then `prefer` per location, sort
keys), ties broken by one random permutation drawn for the call - weighted by free disk space when the policy
weights (Efraimidis-Spirakis keys: P(first) is proportional to the weight).
"""
from __future__ import annotations

import logging
import math
import random
from collections import Counter
from typing import Callable, Mapping, Sequence

log = logging.getLogger("bk.client.placement")

SEARCH_BUDGET_NODES = 200_000

# rule(locations assigned in the window, number of window positions still free) -> still satisfiable?
Rule = Callable[[list, int], bool]


def write_quorum_windows(ensemble_size: int, write_quorum_size: int) -> list[list[int]]:
    """The ensemble indexes of every write quorum (one per first index; all equal when E == WQ)."""
    if write_quorum_size >= ensemble_size:
        return [list(range(ensemble_size))]
    return [[(s + j) % ensemble_size for j in range(write_quorum_size)] for s in range(ensemble_size)]


def rack_rule(min_racks: int, rack_of: Callable[[str], str]) -> Rule:
    """At least `min_racks` distinct racks in the write quorum."""
    def rule(locations: list, free: int) -> bool:
        return len({rack_of(loc) for loc in locations}) + free >= min_racks
    return rule


def durability_rule(min_regions: int, ack_quorum_size: int, region_of: Callable[[str], str]) -> Rule:
    """No min_regions - 1 regions hold an ack quorum of the write quorum: every acknowledged entry is
    then in at least min_regions regions (BookKeeper's RackOrRegionDurabilityCoverageSet)."""
    def rule(locations: list, free: int) -> bool:
        if min_regions <= 1:
            return True
        counts = sorted(Counter(region_of(loc) for loc in locations).values(), reverse=True)
        return sum(counts[:min_regions - 1]) <= ack_quorum_size - 1
    return rule


def weighted_order(candidates: Sequence[str], weights: Mapping[str, float] | None, rng: random.Random) -> list[str]:
    """A random permutation; with weights, each next element is drawn with probability proportional to its
    weight among those left (sorting by u ** (1 / w), u uniform in (0, 1))."""
    if not weights:
        out = list(candidates)
        rng.shuffle(out)
        return out
    keyed = []
    for c in candidates:
        w = max(float(weights.get(c, 0.0)), 1e-12)
        u = rng.random() or 1e-300
        keyed.append((math.log(u) / w, c))
    keyed.sort(key=lambda kc: kc[0], reverse=True)
    return [c for _, c in keyed]


def disk_weights(candidates: Sequence[str], disk: Mapping[str, tuple[int, int]], max_multiple: int) -> dict[str, float]:
    """BookKeeper's WeightedRandomSelectionImpl over free disk bytes: a bookie with no (or zero) free space
    known weighs as the least non-zero one; no weight exceeds max_multiple times the median."""
    free = {c: float(disk[c][0]) if c in disk else 0.0 for c in candidates}
    values = sorted(free.values())
    total = sum(values)
    if total <= 0:
        return {c: 1.0 for c in candidates}
    nonzero = [v for v in values if v > 0]
    least = min(nonzero)
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    cap = max_multiple * median if max_multiple > 0 and median > 0 else float("inf")
    return {c: min(v if v > 0 else least, cap) for c, v in free.items()}


class _Exhausted(Exception):
    pass


def fill(slots: Sequence[str | None], candidates: Sequence[str], location_of: Callable[[str], str],
         write_quorum_size: int, rules: Sequence[Rule],
         prefer: Callable[[int, str, list], tuple] | None = None, rank: Callable[[str], int] | None = None,
         budget: int = SEARCH_BUDGET_NODES) -> list[str] | None:
    """`slots` with every None replaced by a distinct candidate so that every write quorum that contains
    a replaced position satisfies `rules`; None when impossible (see the module docstring).

    Order of trial at position i: by `rank(candidate)` (a per-bookie preference, e.g. "failed recently"),
    then `prefer(i, location, slots so far)`, then the order of `candidates`. Only the first candidate of
    each location in that order is tried (the symmetry prune)."""
    size = len(slots)
    current = list(slots)
    free_positions = [i for i, b in enumerate(current) if b is None]
    windows = write_quorum_windows(size, write_quorum_size)
    windows_of = {i: [w for w in windows if i in w] for i in free_positions}
    used = {b for b in current if b is not None}
    pool = [c for c in candidates if c not in used]
    if len(pool) < len(free_positions):
        return None
    where = {b: location_of(b) for b in (*pool, *used)}
    ranks = {c: rank(c) for c in pool} if rank is not None else {}
    pool.sort(key=lambda c: ranks.get(c, 0))  # stable: the callers' random order within a rank
    nodes = [0]

    def window_ok(window: list[int]) -> bool:
        locations = [where[current[j]] for j in window if current[j] is not None]
        free = sum(1 for j in window if current[j] is None)
        return all(rule(locations, free) for rule in rules)

    def search(k: int) -> bool:
        if k == len(free_positions):
            return True
        nodes[0] += 1
        if nodes[0] > budget:
            raise _Exhausted
        i = free_positions[k]
        firsts: dict[str, str] = {}  # location -> its first unused candidate in pool order
        for c in pool:
            if c not in used and where[c] not in firsts:
                firsts[where[c]] = c
        order = list(firsts.values())
        if prefer is not None:
            order.sort(key=lambda c: (ranks.get(c, 0), prefer(i, where[c], current)))
        for c in order:
            current[i] = c
            used.add(c)
            if all(window_ok(w) for w in windows_of[i]) and search(k + 1):
                return True
            current[i] = None
            used.discard(c)
        return False

    try:
        return list(current) if search(0) else None
    except _Exhausted:
        log.warning("placement search gave up after %d steps (%d positions, %d candidates)", budget,
                    len(free_positions), len(pool))
        return None
