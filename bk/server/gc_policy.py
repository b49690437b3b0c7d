"""Scan-and-compare GC policy (BookKeeper's ScanAndCompareGarbageCollector): which of
this bookie's ledgers may be deleted, decided against the metadata store.

It lives in server/ because it reads the metadata store (bookie/ may not import
meta/); the GC thread (bk.bookie.gc.GarbageCollector) calls `find_garbage` on the
event loop with the set of local ledgers it took BEFORE this reads any metadata,
and a `delete(ids)` coroutine that deletes ledgers locally and durably.

Rules (GC.md "Safety"):
- Only ledgers of that local set are candidates: a ledger created after the scan
  started is never one, whatever the metadata says.
- A candidate is a local ledger missing from the metadata listing; with
  verify_metadata_on_gc (default) its metadata is read again just before it is
  deleted and only "no such ledger" counts. Any other answer (a ZooKeeper error, a
  timeout, a session loss, bad data) keeps the ledger: apache/bookkeeper#4607 lost
  live data treating those as "deleted". A failed listing deletes nothing.
- Over-replicated copies (AutoRecovery moved the segment elsewhere): checked at
  most every gc_over_replicated_ledger_wait_time_ms (0 = never), for closed
  ledgers only, none being replicated right now; the ledger's replication lock
  is held from the last metadata read to the local deletion, so no replication
  worker can put this bookie back into an ensemble in between.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from bk.errors import BKError, NoSuchLedgerMetadataError
from bk.meta.ledger_manager import LedgerManager
from bk.meta.underreplication import LedgerUnderreplicationManager

log = logging.getLogger(__name__)


class ScanAndCompareGarbageCollector:
    def __init__(self, store, config, bookie_id: str):
        self.config = config
        self.bookie_id = bookie_id
        self.ledger_manager = LedgerManager(store)
        self.underreplication = LedgerUnderreplicationManager(store)
        self.timeout_s = config.gc_metadata_timeout_ms / 1000.0
        self._over_replicated_wait_s = config.gc_over_replicated_ledger_wait_time_ms / 1000.0
        self._last_over_replicated_check = time.monotonic()

    async def _call(self, coro):
        """The call's result, or TimeoutError after gc_metadata_timeout_ms. Unlike
        asyncio.wait_for this does not wait for the abandoned call to finish
        cancelling (a store call stuck on a dead connection may not, for a while)."""
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        if not done:
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # no "never retrieved"
            raise asyncio.TimeoutError(f"metadata store call took over {self.timeout_s:.1f}s")
        return task.result()

    async def find_garbage(self, local: set[int], delete: Callable[[list[int]], Awaitable[list[int]]]) -> dict:
        """Delete (through `delete`) the local ledgers proven dead; returns what was done.

        Raises when the listing fails (the caller deletes nothing then)."""
        listed = set(await self._call(self.ledger_manager.list_ledger_ids()))
        candidates = sorted(local - listed)
        errors: list[str] = []
        garbage: list[int] = []
        for lid in candidates:
            if not self.config.verify_metadata_on_gc or await self._gone(lid, errors):
                garbage.append(lid)
        deleted = await delete(garbage) if garbage else []
        over: list[int] = []
        if self._over_replicated_wait_s > 0 and \
                time.monotonic() - self._last_over_replicated_check >= self._over_replicated_wait_s:
            over = await self._remove_over_replicated(sorted(local & listed), delete, errors)
            self._last_over_replicated_check = time.monotonic()
        return {"ledgers": deleted + over, "over_replicated": over, "candidates": len(candidates),
                "kept": len(candidates) - len(deleted), "errors": errors}

    async def _gone(self, ledger_id: int, errors: list[str]) -> bool:
        """True only when the store answers that the ledger has no metadata."""
        try:
            await self._call(self.ledger_manager.read_ledger_metadata(ledger_id))
        except NoSuchLedgerMetadataError:
            return True
        except (BKError, asyncio.TimeoutError, OSError) as e:
            errors.append(f"ledger {ledger_id} kept: its metadata could not be read ({type(e).__name__}: {e})")
            log.warning("GC: ledger %d missing from the listing but its metadata read failed (%s); kept",
                        ledger_id, e)
            return False
        log.info("GC: ledger %d missing from the listing but its metadata exists; kept", ledger_id)
        return False

    async def _remove_over_replicated(self, ledgers: list[int], delete, errors: list[str]) -> list[int]:
        removed: list[int] = []
        holder = f"gc-{self.bookie_id}"
        for lid in ledgers:
            try:
                if not self._over_replicated(await self._metadata(lid)):
                    continue
                # A worker holding the lock may be copying the ledger (maybe here).
                if not await self._call(self.underreplication.acquire_ledger_lock(lid, holder)):
                    continue
                try:
                    if self._over_replicated(await self._metadata(lid)):  # read again under the lock
                        removed += await delete([lid])
                finally:
                    await self._call(self.underreplication.release_ledger_lock(lid))
            except NoSuchLedgerMetadataError:
                continue  # deleted meanwhile: the next pass's comparison handles it
            except (BKError, asyncio.TimeoutError, OSError) as e:
                errors.append(f"over-replication check of ledger {lid} failed, kept: {type(e).__name__}: {e}")
        if removed:
            log.info("GC: deleted %d over-replicated ledgers: %s", len(removed), removed[:20])
        return removed

    async def _metadata(self, ledger_id: int):
        metadata, _version = await self._call(self.ledger_manager.read_ledger_metadata(ledger_id))
        return metadata

    def _over_replicated(self, metadata) -> bool:
        """Closed, and no ensemble of any segment names this bookie."""
        return metadata.is_closed and self.bookie_id not in metadata.bookies()

    async def close(self) -> None:
        await self.underreplication.close()
