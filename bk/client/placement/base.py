"""The EnsemblePlacementPolicy interface, its settings, and the random (default) policy.

A policy decides which bookies store a new ledger (`new_ensemble`), who replaces
failed bookies on an ensemble change (`replace_bookies`), in which order a
read asks the bookies of a write set (`reorder_read_sequence`), and whether an
existing ensemble satisfies it (`is_ensemble_adhering`, what BookKeeper's
Auditor placement check asks: see `for_config` to build the same policy a
bookie's own client uses).

Use from the Auditor (or any caller holding a bookie's config):

    policy = EnsemblePlacementPolicy.for_config(config)      # the policy the bookie's client uses
    policy.bind(store=store, registration=registration)      # where racks come from
    await policy.resolve_bookies(ensemble)                   # learn their racks (cached)
    policy.is_ensemble_adhering(ensemble, wq, aq)            # "FAIL" | "MEETS_SOFT" | "MEETS_STRICT"

Rules every policy keeps:
- a new ensemble is E distinct writable bookies, or NotEnoughBookiesError;
- a replacement is a writable bookie not in the ensemble. Bookies the caller
  prefers to avoid (`avoid`, e.g. ones that failed recently for this ledger)
  are used only when nothing else is left; bookies being replaced are never
  chosen again in the same change;
- the policies are synchronous and pure over what they know: `on_cluster_changed`
  / `resolve_bookies` (async) learn racks and free disk space beforehand;
- the random source is injectable so tests can fix the choice.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from bk.errors import IncorrectParameterError, NotEnoughBookiesError

log = logging.getLogger("bk.client.placement")


class PlacementPolicyAdherence(str, enum.Enum):
    """BookKeeper's EnsemblePlacementPolicy.PlacementPolicyAdherence; compares equal to its name."""
    FAIL = "FAIL"
    MEETS_SOFT = "MEETS_SOFT"
    MEETS_STRICT = "MEETS_STRICT"

    def __str__(self) -> str:
        return self.value


# ensemble_placement_policy values, with BookKeeper's class names accepted as aliases.
POLICY_NAMES = {
    "rackaware": "rackaware", "regionaware": "regionaware", "default": "default", "random": "default",
    "org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy": "rackaware",
    "org.apache.bookkeeper.client.RegionAwareEnsemblePlacementPolicy": "regionaware",
    "org.apache.bookkeeper.client.DefaultEnsemblePlacementPolicy": "default",
}


@dataclass(frozen=True)
class PlacementSettings:
    """The client settings of placement, named as BookKeeper's ClientConfiguration keys (snake_case),
    with its defaults. Pulsar's isolation-group keys likewise. `network_topology_mapping` is bk's own:
    a static bookie -> "/region/rack" mapping (a dict, or the path of a JSON object or of a text file
    of `bookie location` lines)."""
    ensemble_placement_policy: str = "rackaware"
    min_num_racks_per_write_quorum: int = 2
    enforce_min_num_racks_per_write_quorum: bool = False
    network_topology_script_file_name: str = ""
    network_topology_script_number_args: int = 100
    network_topology_mapping: Any = None
    disk_weight_based_placement_enabled: bool = False
    bookie_max_weight_multiple_for_weight_based_placement: int = 3
    get_bookie_info_interval_seconds: int = 24 * 60 * 60
    reorder_read_sequence_enabled: bool = False
    repp_regions_to_write: str = ""
    repp_minimum_regions_for_durability: int = 2
    repp_enable_durability_enforcement_in_replace: bool = True
    isolation_bookie_groups: str = ""
    secondary_isolation_bookie_groups: str = ""

    def __post_init__(self) -> None:
        name = POLICY_NAMES.get(str(self.ensemble_placement_policy).strip(), None)
        if name is None:
            raise IncorrectParameterError(
                f"ensemble_placement_policy must be one of rackaware, regionaware, default; got "
                f"{self.ensemble_placement_policy!r}")
        object.__setattr__(self, "ensemble_placement_policy", name)
        for key in ("min_num_racks_per_write_quorum", "network_topology_script_number_args",
                    "bookie_max_weight_multiple_for_weight_based_placement", "get_bookie_info_interval_seconds",
                    "repp_minimum_regions_for_durability"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise IncorrectParameterError(f"{key} must be an int >= 0, got {value!r}")
        if self.network_topology_script_number_args < 1:
            raise IncorrectParameterError("network_topology_script_number_args must be >= 1")

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def build(cls, **settings) -> "PlacementSettings":
        """Settings from keyword arguments; an unknown name is a clear error (a typo is not ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - names)
        if unknown:
            raise IncorrectParameterError(f"unknown client setting(s): {', '.join(unknown)}")
        return cls(**settings)

    @classmethod
    def from_config(cls, config) -> "PlacementSettings":
        """The same keys from a bookie's config (bk.config.BookieConfig: its TOML) for its own client."""
        values = {}
        for f in dataclasses.fields(cls):
            if hasattr(config, f.name):
                value = getattr(config, f.name)
                values[f.name] = value if value != "" or f.name != "network_topology_mapping" else None
        return cls(**values)

    def kwargs(self) -> dict:
        """As keyword arguments of BookKeeper(...)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def regions_to_write(self) -> tuple[str, ...]:
        return tuple(r.strip() for r in self.repp_regions_to_write.split(";") if r.strip())


class EnsemblePlacementPolicy:
    """The interface, and BookKeeper's DefaultEnsemblePlacementPolicy: a random choice among writable
    bookies (no racks). Topology-aware policies (bk.client.placement.topology_aware) override the
    choice and the adherence check."""

    name = "default"

    def __init__(self, rng: random.Random | None = None, settings: PlacementSettings | None = None, *,
                 topology=None):
        from bk.client.topology import NetworkTopology

        self.rng = rng or random.Random()
        self.settings = settings or PlacementSettings(ensemble_placement_policy=self.name)
        # Where racks and disk sizes come from (bk.client.topology): resolved asynchronously, cached.
        self.topology = topology if topology is not None else NetworkTopology.from_settings(self.settings)
        self._logged: set[str] = set()

    # ------------------------------------------------------------ building
    @staticmethod
    def from_settings(settings: PlacementSettings, rng: random.Random | None = None,
                      topology=None) -> "EnsemblePlacementPolicy":
        """The policy `settings.ensemble_placement_policy` names."""
        if settings.ensemble_placement_policy == "default":
            return EnsemblePlacementPolicy(rng, settings, topology=topology)
        from .topology_aware import RackawareEnsemblePlacementPolicy, RegionAwareEnsemblePlacementPolicy
        cls = (RegionAwareEnsemblePlacementPolicy if settings.ensemble_placement_policy == "regionaware"
               else RackawareEnsemblePlacementPolicy)
        return cls(rng, settings, topology=topology)

    @classmethod
    def for_config(cls, config, **overrides) -> "EnsemblePlacementPolicy":
        """The policy a bookie's own client (AutoRecovery, the Auditor's placement check) uses: the
        placement keys of its config (bk.config), `overrides` replacing some."""
        settings = dataclasses.replace(PlacementSettings.from_config(config), **overrides)
        return cls.from_settings(settings)

    def bind(self, *, store=None, pool=None, registration=None) -> "EnsemblePlacementPolicy":
        """Give the policy the metadata store (the rack layout znode), the RegistrationManager (bookies'
        registration properties) and the bookie connection pool (GET_BOOKIE_INFO for disk weighting)."""
        self.topology.bind(store=store, pool=pool, registration=registration)
        return self

    # ------------------------------------------------------------ what the policy knows
    async def on_cluster_changed(self, writable: Iterable[str], readonly: Iterable[str] = ()) -> None:
        """Called with the writable (and read-only) bookies before each choice: topology-aware policies
        learn their racks (and free space) here; the random policy needs nothing."""

    async def resolve_bookies(self, bookies: Iterable[str]) -> dict[str, str]:
        """The network location ("/region/rack" or "/rack") of each bookie (unknown: the default rack)."""
        return await self.topology.resolve(bookies)

    def location(self, bookie: str) -> str:
        return self.topology.location(bookie)

    def log_once(self, key: str, message: str, *args, level: int = logging.WARNING) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, message, *args)

    # ------------------------------------------------------------ choosing
    def new_ensemble(self, ensemble_size: int, writable: Iterable[str], exclude: Iterable[str] = (), *,
                     write_quorum_size: int | None = None, ack_quorum_size: int | None = None,
                     custom_metadata: Mapping[str, bytes] | None = None) -> list[str]:
        """E distinct bookies chosen at random among `writable` minus `exclude`."""
        excluded = set(exclude)
        candidates = sorted(set(writable) - excluded)
        if len(candidates) < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies, {len(candidates)} available"
                + (f" ({len(excluded)} excluded)" if excluded else ""))
        return self.rng.sample(candidates, ensemble_size)

    def replace_bookies(self, ensemble: Sequence[str], failed: Iterable[str], writable: Iterable[str],
                        avoid: Iterable[str] = (), *, write_quorum_size: int | None = None,
                        ack_quorum_size: int | None = None,
                        custom_metadata: Mapping[str, bytes] | None = None) -> list[str]:
        """A copy of `ensemble` where every bookie in `failed` is replaced (same index); `custom_metadata` is
        the ledger's (per-ledger isolation groups)."""
        failed = set(failed)
        indexes = [i for i, b in enumerate(ensemble) if b in failed]
        # Never a bookie that is in the ensemble (including the failed ones).
        pool = set(writable) - set(ensemble) - failed
        preferred = sorted(pool - set(avoid))
        fallback = sorted(pool - set(preferred))
        if len(preferred) + len(fallback) < len(indexes):
            raise NotEnoughBookiesError(
                f"need {len(indexes)} replacement bookie(s) for {sorted(failed)}, {len(pool)} writable bookie(s)"
                " outside the ensemble")
        chosen = self.rng.sample(preferred, min(len(indexes), len(preferred)))
        if len(chosen) < len(indexes):
            chosen += self.rng.sample(fallback, len(indexes) - len(chosen))
        new = list(ensemble)
        for i, bookie in zip(indexes, chosen):
            new[i] = bookie
        return new

    # ------------------------------------------------------------ checking and reading
    def is_ensemble_adhering(self, ensemble: Sequence[str], write_quorum_size: int,
                             ack_quorum_size: int) -> PlacementPolicyAdherence:
        """BookKeeper's isEnsembleAdheringToPlacementPolicy: the random policy has no rule to break."""
        return PlacementPolicyAdherence.MEETS_STRICT

    def replace_to_adhere(self, ensemble: Sequence[str], writable: Iterable[str], write_quorum_size: int,
                          ack_quorum_size: int, exclude: Iterable[str] = (), *,
                          custom_metadata: Mapping[str, bytes] | None = None) -> list[str] | None:
        """BookKeeper's replaceToAdherePlacementPolicy: `ensemble` with as few positions as possible given to
        other writable bookies (not in the ensemble, not in `exclude`; in the ledger's isolation groups) so
        that it adheres strictly; the ensemble itself when it already does; None when no such replacement
        exists."""
        return list(ensemble)

    def reorder_read_sequence(self, bookies: Sequence[str]) -> list[str]:
        """The order in which to ask a write set's bookies (before the failed-last rule of read_ops):
        unchanged unless the policy is topology-aware and reorder_read_sequence_enabled."""
        return list(bookies)


DefaultEnsemblePlacementPolicy = EnsemblePlacementPolicy


class OneBookiePlacement(EnsemblePlacementPolicy):
    """BookKeeper's LocalBookieEnsemblePlacementPolicy: every ensemble is one given bookie
    (the sanity checks: `bk shell bookiesanity`, HTTP /api/v1/bookie/sanity)."""

    def __init__(self, bookie_id: str):
        super().__init__()
        self.bookie_id = bookie_id

    def new_ensemble(self, ensemble_size, writable, exclude=(), **_) -> list[str]:
        if ensemble_size != 1:
            raise NotEnoughBookiesError(f"ensembles are bookie {self.bookie_id} alone (ensemble size 1)")
        if self.bookie_id not in set(writable) or self.bookie_id in set(exclude):
            raise NotEnoughBookiesError(f"bookie {self.bookie_id} is not registered as writable")
        return [self.bookie_id]
