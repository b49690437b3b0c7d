"""GarbageCollector: the bookie's GC thread (BookKeeper's GarbageCollectorThread).

Every `gc_wait_time_ms`, or when triggered, one pass:
  1. finish any compaction a crash interrupted (EntryLogCompactor.finish_pending);
  2. learn the usage of entry logs closed since the last pass (their ledgers map,
     or a scan when it is missing or corrupt: EntryLogMetadata, bk.entrylog.usage);
  3. scan and compare: take the set of local ledgers FIRST, then ask the policy
     (bk.server.gc_policy, which reads the metadata store) which of them are
     garbage; delete those locally (owner thread), then checkpoint and sync the
     index, so the deletions are durable before any byte of them is;
  4. drop deleted ledgers from every log's usage; delete whole logs with no live
     ledger left (a ledger counts as dead only when neither the in-memory state
     nor the committed index has it);
  5. major compaction if due (or forced), else minor if due (or forced): logs whose
     usage is under the threshold, emptiest first.
The policy is optional (no metadata store: step 3 is skipped) and duck-typed:
`async find_garbage(local_ledgers: set[int], delete) -> dict` runs on the event loop
and calls `await delete(ids)` for the ledgers it proved dead (ids outside
local_ledgers are ignored); `delete` forgets them on the owner thread and returns
once that is checkpointed. The dict may hold "over_replicated" (ids) and "errors".

Control (any thread, JSON-able results; the admin channel and a later HTTP endpoint
call these): `trigger(force_major=, force_minor=)` runs a pass now and returns its
figures, `status()` the last pass and totals, `entry_log_usage()` each log's usage.

Disks full (every ledger dir over disk_usage_threshold): with
is_force_gc_allow_when_no_space, passes run every disk_check_interval_ms with
compaction forced, so a read-only bookie frees space and becomes writable again;
without it compaction is suspended (it writes before it frees) and GC still runs.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Callable

from bk import metrics
from bk.formats.entrylog import LOG_HEADER_BYTES, LOG_SIZE_FIELD_BYTES
from bk.entrylog.usage import EntryLogMetadata
from bk.errors import BKError

from .compactor import EntryLogCompactor

log = logging.getLogger(__name__)

STATUS_KEYS = ("last_run_start_ms", "last_run_duration_ms", "passes", "bytes_freed", "logs_deleted",
               "logs_compacted", "ledgers_deleted", "errors")


class _Paused:
    """Time spent inside the GC's own work (a deletion's checkpoint) while the metadata
    scan runs: the scan's backstop counts only the rest, the store's time. The checkpoint
    is written on the loop thread and read by the GC thread (floats, under the GIL)."""

    def __init__(self):
        self.total = 0.0
        self._since: float | None = None

    def __enter__(self):
        self._since = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.total += time.monotonic() - self._since
        self._since = None

    def __call__(self) -> float:
        since = self._since
        return self.total + (time.monotonic() - since if since is not None else 0.0)


class _Request:
    def __init__(self, force_major: bool, force_minor: bool, only_logs: tuple[int, ...] | None = None):
        self.force_major = force_major
        self.force_minor = force_minor
        self.only_logs = only_logs  # compact exactly these logs (a plan), not by threshold
        self.done = threading.Event()
        self.result: dict | None = None


class GarbageCollector:
    def __init__(self, storage, config, policy=None):
        self.storage = storage
        self.config = config
        self.policy = policy
        self.compactor = EntryLogCompactor(storage, config.compaction_rate_bytes_per_s)
        # Crash tests stop the process at a GC step ("after_ledger_delete",
        # "after_whole_log_delete") and the compactor's steps.
        self.step_hook: Callable[[str, int], None] = lambda step, log_id: None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._logs: dict[int, EntryLogMetadata] = {}
        self._indexed: set[int] = set()  # damaged logs whose live ledgers the index has told
        self._lock = threading.Lock()  # guards _logs (read by entry_log_usage), _requests, _status
        self._requests: list[_Request] = []
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._pass_lock = threading.Lock()  # one pass at a time (the thread, or run_pass in tests)
        now = time.monotonic()
        self._last_major_s = now
        self._last_minor_s = now
        # BookKeeper's suspendMajorGC / suspendMinorGC (HTTP gc/suspend_compaction): a suspended
        # kind is never chosen, forced or due, until resumed; GC itself (deletions) goes on.
        self.suspend_major = False
        self.suspend_minor = False
        # BookKeeper's GarbageCollectionStatus fields (gc_details); times are epoch ms.
        self._bk = {"forceCompacting": False, "majorCompacting": False, "minorCompacting": False,
                    "lastMajorCompactionTime": 0, "lastMinorCompactionTime": 0,
                    "majorCompactionCounter": 0, "minorCompactionCounter": 0}
        self._status = {"enabled": True, "running": False, "last_run_start_ms": None, "last_run_duration_ms": None,
                        "last_pass": None, "passes": 0, "bytes_freed": 0, "logs_deleted": 0, "logs_compacted": 0,
                        "ledgers_deleted": 0, "errors": 0, "last_error": None}

    # ------------------------------------------------------------ lifecycle
    def start(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="bk-gc", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current batch; an interrupted compaction is finished at the next start."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            for req in self._requests:
                req.result = {"ok": False, "error": "the bookie is stopping"}
                req.done.set()
            self._requests.clear()

    def _run(self) -> None:
        cfg = self.config
        try:
            if self.compactor.pending():  # a crash interrupted a compaction: finish it now
                self._wake.set()
        except BKError as e:
            log.error("GC: cannot read the compacting markers: %s", e)
        while not self._stopping:
            self._wake.wait(self._next_wait_s())
            self._wake.clear()
            if self._stopping:
                break
            with self._lock:
                requests, self._requests = self._requests, []
            plain = [r for r in requests if r.only_logs is None]
            if plain or not requests:
                result = self.run_pass(force_major=any(r.force_major for r in plain),
                                       force_minor=any(r.force_minor for r in plain), forced=bool(plain))
                for req in plain:
                    req.result = result
                    req.done.set()
            for req in requests:  # each plan runs its own pass (its figures are its own)
                if req.only_logs is not None and not self._stopping:
                    req.result = self.run_pass(only_logs=req.only_logs, forced=True)
                    req.done.set()
        log.debug("GC thread stopped (gc_wait_time_ms=%d)", cfg.gc_wait_time_ms)

    def _next_wait_s(self) -> float:
        wait_s = self.config.gc_wait_time_ms / 1000.0
        if self.config.is_force_gc_allow_when_no_space and self._disks_full():
            wait_s = min(wait_s, self.config.disk_check_interval_ms / 1000.0)
        return wait_s

    # ------------------------------------------------------------ control (any thread)
    def trigger(self, force_major: bool = False, force_minor: bool = False, timeout_s: float | None = None) -> dict:
        """Run a pass now (blocking until it ends) and return its figures. A pass
        already running finishes first; requests made meanwhile share the next one."""
        return self._request(_Request(force_major, force_minor), timeout_s)

    def compact_logs(self, log_ids, timeout_s: float | None = None) -> dict:
        """Run a pass that compacts exactly `log_ids` (a compaction plan, bk analytics gc)
        instead of the logs under a threshold: first the pass's usual steps (finish
        interrupted compactions, scan and compare, whole empty logs), so deleted ledgers
        are gone from the index and their bytes are not copied; then each listed log
        through the same safe compaction. The figures add `plan`: per requested log,
        "compacted", "deleted" (it had no live ledger left), "not found" (already gone,
        or never this bookie's), "current" (the log being written: never compacted),
        "error" or "stopped"."""
        ids = tuple(sorted({int(i) for i in log_ids}))
        if any(i < 0 for i in ids):
            raise ValueError("log ids are non-negative")
        return self._request(_Request(False, False, ids), timeout_s)

    def _request(self, req: _Request, timeout_s: float | None) -> dict:
        if self._thread is None:
            return self.run_pass(force_major=req.force_major, force_minor=req.force_minor, forced=True,
                                 only_logs=req.only_logs)
        with self._lock:
            self._requests.append(req)
        self._wake.set()
        if not req.done.wait(timeout_s):
            return {"ok": False, "error": f"no GC pass finished within {timeout_s}s (it goes on)"}
        return req.result

    def suspend_compaction(self, major: bool = False, minor: bool = False) -> None:
        self.suspend_major = self.suspend_major or major
        self.suspend_minor = self.suspend_minor or minor

    def resume_compaction(self, major: bool = False, minor: bool = False) -> None:
        self.suspend_major = self.suspend_major and not major
        self.suspend_minor = self.suspend_minor and not minor

    def status(self) -> dict:
        """BookKeeper's GarbageCollectionStatus fields first (ledgerDir: the ledger dirs this
        one collector serves, comma-separated), then bk's own figures."""
        with self._lock:
            out = {"ledgerDir": ",".join(self.config.ledger_dirs), **self._bk}
            out.update(self._status)
            out["entry_logs"] = len(self._logs)
        out["damaged_logs"] = self.damaged_logs()
        out.setdefault("candidates_left", None)  # scan and compare: candidates not yet verified or deleted
        out["compacting_logs"] = self.compactor.pending()
        out["settings"] = {k: getattr(self.config, k) for k in (
            "gc_wait_time_ms", "gc_over_replicated_ledger_wait_time_ms", "verify_metadata_on_gc",
            "minor_compaction_threshold", "minor_compaction_interval_s", "major_compaction_threshold",
            "major_compaction_interval_s", "compaction_rate_bytes_per_s", "is_force_gc_allow_when_no_space")}
        return out

    def entry_log_usage(self) -> list[dict]:
        """Each closed log's usage as this bookie knows it (deleted ledgers removed),
        plus the current log from memory; the rows of bk.entrylog.usage."""
        with self._lock:
            rows = [m.to_dict() for _, m in sorted(self._logs.items())]
        el = self.storage.entry_logger
        cur = el.current_log_id
        if cur is not None and all(r["log_id"] != cur for r in rows):
            try:
                rows.append(el.log_metadata(cur).to_dict())
            except BKError:
                pass
        return rows

    # ------------------------------------------------------------ one pass
    def run_pass(self, force_major: bool = False, force_minor: bool = False, forced: bool = False,
                 only_logs: tuple[int, ...] | None = None) -> dict:
        with self._pass_lock:
            with self._lock:
                self._status["running"] = True
                self._bk["forceCompacting"] = forced
            try:
                return self._pass(force_major, force_minor, forced, only_logs)
            finally:
                with self._lock:
                    self._status["running"] = False
                    self._bk["forceCompacting"] = False

    def _pass(self, force_major: bool, force_minor: bool, forced: bool, only_logs=None) -> dict:
        t0_ms, t0 = int(time.time() * 1000), time.monotonic()
        out = {"ok": True, "start_ms": t0_ms, "ledgers_deleted": [], "over_replicated_deleted": [],
               "logs_deleted": [], "logs_compacted": [], "compaction": None, "bytes_freed": 0,
               "bytes_freed_by_compaction": 0,
               "bytes_rewritten": 0, "errors": []}
        stop = lambda: self._stopping  # noqa: E731
        try:
            for r in self.compactor.finish_pending(self._is_live, stop):
                self._account_compaction(r, out)
            self._learn_logs()
            if self.policy is not None:
                self._scan_and_compare(out)
            self._drop_dead_ledgers()
            self._ask_index_about_damaged_logs()
            self._delete_empty_logs(out)
            if only_logs is None:
                self._compact(force_major, force_minor, forced, out, stop)
            else:
                self._compact_listed(only_logs, out, stop)
        except BKError as e:  # storage trouble: report it, the next pass tries again
            out["errors"].append(f"{type(e).__name__}: {e}")
            log.error("GC pass failed: %s", e)
        except Exception as e:  # a bug: keep the thread alive, say where
            out["errors"].append(f"{type(e).__name__}: {e}")
            log.exception("GC pass failed")
        out["duration_ms"] = int((time.monotonic() - t0) * 1000)
        out["ok"] = not out["errors"]
        self._record(out)
        return out

    def _record(self, out: dict) -> None:
        st = self._status
        with self._lock:
            st["last_run_start_ms"] = out["start_ms"]
            st["last_run_duration_ms"] = out["duration_ms"]
            st["last_pass"] = {k: (len(v) if isinstance(v, list) and k != "errors" else v) for k, v in out.items()}
            st["passes"] += 1
            st["bytes_freed"] += out["bytes_freed"]
            st["logs_deleted"] += len(out["logs_deleted"])
            st["logs_compacted"] += len(out["logs_compacted"])
            st["ledgers_deleted"] += len(out["ledgers_deleted"])
            st["errors"] += len(out["errors"])
            if out["errors"]:
                st["last_error"] = out["errors"][-1]
            active = (len(self._logs), sum(m.live_bytes for m in self._logs.values()))
        metrics.record_gc_pass(out, *active)
        log.info("GC pass: %d ledgers deleted (%d over-replicated), %d logs deleted, %d logs compacted (%s), "
                 "%d bytes freed, %d bytes rewritten, %d errors, %d ms",
                 len(out["ledgers_deleted"]), len(out["over_replicated_deleted"]), len(out["logs_deleted"]),
                 len(out["logs_compacted"]), out["compaction"] or "no compaction", out["bytes_freed"],
                 out["bytes_rewritten"], len(out["errors"]), out["duration_ms"])

    def _is_dead(self, ledger_id: int) -> bool:
        """The one rule, for whole-log deletion and compaction alike: a ledger is dead
        only when it is gone from memory AND from the committed index. A delete whose
        checkpoint failed (a full disk) is gone from memory only: its entries are still
        named by the index, a restart brings it back, so its bytes are kept."""
        return self.storage.get_ledger(ledger_id) is None and self.storage.index.get_ledger(ledger_id) is None

    def _is_live(self, ledger_id: int) -> bool:
        return not self._is_dead(ledger_id)

    def _learn_logs(self) -> None:
        el = self.storage.entry_logger
        closed = el.closed_log_ids()
        with self._lock:
            for gone in set(self._logs) - set(closed):
                del self._logs[gone]
                self._indexed.discard(gone)
            known = set(self._logs)
        for log_id in closed:
            if log_id in known:
                continue
            try:
                meta = el.log_metadata(log_id)
            except BKError as e:
                log.warning("GC: cannot read the usage of entry log %x: %s", log_id, e)
                continue
            if meta.damaged:
                log.error("GC: entry log %x is damaged (%s): it is never deleted or compacted on what its "
                          "records say; the index decides what is live in it", log_id, meta.damage)
            with self._lock:
                self._logs[log_id] = meta

    def _scan_and_compare(self, out: dict) -> None:
        storage = self.storage
        # The local set is taken before the metadata is read: a ledger created
        # after this moment is not a candidate, whatever the metadata says.
        local = frozenset(storage.run_on_owner(storage.ledger_ids))
        forgotten: list[int] = []  # forgotten on the owner thread (loop), in order
        durable = [0]  # forgotten[:durable[0]] are checkpointed and synced
        checkpointing = _Paused()

        async def delete(ids: list[int]) -> list[int]:
            """On the loop (the owner thread): forget the ledgers, then make it durable.
            The policy calls it once per verified batch, so each batch frees its ledgers."""
            ids = sorted((set(ids) & local).difference(forgotten))
            if not ids:
                return []
            for lid in ids:
                storage.delete_ledger(lid)
            forgotten.extend(ids)
            # Shielded: a cancelled scan (stop, backstop) leaves the checkpoint running;
            # the GC thread then makes the deletions durable itself before going on.
            with checkpointing:
                await asyncio.shield(asyncio.to_thread(self._make_durable))
            durable[0] = len(forgotten)
            self.step_hook("after_ledger_delete", -1)
            return ids

        timeout_s = self.config.gc_metadata_timeout_ms / 1000.0
        found: dict = {}
        try:
            # A backstop only: the policy keeps to its own budget (10 call timeouts) and
            # still deletes what it verified when that runs out. It counts the store's time,
            # not the checkpoints of the deletions: on a loaded disk those may be long, and
            # a backstop that fired on them would throw away the pass's count of what is left.
            found = self._on_loop(self.policy.find_garbage(set(local), delete), timeout_s * 20,
                                  paused=checkpointing)
        except Exception as e:  # store error, timeout, session loss: nothing more is garbage
            out["errors"].append(f"metadata scan failed: {type(e).__name__}: {e}")
            log.warning("GC: metadata scan failed; no (further) ledger deleted this pass: %s", e)
        if durable[0] < len(forgotten):  # cut off during a checkpoint: finish it before any byte goes
            self._make_durable()
        deleted = sorted(forgotten)
        out["errors"] += found.get("errors", [])
        out["ledgers_deleted"] = deleted
        out["over_replicated_deleted"] = sorted(set(found.get("over_replicated", ())) & set(deleted))
        out["candidates_left"] = left = found.get("candidates_left")
        if left is not None:  # unknown when the listing failed: the last count stands
            with self._lock:
                self._status["candidates_left"] = left
        if deleted or left:
            log.info("GC: deleted %d ledgers: %s; %s candidates left for the next pass", len(deleted), deleted[:20],
                     "unknown" if left is None else left)

    def _make_durable(self) -> None:
        """The forgotten ledgers' state reaches the index, durably, and the journals'
        marks lie after their records (LedgerStorage.checkpoint_deletions): after this
        no committed location names their entries and no replay brings them back,
        even after a power cut."""
        self.storage.checkpoint_deletions()

    def _on_loop(self, coro, timeout_s: float, paused: Callable[[], float] = lambda: 0.0):
        """Run coro on the loop; raise on stop or after timeout_s (not counting the time
        `paused` reports), once it has ended (a cancelled scan must not go on deleting
        while this thread goes on)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            raise RuntimeError("no event loop to reach the metadata store")
        ended, cut = threading.Event(), threading.Event()
        task: list[asyncio.Task] = []

        async def run():
            try:
                if cut.is_set():  # cut before it started
                    coro.close()
                    raise asyncio.CancelledError()
                task.append(asyncio.current_task())
                return await coro
            finally:
                ended.set()

        def cancel() -> None:  # on the loop
            cut.set()
            if task:
                task[0].cancel()
        fut = asyncio.run_coroutine_threadsafe(run(), loop)
        deadline = time.monotonic() + timeout_s
        # Polled (not fut.result(timeout)): the coroutine's own TimeoutError must not
        # read as "not done yet", and a stopping bookie must not wait for the scan.
        while not concurrent.futures.wait([fut], timeout=0.2).done:
            if self._stopping or time.monotonic() >= deadline + paused():
                try:
                    loop.call_soon_threadsafe(cancel)
                except RuntimeError:  # the loop closed: nothing runs there any more
                    pass
                while not ended.wait(0.2) and loop.is_running():
                    pass
                raise TimeoutError("the bookie is stopping" if self._stopping
                                   else f"metadata scan took over {timeout_s:.0f}s")
        return fut.result()

    def _drop_dead_ledgers(self) -> None:
        dead: dict[int, bool] = {}

        def is_dead(lid: int) -> bool:
            if lid not in dead:
                dead[lid] = self._is_dead(lid)
            return dead[lid]
        with self._lock:
            metas = list(self._logs.values())
        for meta in metas:
            meta.remove_ledgers_if(is_dead)

    def _ask_index_about_damaged_logs(self) -> None:
        """A damaged log's scan saw only the ledgers before its damage. What is live in
        it is what the index places there: one walk of the index for the damaged logs
        not yet looked up gives their ledgers and, read from each record's size field,
        their bytes. Nothing new is ever placed in a closed log, so the answer only
        shrinks (by deleted ledgers) and is asked once per log; a whole-log deletion
        asks again (_delete_empty_logs)."""
        with self._lock:
            todo = {log_id: m for log_id, m in self._logs.items() if m.damaged and log_id not in self._indexed}
        if not todo:
            return
        el = self.storage.entry_logger
        # streamed, per log and ledger: entries and record bytes (bounded memory: a damaged
        # 1 GiB log of small entries holds millions of locations)
        indexed: dict[int, dict[int, int]] = {log_id: {} for log_id in todo}
        entries = dict.fromkeys(todo, 0)
        chunk: list[tuple[int, int]] = []

        def account() -> None:
            for (lid, loc), size in zip(chunk, el.record_sizes([loc for _, loc in chunk])):
                per_ledger = indexed[loc >> 32]
                per_ledger[lid] = per_ledger.get(lid, 0) + LOG_SIZE_FIELD_BYTES + (size or 0)
                entries[loc >> 32] += 1
            chunk.clear()
        for lid, _eid, loc in self.storage.index.iter_locations_in_logs(todo):
            chunk.append((lid, loc))
            if len(chunk) >= 4096:
                account()
        account()
        for log_id, meta in todo.items():
            # a ledger the scan saw and the index does not place here is kept while it lives
            ledgers = {lid: n for lid, n in meta.ledgers.items() if not self._is_dead(lid)}
            ledgers.update(indexed[log_id])
            total = max(0, el.log_file_bytes(log_id) - LOG_HEADER_BYTES)
            with self._lock:
                meta.ledgers = ledgers
                meta.total_bytes = max(total, sum(ledgers.values()))
                self._indexed.add(log_id)
            log.info("GC: damaged entry log %x holds %d entries of %d ledgers by the index", log_id,
                     entries[log_id], len(indexed[log_id]))

    def damaged_logs(self) -> dict[str, str]:
        """Hex log id -> how its damage was found, for the logs GC knows (gcstatus)."""
        with self._lock:
            return {f"{log_id:x}": m.damage for log_id, m in sorted(self._logs.items()) if m.damaged}

    def _delete_empty_logs(self, out: dict) -> None:
        el = self.storage.entry_logger
        with self._lock:
            empty = [log_id for log_id, m in self._logs.items() if m.is_empty()]
            damaged = [log_id for log_id, m in self._logs.items() if m.damaged and not m.ledgers]
        if damaged:  # the index's answer is asked again right before deleting: it must be "nothing"
            for log_id, named in self.storage.index.count_locations_in_logs(damaged).items():
                if named:
                    log.error("GC: damaged entry log %x kept: the index still places %d entries in it",
                              log_id, named)
                    with self._lock:
                        self._indexed.discard(log_id)  # look it up again next pass
                else:
                    empty.append(log_id)
        for log_id in sorted(empty):
            size = el.log_file_bytes(log_id)
            if el.delete_log(log_id):
                out["logs_deleted"].append(log_id)
                out["bytes_freed"] += size
            with self._lock:
                self._logs.pop(log_id, None)
                self._indexed.discard(log_id)
            self.step_hook("after_whole_log_delete", log_id)

    def _disks_full(self) -> bool:
        usage = self.storage.entry_logger.disk_usage().values()
        return bool(usage) and all(u.usage > self.config.disk_usage_threshold for u in usage)

    def _compact(self, force_major: bool, force_minor: bool, forced: bool, out: dict, stop) -> None:
        cfg = self.config
        now = time.monotonic()
        major_on = cfg.major_compaction_threshold > 0 and cfg.major_compaction_interval_s > 0
        minor_on = cfg.minor_compaction_threshold > 0 and cfg.minor_compaction_interval_s > 0
        full = self._disks_full()
        allow_full = full and cfg.is_force_gc_allow_when_no_space
        if full and not allow_full:
            log.warning("GC: every ledger dir is over disk_usage_threshold: compaction suspended "
                        "(is_force_gc_allow_when_no_space=false)")
            return
        if not self.suspend_major and (force_major or (major_on and (
                forced or allow_full or now - self._last_major_s >= cfg.major_compaction_interval_s))):
            kind, threshold = "major", cfg.major_compaction_threshold
        elif not self.suspend_minor and (force_minor or (minor_on and (
                forced or allow_full or now - self._last_minor_s >= cfg.minor_compaction_interval_s))):
            kind, threshold = "minor", cfg.minor_compaction_threshold
        else:
            return
        with self._lock:
            candidates = sorted((m.usage, log_id) for log_id, m in self._logs.items() if m.usage < threshold)
            self._bk[kind + "Compacting"] = True
        out["compaction"] = kind
        try:
            for _usage, log_id in candidates:
                if stop():
                    break
                r = self.compactor.compact(log_id, self._is_live, stop)
                self._account_compaction(r, out)
                with self._lock:
                    if r.deleted:
                        self._logs.pop(log_id, None)
        finally:
            with self._lock:
                self._bk[kind + "Compacting"] = False
                self._bk[kind + "CompactionCounter"] += 1
                self._bk["last" + kind.capitalize() + "CompactionTime"] = int(time.time() * 1000)
        if kind == "major":  # a major compaction covers the minor one too (BookKeeper)
            self._last_major_s = self._last_minor_s = time.monotonic()
        else:
            self._last_minor_s = time.monotonic()

    def _compact_listed(self, log_ids, out: dict, stop) -> None:
        """Compact exactly `log_ids` (emptiest first), each through the compactor's safe path."""
        out["compaction"] = "plan"
        plan = out["plan"] = {}
        full = self._disks_full()
        if full and not self.config.is_force_gc_allow_when_no_space:
            for log_id in log_ids:
                plan[log_id] = "suspended: every ledger dir is over disk_usage_threshold"
            return
        if self.suspend_major:  # a plan compacts at any usage: major compaction's kind
            for log_id in log_ids:
                plan[log_id] = "suspended: major compaction is suspended (gc/resume_compaction)"
            return
        current = self.storage.entry_logger.current_log_id
        with self._lock:
            known = {log_id: m.usage for log_id, m in self._logs.items()}
        for log_id in log_ids:
            if log_id in out["logs_deleted"]:
                plan[log_id] = "deleted"
            elif log_id == current:
                plan[log_id] = "current"
            elif log_id not in known:
                plan[log_id] = "not found"
        for log_id in sorted((i for i in log_ids if i not in plan), key=lambda i: (known[i], i)):
            if stop():
                plan[log_id] = "stopped"
                continue
            r = self.compactor.compact(log_id, self._is_live, stop)
            self._account_compaction(r, out)
            plan[log_id] = "compacted" if r.deleted else ("error" if r.error else "stopped")
            with self._lock:
                if r.deleted:
                    self._logs.pop(log_id, None)

    def _account_compaction(self, r, out: dict) -> None:
        out["bytes_rewritten"] += r.bytes_copied
        if r.deleted:
            out["logs_compacted"].append(r.log_id)
            freed = max(0, r.file_bytes_deleted - r.bytes_copied)
            out["bytes_freed"] += freed
            out["bytes_freed_by_compaction"] += freed
        if r.error:
            out["errors"].append(f"compaction of entry log {r.log_id:x}: {r.error}")
