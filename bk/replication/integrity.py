"""DataIntegrityCheck: BP-46 phase two, a bookie repairing itself from its peers.

Started by BookieServer once the bookie serves and is registered, whenever the
index's needs-integrity-check flag is set (phase one set it, bk.server.integrity;
a repair cut short by a crash or a stop left it set, so it resumes at the next
boot). It has its own BookKeeper client (its own metadata session), like
AutoRecovery.

The ledgers: every ledger whose metadata names this bookie in a segment (closed
ones too), and every ledger the bookie holds in limbo. For each, `parallel`
at a time:
1. No metadata any more: the ledger was deleted; nobody reads it, limbo is cleared
   (GC reclaims its bytes).
2. Not closed, in limbo and fenced here (phase one fences exactly the open ledgers
   whose last ensemble named this bookie, BookKeeper's rule): open it with recovery
   (fences it on every bookie and closes it at the end the bookies agree on). A
   recovery that cannot decide (bookies in limbo that may have lost the tail) fails
   and is retried: the ledger stays open and in limbo, never closed short
   (bk.client.recovery). An open ledger in limbo but not fenced (its writer had moved
   to other bookies) is never recovered: its writer goes on; its segments naming this
   bookie all ended before phase one and are repaired by step 3.
3. For every segment naming this bookie that has an end, the entries whose write
   set holds this bookie and that it does not store are copied from the other
   members of the write set (digest verified, added to this bookie locally as
   recovery adds; bk.replication.replicator.EntryCopy). "Does not store" includes
   entries whose entry log was found missing or cut short at start
   (bk.bookie.log_check): the copy's new location replaces the dead one.
4. Limbo is cleared with a checkpoint that also makes the copied entries durable
   (Bookie.clear_limbo), so a cleared limbo never stands in front of an entry
   that a crash could still take.
A ledger that fails is retried with exponential backoff (peers down, recovery
undecided), without holding up the others. Once every ledger is done the
bookie-wide flag is cleared. Progress (`status()`) is published by the server
in the bookie's registration (`bk shell repairstatus`) and logged at the start
and the end with figures.

`local` is the Bookie (duck-typed: this layer does not import bk.bookie):
`missing_entries`, `clear_limbo`, `limbo_ledgers`, `is_limbo`, `is_fenced`, `add_entry_cb`
(copies are added straight into it, as recovery adds), `finish_integrity_check`, and
`log_check` (what the start found gone: `entries_lost` in the status).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Callable

from bk.eventloop import cancel_and_wait
from bk.errors import BKError, NoSuchLedgerMetadataError, ReplicationError

from .replicator import EntryCopy, RateLimiter, bookie_entries, ledger_digest, segment_bounds, write_set

log = logging.getLogger(__name__)
_OK = SimpleNamespace(rc=0)  # what EntryCopy reads of a successful answer


def _local_done(answered, err) -> None:
    answered(_OK if err is None else None, err)

RETRY_FIRST_S = 1.0
PROGRESS_EVERY_S = 1.0
LAST_ERRORS = 10


@dataclass
class RepairStatus:
    state: str = "idle"  # idle | running | done | stopped
    ledgers_total: int = 0
    ledgers_done: int = 0
    ledgers_recovered: int = 0  # open ledgers this repair closed by recovery
    entries_lost: int = 0  # entries found at start in entry logs that are missing or cut short
    entries_copied: int = 0
    bytes_copied: int = 0
    errors: int = 0  # failed attempts (each retried)
    last_errors: deque = field(default_factory=lambda: deque(maxlen=LAST_ERRORS))
    started_at: float | None = None  # wall clock (time.time)
    finished_at: float | None = None
    _t0: float = 0.0

    @property
    def ledgers_left(self) -> int:
        return self.ledgers_total - self.ledgers_done

    @property
    def elapsed_s(self) -> float:
        if self.started_at is None:
            return 0.0
        return (self.finished_at or time.time()) - self.started_at

    def as_dict(self) -> dict:
        return {"state": self.state, "ledgers_total": self.ledgers_total, "ledgers_done": self.ledgers_done,
                "ledgers_left": self.ledgers_left, "ledgers_recovered": self.ledgers_recovered,
                "entries_lost": self.entries_lost, "entries_copied": self.entries_copied, "bytes_copied": self.bytes_copied,
                "errors": self.errors, "last_errors": list(self.last_errors),
                "started_at": self.started_at, "finished_at": self.finished_at,
                "elapsed_s": round(self.elapsed_s, 3)}


class DataIntegrityCheck:
    def __init__(self, config, local, *, bookie_id: str | None = None, bk=None,
                 on_progress: Callable[[RepairStatus], None] | None = None,
                 retry_first_s: float = RETRY_FIRST_S):
        self.config = config
        self.local = local
        self.bookie_id = bookie_id or config.bookie_id
        self.bk = bk
        self._own_bk = bk is None
        self.on_progress = on_progress
        self.parallel = max(1, config.data_integrity_repair_parallel_ledgers)
        self.window = max(1, config.rereplication_entry_batch_size)
        rate = config.data_integrity_repair_rate_bytes_per_s
        self.limiter = RateLimiter(rate) if rate > 0 else None
        self.retry_first_s = retry_first_s
        self.retry_max_s = max(retry_first_s, config.data_integrity_repair_retry_max_s)
        self.status = RepairStatus()
        self._task: asyncio.Task | None = None
        self._attempts: dict[int, int] = {}  # failed attempts per ledger (any worker)
        self._last_progress = 0.0

    async def start(self) -> "DataIntegrityCheck":
        if self.bk is None:
            from bk.client import BookKeeper
            cfg = self.config
            self.bk = await BookKeeper.for_bookie(cfg).start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="bp46-repair")
        return self

    async def wait(self) -> RepairStatus:
        """Until every ledger is repaired (tests; the server does not wait)."""
        if self._task is not None:
            await asyncio.shield(self._task)
        return self.status

    @property
    def done(self) -> bool:
        return self.status.state == "done"

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self.status.state == "running":
            self.status.state = "stopped"
            log.warning("repair stopped with %d of %d ledgers left; it resumes at the next start",
                        self.status.ledgers_left, self.status.ledgers_total)
        if self._own_bk and self.bk is not None:
            await self.bk.close()
            self.bk = None

    # ------------------------------------------------------------ the run
    async def _run(self) -> None:
        st = self.status
        st.state, st.started_at = "running", time.time()
        found = getattr(self.local, "log_check", None)
        st.entries_lost = found.dead_entries if found is not None else 0
        ledgers = await self._with_retries("listing the ledgers to repair", self._ledgers)
        st.ledgers_total = len(ledgers)
        log.warning("repair starts: %d ledgers to check on bookie %s%s", len(ledgers), self.bookie_id,
                    f" ({st.entries_lost} entries lost with their entry logs)" if st.entries_lost else "")
        self._progress(force=True)
        queue: asyncio.Queue = asyncio.Queue()
        for ledger_id in ledgers:
            queue.put_nowait(ledger_id)
        left, all_done = set(ledgers), asyncio.Event()
        if not left:
            all_done.set()
        workers = [asyncio.ensure_future(self._worker(queue, left, all_done))
                   for _ in range(min(self.parallel, len(ledgers)))]
        try:
            await all_done.wait()
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        await self._with_retries("clearing the needs-integrity-check flag", self.local.finish_integrity_check)
        st.state, st.finished_at = "done", time.time()
        self._progress(force=True)
        log.warning("repair done: %d ledgers checked, %d closed by recovery, %d entries (%d bytes) copied from"
                    " peers in %.1fs (%.1f MB/s), %d failed attempts retried", st.ledgers_total,
                    st.ledgers_recovered, st.entries_copied, st.bytes_copied, st.elapsed_s,
                    st.bytes_copied / 1e6 / max(st.elapsed_s, 1e-9), st.errors)

    async def _ledgers(self) -> list[int]:
        me = self.bookie_id
        ids = set(self.local.limbo_ledgers())
        async for ledger_id, md, _ in self.bk.ledger_manager.iter_ledger_metadata(concurrency=256):
            if any(me in ensemble for _, ensemble in md.segments):
                ids.add(ledger_id)
        return sorted(ids)

    async def _with_retries(self, what: str, fn):
        delay = self.retry_first_s
        while True:
            try:
                return await fn()
            except BKError as e:
                self._error(None, f"{what}: {e}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_s)

    async def _worker(self, queue: asyncio.Queue, left: set, all_done: asyncio.Event) -> None:
        attempts = self._attempts
        loop = asyncio.get_running_loop()
        while True:
            ledger_id = await queue.get()
            try:
                await self._repair(ledger_id)
            except (BKError, OSError) as e:
                n = attempts[ledger_id] = attempts.get(ledger_id, 0) + 1
                delay = min(self.retry_first_s * 2 ** (n - 1), self.retry_max_s)
                self._error(ledger_id, f"{e} (attempt {n}; retrying in {delay:.0f}s)")
                loop.call_later(delay, queue.put_nowait, ledger_id)  # the others go on meanwhile
                continue
            left.discard(ledger_id)
            self.status.ledgers_done += 1
            self._progress()
            if not left:
                all_done.set()

    async def _repair(self, ledger_id: int) -> None:
        lm, me = self.bk.ledger_manager, self.bookie_id
        try:
            md, _ = await lm.read_ledger_metadata(ledger_id)
        except NoSuchLedgerMetadataError:
            await self.local.clear_limbo([ledger_id])  # deleted: no reader left to protect
            return
        if not md.is_closed and self.local.is_limbo(ledger_id) and self.local.is_fenced(ledger_id):
            if md.password is None:
                raise ReplicationError(f"ledger {ledger_id}: its metadata stores no password, so it cannot be"
                                       " recovered from here")
            log.info("repair: recovering open ledger %d", ledger_id)
            await self.bk.open_ledger(ledger_id, password=md.password, recovery=True)
            md, _ = await lm.read_ledger_metadata(ledger_id)
            self.status.ledgers_recovered += 1
        for index, (first, ensemble) in enumerate(md.segments):
            if me not in ensemble:
                continue
            _, last = segment_bounds(md, index)
            if last is None:  # the open end of a ledger not in limbo here: still its writer's
                continue
            mine = bookie_entries(first, last, md.ensemble_size, md.write_quorum_size, ensemble.index(me))
            missing = await asyncio.to_thread(self.local.missing_entries, ledger_id, mine)
            if missing:
                await self._copy(ledger_id, md, ensemble, missing)
        await self.local.clear_limbo([ledger_id])

    async def _copy(self, ledger_id: int, md, ensemble: tuple, missing: list[int]) -> None:
        me = self.bookie_id
        digest, key = ledger_digest(ledger_id, md)

        def replicas_for(entry_id: int) -> list[str]:
            return [b for b in write_set(md, ensemble, entry_id) if b != me]

        def on_bytes(nbytes: int) -> None:
            self.status.entries_copied += 1
            self.status.bytes_copied += nbytes
            self._progress()

        copy = EntryCopy(self.bk.pool, digest, key, missing, replicas_for, me, self.window, self.limiter, on_bytes,
                         store=partial(self._store_locally, ledger_id, key))
        try:
            await copy.start()
        finally:
            copy.cancel()

    def _store_locally(self, ledger_id: int, key: bytes, entry_id: int, body: bytes, answered) -> None:
        """A recovery add straight into this bookie (no round trip through its own listener)."""
        self.local.add_entry_cb(ledger_id, entry_id, bytes(body), key, True, _local_done, answered)

    # ------------------------------------------------------------ reporting
    def _error(self, ledger_id: int | None, message: str) -> None:
        self.status.errors += 1
        self.status.last_errors.append({"ledger_id": ledger_id, "error": message, "at": time.time()})
        log.warning("repair%s: %s", f" of ledger {ledger_id}" if ledger_id is not None else "", message)
        self._progress(force=True)

    def _progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_progress is None or (not force and now - self._last_progress < PROGRESS_EVERY_S):
            return
        self._last_progress = now
        try:
            self.on_progress(self.status)
        except Exception:  # a status display must not stop the repair
            log.exception("repair progress callback failed")
