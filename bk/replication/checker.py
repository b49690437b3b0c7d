"""LedgerChecker: does each bookie of a ledger still hold its share of each segment?

For every segment with an end (all segments of a closed ledger, all but the
last of an open one) and every bookie in it, the first and the last entry of
the bookie's share (the entries whose write set includes it) are read from
that bookie - BookKeeper's LedgerChecker does the same. The answer per bookie:
- an EOK whose digest verifies: present;
- an explicit ENOENTRY / ENOLEDGER, or bytes that fail verification: missing -
  the bookie lost (part of) its share and the ledger is under-replicated;
- anything else (connection refused, timeout, EIO): unknown. A probe whose
  connection broke is asked once more first, on a new connection: a broken
  stream (a TLS session a network fault cut bytes from) fails the first request
  sent on it after the network heals, and says nothing about the bookie.
What to do with unknown shares is the caller's: the auditor marks those of
registered bookies (BookKeeper's checker counts every failed read as a bad
fragment), the replication worker copies them.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Iterable

from bk.errors import BKError, BookieConnectionError, DigestMismatchError, ReplicationError
from bk.meta.ledger_metadata import LedgerMetadata
from bk.proto import StatusCode

from .replicator import ledger_digest, segment_bounds, share_ends

log = logging.getLogger(__name__)

EOK = int(StatusCode.EOK)
NEGATIVE = (int(StatusCode.ENOENTRY), int(StatusCode.ENOLEDGER))
PROBE_TRIES = 2  # a probe whose connection broke, or could not be made, is sent once more
RETRY_PAUSE_S = 0.05


Share = tuple[int, str]  # (first entry of a segment, a bookie of it): that bookie's share of the segment


@dataclass
class CheckResult:
    ledger_id: int
    missing: set[str] = field(default_factory=set)  # bookies that lack (part of) their share
    unknown: set[str] = field(default_factory=set)  # bookies that could not be asked
    missing_shares: set[Share] = field(default_factory=set)  # the shares found lacking
    unknown_shares: set[Share] = field(default_factory=set)  # the shares that could not be asked about
    reads: int = 0


class LedgerChecker:
    def __init__(self, pool, *, concurrency: int = 64):
        self.pool = pool
        self._slots = asyncio.Semaphore(max(1, concurrency))

    async def _probe(self, digest, bookie: str, entry_id: int) -> bool | None:
        """True present, False missing, None unknown."""
        for attempt in range(PROBE_TRIES):
            async with self._slots:
                try:
                    client = self.pool.get(bookie)
                    response = await client.call(client.send_read, digest.ledger_id, entry_id)
                    break
                except BookieConnectionError:
                    if attempt + 1 == PROBE_TRIES:
                        return None
                except BKError:  # a timeout has waited its time already; the rest is an answer
                    return None
            await asyncio.sleep(RETRY_PAUSE_S)
        if response.rc == EOK:
            try:
                digest.verify_entry(entry_id, response.body)
            except DigestMismatchError:
                return False
            return True
        if response.rc in NEGATIVE:
            return False
        return None

    async def check(self, ledger_id: int, md: LedgerMetadata, bookies: Iterable[str] | None = None) -> CheckResult:
        """Probe the shares of `bookies` (default: every bookie of the ledger)."""
        wanted = set(bookies) if bookies is not None else None
        result = CheckResult(ledger_id)
        try:
            digest, _ = ledger_digest(ledger_id, md)
        except ReplicationError as e:
            log.warning("cannot check %s", e)
            return result
        probes = []
        for index, (_, ensemble) in enumerate(md.segments):
            first, last = segment_bounds(md, index)
            if last is None:
                continue  # the open end of a ledger: its writer may still add to it
            for position, bookie in enumerate(ensemble):
                if wanted is not None and bookie not in wanted:
                    continue
                for entry_id in share_ends(first, last, md.ensemble_size, md.write_quorum_size, position):
                    probes.append(((first, bookie), self._probe(digest, bookie, entry_id)))
        answers = await asyncio.gather(*(p for _, p in probes))
        result.reads = len(probes)
        for (share, _), present in zip(probes, answers):
            if present is False:
                result.missing_shares.add(share)
            elif present is None:
                result.unknown_shares.add(share)
        result.unknown_shares -= result.missing_shares
        result.missing = {bookie for _, bookie in result.missing_shares}
        result.unknown = {bookie for _, bookie in result.unknown_shares} - result.missing
        return result
