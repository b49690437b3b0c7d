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

Progress with any backlog: candidates are verified in batches of
gc_over_replicated_ledger_max_concurrent_requests reads at once, and each batch's
proven-dead ledgers are deleted (durably) before the next batch is read. The
metadata phase of a pass has a budget of PHASE_BUDGET_CALLS metadata-call timeouts
(300 s by default); when it runs out, what the batch in flight already proved dead
is still deleted, the rest is left, and the next pass starts where this one stopped
(so ledgers whose reads keep failing cannot starve the others). A batch in which
every read failed ends the phase too: the store is down, the next pass tries again.
"""
from __future__ import annotations

import asyncio
import bisect
import logging
import time
from typing import Awaitable, Callable

from bk.errors import BKError, NoSuchLedgerMetadataError
from bk.meta.ledger_manager import LedgerManager
from bk.meta.underreplication import LedgerUnderreplicationManager

log = logging.getLogger(__name__)

PHASE_BUDGET_CALLS = 10  # the metadata phase of a pass may last this many call timeouts
ERRORS_LISTED = 10  # per pass, further read failures are counted in one line

GONE, LIVE, FAILED = "gone", "live", "failed"


def _rotate(ids: list[int], start_at: int | None) -> list[int]:
    """Sorted `ids`, starting at the first >= start_at and wrapping around."""
    if start_at is None:
        return ids
    i = bisect.bisect_left(ids, start_at)
    return ids[i:] + ids[:i]


class _Failures:
    """A pass's read failures: the first few spelled out, the rest counted."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        self.count = 0

    def add(self, message: str) -> None:
        self.count += 1
        if self.count <= ERRORS_LISTED:
            self.errors.append(message)

    def close(self, what: str) -> None:
        if self.count > ERRORS_LISTED:
            self.errors.append(f"{self.count - ERRORS_LISTED} more {what} (not listed)")


class ScanAndCompareGarbageCollector:
    def __init__(self, store, config, bookie_id: str):
        self.config = config
        self.bookie_id = bookie_id
        self.ledger_manager = LedgerManager(store)
        self.underreplication = LedgerUnderreplicationManager(store)
        self.timeout_s = config.gc_metadata_timeout_ms / 1000.0
        self.budget_s = self.timeout_s * PHASE_BUDGET_CALLS
        self.batch = max(1, config.gc_over_replicated_ledger_max_concurrent_requests)
        self._over_replicated_wait_s = config.gc_over_replicated_ledger_wait_time_ms / 1000.0
        self._last_over_replicated_check = time.monotonic()
        self._resume_at: int | None = None  # the candidate the last cut-short pass did not reach
        self._over_resume_at: int | None = None  # same for an over-replication sweep cut short

    async def _call(self, coro, timeout_s: float | None = None):
        """The call's result, or TimeoutError after gc_metadata_timeout_ms. Unlike
        asyncio.wait_for this does not wait for the abandoned call to finish
        cancelling (a store call stuck on a dead connection may not, for a while)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # no "never retrieved"
            raise asyncio.TimeoutError(f"metadata store call took over {timeout_s:.1f}s")
        return task.result()

    async def find_garbage(self, local: set[int], delete: Callable[[list[int]], Awaitable[list[int]]]) -> dict:
        """Delete (through `delete`) the local ledgers proven dead; returns what was done:
        ledgers deleted, over_replicated (ids), candidates (this pass), kept (their
        metadata exists), candidates_left (neither deleted nor proven live: not reached
        or unreadable; the next pass goes on with them), errors.

        Raises when the listing fails (the caller deletes nothing then)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.budget_s
        listed = set(await self._call(self.ledger_manager.list_ledger_ids(), self.budget_s))
        candidates = sorted(local - listed)
        errors: list[str] = []
        verdicts = await self._collect(candidates, delete, deadline, errors)
        deleted = [lid for lid in candidates if verdicts.get(lid) == GONE]
        kept = sum(1 for v in verdicts.values() if v == LIVE)
        left = len(candidates) - len(deleted) - kept
        if candidates:
            log.info("GC: %d candidates (local ledgers missing from the metadata listing): %d deleted, "
                     "%d have metadata (kept), %d left for the next pass", len(candidates), len(deleted), kept, left)
        over: list[int] = []
        if self._over_replicated_due():
            if loop.time() < deadline:
                over = await self._remove_over_replicated(sorted(local & listed), delete, errors, deadline)
            else:
                log.info("GC: over-replication check postponed: the metadata phase used its budget")
        return {"ledgers": deleted + over, "over_replicated": over, "candidates": len(candidates),
                "kept": kept, "candidates_left": left, "errors": errors}

    async def _collect(self, candidates: list[int], delete, deadline: float, errors: list[str]) -> dict[int, str]:
        """Verify and delete batch by batch; returns each reached candidate's verdict
        (GONE = deleted, LIVE = its metadata exists, FAILED = unreadable, kept)."""
        verdicts: dict[int, str] = {}
        failures = _Failures(errors)
        order = _rotate(candidates, self._resume_at)
        self._resume_at = None
        loop = asyncio.get_running_loop()
        for start in range(0, len(order), self.batch):
            batch = order[start:start + self.batch]
            if loop.time() >= deadline:
                self._resume_at = batch[0]
                log.warning("GC: the metadata phase used its budget (%.0f s); %d candidates not reached this pass",
                            self.budget_s, len(order) - start)
                break
            if self.config.verify_metadata_on_gc:
                answers = await self._verify(batch, deadline, failures)
            else:
                answers = dict.fromkeys(batch, GONE)
            garbage = [lid for lid in batch if answers.get(lid) == GONE]
            # Deleted even when the budget ran out during the reads: a verified verdict is never thrown away.
            done = set(await delete(garbage)) if garbage else set()
            for lid in batch:
                answer = answers.get(lid)
                if answer == GONE:
                    answer = GONE if lid in done else FAILED
                if answer is not None:
                    verdicts[lid] = answer
            unanswered = [lid for lid in batch if lid not in answers]
            if unanswered:
                self._resume_at = unanswered[0]
                log.warning("GC: the metadata phase used its budget (%.0f s) while verifying; %d candidates "
                            "not reached this pass", self.budget_s, len(order) - start - len(batch) + len(unanswered))
                break
            if all(a == FAILED for a in answers.values()) and start + len(batch) < len(order):
                self._resume_at = order[start + len(batch)]
                errors.append(f"every metadata read of a batch of {len(batch)} candidates failed: "
                              f"{len(order) - start - len(batch)} more candidates left for the next pass")
                break
        failures.close("candidates kept: their metadata could not be read")
        return verdicts

    async def _verify(self, batch: list[int], deadline: float, failures: _Failures) -> dict[int, str]:
        """Read the batch's metadata at once; the answers that came before the deadline."""
        loop = asyncio.get_running_loop()
        tasks = {asyncio.ensure_future(self._verdict(lid, failures)): lid for lid in batch}
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
        for task in pending:
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return {tasks[t]: t.result() for t in done}

    async def _verdict(self, ledger_id: int, failures: _Failures) -> str:
        """GONE only when the store answers that the ledger has no metadata."""
        try:
            await self._call(self.ledger_manager.read_ledger_metadata(ledger_id))
        except NoSuchLedgerMetadataError:
            return GONE
        except (BKError, asyncio.TimeoutError, OSError) as e:
            failures.add(f"ledger {ledger_id} kept: its metadata could not be read ({type(e).__name__}: {e})")
            if failures.count <= ERRORS_LISTED:
                log.warning("GC: ledger %d missing from the listing but its metadata read failed (%s); kept",
                            ledger_id, e)
            return FAILED
        log.info("GC: ledger %d missing from the listing but its metadata exists; kept", ledger_id)
        return LIVE

    # ------------------------------------------------------------ over-replicated copies
    def _over_replicated_due(self) -> bool:
        return self._over_replicated_wait_s > 0 and (
            self._over_resume_at is not None
            or time.monotonic() - self._last_over_replicated_check >= self._over_replicated_wait_s)

    async def _remove_over_replicated(self, ledgers: list[int], delete, errors: list[str],
                                      deadline: float) -> list[int]:
        """One sweep over the local ledgers that have metadata, batch by batch; a sweep
        cut by the budget goes on at the next pass, a finished one waits the interval."""
        removed: list[int] = []
        failures = _Failures(errors)
        order = _rotate(ledgers, self._over_resume_at)
        self._over_resume_at = None
        loop = asyncio.get_running_loop()
        for start in range(0, len(order), self.batch):
            if loop.time() >= deadline:
                self._over_resume_at = order[start]
                break
            removed += await self._over_replicated_batch(order[start:start + self.batch], delete, failures)
        if self._over_resume_at is None:
            self._last_over_replicated_check = time.monotonic()
        failures.close("over-replication checks failed")
        if removed:
            log.info("GC: deleted %d over-replicated ledgers: %s", len(removed), removed[:20])
        return removed

    async def _over_replicated_batch(self, batch: list[int], delete, failures: _Failures) -> list[int]:
        # A first read without the lock (most ledgers are not over-replicated: no lock churn).
        suspects = [lid for lid, over in zip(batch, await asyncio.gather(
            *(self._is_over_replicated(lid, failures) for lid in batch))) if over]
        if not suspects:
            return []
        locked: list[int] = []
        try:
            confirmed = await asyncio.gather(*(self._lock_and_confirm(lid, locked, failures) for lid in suspects))
            doomed = [lid for lid, ok in zip(suspects, confirmed) if ok]
            # Deleted (durably) while this pass holds their locks.
            return await delete(doomed) if doomed else []
        finally:
            for lid in locked:
                try:
                    await self._call(self.underreplication.release_ledger_lock(lid))
                except (BKError, asyncio.TimeoutError, OSError) as e:  # the manager finds and releases it
                    log.warning("GC: releasing the replication lock of ledger %d: %s", lid, e)

    async def _is_over_replicated(self, ledger_id: int, failures: _Failures) -> bool:
        try:
            return self._over_replicated(await self._metadata(ledger_id))
        except NoSuchLedgerMetadataError:
            return False  # deleted meanwhile: the next pass's comparison handles it
        except (BKError, asyncio.TimeoutError, OSError) as e:
            failures.add(f"over-replication check of ledger {ledger_id} failed, kept: {type(e).__name__}: {e}")
            return False

    async def _lock_and_confirm(self, ledger_id: int, locked: list[int], failures: _Failures) -> bool:
        """Take the ledger's replication lock (a worker holding it may be copying the
        ledger, maybe here) and read the metadata again under it."""
        try:
            if not await self._call(self.underreplication.acquire_ledger_lock(ledger_id, f"gc-{self.bookie_id}")):
                return False
            locked.append(ledger_id)
            return await self._is_over_replicated(ledger_id, failures)
        except (BKError, asyncio.TimeoutError, OSError) as e:
            # A timed-out acquire may have created the lock: the manager finds and releases it.
            failures.add(f"over-replication check of ledger {ledger_id} failed, kept: {type(e).__name__}: {e}")
            return False

    async def _metadata(self, ledger_id: int):
        metadata, _version = await self._call(self.ledger_manager.read_ledger_metadata(ledger_id))
        return metadata

    def _over_replicated(self, metadata) -> bool:
        """Closed, and no ensemble of any segment names this bookie."""
        return metadata.is_closed and self.bookie_id not in metadata.bookies()

    async def close(self) -> None:
        await self.underreplication.close()
