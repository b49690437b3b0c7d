"""Ledger recovery: fence a ledger whose writer may still be alive, find its end, close it.

REPLICATION.md, "Fencing and ledger recovery", steps 1-5:
1. CLOSED: nothing to do. Otherwise CAS OPEN -> IN_RECOVERY (an IN_RECOVERY
   ledger - another recoverer, or one that failed - is recovered again), so
   the old writer's next ensemble change fails.
2. Fencing read of entry -1 (FLAG_DO_FENCING + master key) to every bookie of
   the last segment; continue once EOK/ENOENTRY/ENOLEDGER answers cover the
   ensemble (E - AQ + 1). From then on no ack quorum of unfenced bookies
   exists, so the old writer cannot get another entry acknowledged. More than
   AQ - 1 other answers (errors, timeouts, bad digests): fail, never guess.
3. Start at max(highest piggybacked LAC in the answers, first entry of the
   last segment - 1) + 1.
4. Read forward with recovery reads (fencing reads of each entry, sent to the
   whole write set at once; a small window of entries ahead is in flight, the
   decisions are taken in entry order):
   - positive: one EOK with a valid digest;
   - negative: WQ - AQ + 1 explicit ENOENTRY/ENOLEDGER answers;
   - neither once every answer is in: fail (LedgerRecoveryError), the ledger
     stays IN_RECOVERY and recovery can be retried.
   Each positive entry is written back to its write set with FLAG_RECOVERY_ADD,
   stamped with the LAC recovery started from, by a RecoveryWriter (the writer's
   add path: quorums, in-order completion, ensemble changes - but those are kept
   local until the final CAS). The first negative ends the scan.
5. Once every write-back reached AQ bookies: CAS IN_RECOVERY -> CLOSED with
   lastEntryId = the last positive entry (or start - 1) and its length, and the
   segments including recovery's own ensemble changes. A ledger found CLOSED by
   a concurrent recoverer is accepted as it is.
"""
from __future__ import annotations

import asyncio
import logging
from functools import partial

from bk.errors import (
    BKError, DigestMismatchError, LedgerRecoveryError, UnauthorizedAccessError, error_for_code,
)
from bk.meta.ledger_metadata import LedgerMetadata, LedgerState
from bk.proto import FLAG_DO_FENCING, FLAG_RECOVERY_ADD, DigestManager, StatusCode

from .ledger_handle import LedgerHandle
from .quorum import coverage
from .read_ops import ReadEntryOp, order_replicas

log = logging.getLogger(__name__)

EOK = int(StatusCode.EOK)
EUA = int(StatusCode.EUA)
NEGATIVE = (int(StatusCode.ENOENTRY), int(StatusCode.ENOLEDGER))
RECOVERY_READ_WINDOW = 16


class RecoveryWriter(LedgerHandle):
    """Writes recovered entries back (FLAG_RECOVERY_ADD); its ensemble changes stay local."""

    def __init__(self, bk, ledger_id: int, metadata: LedgerMetadata, version: int, digest: DigestManager,
                 master_key: bytes, start: int, length_before: int):
        super().__init__(bk, ledger_id, metadata, version, digest, master_key, add_flags=FLAG_RECOVERY_ADD)
        self._lac = self._last_add_pushed = self._fixed_lac = start - 1
        self._length_confirmed = self._length_pushed = length_before
        self._segments_kept = len(metadata.segments) - 1  # recovery owns the last segment and any after it

    async def _store_ensemble_change(self, start: int, old: tuple, new: tuple):
        # REPLICATION.md: recovery's own ensemble changes are written only with the final CAS.
        return self.metadata.with_ensemble_change(start, new), self._version

    def _close_metadata(self, lac: int, length: int, current: LedgerMetadata):
        if current.state is LedgerState.CLOSED:
            return None  # a concurrent recoverer closed it first: its result stands
        segments = current.segments[:self._segments_kept] + self.metadata.segments[self._segments_kept:]
        return current.replace(segments=segments, state=LedgerState.CLOSED, last_entry_id=lac, length=length)


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


def _describe(answers: list) -> str:
    return "; ".join(answers) or "no answers"


async def fence_last_segment(pool, digest: DigestManager, metadata: LedgerMetadata, master_key: bytes) -> int:
    """Step 2: fence every bookie of the last segment; returns the highest LAC the answers carry."""
    _, ensemble = metadata.last_segment
    need = coverage(len(ensemble), metadata.ack_quorum_size)
    allowed_unknown = len(ensemble) - need
    done = asyncio.get_running_loop().create_future()
    state = {"covered": 0, "unknown": 0, "lac": -1}
    answers: list[str] = []
    ledger_id = digest.ledger_id

    def on_answer(bookie: str, response, err) -> None:
        if done.done():
            return
        if err is not None:
            state["unknown"] += 1
            answers.append(f"{bookie}: {err}")
        elif response.rc == EOK:
            try:
                _, lac, _, _ = digest.unpack_entry(response.body)
            except DigestMismatchError as e:
                state["unknown"] += 1
                answers.append(f"{bookie}: {e}")
            else:
                state["covered"] += 1
                state["lac"] = max(state["lac"], lac)
                answers.append(f"{bookie}: EOK (LAC {lac})")
        elif response.rc in NEGATIVE:
            state["covered"] += 1
            answers.append(f"{bookie}: {StatusCode(response.rc).name}")
        elif response.rc == EUA:
            done.set_exception(UnauthorizedAccessError(
                f"bookie {bookie} refused to fence ledger {ledger_id}: wrong password", ledger_id=ledger_id))
            return
        else:
            state["unknown"] += 1
            answers.append(f"{bookie}: {error_for_code(response.rc).name}")
        if state["covered"] >= need:
            done.set_result(state["lac"])
        elif state["unknown"] > allowed_unknown:
            done.set_exception(LedgerRecoveryError(
                f"ledger {ledger_id}: cannot fence: {state['unknown']} of {len(ensemble)} bookies of the last"
                f" segment gave no answer that counts, at most {allowed_unknown} may ({_describe(answers)})"))

    for bookie in ensemble:
        try:
            client = pool.get(bookie)
            client.send_read(ledger_id, -1, partial(on_answer, bookie), flags=FLAG_DO_FENCING,
                             master_key=master_key)
        except BKError as e:
            on_answer(bookie, None, e)
    return await done


def recovery_read(pool, digest: DigestManager, metadata: LedgerMetadata, entry_id: int,
                  master_key: bytes) -> asyncio.Future:
    """Step 4 for one entry: a future of (payload, length) if positive, None if negative.

    Fails with LedgerRecoveryError when the answers decide neither."""
    ensemble = metadata.last_segment[1]
    size, wq, aq = metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size
    write_set = [ensemble[(entry_id + i) % size] for i in range(wq)]
    need_negative = wq - aq + 1
    done = asyncio.get_running_loop().create_future()
    state = {"answered": 0, "negative": 0}
    answers: list[str] = []

    def on_answer(bookie: str, response, err) -> None:
        state["answered"] += 1
        if done.done():
            return
        if err is not None:
            answers.append(f"{bookie}: {err}")
        elif response.rc == EOK:
            try:
                _, length, payload = digest.verify_entry(entry_id, response.body)
            except DigestMismatchError as e:
                answers.append(f"{bookie}: {e}")
            else:
                done.set_result((bytes(payload), length))
                return
        elif response.rc in NEGATIVE:
            state["negative"] += 1
            answers.append(f"{bookie}: {StatusCode(response.rc).name}")
            if state["negative"] >= need_negative:
                done.set_result(None)
                return
        else:
            answers.append(f"{bookie}: {error_for_code(response.rc).name}")
        if state["answered"] == wq:
            done.set_exception(LedgerRecoveryError(
                f"ledger {digest.ledger_id} entry {entry_id}: neither a valid copy nor {need_negative} explicit"
                f" negatives ({_describe(answers)}); recovery must be retried"))

    for bookie in write_set:
        try:
            client = pool.get(bookie)
            client.send_read(digest.ledger_id, entry_id, partial(on_answer, bookie), flags=FLAG_DO_FENCING,
                             master_key=master_key)
        except BKError as e:
            on_answer(bookie, None, e)
    return done


async def _length_of(bk, digest: DigestManager, metadata: LedgerMetadata, entry_id: int) -> int:
    """The cumulative length stamped in entry `entry_id` (an entry <= LAC, so readable normally)."""
    if entry_id < 0:
        return 0
    ensemble = metadata.ensemble_for(entry_id)
    replicas = [ensemble[(entry_id + i) % metadata.ensemble_size] for i in range(metadata.write_quorum_size)]
    done = asyncio.get_running_loop().create_future()

    def finished(_, entry, err) -> None:
        if err is not None:
            done.set_exception(err)
        else:
            done.set_result(op.length)

    op = ReadEntryOp(bk.pool, digest, entry_id, order_replicas(replicas, bk.pool), finished)
    op.start()
    try:
        return await done
    except BKError as e:
        raise LedgerRecoveryError(f"ledger {digest.ledger_id}: cannot read entry {entry_id} for the ledger"
                                  f" length: {e}") from e


async def recover_ledger(bk, ledger_id: int, digest: DigestManager, master_key: bytes
                         ) -> tuple[LedgerMetadata, int]:
    """Fence and close ledger `ledger_id`; returns its CLOSED metadata and version."""
    lm = bk.ledger_manager

    def mark_in_recovery(current: LedgerMetadata):
        return current.with_in_recovery() if current.state is LedgerState.OPEN else None

    metadata, version = await lm.update_ledger_metadata(ledger_id, mark_in_recovery)
    if metadata.is_closed:
        return metadata, version
    fenced_lac = await fence_last_segment(bk.pool, digest, metadata, master_key)
    start = max(fenced_lac, metadata.last_segment[0] - 1) + 1
    log.info("ledger %d: fenced; recovering from entry %d", ledger_id, start)

    writer: RecoveryWriter | None = None
    write_backs = []
    reads: dict[int, asyncio.Future] = {}
    next_read = start
    entry_id = start
    try:
        while True:
            while next_read < entry_id + RECOVERY_READ_WINDOW:
                reads[next_read] = recovery_read(bk.pool, digest, metadata, next_read, master_key)
                next_read += 1
            found = await reads.pop(entry_id)
            if found is None:
                break
            payload, length = found
            if writer is None:
                writer = RecoveryWriter(bk, ledger_id, metadata, version, digest, master_key, start,
                                        length - len(payload))
            write_backs.append(writer.async_add_entry(payload))
            entry_id += 1
        results = await asyncio.gather(*write_backs, return_exceptions=True)
    except BaseException:
        for fut in write_backs:  # their errors are this failure's consequences, not news
            fut.add_done_callback(_retrieve)
        raise
    finally:
        for fut in reads.values():  # reads past the end: nobody needs their answers
            fut.cancel()
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise LedgerRecoveryError(f"ledger {ledger_id}: writing recovered entries back failed: {failed[0]}"
                                  ) from failed[0]
    last_entry_id = entry_id - 1
    if writer is None:
        writer = RecoveryWriter(bk, ledger_id, metadata, version, digest, master_key, start,
                                await _length_of(bk, digest, metadata, last_entry_id))
    await writer.close()
    log.info("ledger %d: recovered and closed at entry %d", ledger_id, writer.metadata.last_entry_id)
    return writer.metadata, writer._version
