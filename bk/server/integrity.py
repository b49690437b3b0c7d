"""BP-46 at boot: may this bookie have lost data, and phase one if so.

REPLICATION.md, "Running without the journal". With `journal_write_data = false` an
add is acknowledged once it is in the write cache, so a crash loses what the last
checkpoint had not written, and a wiped disk loses everything. A bookie that
answered ENOENTRY for such an entry, or accepted a plain add to a ledger whose
fence it forgot, would break ledger recovery (BP-46's scenarios 1 and 2). So,
before the bookie serves anything:

Detection. Data may be lost when the index's unclean-shutdown flag was still set
(crash, SIGKILL, power loss; an error reading it counts as set), or when cookie
validation found directories that once had a cookie and now have none (a replaced
or wiped disk). A clean stop cleared the flag and leaves nothing to do.

Phase one. Read the metadata of every ledger in the cluster and keep those with a
segment naming this bookie. Each is fenced and put in limbo locally, with a ledger
record (and the master key the metadata's password yields) where the bookie has
none, and all of it is made durable by one checkpoint, together with the
bookie-wide needs-integrity-check flag (Bookie.mark_for_integrity_check). Only then
may the cookies be stamped and the bookie listen and register. Phase two
(bk.replication.integrity) repairs in the background once it serves.

bk marks every such ledger, closed ones too, where BP-46 limbos only the ledgers
not closed: a closed ledger's lost entry answered with ENOENTRY is the same false
negative, and fencing a closed ledger costs nothing (only recovery adds may write
to it, and they pass a fence). Limbo on a closed ledger is cleared as soon as
phase two has checked its entries.

Cookie failures that are repaired: the ZooKeeper cookie equals this configuration
and directories lack theirs. Anything else (a ZooKeeper cookie that differs, one
missing while directories have one, a directory cookie that differs) is a
configuration error and always refuses to start.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from bk.errors import CookieError
from bk.meta.cookie import CookieCheck
from bk.meta.ledger_manager import LedgerManager
from bk.proto import master_key

log = logging.getLogger(__name__)

METADATA_READ_CONCURRENCY = 256
FIX_COMMAND = "bk shell fixcookie --conf <this bookie's config>"


def repairable(check: CookieCheck) -> bool:
    """Only lost directory cookies are repairable; see the module docstring."""
    return check.zk_version is not None and not check.zk_mismatch and not check.dir_mismatches


def refuse_cookie_problems(bookie_id: str, check: CookieCheck, stamping_enabled: bool) -> None:
    """Raise the boot error for a failed cookie check that this boot will not repair."""
    problems = " | ".join(check.problems)
    if not repairable(check):
        raise CookieError(f"bookie {bookie_id} refuses to start: {problems}")
    if not stamping_enabled:
        raise CookieError(
            f"bookie {bookie_id} refuses to start: {problems}. These directories lost their cookies (a"
            " replaced or wiped disk?), so the bookie may have lost data. Fix: stop the bookie and run"
            f" `{FIX_COMMAND}` (it fences and puts in limbo every ledger of this bookie, then stamps the"
            " cookies; the bookie repairs the rest from its peers when it starts), or set"
            " data_integrity_cookie_stamping_enabled = true to let the bookie do the same itself.")


@dataclass(frozen=True)
class PhaseOneResult:
    ledgers_marked: int
    ledgers_scanned: int
    elapsed_s: float

    def as_dict(self) -> dict:
        return {"ledgers_marked": self.ledgers_marked, "ledgers_scanned": self.ledgers_scanned,
                "elapsed_s": round(self.elapsed_s, 3)}


async def ledgers_of_bookie(store, bookie_id: str) -> tuple[list[tuple[int, bytes | None]], int]:
    """(ledger_id, master key or None) of every ledger with a segment naming `bookie_id`, and
    how many ledgers were read. Any store error propagates: phase one never guesses."""
    marks, scanned = [], 0
    async for ledger_id, md, _version in LedgerManager(store).iter_ledger_metadata(
            concurrency=METADATA_READ_CONCURRENCY):
        scanned += 1
        if any(bookie_id in ensemble for _, ensemble in md.segments):
            marks.append((ledger_id, master_key(md.password) if md.password is not None else None))
    return marks, scanned


async def run_phase_one(store, bookie, bookie_id: str, why: str) -> PhaseOneResult:
    """Fence and limbo every ledger of this bookie, durably (one checkpoint)."""
    t0 = time.monotonic()
    log.warning("bookie %s may have lost data (%s): phase one, fencing its ledgers and putting them in limbo"
                " before it serves", bookie_id, why)
    marks, scanned = await ledgers_of_bookie(store, bookie_id)
    count = await bookie.mark_for_integrity_check(marks)
    result = PhaseOneResult(count, scanned, time.monotonic() - t0)
    log.warning("phase one done: %d of %d ledgers fenced and in limbo in %.2fs; the bookie repairs them from"
                " its peers once it serves", count, scanned, result.elapsed_s)
    return result
