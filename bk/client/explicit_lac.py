"""Explicit LAC: an idle writer tells its bookies its LAC (BookKeeper's ExplicitLacFlushPolicy).

A reader learns the LAC from what the writer stamps into each entry, so the LAC it
can see trails the writer's by one entry: the last entry written stays invisible
until the next add carries a newer LAC. With `explicit_lac_interval_ms` > 0 (the
BookKeeper client's explicitLacInterval; 0, the default, turns it off) a writer
checks every interval: if no add was sent since the last check (it is idle) and its
LAC is above the last one it sent, it sends WRITE_LAC (the explicit LAC buffer,
`ledger_id | lac | digest`) to every bookie of its current ensemble. A bookie keeps
the buffer (READ_LAC returns it: ReadHandle.read_explicit_lac) and raises the LAC it
knows, which answers the long polls waiting on it (a tailing reader sees the last
entry within about two intervals).

Best effort, as in BookKeeper: an answer is never awaited by an add, a failed
WRITE_LAC changes nothing (the next check sends again only if the LAC moved), and
it never triggers an ensemble change. The LAC sent is one the writer already has,
so it names only acknowledged entries.
"""
from __future__ import annotations

import logging

from bk.errors import BKError

log = logging.getLogger(__name__)


class ExplicitLacFlusher:
    __slots__ = ("lh", "interval_s", "sent_lac", "sends", "_seen_pushed", "_timer")

    def __init__(self, lh, interval_ms: int):
        self.lh = lh
        self.interval_s = interval_ms / 1000.0
        self.sent_lac = -1  # the highest LAC sent (or piggybacked when the check ran: see _check)
        self.sends = 0  # WRITE_LAC rounds sent (stats, tests)
        self._seen_pushed = lh.last_add_pushed
        self._timer = lh._loop.call_later(self.interval_s, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        lh = self.lh
        if lh._core.refuse is not None or lh._bk.closed:  # closing, closed or fenced out: no more
            self._timer = None
            return
        self._timer = lh._loop.call_later(self.interval_s, self._check)
        pushed = lh.last_add_pushed
        if pushed != self._seen_pushed:  # adds are flowing: their piggybacked LACs tell the readers
            self._seen_pushed = pushed
            return
        lac = lh.last_add_confirmed
        if lac > self.sent_lac:
            self.sent_lac = lac
            self._send(lac)

    def _send(self, lac: int) -> None:
        lh = self.lh
        lac_buf = lh._digest.frame_lac(lac)
        self.sends += 1
        failed = lh._core.failed_bookies
        for bookie in lh.ensemble:
            if bookie in failed:
                continue
            try:
                lh._bk.pool.get(bookie).send_write_lac(lh.ledger_id, lh._master_key, lac, lac_buf,
                                                       lambda response, err, b=bookie: self._answered(b, response, err))
            except BKError as e:  # the client is closing
                log.debug("ledger %d: explicit LAC %d not sent to %s: %s", lh.ledger_id, lac, bookie, e)

    def _answered(self, bookie: str, response, err) -> None:
        if err is not None or response.rc != 0:
            log.debug("ledger %d: WRITE_LAC to %s failed: %s", self.lh.ledger_id, bookie,
                      err if err is not None else response.rc)
