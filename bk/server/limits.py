"""BookieLimits: the bookie-wide limits every connection shares (issue 27, docs/OVERLOAD.md).

The per-connection limits (bk.server.connection) bound what one client holds; these bound
the sum over all of them, so N connections cannot hold N times the per-connection budget:

- adds in progress (BookKeeper's maxAddsInProgressLimit) and their body bytes, counted
  from the moment an ADD is decoded until it is answered;
- reads in progress (maxReadsInProgressLimit): READ, BATCH_READ, READ_LAC (v2 and v3),
  counted from decoding until answered, waiting for a read slot included;
- v3 long polls parked on a ledger's LAC (`max_long_polls`, bk's own), counted until answered.

Adds and reads follow the per-connection path: at a limit the bookie stops reading every
connection that delivers bytes (BookKeeper turns autoread off on the channel), and reads
them all again once every count is back to half its limit; a request arriving while a count
is already at twice its limit (possible: each connection not yet paused delivers one more
socket read) is answered ETOOMANYREQUESTS and changes nothing. So the adds and reads in
progress never exceed twice their limits, and the add bytes twice theirs plus one add. Long polls are refused beyond their limit at once: they
hold no socket data to pause.

Invariant: a connection is in `paused` exactly while its reading is stopped on account of
these limits (it may be stopped for its own limits too); `resume_if_below_half` hands each
back to `BookieConnection.maybe_resume`, which reads again only if its own limits allow.
All on the event loop.
"""
from __future__ import annotations

import logging
import math
import time

LOG_EVERY_S = 10.0  # a flood pauses and resumes many times a second: one log line per this

log = logging.getLogger(__name__)


def _limit(n: int) -> float:
    return n if n > 0 else math.inf  # 0 = unlimited (BookKeeper's convention)


class BookieLimits:
    __slots__ = ("max_adds", "max_add_bytes", "max_reads", "max_long_polls", "refuse_adds", "refuse_add_bytes",
                 "refuse_reads", "adds", "add_bytes", "reads", "long_polls", "paused", "pauses",
                 "refused", "_logged_at")

    def __init__(self, config):
        self.max_adds = _limit(config.max_adds_in_progress_limit)
        self.max_add_bytes = _limit(config.max_add_bytes_in_progress_limit)
        self.max_reads = _limit(config.max_reads_in_progress_limit)
        self.max_long_polls = _limit(config.max_long_polls)
        self.refuse_adds = 2 * self.max_adds
        self.refuse_add_bytes = 2 * self.max_add_bytes
        self.refuse_reads = 2 * self.max_reads
        self.adds = 0  # ADDs decoded and not yet answered, every connection
        self.add_bytes = 0  # their body bytes
        self.reads = 0  # reads decoded and not yet answered (long polls apart)
        self.long_polls = 0  # v3 long polls parked or being answered
        self.paused: set = set()  # connections whose reading these limits stopped
        self.pauses = 0  # times a connection was stopped for them (logged)
        self.refused = 0  # requests answered ETOOMANYREQUESTS for them (logged)
        self._logged_at = -LOG_EVERY_S

    # ------------------------------------------------------------ admission
    def saturated(self) -> bool:
        """Whether some count reached its limit: connections delivering bytes stop reading."""
        return self.adds >= self.max_adds or self.add_bytes >= self.max_add_bytes or self.reads >= self.max_reads

    def below_half(self) -> bool:
        return (self.adds <= self.max_adds / 2 and self.add_bytes <= self.max_add_bytes / 2
                and self.reads <= self.max_reads / 2)

    def admit_adds(self, n: int, nbytes: int) -> bool:
        """Count n adds of nbytes in progress, or False (nothing counted): the hard limit. One
        add is admitted while both counts are below twice their limits; a run of n only if
        all of it fits under them (then each of its adds would be admitted one by one too;
        else the caller admits them one by one: the same refusals either way)."""
        if n == 1:
            if self.adds >= self.refuse_adds or self.add_bytes >= self.refuse_add_bytes:
                self.refused += 1
                return False
        elif self.adds + n > self.refuse_adds or self.add_bytes + nbytes > self.refuse_add_bytes:
            return False
        self.adds += n
        self.add_bytes += nbytes
        return True

    def admit_read(self) -> bool:
        ok = self.reads < self.refuse_reads
        self.reads += ok
        self.refused += not ok
        return ok

    def admit_long_poll(self) -> bool:
        ok = self.long_polls < self.max_long_polls
        self.long_polls += ok
        self.refused += not ok
        return ok

    # ------------------------------------------------------------ pausing and resuming reading
    def pause(self, conn) -> None:
        """`conn` stopped reading on account of these limits (the caller paused its transport)."""
        if conn not in self.paused:
            if not self.paused and (now := time.monotonic()) - self._logged_at >= LOG_EVERY_S:
                self._logged_at = now
                log.info("bookie-wide limit reached (adds %d, add bytes %d, reads %d; %d pauses, %d refused so"
                         " far): not reading from connections until back to half", self.adds, self.add_bytes,
                         self.reads, self.pauses, self.refused)
            self.paused.add(conn)
            self.pauses += 1

    def forget(self, conn) -> None:
        self.paused.discard(conn)

    def resume_if_below_half(self) -> None:
        """Called as counts go down: once every count is at half its limit, every connection
        these limits stopped may read again (each still under its own limits)."""
        if self.paused and self.below_half():
            paused, self.paused = self.paused, set()
            log.debug("bookie-wide limits back to half: reading from %d connections again", len(paused))
            for conn in paused:
                conn.maybe_resume()
