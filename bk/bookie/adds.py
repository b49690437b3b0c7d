"""The bookie's add path (a part of Bookie: bk.bookie.bookie), its hottest Python code.

What the server hands the bookie is an AddRun: adds of one connection in arrival order,
each an Add-shaped record (fields flags, master_key, ledger_id, entry_id, body, in this
order: the codec's AddRequest and V3AddRequest are such records, so nothing is copied per
add), and whether the run is DEFERRED_SYNC. The bookie reads the records' fields by name;
only the scan kernel (bk/_native, scan_add_run) reads those five by position, which is why
their order is part of the record's contract. A lone add that is not DEFERRED_SYNC takes
`add_entry_cb`, the one-add primitive a run also falls back to per add: the same admission
for 40% less CPU than an AddRun of one (`python -m bench.lone_add`, docs/BENCHMARKS.md).

Every add is admitted by its ledger's descriptor (LedgerDescriptor.check_access, then
check_writable: BookKeeper's checkAccess / isFenced); nothing here compares keys or looks
at the fence itself. Rules kept (module docstring of bk.bookie.bookie for the rest):
- a ledger's first key is journaled before any entry of it is queued to the journal;
- every entry is in the write cache before its journal record is queued, and acknowledged
  only once its journal group is fsynced (journal on), a DEFERRED_SYNC one once queued;
- an add that had to wait for write-cache room is admitted again when it resumes (the
  ledger may have been fenced meanwhile).
"""
from __future__ import annotations

import asyncio
import logging
import struct
import time
from operator import attrgetter
from typing import NamedTuple, Sequence

from bk import metrics
from bk._native import load
from bk.errors import BadRequestError, BookieError, BookieReadOnlyError, TooManyRequestsError
from bk.journal import MASTER_KEY, meta_body
from bk.proto.constants import FLAG_RECOVERY_ADD
from bk.formats.wire import ENTRY_IDS_LAC

log = logging.getLogger(__name__)

_ENTRY_HEADER = ENTRY_IDS_LAC  # ledger id, entry id, piggybacked LAC
_ENTRY_ID, _BODY = attrgetter("entry_id"), attrgetter("body")
_scan_add_run = load("codec").scan_add_run


class Add(NamedTuple):
    """One add, as the bookie takes it. `flags` carries FLAG_RECOVERY_ADD (a recovery or
    re-replication add: it lands on a fenced ledger and on a read-only bookie); `body` is
    the digest-framed entry, whose first 24 bytes are ledger id, entry id and the writer's
    LAC. Records of other types with these five fields first, in this order, do as well."""

    flags: int
    master_key: bytes
    ledger_id: int
    entry_id: int
    body: bytes


class AddRun(NamedTuple):
    """Adds of one connection in arrival order (Add-shaped records; the completion hands the
    same objects back). `deferred_sync`: acknowledge once journaled, before the fsync (v3
    writeFlags DEFERRED_SYNC on every add of the run; FORCE_LEDGER waits for their fsync)."""

    adds: Sequence
    deferred_sync: bool = False


def _complete_future(fut: asyncio.Future, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)


def _run_done(run, err) -> None:
    """Journal completion of an add run: every accepted add at once."""
    cb, ctx, adds = run
    cb(ctx, adds, err)


def _one_done(one, err) -> None:
    """add_entry_cb completion of one add of a run."""
    cb, ctx, add = one
    cb(ctx, [add], err)


def _ignore(ctx, err) -> None:
    if err is not None:
        log.error("journal meta-record failed: %s", err)


class AddPath:
    """Bookie's adds. Uses the Bookie's storage, journals, deferred_sync, read_only, _loop,
    _write_data, _full_wait_s, _room_queue and _room_task (set by Bookie.__init__/start)."""

    def _journal(self, ledger_id: int):
        journals = self.journals
        return journals[ledger_id % len(journals)] if len(journals) > 1 else journals[0]

    def _admitted(self, ledger_id: int, master_key: bytes):
        """The ledger's descriptor (created if unknown) once `master_key` is admitted (adds,
        fences, LAC writes); a first key is stored and journaled before anything else of the
        request."""
        storage = self.storage
        desc = storage.get_ledger(ledger_id)
        if desc is None:
            desc = storage.create_ledger(ledger_id)
        if desc.check_access(master_key):
            self._store_key(desc, master_key)
        return desc

    def _store_key(self, desc, master_key: bytes) -> None:
        """A ledger's first key (admitted by check_access): remember it and journal it,
        before any entry of it is queued to the same journal."""
        self.storage.update_ledger(desc, master_key=bytes(master_key))
        self._journal(desc.ledger_id).log(meta_body(desc.ledger_id, MASTER_KEY, master_key), _ignore, None)

    # ------------------------------------------------------------ one add
    def add_entry_cb(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                     recovery: bool, cb, ctx, _deadline: float = 0.0) -> None:
        """Add an entry; `cb(ctx, err)` runs once on the loop (maybe synchronously).

        The one-add primitive: what add_run leaves to it (a request the scan kernel does not
        take, a run past a full write cache, a read-only bookie) and what waits for write-cache
        room. Keep it to one header unpack, one dict lookup, the descriptor's admission and one
        cache put before the journal.
        """
        try:
            try:
                body_ledger, body_entry, lac = _ENTRY_HEADER.unpack_from(entry)
            except struct.error:
                raise BadRequestError("entry shorter than its 24-byte header",
                                      ledger_id=ledger_id, entry_id=entry_id) from None
            if body_ledger != ledger_id or body_entry != entry_id:
                raise BadRequestError("entry body does not match its ledger/entry id",
                                      ledger_id=ledger_id, entry_id=entry_id)
            if entry_id < 0:
                raise BadRequestError("negative entry id on an add", ledger_id=ledger_id, entry_id=entry_id)
            if self.read_only and not recovery:  # recovery adds still land (re-replication, recovery)
                raise BookieReadOnlyError(ledger_id=ledger_id, entry_id=entry_id)
            desc = self._admitted(ledger_id, master_key)
            desc.check_writable(recovery)
            storage = self.storage
            if not storage.put(ledger_id, entry_id, entry):
                if not _deadline:
                    _deadline = time.monotonic() + self._full_wait_s
                    metrics.THROTTLED_WRITE_REQUESTS.inc()
                    self.adds_throttled += 1
                elif time.monotonic() >= _deadline:
                    metrics.REJECTED_WRITE_REQUESTS.inc()
                    self.adds_rejected += 1
                    raise TooManyRequestsError("write cache full: the bookie cannot flush fast enough",
                                               ledger_id=ledger_id, entry_id=entry_id)
                self._wait_for_room((ledger_id, entry_id, entry, master_key, recovery, cb, ctx, _deadline))
                return
            if lac > desc.lac:
                desc.lac = lac
        except BookieError as err:
            cb(ctx, err)
            return
        if self._write_data:
            journals = self.journals
            (journals[0] if len(journals) == 1 else journals[ledger_id % len(journals)]).log(entry, cb, ctx)
        else:
            cb(ctx, None)

    async def add_entry(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                        recovery: bool = False) -> None:
        fut = self._loop.create_future()
        self.add_entry_cb(ledger_id, entry_id, entry, master_key, recovery, _complete_future, fut)
        await fut

    # ------------------------------------------------------------ runs
    def add_entries_cb(self, adds: list, cb, ctx) -> None:
        """add_run of `adds` (Add-shaped records), none of them DEFERRED_SYNC."""
        self.add_run(AddRun(adds), cb, ctx)

    def add_run(self, run: AddRun, cb, ctx) -> None:
        """Add a run (AddRun), doing the per-ledger work once per run instead of once per add.

        Every add is completed exactly once, on the loop, through `cb(ctx, done, err)` where
        `done` lists adds (the run's own records) sharing the outcome `err`:
        - adds admission refuses: at once (with the rest of their segment, see below), with
          the error add_entry_cb gives (same checks in the same order); nothing of them is
          stored;
        - the accepted ones: one call per journal once the last of them is durable (one
          log_many), or once queued (deferred_sync), or at once (journal off); in arrival
          order per ledger;
        - a record the scan kernel does not take (a bad header, a body that is not bytes)
          goes through add_entry_cb alone, as does, from the first add whose write-cache put
          finds both halves full on, the rest of the run (wait for room, then
          ETOOMANYREQUESTS).

        Admission and key state cannot change during the run (it is synchronous on the loop),
        so each segment (one ledger, one key object, one recovery flag: the kernel's split)
        is admitted at most once, and not again for a ledger whose key object and recovery
        flag were admitted earlier in the run. A lone add (not DEFERRED_SYNC) goes straight
        to add_entry_cb.
        """
        adds = run.adds
        if self.read_only or (len(adds) == 1 and not run.deferred_sync):
            # a lone add takes the one-add primitive (a run's batching costs a lone add ~5 us
            # more); read-only (rare): keep add_entry_cb's order of checks per add
            self._add_one_by_one(adds, cb, ctx)
            return
        storage = self.storage
        # ledger_id -> [desc, accepted adds, highest lac, key object admitted, recovery flag admitted]
        groups: dict = {}
        for start, end, top_lac in _scan_add_run(adds):
            if top_lac is None:  # a bad add (add_entry_cb answers its EBADREQ) or a non-bytes body
                self._add_one_by_one(adds[start:end], cb, ctx)
                continue
            first = adds[start]
            ledger_id = first.ledger_id
            group = groups.get(ledger_id)
            if group is None:
                desc = storage.get_ledger(ledger_id)
                if desc is None:
                    desc = storage.create_ledger(ledger_id)
                group = groups[ledger_id] = [desc, [], -1, None, None]
            key, recovery = first.master_key, first.flags & FLAG_RECOVERY_ADD
            if key is not group[3] or recovery != group[4]:  # else admitted already in this run
                desc = group[0]
                try:
                    if key is not group[3]:
                        if desc.check_access(key):
                            self._store_key(desc, key)
                        group[3] = key
                    desc.check_writable(recovery)
                except BookieError as err:
                    cb(ctx, adds[start:end], err)
                    continue
                group[4] = recovery
            group[1] += adds[start:end]
            if top_lac > group[2]:
                group[2] = top_lac
        if groups:
            self._store_and_log(groups, run.deferred_sync, cb, ctx)

    def _store_and_log(self, groups: dict, deferred: bool, cb, ctx) -> None:
        """add_run's second half: write-cache puts per ledger, then one journal call per
        journal (or the completion at once, journal off), then the fallback."""
        storage = self.storage
        journals = self.journals
        runs: dict = {}  # journal index -> [bodies, adds, ledger ids]
        rest: list = []  # adds left to add_entry_cb once a put found the cache full
        for ledger_id, (desc, accepted, top_lac, _key, _recovery) in groups.items():
            if not accepted:
                continue
            if rest:
                rest += accepted
                continue
            bodies = list(map(_BODY, accepted))
            stored = storage.put_many(ledger_id, list(map(_ENTRY_ID, accepted)), bodies)
            if stored < len(accepted):
                rest += accepted[stored:]
                accepted, bodies = accepted[:stored], bodies[:stored]
                if not accepted:
                    continue
                top_lac = max(_ENTRY_HEADER.unpack_from(b)[2] for b in bodies)
            if top_lac > desc.lac:
                desc.lac = top_lac
            index = ledger_id % len(journals) if len(journals) > 1 else 0  # as _journal()
            run = runs.get(index)
            if run is None:
                runs[index] = [bodies, accepted, [ledger_id]]
            else:
                run[0] += bodies
                run[1] += accepted
                run[2].append(ledger_id)
        for index, (bodies, accepted, ledger_ids) in runs.items():
            if not self._write_data:
                cb(ctx, accepted, None)
                continue
            try:
                if deferred:  # acknowledged once queued, before the fsync; FORCE_LEDGER waits for it
                    tracker = self.deferred_sync
                    journals[index].log_many(bodies, tracker.done, tracker.logged(index, ledger_ids))
                    cb(ctx, accepted, None)
                else:
                    journals[index].log_many(bodies, _run_done, (cb, ctx, accepted))
            except BookieError as err:  # nothing of the run was queued
                cb(ctx, accepted, err)
        if rest:
            self._add_one_by_one(rest, cb, ctx)

    def _add_one_by_one(self, adds, cb, ctx) -> None:
        for add in adds:
            self.add_entry_cb(add.ledger_id, add.entry_id, add.body, add.master_key,
                              bool(add.flags & FLAG_RECOVERY_ADD), _one_done, (cb, ctx, add))

    async def force_ledger(self, ledger_id: int) -> None:
        """FORCE_LEDGER: once every deferred-sync add of the ledger acknowledged before the call is
        durable in the journal (bk/bookie/deferred_sync.py). Other adds are acknowledged only once
        durable, so there is nothing to wait for (nor without the journal: journal_write_data false
        makes no add durable before a checkpoint, forced or not - as BookKeeper's forceLedger)."""
        await self.deferred_sync.wait(ledger_id)

    # ------------------------------------------------------------ waiting for write-cache room
    def _wait_for_room(self, args: tuple) -> None:
        """An add that found both write-cache halves full waits in a queue as its arguments
        only: a task each cost ~3 KiB, so a flood of small adds (20,000 waiting per
        connection) held far more than their bytes (docs/OVERLOAD.md)."""
        self._room_queue.append(args)
        if self._room_task is None:
            self._room_task = self._loop.create_task(self._retry_when_room())

    async def _retry_when_room(self) -> None:
        """Once a flush frees a half, or the oldest waiting add's deadline passed, every
        waiting add is tried once more in arrival order through add_entry_cb: everything
        is checked again (admission included: the ledger may have been fenced while the add
        waited, and then it must not be acknowledged); one that still finds no room
        queues itself again, or is refused with ETOOMANYREQUESTS past its deadline."""
        queue = self._room_queue
        try:
            while queue:
                await self.storage.wait_for_room(max(0.0, queue[0][-1] - time.monotonic()))
                for _ in range(len(queue)):
                    self.add_entry_cb(*queue.popleft())
        finally:
            self._room_task = None

