"""LedgerHandle: the single writer of a ledger (add, ensemble change, close) - REPLICATION.md.

Adds. `add_entry` gives the entry the next id, frames it once (digest, the
current LAC piggybacked, the cumulative length; AddFramer) and sends that frame
to its write set. An entry is acknowledged once AQ bookies of its write set
answered EOK under the current ensemble; completions are delivered strictly in
entry-id order and the LAC advances along the contiguous acknowledged prefix.

Ensemble change. Any failure of a bookie in the ensemble other than EFENCED/EUA
(timeout, connection loss, EIO, EREADONLY, ETOOMANYREQUESTS, ...) marks it
failed and freezes completions - so the LAC L cannot move - and one task per
ledger (serialized) replaces every failed bookie by a writable bookie outside
the ensemble, CASes the segment `L+1 -> new ensemble` into the metadata
(replacing a last segment that already starts at L+1), then, for every
unacknowledged entry, forgets the acks of the indexes whose bookie changed and
sends the entry to the new bookies. Only then are completions released, so no
entry is acknowledged on the strength of an ensemble the metadata store does
not have. Entries added during the change go to the bookies of the current
ensemble that have not failed, and to the replacements afterwards. Failures
seen during the CAS trigger another round with the same start L+1.

Delayed ensemble change (BookKeeper's delayEnsembleChange; always on for
recovery's RecoveryWriter, for writers when the client's
`delay_ensemble_change` is set). A failed bookie is still marked failed (no
more sends to it, its late answers ignored, acks it gave before stay), but the
ensemble is changed only once some write set of the ensemble has fewer than AQ
bookies that have not failed: before that every pending and every new entry
can still complete on AQ acks, so completions are not frozen and the metadata
keeps naming the failed bookie. When a change is needed it replaces every
failed bookie, the delayed ones too. The price: entries written meanwhile
have one copy fewer on the failed bookie's side (re-replication or the
auditor's checks restore them), which is what lets a ledger with no spare
bookie keep going, and be recovered, with one bookie down.

Fatal errors. EFENCED (another client recovered the ledger), EUA (wrong key),
a CAS that finds the ledger IN_RECOVERY or CLOSED (fenced out), or no
replacement bookies (NotEnoughBookiesError) end writing: every pending add and
every later add fails with that error class. Each such error carries
`outcome_unknown`: True when the entry had been sent to some bookie (it may or
may not be in the ledger after recovery - its message says so), False when it
was never sent (it is certainly not in the ledger).

Deferred sync (`write_flags={"DEFERRED_SYNC"}`, BookKeeper's WriteFlag). Adds carry the v3
writeFlags DEFERRED_SYNC (over the v3 side connection when the client speaks v2): a bookie
acknowledges them before its journal fsync. Completions still come in entry-id order, but the
LAC stays where the last `force()` left it (BookKeeper's lastAddConfirmed vs
pendingAddsSequenceHead, here `last_add_acked`); `force()` sends FORCE_LEDGER to every bookie of
the ensemble and, once all answered EOK, moves the LAC to the prefix acknowledged when it
started. As in BookKeeper, a bookie failure is fatal for such a writer (no ensemble change:
acknowledged entries above the LAC exist only on that ensemble). close() forces first.

Close. Waits for every pending add and any ensemble change, then CASes
OPEN -> CLOSED with lastEntryId = LAC and its length. Closing a closed handle is
a no-op; adds after close() started raise LedgerClosedError.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque

from bk.errors import (
    BKError, BookieError, BookieIOError, IncorrectParameterError, LedgerClosedError, LedgerFencedError, MetadataFormatError,
    MetadataStoreError, MetadataVersionError, NoSuchLedgerMetadataError, NotEnoughBookiesError, UnauthorizedAccessError,
    error_for_code,
)
from bk import _native
from bk.meta.ledger_metadata import LedgerMetadata, LedgerState
from bk.proto import DigestManager, StatusCode
from bk.formats.wire import FLAG_DEFERRED_SYNC

from .quorum import AddFramer, in_write_set
from .read_handle import ReadHandle
from .explicit_lac import ExplicitLacFlusher
from .writer import LedgerWriter

log = logging.getLogger(__name__)
_core = _native.load("core", "bk.client")
AddCore, AddResponder, PendingAdd = _core.AddCore, _core.AddResponder, _core.PendingAdd

EOK = int(StatusCode.EOK)
EFENCED = int(StatusCode.EFENCED)
EUA = int(StatusCode.EUA)

OPEN, CLOSING, CLOSED = "open", "closing", "closed"
METADATA_RETRIES = 6
METADATA_RETRY_FIRST_S = 0.05


def _error(cls: type, message: str, ledger_id: int, entry_id: int | None, outcome_unknown: bool) -> BKError:
    """An add's error: every class carries `ledger_id`, `entry_id` (None if no id was given) and
    `outcome_unknown` (True: sent, may or may not be in the ledger; False: certainly not written)."""
    err = cls(message, ledger_id=ledger_id, entry_id=entry_id) if issubclass(cls, BookieError) else cls(message)
    err.ledger_id, err.entry_id, err.outcome_unknown = ledger_id, entry_id, outcome_unknown
    return err


class LedgerHandle(ReadHandle):
    """The writer of one ledger. Its add path is a core object (`self._core`, an AddCore of
    bk/client/_core.pyx or its twin core_py.py) that holds the hot state in declared fields and
    calls this class back only through the hooks given to it here."""

    sends_explicit_lac = True  # with explicit_lac_interval_ms set (bk/client/explicit_lac.py)

    def __init__(self, bk, ledger_id: int, metadata: LedgerMetadata, version: int, digest: DigestManager,
                 master_key: bytes, *, add_flags: int = 0, write_flags=frozenset()):
        self._loop = asyncio.get_running_loop()
        # BookKeeper's WriteFlag set (BookKeeper.create_ledger checks it; the metadata never records it)
        self.write_flags = frozenset(write_flags)
        self._deferred_sync = "DEFERRED_SYNC" in self.write_flags
        if self._deferred_sync:
            add_flags |= FLAG_DEFERRED_SYNC
        core = self._core = AddCore(ledger_id, bk, self._loop, raise_refused=self._raise_refused,
                                    raise_too_large=self._too_large, send_again=self._send,
                                    add_failure=self._add_failure, wake_drain=self._wake_drain)
        super().__init__(bk, ledger_id, metadata, version, digest, master_key)
        self._framer = core.framer = AddFramer(digest, master_key, bk.max_frame_size_bytes, add_flags)
        # the core frames small CRC32C entries with the codec kernel directly (None: ask the framer)
        core.frame_small, core.add_header, core.frame_small_max = self._framer.small_frame_kernel()
        core.master_key = master_key
        core.max_payload_bytes = self._framer.max_payload_bytes()
        self._E = core.ensemble_size = metadata.ensemble_size
        self._WQ = core.write_quorum_size = metadata.write_quorum_size
        self._AQ = core.ack_quorum_size = metadata.ack_quorum_size
        self._set_ensemble(metadata.last_segment[1])
        core.lac = metadata.last_entry_id
        core.length_confirmed = metadata.length
        core.last_add_acked, core.length_acked = core.lac, core.length_confirmed
        core.deferred_sync = self._deferred_sync
        core.last_add_pushed = core.lac
        core.length_pushed = core.length_confirmed
        core.pending = deque()  # of PendingAdd, in entry-id order
        core.failed_bookies = set()  # in the ensemble, waiting to be replaced
        core.changing = False  # completions frozen until the metadata has the new ensemble
        core.refuse = None  # see _update_refuse
        self._avoid: set[str] = set()  # every bookie that failed for this handle
        self._delay_ensemble_change = bool(getattr(bk, "delay_ensemble_change", False))
        self.delayed_failures = 0  # bookie failures kept in the ensemble (delayed ensemble change)
        self._change_task: asyncio.Task | None = None
        self._fatal: tuple[type, str] | None = None
        self._state = OPEN
        self._close_task: asyncio.Task | None = None
        self._drain_waiter: asyncio.Future | None = None
        self.ensemble_changes = 0
        # the add path is the core's own methods (no Python frame in between)
        self.async_add_entry = core.async_add_entry
        interval_ms = getattr(bk, "explicit_lac_interval_ms", 0)  # BookKeeper's explicitLacInterval (0: off)
        self.explicit_lac = ExplicitLacFlusher(self, interval_ms) if interval_ms > 0 and self.sends_explicit_lac else None
        self.add_entry = core.add_entry
        self.add_entries = core.add_entries

    @property
    def _lac(self) -> int:  # ReadHandle's name for the LAC; the writer's lives in its core
        return self._core.lac

    @_lac.setter
    def _lac(self, value: int) -> None:
        self._core.lac = value

    # ------------------------------------------------------------ state
    @property
    def last_add_pushed(self) -> int:
        return self._core.last_add_pushed

    @property
    def length(self) -> int:
        """Payload bytes of entries 0..LAC."""
        return self._core.length_confirmed

    @property
    def ensemble(self) -> tuple[str, ...]:
        """The bookies new entries go to."""
        return self._ensemble

    @property
    def failed_bookies(self) -> frozenset[str]:
        """Bookies of the ensemble this writer saw fail and is replacing (or, with a delayed
        ensemble change, keeps): it sends them no add and counts none of their answers."""
        return frozenset(self._core.failed_bookies)

    @property
    def pending_adds(self) -> int:
        return len(self._core.pending)

    def _last_readable(self) -> int:
        return self._core.lac

    def _set_ensemble(self, ensemble) -> None:
        core = self._core
        self._ensemble = tuple(ensemble)
        core.index = self._index = {b: i for i, b in enumerate(self._ensemble)}
        pool = self._bk.pool
        self._clients = [pool.get(b) for b in self._ensemble]
        if self._deferred_sync:  # only v3 carries DEFERRED_SYNC (BookKeeper's v2 client refuses it)
            self._clients = [c.v3_client() for c in self._clients]
        # per ensemble index: (the client's request core, response callback bound to the bookie),
        # and per entry id mod E: the write set's indexes and those pairs (no per-add work)
        E, WQ = self._E, self._WQ
        self._write_sets_by_index = [(c._core, AddResponder(core, b)) for c, b in zip(self._clients, self._ensemble)]
        core.write_set_indexes = [tuple((r + i) % E for i in range(WQ)) for r in range(E)]
        core.write_sets = [tuple(self._write_sets_by_index[i] for i in idx) for idx in core.write_set_indexes]

    # ------------------------------------------------------------ adds
    # async_add_entry is the core's (bk/client/_core.pyx, twin core_py.py), as are the answers and
    # in-order completion; the rare paths below are the hooks the core was given.
    # The four ways to add are the core's own methods, bound in __init__ (these definitions document
    # them and serve a subclass that calls them through the class).
    def async_add_entry(self, data, callback=None):
        """Start an add; `callback(entry_id, err)` later, in entry-id order (or the future of the
        entry id without a callback). An add that cannot start raises here."""
        return self._core.async_add_entry(data, callback)

    def add_entry(self, data) -> asyncio.Future:
        """Append `data`: `await lh.add_entry(data)` is its entry id once AQ bookies stored it.

        The add starts at the call and the result is a plain future (no coroutine, so `gather`
        over many wraps none in a task); an add that cannot start raises when awaited."""
        return self._core.add_entry(data)

    def add_entries(self, payloads) -> asyncio.Future:
        """Append every payload (any iterable of bytes-like) now: `await lh.add_entries(batch)` is
        their entry ids, in order. A failure part way raises AddBatchError (acknowledged ids,
        failed ids, payloads never added: each add reported once). Bad input adds nothing."""
        return self._core.add_entries(payloads)

    def writer(self, max_in_flight: int = 1000) -> "LedgerWriter":
        """`async with lh.writer(max_in_flight=D) as w: await w.add(data)` - adds with a bounded
        window; see bk/client/writer.py."""
        return LedgerWriter(self, max_in_flight)

    def _raise_refused(self):
        if self._state is not OPEN:
            raise _error(LedgerClosedError, f"ledger {self.ledger_id} is closed: no more adds",
                         self.ledger_id, None, False)
        if self._bk.closed:
            raise _error(LedgerClosedError, f"ledger {self.ledger_id}: its BookKeeper client is closed",
                         self.ledger_id, None, False)
        if self._fatal is not None:
            cls, why = self._fatal
            raise _error(cls, f"{why}; this add was not written", self.ledger_id, None, False)

    def _too_large(self, n: int):
        raise IncorrectParameterError(
            f"entry of {n} bytes is larger than {self._core.max_payload_bytes} bytes"
            f" (max_frame_size_bytes {self._framer.max_frame_size_bytes} less the ADD headers)")

    def _update_refuse(self) -> None:
        """`_refuse` is set whenever the handle's state or a fatal error refuses adds (the
        client's own closing is checked beside it): one check on the hot path."""
        self._core.refuse = True if (self._state is not OPEN or self._fatal is not None) else None

    def _send(self, op: PendingAdd, indexes) -> None:
        ensemble, failed, responders = self._ensemble, self._core.failed_bookies, self._write_sets_by_index
        frame, ledger_id, entry_id = op.frame, self.ledger_id, op.entry_id
        op.sent = True
        for i in indexes:
            if ensemble[i] in failed:
                continue  # sent to its replacement once the ensemble change is in the metadata
            client, respond = responders[i]
            client.send_add(frame, ledger_id, entry_id, respond)

    def _add_failure(self, bookie: str, response, err) -> None:
        """A bookie's answer to an ADD other than EOK, or a failure to get one."""
        if self._fatal is not None or self._state is CLOSED:
            return
        rc = None if err is not None else response.rc
        entry_id = response.entry_id if response is not None else None
        if rc == EFENCED:
            self._fail(LedgerFencedError, f"ledger {self.ledger_id} is fenced (bookie {bookie}): another client"
                       " opened it with recovery; this writer can add nothing more")
        elif rc == EUA:
            self._fail(UnauthorizedAccessError, f"bookie {bookie} refused the master key of ledger"
                       f" {self.ledger_id} (wrong password?)")
        else:
            self._bookie_failed(bookie, err or error_for_code(rc, ledger_id=self.ledger_id, entry_id=entry_id))

    def _fail(self, cls: type, why: str) -> None:
        """Fatal for the writer: fail every pending add and refuse every later one."""
        if self._fatal is not None:
            return
        log.warning("ledger %d: writer stops: %s", self.ledger_id, why)
        self._fatal = (cls, why)
        self._update_refuse()
        pending = list(self._core.pending)
        self._core.pending.clear()
        for op in pending:
            op.frame = None
            if op.finished():
                continue
            if op.sent:
                msg = (f"{why}; entry {op.entry_id} was in flight: its outcome is unknown"
                       " (it may or may not be in the ledger after recovery)")
            else:
                msg = f"{why}; entry {op.entry_id} was not written"
            op.complete(op.entry_id, _error(cls, msg, self.ledger_id, op.entry_id, op.sent))
        self._wake_drain()

    # ------------------------------------------------------------ ensemble change
    def _bookie_failed(self, bookie: str, err: BaseException) -> None:
        core = self._core
        if bookie not in self._index or bookie in core.failed_bookies:
            return  # replaced already, or already being replaced
        if self._bk.closed:
            self._fail(LedgerClosedError, f"ledger {self.ledger_id}: its BookKeeper client was closed")
            return
        if self._deferred_sync:  # as BookKeeper: a DEFERRED_SYNC ledger never changes its ensemble
            self._fail(type(err) if isinstance(err, BookieError) else BookieIOError,
                       f"ledger {self.ledger_id}: bookie {bookie} failed ({err}); a DEFERRED_SYNC ledger cannot"
                       " change its ensemble, so this writer can add nothing more")
            return
        core.failed_bookies.add(bookie)
        self._avoid.add(bookie)
        if self._delay_ensemble_change and not core.changing and self._ack_quorum_reachable():
            self.delayed_failures += 1
            log.info("ledger %d: bookie %s failed (%s); every write set still has %d bookies up: ensemble"
                     " change delayed", self.ledger_id, bookie, err, self._AQ)
            return
        log.info("ledger %d: bookie %s failed (%s); changing the ensemble", self.ledger_id, bookie, err)
        core.changing = True
        if self._change_task is None:
            self._change_task = self._loop.create_task(self._ensemble_change(),
                                                       name=f"ensemble-change-{self.ledger_id}")

    def _ack_quorum_reachable(self) -> bool:
        """True while every write set of the ensemble has AQ bookies that have not failed (so every
        pending entry - its acks from now-failed bookies still count - and every new one can complete)."""
        ensemble, failed, aq = self._ensemble, self._core.failed_bookies, self._AQ
        return all(sum(1 for i in indexes if ensemble[i] not in failed) >= aq
                   for indexes in self._core.write_set_indexes)

    async def _ensemble_change(self) -> None:
        retries = 0
        try:
            while self._fatal is None and self._core.failed_bookies:
                failed = set(self._core.failed_bookies)
                start = self._core.lac + 1  # frozen while the core is changing
                old = self._ensemble
                try:
                    writable = await self._bk.registration.writable_bookies()
                    await self._bk.placement.on_cluster_changed(writable)
                    new = tuple(self._bk.placement.replace_bookies(
                        old, failed, writable, avoid=self._avoid, write_quorum_size=self._WQ, ack_quorum_size=self._AQ,
                        custom_metadata=dict(self.metadata.custom_metadata)))
                    metadata, version = await self._store_ensemble_change(start, old, new)
                except (NotEnoughBookiesError, LedgerFencedError, NoSuchLedgerMetadataError,
                        MetadataFormatError) as e:
                    self._fail(type(e) if not isinstance(e, MetadataFormatError) else LedgerFencedError,
                               f"ledger {self.ledger_id}: ensemble change failed: {e}")
                    return
                except (MetadataStoreError, MetadataVersionError) as e:
                    retries += 1
                    if retries > METADATA_RETRIES or self._bk.closed:
                        self._fail(type(e), f"ledger {self.ledger_id}: ensemble change failed: {e}")
                        return
                    log.warning("ledger %d: ensemble change: %s; retrying", self.ledger_id, e)
                    await asyncio.sleep(METADATA_RETRY_FIRST_S * 2 ** (retries - 1))
                    continue
                retries = 0
                if self._fatal is not None:
                    return
                self._update_metadata(metadata, version)
                try:
                    self._apply_ensemble(old, new, failed)
                except BKError as e:  # the BookKeeper client was closed meanwhile
                    self._fail(type(e), f"ledger {self.ledger_id}: {e}")
                    return
                log.info("ledger %d: ensemble from entry %d is %s", self.ledger_id, start, list(new))
        except Exception as e:  # a bug (a placement policy's, say): fail the adds, never leave them waiting
            log.exception("ledger %d: ensemble change failed unexpectedly", self.ledger_id)
            self._fail(BookieIOError, f"ledger {self.ledger_id}: ensemble change failed: {type(e).__name__}: {e}")
        finally:
            self._change_task = None
            if self._fatal is not None or not self._core.failed_bookies:
                self._core.changing = False
                if self._fatal is None:
                    self._core.deliver()
            self._wake_drain()

    async def _store_ensemble_change(self, start: int, old: tuple, new: tuple) -> tuple[LedgerMetadata, int]:
        """CAS the new segment into the metadata store (a writer's ensemble change)."""
        return await self._bk.ledger_manager.update_ledger_metadata(
            self.ledger_id, functools.partial(self._change_metadata, start, old, new))

    def _change_metadata(self, start: int, old: tuple, new: tuple, current: LedgerMetadata):
        if current.state is not LedgerState.OPEN:
            raise LedgerFencedError(f"ledger {self.ledger_id} is {current.state.name} in the metadata:"
                                    " another client is recovering or closed it (this writer is fenced out)")
        last_first, last_ensemble = current.last_segment
        if (last_first, last_ensemble) == (start, new):
            return None  # our own earlier attempt got through
        if last_ensemble != old:
            raise LedgerFencedError(f"ledger {self.ledger_id}: the last segment in the metadata is"
                                    f" {list(last_ensemble)}, this writer uses {list(old)}: another client changed it")
        return current.with_ensemble_change(start, new)

    def _apply_ensemble(self, old: tuple, new: tuple, replaced: set) -> None:
        self._set_ensemble(new)
        self._core.failed_bookies -= replaced
        self.ensemble_changes += 1
        changed = [i for i in range(self._E) if old[i] != new[i]]
        E, WQ = self._E, self._WQ
        for op in list(self._core.pending):
            indexes = [i for i in changed if in_write_set(i, op.entry_id, E, WQ)]
            if indexes:
                for i in indexes:
                    op.unack(i)
                self._send(op, indexes)

    # ------------------------------------------------------------ close
    def _wake_drain(self) -> None:
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _drain(self) -> None:
        while self._core.pending or self._change_task is not None:
            self._drain_waiter = self._loop.create_future()
            await self._drain_waiter
        self._drain_waiter = None

    async def close(self) -> None:
        """Wait for outstanding adds, then CAS the ledger CLOSED at its LAC. Idempotent."""
        if self._state is CLOSED:
            return
        self._state = CLOSING
        self._update_refuse()
        if self._close_task is None:
            self._close_task = self._loop.create_task(self._close(), name=f"close-{self.ledger_id}")
        task = self._close_task
        try:
            await asyncio.shield(task)
        finally:
            if task.done() and self._close_task is task and self._state is not CLOSED:
                self._close_task = None  # e.g. the metadata store was down: close() may be retried

    def _close_metadata(self, lac: int, length: int, current: LedgerMetadata):
        """The writer's close: OPEN -> CLOSED at its LAC; a ledger closed elsewhere must agree."""
        if current.state is LedgerState.CLOSED:
            if (current.last_entry_id, current.length) == (lac, length):
                return None
            raise LedgerFencedError(
                f"ledger {self.ledger_id} was closed by another client at entry {current.last_entry_id}"
                f" (length {current.length}); this writer's LAC is {lac}")
        if current.state is LedgerState.IN_RECOVERY:
            raise LedgerFencedError(f"ledger {self.ledger_id} is being recovered by another client")
        return current.with_closed(lac, length)

    async def _close(self) -> None:
        await self._drain()
        if self._deferred_sync and self._core.last_add_acked > self._core.lac:
            # bk closes at what is durable and acknowledged: force first (BookKeeper closes at its LAC,
            # leaving acknowledged adds since the last force() out of the ledger). If the force
            # fails, close() raises and the ledger stays OPEN: recovery decides what it holds.
            await self._force()
        update = functools.partial(self._close_metadata, self._core.lac, self._core.length_confirmed)
        try:
            metadata, version = await self._bk.ledger_manager.update_ledger_metadata(self.ledger_id, update)
        except (LedgerFencedError, NoSuchLedgerMetadataError):
            self._state = CLOSED
            self._update_refuse()
            raise
        self._update_metadata(metadata, version)
        self._state = CLOSED
        self._update_refuse()
        log.debug("ledger %d closed at entry %d (%d bytes)", self.ledger_id, metadata.last_entry_id,
                  metadata.length)

    @property
    def is_closed(self) -> bool:
        return self._state is CLOSED

    async def read_last_add_confirmed(self) -> int:
        """The writer knows its LAC."""
        return self._core.lac

    # ------------------------------------------------------------ force (deferred sync)
    @property
    def last_add_acked(self) -> int:
        """The last id of the acknowledged prefix (BookKeeper's pendingAddsSequenceHead): the LAC on
        every ledger but a DEFERRED_SYNC one, where the LAC stays at what force() made durable."""
        return self._core.last_add_acked

    async def force(self) -> None:
        """Make every add acknowledged so far durable and move the LAC to it (BookKeeper's
        LedgerHandle.force, ForceLedgerOp): FORCE_LEDGER goes to every bookie of the current
        ensemble, and all of them must answer EOK (each then holds on disk every entry it had
        acknowledged, so each entry acknowledged by AQ bookies is durable on AQ bookies). Any other
        answer, or none in add_timeout_s, raises that bookie's error and the LAC stays; adds are not
        failed by it. On a ledger written without DEFERRED_SYNC every acknowledged add is durable
        already and force() only asks the bookies."""
        if self._state is not OPEN:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed: force() needs an open ledger")
        if self._fatal is not None:
            cls, why = self._fatal
            raise _error(cls, f"{why}; force() cannot run", self.ledger_id, None, True)
        await self._force()

    async def _force(self) -> None:
        core = self._core
        head, length = core.last_add_acked, core.length_acked  # captured first, as ForceLedgerOp does
        ensemble, pool = self._ensemble, self._bk.pool
        answers = await asyncio.gather(
            *(pool.get(b).call(pool.get(b).send_force_ledger, self.ledger_id) for b in ensemble),
            return_exceptions=True)
        failures = []
        for bookie, answer in zip(ensemble, answers):
            if isinstance(answer, BaseException):
                failures.append((bookie, answer))
            elif answer.rc != EOK:
                failures.append((bookie, error_for_code(answer.rc, ledger_id=self.ledger_id)))
        if failures:
            bookie, err = failures[-1]
            cls = type(err) if isinstance(err, BKError) else BookieIOError
            raise _error(cls, f"ledger {self.ledger_id}: force() failed: " + "; ".join(
                f"bookie {b}: {e}" for b, e in failures) + f" (LAC stays {core.lac}; entries up to {head} are"
                " acknowledged, not known to be durable)", self.ledger_id, None, True) from err
        if head > core.lac:
            core.lac, core.length_confirmed = head, length

    def _learn_lac(self, lac: int) -> None:
        """The writer's LAC is its own: what bookies report never sets it."""
