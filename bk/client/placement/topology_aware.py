"""Rack-aware and region-aware placement (BookKeeper's RackawareEnsemblePlacementPolicy, the client
default, and RegionAwareEnsemblePlacementPolicy), with Pulsar's bookie isolation groups and
BookKeeper's free-disk weighting on top of either.

Rack-aware rule: every write quorum (bk.client.placement.search) spans at least
min(WQ, min_num_racks_per_write_quorum) racks. When no ensemble of the writable
bookies can satisfy it (too few racks, or too few bookies in them), the policy
falls back - logged once - to the ensemble that spreads best, and
is_ensemble_adhering says FAIL; with enforce_min_num_racks_per_write_quorum it
raises NotEnoughBookiesError instead, and bookies of the default rack (whose
rack is unknown) are never chosen, as BookKeeper does. A replacement keeps the
rule for every write quorum it joins, preferring the replaced bookie's rack.

Region-aware: a location is "/region/rack"; the region is its first element.
With `repp_regions_to_write` ("r1;r2;r3") the durability rule holds as well: no
repp_minimum_regions_for_durability - 1 regions hold an ack quorum of any write
quorum, so each acknowledged entry is in that many regions (a hard rule; for
replacements only while repp_enable_durability_enforcement_in_replace). The
bookies are spread evenly over the regions, and within them by rack.

Isolation groups (Pulsar's IsolatedBookieEnsemblePlacementPolicy): with
`isolation_bookie_groups` (or, per ledger, Pulsar's EnsemblePlacementPolicyConfig JSON in
the ledger's custom metadata), a ledger's bookies come only from those groups; when
they have fewer than E writable bookies, `secondary_isolation_bookie_groups` are
added, and then bookies that belong to no group at all (as Pulsar does); bookies
of other groups never. A group named "*" turns isolation off.

Weighting (`disk_weight_based_placement_enabled`): the random order in which
candidates are tried is drawn with probability proportional to free disk space
(GET_BOOKIE_INFO), capped at bookie_max_weight_multiple_for_weight_based_placement
times the median, as BookKeeper's WeightedRandomSelection does. The rules come first.
"""
from __future__ import annotations

import json
import logging
import socket
from typing import Iterable, Mapping, Sequence

from bk.client.topology import DEFAULT_REGION_AND_RACK, DEFAULT_RACK
from bk.errors import IncorrectParameterError, NotEnoughBookiesError

from .base import EnsemblePlacementPolicy, PlacementPolicyAdherence, log
from .search import disk_weights, durability_rule, fill, rack_rule, weighted_order, write_quorum_windows

UNKNOWN_REGION = "UnknownRegion"
# Pulsar's per-ledger isolation: custom metadata key and JSON {"policyClass": ..., "properties": {...}}
ENSEMBLE_PLACEMENT_POLICY_CONFIG = "EnsemblePlacementPolicyConfig"


def _groups(value) -> set[str]:
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return {g.strip() for g in str(value or "").split(",") if g.strip()}


def region_of(location: str) -> str:
    """BookKeeper's RegionAwareEnsemblePlacementPolicy.getRegion: the first path element."""
    if location == DEFAULT_REGION_AND_RACK:
        return UNKNOWN_REGION
    parts = location.split("/")
    return parts[1] if len(parts) > 1 and parts[1] else UNKNOWN_REGION


class RackawareEnsemblePlacementPolicy(EnsemblePlacementPolicy):
    name = "rackaware"
    default_rack = DEFAULT_RACK

    def __init__(self, rng=None, settings=None, *, topology=None, local_address: str | None = None):
        super().__init__(rng, settings, topology=topology)
        self.topology.default_rack = self.default_rack
        self.min_racks = self.settings.min_num_racks_per_write_quorum
        self.enforce = self.settings.enforce_min_num_racks_per_write_quorum
        self._local_address = local_address
        self.local_location: str | None = None  # the client's own location (reads prefer it)
        primary = _groups(self.settings.isolation_bookie_groups)
        self.isolation = ((primary, _groups(self.settings.secondary_isolation_bookie_groups))
                          if primary and "*" not in primary else None)

    # ------------------------------------------------------------ learning
    async def on_cluster_changed(self, writable: Iterable[str], readonly: Iterable[str] = ()) -> None:
        """Learn the racks (and, when weighting, the free disk space) of these bookies; cached."""
        await self.topology.update(writable, readonly,
                                   disk_info=self.settings.disk_weight_based_placement_enabled)
        if self.local_location is None and self.settings.reorder_read_sequence_enabled:
            address = self._local_address or await _local_address()
            self.local_location = (await self.topology.resolve([address]))[address]

    # ------------------------------------------------------------ rules
    def _rules(self, write_quorum_size: int, ack_quorum_size: int, *, replacing: bool = False) -> list:
        return [rack_rule(min(write_quorum_size, self.min_racks), lambda loc: loc)]

    def _prefer(self, write_quorum_size: int, old: Sequence[str] | None):
        """Sort key of location `loc` for position i: for a replacement the replaced bookie's rack, then its
        region; then (region-aware: the regions least used so far, then) the locations least seen in the
        write quorums around i."""
        location = self.location

        def key(i: int, loc: str, current: list) -> tuple:
            size = len(current)
            near = 0
            for d in range(1, write_quorum_size):
                for j in {(i - d) % size, (i + d) % size} - {i}:
                    if current[j] is not None and location(current[j]) == loc:
                        near += 1
            if old is not None:
                was = location(old[i])
                return (loc != was, region_of(loc) != region_of(was), near)
            return self._spread_key(loc, current, near)
        return key

    def _spread_key(self, loc: str, current: list, near: int) -> tuple:
        return (near,)

    def _weights(self, candidates: Sequence[str]) -> Mapping[str, float] | None:
        if not self.settings.disk_weight_based_placement_enabled:
            return None
        return disk_weights(candidates, self.topology.disk,
                            self.settings.bookie_max_weight_multiple_for_weight_based_placement)

    def _isolation_for(self, custom_metadata) -> tuple[set, set] | None:
        """The ledger's own groups (Pulsar's EnsemblePlacementPolicyConfig in its custom metadata), else
        the client's settings."""
        raw = dict(custom_metadata or {}).get(ENSEMBLE_PLACEMENT_POLICY_CONFIG)
        if raw is None:
            return self.isolation
        try:
            config = json.loads(bytes(raw).decode())
            isolated = str(config.get("policyClass", "")).endswith("IsolatedBookieEnsemblePlacementPolicy")
            props = (config.get("properties") or {}) if isolated else {}
            if not isinstance(props, dict):  # else props.get below raised out of an ensemble change
                raise TypeError(f'"properties" is a {type(props).__name__}, not an object')
        except (ValueError, AttributeError, TypeError) as e:
            self.log_once("bad-policy-config", "ledger custom metadata %s is not Pulsar's JSON (%s): using the"
                          " client's isolation groups", ENSEMBLE_PLACEMENT_POLICY_CONFIG, e)
            return self.isolation
        primary = _groups(props.get("isolationBookieGroups"))
        if not primary or "*" in primary:
            return None
        return primary, _groups(props.get("secondaryIsolationBookieGroups"))

    def _eligible(self, writable: Iterable[str], needed: int, custom_metadata=None) -> set[str]:
        """Writable bookies this policy may use: isolation groups, and no default-rack bookie when the rack
        rule is enforced."""
        pool = set(writable)
        isolation = self._isolation_for(custom_metadata)
        if isolation is not None and self.topology.has_groups:
            primary, secondary = isolation
            grouped = self.topology.grouped_bookies()
            chosen = pool & self.topology.bookies_in_groups(primary)
            if len(chosen) < needed:
                chosen |= pool & self.topology.bookies_in_groups(secondary)
            if len(chosen) < needed:
                chosen |= pool - grouped  # bookies of no group, as Pulsar's last resort
            pool = chosen
        if self.enforce:
            pool = {b for b in pool if self.location(b) != self.default_rack}
        return pool

    def _check_sizes(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
        pass

    # ------------------------------------------------------------ choosing
    def new_ensemble(self, ensemble_size, writable, exclude=(), *, write_quorum_size=None, ack_quorum_size=None,
                     custom_metadata=None) -> list[str]:
        wq = write_quorum_size or ensemble_size
        aq = ack_quorum_size or wq
        self._check_sizes(ensemble_size, wq, aq)
        candidates = sorted(self._eligible(writable, ensemble_size, custom_metadata) - set(exclude))
        if len(candidates) < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies, {len(candidates)} available to the {self.name} policy"
                + (" (default-rack bookies excluded: enforce_min_num_racks_per_write_quorum)" if self.enforce else ""))
        order = weighted_order(candidates, self._weights(candidates), self.rng)
        slots = [None] * ensemble_size
        prefer = self._prefer(wq, None)
        chosen = fill(slots, order, self.location, wq, self._rules(wq, aq), prefer)
        if chosen is None:
            chosen = self._fallback("new ensemble", slots, order, wq, aq, prefer)
        return chosen

    def replace_bookies(self, ensemble, failed, writable, avoid=(), *, write_quorum_size=None,
                        ack_quorum_size=None, custom_metadata=None) -> list[str]:
        failed = set(failed)
        size = len(ensemble)
        wq = write_quorum_size or size
        aq = ack_quorum_size or wq
        indexes = [i for i, b in enumerate(ensemble) if b in failed]
        pool = sorted(self._eligible(writable, size, custom_metadata) - set(ensemble) - failed)
        if len(pool) < len(indexes):
            raise NotEnoughBookiesError(
                f"need {len(indexes)} replacement bookie(s) for {sorted(failed)}, {len(pool)} writable bookie(s)"
                f" outside the ensemble available to the {self.name} policy")
        avoid = set(avoid)
        order = weighted_order(pool, self._weights(pool), self.rng)
        slots = [None if i in indexes else b for i, b in enumerate(ensemble)]
        prefer = self._prefer(wq, list(ensemble))
        rank = avoid.__contains__  # bookies that failed recently for this ledger: last resort
        rules = self._rules(wq, aq, replacing=True)
        preferred = [c for c in order if c not in avoid]
        chosen = None
        if len(preferred) >= len(indexes):
            chosen = fill(slots, preferred, self.location, wq, rules, prefer)
        if chosen is None and len(preferred) < len(order):
            chosen = fill(slots, order, self.location, wq, rules, prefer, rank)
        if chosen is None:  # the rule cannot hold: the best spread, whatever the replaced bookie's rack
            chosen = self._fallback("replacement", slots, order, wq, aq, self._prefer(wq, None), rank)
        return chosen

    def _fallback(self, what: str, slots, order, wq: int, aq: int, prefer, rank=None) -> list[str]:
        racks = len({self.location(b) for b in order} | {self.location(b) for b in slots if b is not None})
        if self.enforce:
            raise NotEnoughBookiesError(
                f"{what}: no choice of the {len(order)} eligible bookies ({racks} rack(s)) gives every write quorum"
                f" of {wq} the {self.name} policy's {min(wq, self.min_racks)} racks, and"
                " enforce_min_num_racks_per_write_quorum is set")
        # Without any rack information (every bookie in the default rack) this is the expected case of a
        # cluster that does not use racks: said at INFO; with racks known it is a warning.
        unplaced = all(self.location(b) == self.default_rack for b in order)
        self.log_once(f"fallback-{what}", "%s policy: no %s can give every write quorum of %d its %d racks with"
                      " the writable bookies (%d rack(s)); placing with the best spread instead (logged once)",
                      self.name, what, wq, min(wq, self.min_racks), racks,
                      level=logging.INFO if unplaced else logging.WARNING)
        chosen = fill(slots, order, self.location, wq, [], prefer, rank)
        assert chosen is not None  # enough candidates were checked by the caller
        return chosen

    def replace_to_adhere(self, ensemble, writable, write_quorum_size, ack_quorum_size, exclude=(), *,
                          custom_metadata=None):
        """The fewest positions re-chosen (subsets by size, each an exhaustive search) so that every write
        quorum meets the rules; None when even re-choosing all of them cannot (what the Auditor's repair of a
        ledger that no longer satisfies the policy needs)."""
        from itertools import combinations

        ensemble = list(ensemble)
        wq, aq = write_quorum_size, ack_quorum_size
        if self.is_ensemble_adhering(ensemble, wq, aq) == PlacementPolicyAdherence.MEETS_STRICT:
            return ensemble
        pool = sorted(self._eligible(writable, len(ensemble), custom_metadata) - set(ensemble) - set(exclude))
        order = weighted_order(pool, self._weights(pool), self.rng)
        rules = self._rules(wq, aq)
        prefer = self._prefer(wq, None)
        for k in range(1, min(len(ensemble), len(pool)) + 1):
            for positions in combinations(range(len(ensemble)), k):
                slots = [None if i in positions else b for i, b in enumerate(ensemble)]
                chosen = fill(slots, order, self.location, wq, rules, prefer)
                # fill checks the write quorums it changed; the others must already hold
                if chosen is not None and self.is_ensemble_adhering(chosen, wq, aq) == "MEETS_STRICT":
                    return chosen
        return None

    # ------------------------------------------------------------ checking
    def _rack_rule_holds(self, ensemble: Sequence[str], wq: int) -> bool:
        need = min(wq, self.min_racks)
        for window in write_quorum_windows(len(ensemble), wq):
            racks = {self.location(ensemble[j]) for j in window if self.topology.known(ensemble[j])}
            if len(racks) < need or (self.enforce and self.default_rack in racks):
                return False
        return True

    def is_ensemble_adhering(self, ensemble, write_quorum_size, ack_quorum_size) -> PlacementPolicyAdherence:
        """MEETS_STRICT when every write quorum spans min(WQ, min_num_racks_per_write_quorum) racks (and, when
        enforced, none is the default rack), else FAIL. A bookie whose location was never resolved counts no
        rack (call resolve_bookies first)."""
        if self._rack_rule_holds(list(ensemble), write_quorum_size):
            return PlacementPolicyAdherence.MEETS_STRICT
        return PlacementPolicyAdherence.FAIL

    # ------------------------------------------------------------ reading
    def reorder_read_sequence(self, bookies: Sequence[str]) -> list[str]:
        """reorder_read_sequence_enabled: bookies of the client's rack first, then of its region, then the
        rest, each group in write-set order (the failed-last rule of read_ops applies after this)."""
        local = self.local_location
        if not self.settings.reorder_read_sequence_enabled or local is None or local == self.default_rack:
            return list(bookies)
        region = region_of(local)

        def rank(b: str) -> int:
            if not self.topology.known(b):
                return 2
            loc = self.location(b)
            return 0 if loc == local else 1 if region != UNKNOWN_REGION and region_of(loc) == region else 2
        return sorted(bookies, key=rank)


class RegionAwareEnsemblePlacementPolicy(RackawareEnsemblePlacementPolicy):
    name = "regionaware"
    default_rack = DEFAULT_REGION_AND_RACK

    def __init__(self, rng=None, settings=None, *, topology=None, local_address: str | None = None):
        super().__init__(rng, settings, topology=topology, local_address=local_address)
        self.regions_to_write = self.settings.regions_to_write
        self.min_regions = self.settings.repp_minimum_regions_for_durability if self.regions_to_write else 0
        if self.regions_to_write and len(self.regions_to_write) < self.min_regions:
            raise IncorrectParameterError(
                f"repp_regions_to_write names {len(self.regions_to_write)} region(s), fewer than"
                f" repp_minimum_regions_for_durability={self.min_regions}")

    def _check_sizes(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
        m = self.min_regions
        if m <= 0:
            return
        # BookKeeper's checks: an ack quorum must be able to span m regions, also with regions lost.
        if ack_quorum_size < m:
            raise IncorrectParameterError(
                f"ack quorum {ack_quorum_size} < repp_minimum_regions_for_durability {m}: durability cannot hold")
        if ack_quorum_size <= write_quorum_size - write_quorum_size // m:
            raise IncorrectParameterError(
                f"ack quorum {ack_quorum_size} must exceed write quorum {write_quorum_size} - {write_quorum_size}"
                f" // {m} for durability across {m} regions in degraded mode")

    def _rules(self, write_quorum_size: int, ack_quorum_size: int, *, replacing: bool = False) -> list:
        rules = super()._rules(write_quorum_size, ack_quorum_size)
        if self.min_regions > 1 and (not replacing or self.settings.repp_enable_durability_enforcement_in_replace):
            rules.append(durability_rule(self.min_regions, ack_quorum_size, region_of))
        return rules

    def _spread_key(self, loc: str, current: list, near: int) -> tuple:
        region = region_of(loc)  # the region least used so far first: an even spread over the regions
        return (sum(1 for b in current if b is not None and region_of(self.location(b)) == region), near)

    def is_ensemble_adhering(self, ensemble, write_quorum_size, ack_quorum_size) -> PlacementPolicyAdherence:
        """FAIL when a write quorum breaks the durability rule (repp_regions_to_write set: some
        minimum_regions - 1 regions hold an ack quorum); otherwise MEETS_STRICT when the rack rule holds too,
        MEETS_SOFT when only durability holds. Without durability configured, as the rack-aware policy."""
        ensemble = list(ensemble)
        if self.min_regions > 1:
            rule = durability_rule(self.min_regions, ack_quorum_size, region_of)
            for window in write_quorum_windows(len(ensemble), write_quorum_size):
                if not rule([self.location(ensemble[j]) for j in window], 0):
                    return PlacementPolicyAdherence.FAIL
            return (PlacementPolicyAdherence.MEETS_STRICT if self._rack_rule_holds(ensemble, write_quorum_size)
                    else PlacementPolicyAdherence.MEETS_SOFT)
        return super().is_ensemble_adhering(ensemble, write_quorum_size, ack_quorum_size)


async def _local_address() -> str:
    """The client host's address, as BookKeeper's InetAddress.getLocalHost().getHostAddress()."""
    import asyncio

    try:
        infos = await asyncio.get_running_loop().getaddrinfo(socket.gethostname(), None, family=socket.AF_INET)
        return infos[0][4][0]
    except (OSError, IndexError):
        return "127.0.0.1"
