"""Speculative reads: when to ask another replica while the first one has not answered.

BookKeeper's DefaultSpeculativeRequestExecutionPolicy, as a value object the read ops consult:
a read that has had no answer `first_s` after it was sent is also sent to the next replica of
the entry's write set; if that one was sent, the next look comes `next_s(previous)` later
(the previous delay times `multiplier`, at most `max_s`), until a replica answers or none is
left. A speculative request is only sent while no bookie already asked for the entry has
answered anything in the same read operation (that bookie is alive, only slow on this entry:
asking another would add load, not latency) - PendingReadOp's rule.

The client settings, with BookKeeper's ClientConfiguration defaults (keys in snake_case, _ms
for milliseconds as elsewhere in bk):
- entry reads: `speculative_read_timeout_ms` 2000 (0 turns speculative reads off);
  `first_speculative_read_timeout_ms` and `max_speculative_read_timeout_ms` default to it;
  `speculative_read_timeout_backoff_multiplier` 2.0;
- long-poll LAC reads (readLastAddConfirmedAndEntry): `first_speculative_read_lac_timeout_ms`
  1500 (0: off), `max_speculative_read_lac_timeout_ms` 5000,
  `speculative_read_lac_timeout_backoff_multiplier` 2.0.
With the defaults (first == max) the delay never grows; the multiplier matters when a
smaller first timeout is chosen.

Every speculative request sent counts in SPECULATIVE_READ_COUNT (BookKeeper's client
statistic `speculativeReadCount`).
"""
from __future__ import annotations

from bk.errors import IncorrectParameterError
from bk.metrics import Counter

DEFAULT_SPECULATIVE_READ_TIMEOUT_MS = 2000
DEFAULT_SPECULATIVE_READ_TIMEOUT_BACKOFF_MULTIPLIER = 2.0
DEFAULT_FIRST_SPECULATIVE_READ_LAC_TIMEOUT_MS = 1500
DEFAULT_MAX_SPECULATIVE_READ_LAC_TIMEOUT_MS = 5000
DEFAULT_SPECULATIVE_READ_LAC_TIMEOUT_BACKOFF_MULTIPLIER = 2.0

SPECULATIVE_READ_COUNT = Counter("bookkeeper_client_SPECULATIVE_READ_COUNT",
                                 "reads also sent to another replica because the first had not answered in time")


class SpeculativePolicy:
    """First delay, largest delay and backoff multiplier of speculative requests (seconds)."""

    __slots__ = ("first_s", "max_s", "multiplier")

    def __init__(self, first_ms: int, max_ms: int, multiplier: float):
        self.first_s = first_ms / 1000.0
        self.max_s = max_ms / 1000.0
        self.multiplier = float(multiplier)

    def __repr__(self) -> str:
        return (f"SpeculativePolicy(first_ms={self.first_s * 1000:g}, max_ms={self.max_s * 1000:g},"
                f" multiplier={self.multiplier:g})")

    def next_s(self, previous_s: float) -> float:
        """The delay before the next speculative request, after one sent `previous_s` after the last."""
        return min(self.max_s, round(previous_s * 1000 * self.multiplier) / 1000.0)

    @classmethod
    def build(cls, what: str, first_ms, max_ms, multiplier) -> "SpeculativePolicy | None":
        """The policy for these settings (`what` names them in errors); None when first_ms is 0 (off)."""
        for name, value in ((f"first {what} timeout", first_ms), (f"max {what} timeout", max_ms)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise IncorrectParameterError(f"{name} must be a number of milliseconds >= 0 (0: off), got {value!r}")
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or not multiplier > 0:
            raise IncorrectParameterError(f"{what} timeout backoff multiplier must be > 0, got {multiplier!r}")
        if first_ms == 0:
            return None
        return cls(first_ms, max_ms, multiplier)


# The read settings a bookie's own client (BookKeeper.for_bookie: AutoRecovery, BP-46 repair) takes
# from the bookie's configuration (bk/config.py), under the same names; -1 there = unset.
READ_SETTINGS = ("speculative_read_timeout_ms", "first_speculative_read_timeout_ms",
                 "max_speculative_read_timeout_ms", "speculative_read_timeout_backoff_multiplier",
                 "first_speculative_read_lac_timeout_ms", "max_speculative_read_lac_timeout_ms",
                 "speculative_read_lac_timeout_backoff_multiplier", "sticky_reads_enabled")


def read_settings(config) -> dict:
    """BookKeeper(...) keyword arguments for the read settings of a BookieConfig."""
    values = {key: getattr(config, key) for key in READ_SETTINGS}
    for key in ("first_speculative_read_timeout_ms", "max_speculative_read_timeout_ms"):
        if values[key] < 0:
            values[key] = None  # unset: speculative_read_timeout_ms
    return values
