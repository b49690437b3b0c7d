"""Operator switches of AutoRecovery (the shell's autorecovery, lostbookierecoverydelay,
whoisauditor, listunderreplicated, triggeraudit and decommissionbookie commands).

Everything here talks to the metadata store only; the Auditor and the workers
react through their watches:
- trigger an audit: write the lost-bookie delay with the value it has (the
  auditor reads a same-value write as "audit now", BookKeeper's protocol);
- decommission: the bookie must be down; trigger the audit, wait until no
  ledger's metadata names the bookie any more, then delete its cookie.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

from bk.errors import BKError, IncorrectParameterError, MetadataNotFoundError, NoSuchLedgerMetadataError
from bk.meta.cookie import CookieStore
from bk.meta.underreplication import LedgerUnderreplicationManager

from .election import current_auditor

log = logging.getLogger(__name__)


@dataclass
class UnderreplicatedInfo:
    ledger_id: int
    missing_replicas: tuple[str, ...]
    ctime_ms: int | None
    worker: str | None  # the bookie whose worker holds the lock


async def replication_status(urm: LedgerUnderreplicationManager) -> dict:
    return {
        "enabled": await urm.is_ledger_replication_enabled(),
        "auditor": await current_auditor(urm.store),
        "lost_bookie_recovery_delay_s": await urm.get_lost_bookie_recovery_delay(0),
        "underreplicated_ledgers": len(await urm.list_underreplicated_ledgers()),
    }


async def list_underreplicated(urm: LedgerUnderreplicationManager, *, missing_replica: str | None = None,
                               with_worker: bool = False) -> list[UnderreplicatedInfo]:
    out = []
    async for ledger_id in urm.iter_underreplicated_ledgers():
        info = await urm.get_ledger_unreplication_info(ledger_id)
        if info is None:
            continue  # replicated meanwhile
        if missing_replica is not None and missing_replica not in info.replicas:
            continue
        worker = await urm.lock_holder(ledger_id) if with_worker else None
        out.append(UnderreplicatedInfo(ledger_id, info.replicas, info.ctime_ms, worker))
    return out


async def trigger_audit(urm: LedgerUnderreplicationManager) -> int:
    """Ask the auditor for a full bookie audit now; returns the (unchanged) delay."""
    delay_s = await urm.get_lost_bookie_recovery_delay(0)
    await urm.set_lost_bookie_recovery_delay(delay_s)
    return delay_s


async def ledgers_using(bk, bookie_id: str) -> list[int]:
    """Ledgers whose metadata names `bookie_id` in some segment."""
    lm = bk.ledger_manager
    ids = await lm.list_ledger_ids()
    using = []
    for start in range(0, len(ids), 32):
        batch = ids[start:start + 32]
        answers = await asyncio.gather(*(lm.read_ledger_metadata(i) for i in batch), return_exceptions=True)
        for ledger_id, answer in zip(batch, answers):
            if isinstance(answer, NoSuchLedgerMetadataError):
                continue
            if isinstance(answer, BaseException):
                raise answer
            if bookie_id in answer[0].bookies():
                using.append(ledger_id)
    return using


async def decommission_bookie(bk, urm: LedgerUnderreplicationManager, bookie_id: str, *,
                              poll_s: float = 1.0, timeout_s: float | None = None,
                              on_progress: Callable[[int, int], None] | None = None) -> dict:
    """Re-replicate everything off a bookie that is down, through AutoRecovery, then delete its cookie.

    `on_progress(remaining_ledgers, initial_ledgers)` after each look."""
    if await bk.registration.registration(bookie_id) is not None:
        raise IncorrectParameterError(f"bookie {bookie_id} is registered (running): stop it before decommissioning")
    initial = await ledgers_using(bk, bookie_id)
    if initial:
        if await current_auditor(urm.store) is None:
            raise BKError("no auditor is running (AutoRecovery is not enabled on any bookie): "
                          f"use `bk shell recover {bookie_id}` instead")
        if not await urm.is_ledger_replication_enabled():
            raise BKError("replication is disabled: `bk shell autorecovery --enable` first")
        await trigger_audit(urm)
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    remaining = initial
    while True:
        if on_progress is not None:
            on_progress(len(remaining), len(initial))
        if not remaining:
            break
        if deadline is not None and loop.time() > deadline:
            raise BKError(f"bookie {bookie_id}: {len(remaining)} ledger(s) still use it after {timeout_s:g} s"
                          f" ({', '.join(map(str, remaining[:10]))}{' ...' if len(remaining) > 10 else ''})")
        await asyncio.sleep(poll_s)
        remaining = await ledgers_using(bk, bookie_id)
    cookie_deleted = True
    try:
        await CookieStore(bk.store).delete(bookie_id)
    except MetadataNotFoundError:
        cookie_deleted = False
    return {"bookie_id": bookie_id, "ledgers": len(initial), "cookie_deleted": cookie_deleted}
