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

Detection also runs whatever the journal setting: the entry-log check of every start
(bk.bookie.log_check) finds entries whose entry log is missing or cut short (a wiped
second ledger dir, a deleted log). That is data loss found, not a crash: phase one runs
for the ledgers with such entries (all of the bookie's when another reason holds too).

Phase one. Read the metadata of every ledger in the cluster and keep those with a
segment naming this bookie. Each is put in limbo locally, with a ledger record (and
the master key the metadata's password yields) where the bookie has none, and all of
it is made durable by one checkpoint, together with the bookie-wide
needs-integrity-check flag (Bookie.mark_for_integrity_check). Only then may the
cookies be stamped and the bookie listen and register. Phase two
(bk.replication.integrity) repairs in the background once it serves.

What is fenced is what BookKeeper fences (DataIntegrityCheckImpl's pre-boot): a ledger
not closed whose LAST ensemble names this bookie, so that its writer cannot get an add
acknowledged by a bookie that may have lost the entries before it, and so that phase two
may open it with recovery. A ledger not closed whose last ensemble left this bookie is
put in limbo only: its writer is alive elsewhere and must not be fenced out by a crash
of a bookie it no longer uses (it may even pick this bookie again); the segments naming
this bookie all have an end, so phase two copies what they lack without recovery.

bk also limbos (and fences) closed ledgers, where BP-46 limbos only the ledgers not
closed: a closed ledger's lost entry answered with ENOENTRY is the same false
negative, and fencing a closed ledger costs nothing (only recovery adds may write
to it, and they pass a fence). Limbo is cleared as soon as phase two has checked a
ledger's entries.

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
            f" `{FIX_COMMAND}` (it puts every ledger of this bookie in limbo, fencing those BookKeeper fences, then stamps the"
            " cookies; the bookie repairs the rest from its peers when it starts), or set"
            " data_integrity_cookie_stamping_enabled = true to let the bookie do the same itself.")


def boot_reasons(bookie, cookies, checking: bool) -> tuple[list[str], set[int] | None]:
    """Why phase one must run at this start (empty: it need not), and which ledgers it covers
    (None: every ledger of the bookie; a set: only those, when the only reason is entries
    found gone with their entry logs, whose other ledgers lost nothing)."""
    reasons = []
    if checking and bookie.was_unclean_shutdown:
        reasons.append("the last shutdown was not clean")
    if cookies.problems:  # only found with checking on (verify_cookies' allow_repair)
        reasons.append("directories lost their cookies: " + ", ".join(cookies.missing_dirs))
    only = None
    found = bookie.log_check
    if found.dead_logs:
        if not reasons:
            only = set(found.ledgers)
        reasons.append(found.summary())
    return reasons, only


@dataclass(frozen=True)
class PhaseOneResult:
    ledgers_marked: int
    ledgers_scanned: int
    elapsed_s: float
    ledgers_fenced: int = 0

    def as_dict(self) -> dict:
        return {"ledgers_marked": self.ledgers_marked, "ledgers_fenced": self.ledgers_fenced,
                "ledgers_scanned": self.ledgers_scanned, "elapsed_s": round(self.elapsed_s, 3)}


def must_fence(md, bookie_id: str) -> bool:
    """BookKeeper's pre-boot rule: not closed, and the last ensemble names the bookie."""
    return not md.is_closed and bool(md.segments) and bookie_id in md.segments[-1][1]


async def ledgers_of_bookie(store, bookie_id: str, only: set[int] | None = None
                            ) -> tuple[list[tuple[int, bytes | None]], set[int], int]:
    """(ledger_id, master key or None) of every ledger with a segment naming `bookie_id` (and
    in `only`, when given), the ids among them not to fence (module docstring), and how many
    ledgers were read. Any store error propagates: phase one never guesses."""
    marks, unfenced, scanned = [], set(), 0
    async for ledger_id, md, _version in LedgerManager(store).iter_ledger_metadata(
            concurrency=METADATA_READ_CONCURRENCY):
        scanned += 1
        if only is not None and ledger_id not in only:
            continue
        if any(bookie_id in ensemble for _, ensemble in md.segments):
            marks.append((ledger_id, master_key(md.password) if md.password is not None else None))
            if not md.is_closed and not must_fence(md, bookie_id):
                unfenced.add(ledger_id)
    return marks, unfenced, scanned


async def run_phase_one(store, bookie, bookie_id: str, why: str, only: set[int] | None = None) -> PhaseOneResult:
    """Put this bookie's ledgers (those in `only`, when given) in limbo and fence those that
    must be fenced, durably (one checkpoint)."""
    t0 = time.monotonic()
    log.warning("bookie %s may have lost data (%s): phase one, putting %s in limbo and fencing those its"
                " crash could harm, before it serves", bookie_id, why,
                "its ledgers" if only is None else f"the {len(only)} ledgers with lost entries")
    marks, unfenced, scanned = await ledgers_of_bookie(store, bookie_id, only)
    count = await bookie.mark_for_integrity_check(marks, unfenced=unfenced)
    result = PhaseOneResult(count, scanned, time.monotonic() - t0, ledgers_fenced=count - len(unfenced))
    log.warning("phase one done: %d of %d ledgers fenced and in limbo, %d more in limbo unfenced (open, their"
                " last ensemble left this bookie), in %.2fs; the bookie repairs them from its peers once it serves",
                result.ledgers_fenced, scanned, len(unfenced), result.elapsed_s)
    return result
