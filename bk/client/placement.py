"""EnsemblePlacementPolicy: which bookies store a new ledger, and who replaces a failed one.

BookKeeper's default policy, without racks: a random choice among the
writable bookies (the children of `available/`; read-only bookies are listed
under `available/readonly/` and are never candidates).

Rules:
- a new ensemble is E distinct writable bookies, or NotEnoughBookiesError;
- a replacement is a writable bookie not in the ensemble. Bookies the caller
  prefers to avoid (`avoid`, e.g. ones that failed recently for this ledger)
  are used only when nothing else is left; bookies being replaced are never
  chosen again in the same change;
- the random source is injectable so tests can fix the choice.
"""
from __future__ import annotations

import random
from typing import Iterable, Sequence

from bk.errors import NotEnoughBookiesError


class EnsemblePlacementPolicy:
    def __init__(self, rng: random.Random | None = None):
        self.rng = rng or random.Random()

    def new_ensemble(self, ensemble_size: int, writable: Iterable[str],
                     exclude: Iterable[str] = ()) -> list[str]:
        """E distinct bookies chosen at random among `writable` minus `exclude`."""
        excluded = set(exclude)
        candidates = sorted(set(writable) - excluded)
        if len(candidates) < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies, {len(candidates)} available"
                + (f" ({len(excluded)} excluded)" if excluded else ""))
        return self.rng.sample(candidates, ensemble_size)

    def replace_bookies(self, ensemble: Sequence[str], failed: Iterable[str], writable: Iterable[str],
                        avoid: Iterable[str] = ()) -> list[str]:
        """A copy of `ensemble` where every bookie in `failed` is replaced (same index)."""
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
