"""Ensemble placement policies: which bookies store a ledger, who replaces a failed one, and in
which order reads ask a write set. The interface and settings are in `base`; the random policy
there too; the rack- and region-aware ones (with isolation groups and disk weighting) in
`topology_aware`; the constrained search in `search`; where racks come from in bk.client.topology.
"""
from .base import (
    DefaultEnsemblePlacementPolicy, EnsemblePlacementPolicy, OneBookiePlacement, PlacementPolicyAdherence,
    PlacementSettings,
)
from .topology_aware import RackawareEnsemblePlacementPolicy, RegionAwareEnsemblePlacementPolicy

__all__ = ["DefaultEnsemblePlacementPolicy", "EnsemblePlacementPolicy", "OneBookiePlacement", "PlacementPolicyAdherence",
           "PlacementSettings", "RackawareEnsemblePlacementPolicy", "RegionAwareEnsemblePlacementPolicy"]
