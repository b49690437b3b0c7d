"""Ledger recovery: fence a ledger whose writer may still be alive, find its end, close it.

REPLICATION.md, "Fencing and ledger recovery", steps 1-5:
1. CLOSED: nothing to do. Otherwise CAS OPEN -> IN_RECOVERY (an IN_RECOVERY
   ledger - another recoverer, or one that failed - is recovered again), so
   the old writer's next ensemble change fails.
2. Fencing read of entry -1 (FLAG_DO_FENCING + master key) to every bookie of
   the last segment; continue once the answers that prove a fence cover the
   ensemble (E - AQ + 1). From then on no ack quorum of unfenced bookies
   exists, so the old writer cannot get another entry acknowledged. More than
   AQ - 1 other answers (errors, timeouts, bad digests): fail, never guess.
   An answer proves the fence when it is EOK (valid digest: its LAC counts),
   ENOENTRY, ENOLEDGER or EUNKNOWNLEDGERSTATE. The last one (BP-46 limbo) also
   proves it: a bookie makes the fence durable before it reads (bk's
   processor awaits Bookie.fence_ledger, then reads; a key or storage failure
   of the fence answers EUA/EIO and no read happens), and a ledger is put in
   limbo only together with its fence, at boot. But it carries no LAC: the
   bookie may have lost its tail, so its "last entry" means nothing.
3. Start at max(highest piggybacked LAC in the answers, first entry of the
   last segment - 1) + 1.
4. Read forward with recovery reads (fencing reads of each entry, sent to the
   whole write set at once; a small window of entries ahead is in flight, the
   decisions are taken in entry order):
   - positive: one EOK with a valid digest;
   - negative: WQ - AQ + 1 explicit ENOENTRY/ENOLEDGER answers;
   - EUNKNOWNLEDGERSTATE, timeouts, connection errors, EIO and bad digests are
     never negatives; neither once every answer is in: fail
     (LedgerRecoveryError naming each bookie's answer and what it means),
     the ledger stays IN_RECOVERY and recovery can be retried. Every read
     ends: the bookie client expires each request after its read timeout.
   An entry at or below a LAC recovery has seen (fencing answers, or the LACs
   piggybacked on recovered entries, including those read ahead) was
   acknowledged: failing to find it is stated as data loss, and explicit
   negatives for it fail recovery instead of closing the ledger short.
   Each positive entry is written back to its write set with FLAG_RECOVERY_ADD,
   stamped with the LAC recovery started from, by a RecoveryWriter (the writer's
   add path: quorums, in-order completion; a failed bookie is replaced only
   when some entry can no longer reach AQ without it - delayed ensemble change -
   and replacements are kept local until the final CAS). The first negative
   ends the scan.
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
ELIMBO = int(StatusCode.EUNKNOWNLEDGERSTATE)
NEGATIVE = (int(StatusCode.ENOENTRY), int(StatusCode.ENOLEDGER))
RECOVERY_READ_WINDOW = 16


class RecoveryWriter(LedgerHandle):
    """Writes recovered entries back (FLAG_RECOVERY_ADD); delayed ensemble changes, kept local."""

    sends_explicit_lac = False  # the ledger is being closed: its readers learn the end from the metadata

    def __init__(self, bk, ledger_id: int, metadata: LedgerMetadata, version: int, digest: DigestManager,
                 master_key: bytes, start: int, length_before: int):
        super().__init__(bk, ledger_id, metadata, version, digest, master_key, add_flags=FLAG_RECOVERY_ADD)
        # A bookie of the last segment may be down with no spare to replace it (#3905, #2281): write
        # back to the others as long as AQ of every write set are up (LedgerHandle's docstring).
        self._delay_ensemble_change = True
        core = self._core
        core.lac = core.last_add_pushed = core.last_add_acked = core.fixed_lac = start - 1
        core.length_confirmed = core.length_pushed = length_before
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


# How one answer to a recovery or fencing read counts (REPLICATION.md; module docstring).
VALID, NEGATIVE_ANSWER, LIMBO, UNKNOWN = "valid", "negative", "limbo", "unknown"


def _classify(response, err) -> tuple[str, str]:
    """`(kind, text)` of an answer other than EOK (an EOK is judged by its digest)."""
    if err is not None:
        return UNKNOWN, str(err)
    if response.rc in NEGATIVE:
        return NEGATIVE_ANSWER, StatusCode(response.rc).name
    if response.rc == ELIMBO:
        return LIMBO, "EUNKNOWNLEDGERSTATE"
    return UNKNOWN, error_for_code(response.rc).name


def _describe(answers: dict) -> str:
    return "; ".join(f"{b}: {text}" for b, (_, text) in answers.items()) or "no answers"


def _machine(answers: dict, unknown_kinds: tuple = (UNKNOWN, LIMBO)) -> dict:
    """The error's machine fields for `answers` ({bookie: (kind, text)})."""
    return dict(answers={b: text for b, (_, text) in answers.items()},
                unknown_bookies=tuple(b for b, (kind, _) in answers.items() if kind in unknown_kinds),
                limbo_bookies=tuple(b for b, (kind, _) in answers.items() if kind == LIMBO))


def _limbo_advice(limbo: tuple) -> str:
    if not limbo:
        return ""
    return (f" Bookie(s) {', '.join(limbo)} answered EUNKNOWNLEDGERSTATE: the ledger is in limbo there, they may"
            " have lost data in a crash while running without the journal (BP-46) and cannot say whether they"
            " had it.")


def undecided_entry_error(ledger_id: int, entry_id: int, answers: dict, write_quorum: int, need_negative: int,
                          known_lac: int = -1) -> LedgerRecoveryError:
    """The error for an entry that recovery reads could decide neither way.

    `answers` is {bookie: (kind, text)} for the write set. Data loss is stated when the entry is
    at or below `known_lac` (a LAC some entry or fencing answer carried: the entry was certainly
    acknowledged) and no replica holds a valid copy."""
    fields = _machine(answers)
    negatives = sum(1 for kind, _ in answers.values() if kind == NEGATIVE_ANSWER)
    silent = tuple(b for b, (kind, _) in answers.items() if kind == UNKNOWN)
    where = f"ledger {ledger_id} entry {entry_id}"
    kept = (" The ledger is left OPEN/IN_RECOVERY, not closed: retry open_ledger(recovery=True) once"
            f" {', '.join(fields['unknown_bookies']) or 'the bookies'} are repaired or reachable.")
    if entry_id <= known_lac:
        if silent:
            head = (f"{where}: POSSIBLE DATA LOSS of an acknowledged entry (LAC {known_lac} was seen): no replica"
                    f" that answered has a valid copy; only {', '.join(silent)} (no usable answer) may still"
                    " hold it")
        else:
            head = (f"{where}: DATA LOSS of an acknowledged entry (LAC {known_lac} was seen): none of the"
                    f" {write_quorum} replicas holds a valid copy")
            kept = (" The ledger is left OPEN/IN_RECOVERY, never closed short of an acknowledged entry; recovery"
                    " cannot succeed unless a copy of the entry is restored.")
        return LedgerRecoveryError(f"{head} ({_describe(answers)}).{_limbo_advice(fields['limbo_bookies'])}{kept}",
                                   ledger_id=ledger_id, entry_id=entry_id, data_loss=not silent, **fields)
    head = (f"{where}: recovery cannot tell whether the entry exists: neither a valid copy nor {need_negative}"
            f" explicit negatives (ENOENTRY/ENOLEDGER; {negatives} received) among the {write_quorum} replicas")
    if fields["limbo_bookies"] and len(fields["limbo_bookies"]) + negatives == len(answers) == write_quorum:
        kept = (" No replica has the entry and the limbo bookies cannot say whether they lost it: if it was"
                " acknowledged, it is lost on every replica (DATA LOSS, not provable from here). The ledger is"
                " left OPEN/IN_RECOVERY, never closed short; a retry can only succeed once a copy of the entry"
                " comes back (restored data, or a replica that did not lose it).")
    return LedgerRecoveryError(f"{head} ({_describe(answers)}).{_limbo_advice(fields['limbo_bookies'])}{kept}",
                               ledger_id=ledger_id, entry_id=entry_id, **fields)


async def fence_last_segment(pool, digest: DigestManager, metadata: LedgerMetadata, master_key: bytes) -> int:
    """Step 2: fence every bookie of the last segment; returns the highest LAC the answers carry."""
    return await start_fencing(pool, digest, metadata, master_key)


def start_fencing(pool, digest: DigestManager, metadata: LedgerMetadata, master_key: bytes) -> asyncio.Future:
    """Send the fencing reads; a future of the highest LAC once the fence covers the ensemble.

    Covered by EOK (valid digest; its LAC counts), ENOENTRY, ENOLEDGER and EUNKNOWNLEDGERSTATE
    (fenced, but no LAC: the module docstring says why)."""
    _, ensemble = metadata.last_segment
    need = coverage(len(ensemble), metadata.ack_quorum_size)
    allowed_unknown = len(ensemble) - need
    done = asyncio.get_running_loop().create_future()
    state = {"covered": 0, "unknown": 0, "lac": -1}
    answers: dict[str, tuple[str, str]] = {}
    ledger_id = digest.ledger_id

    def on_answer(bookie: str, response, err) -> None:
        if done.done():
            return
        if err is None and response.rc == EOK:
            try:
                _, lac, _, _ = digest.unpack_entry(response.body)
            except DigestMismatchError as e:
                kind, text = UNKNOWN, str(e)
            else:
                kind, text = VALID, f"EOK (LAC {lac})"
                state["lac"] = max(state["lac"], lac)
        elif err is None and response.rc == EUA:
            done.set_exception(UnauthorizedAccessError(
                f"bookie {bookie} refused to fence ledger {ledger_id}: wrong password", ledger_id=ledger_id))
            return
        else:
            kind, text = _classify(response, err)
        answers[bookie] = (kind, text)
        state["unknown" if kind == UNKNOWN else "covered"] += 1
        if state["covered"] >= need:
            done.set_result(state["lac"])
        elif state["unknown"] > allowed_unknown:
            done.set_exception(LedgerRecoveryError(
                f"ledger {ledger_id}: cannot fence: {state['unknown']} of {len(ensemble)} bookies of the last"
                f" segment gave no answer that counts, at most {allowed_unknown} may ({_describe(answers)})."
                " The ledger is left IN_RECOVERY, not closed: retry once those bookies are reachable.",
                ledger_id=ledger_id, **_machine(answers, (UNKNOWN,))))

    for bookie in ensemble:
        try:
            client = pool.get(bookie)
            client.send_read(ledger_id, -1, partial(on_answer, bookie), flags=FLAG_DO_FENCING,
                             master_key=master_key)
        except BKError as e:
            on_answer(bookie, None, e)
    return done


def recovery_read(pool, digest: DigestManager, metadata: LedgerMetadata, entry_id: int,
                  master_key: bytes, known_lac: int = -1) -> asyncio.Future:
    """Step 4 for one entry: a future of (payload, length, lac) if positive, None if negative.

    Fails with LedgerRecoveryError (undecided_entry_error) when every answer is in and they
    decide neither; every read ends (the bookie client's read timeout bounds each one)."""
    ensemble = metadata.last_segment[1]
    size, wq, aq = metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size
    write_set = [ensemble[(entry_id + i) % size] for i in range(wq)]
    need_negative = coverage(wq, aq)
    done = asyncio.get_running_loop().create_future()
    state = {"negative": 0}
    answers: dict[str, tuple[str, str]] = {}

    def on_answer(bookie: str, response, err) -> None:
        if done.done():
            return
        if err is None and response.rc == EOK:
            try:
                lac, length, payload = digest.verify_entry(entry_id, response.body)
            except DigestMismatchError as e:
                kind, text = UNKNOWN, str(e)
            else:
                done.set_result((bytes(payload), length, lac))
                return
        else:
            kind, text = _classify(response, err)
        answers[bookie] = (kind, text)
        if kind == NEGATIVE_ANSWER:
            state["negative"] += 1
            if state["negative"] >= need_negative:
                done.set_result(None)
                return
        if len(answers) == wq:
            done.set_exception(undecided_entry_error(digest.ledger_id, entry_id, answers, wq, need_negative,
                                                     known_lac))

    for bookie in write_set:
        try:
            client = pool.get(bookie)
            client.send_read(digest.ledger_id, entry_id, partial(on_answer, bookie), flags=FLAG_DO_FENCING,
                             master_key=master_key)
        except BKError as e:
            on_answer(bookie, None, e)
    return done


def _lac_ahead(reads: dict) -> int:
    """The highest LAC carried by the recovered entries already read ahead (-1 if none)."""
    lac = -1
    for fut in reads.values():
        if fut.done() and not fut.cancelled() and fut.exception() is None and fut.result() is not None:
            lac = max(lac, fut.result()[2])
    return lac


def _restated(err: LedgerRecoveryError, metadata: LedgerMetadata, known_lac: int) -> LedgerRecoveryError:
    """`err` (an undecided entry) again, now that a LAC read ahead shows the entry was acknowledged."""
    kinds = {b: ((LIMBO if b in err.limbo_bookies else UNKNOWN if b in err.unknown_bookies else NEGATIVE_ANSWER),
                 text) for b, text in err.answers.items()}
    wq = metadata.write_quorum_size
    return undecided_entry_error(err.ledger_id, err.entry_id, kinds, wq, coverage(wq, metadata.ack_quorum_size),
                                 known_lac)


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
        raise LedgerRecoveryError(
            f"ledger {digest.ledger_id}: cannot read entry {entry_id}, the last acknowledged entry, for the"
            f" ledger length: {e}. If no replica holds it any more this is DATA LOSS of an acknowledged entry;"
            " the ledger is left OPEN/IN_RECOVERY, never closed short.", ledger_id=digest.ledger_id,
            entry_id=entry_id) from e


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
    known_lac = fenced_lac  # every entry up to it was acknowledged to the writer
    try:
        while True:
            while next_read < entry_id + RECOVERY_READ_WINDOW:
                reads[next_read] = recovery_read(bk.pool, digest, metadata, next_read, master_key, known_lac)
                next_read += 1
            try:
                found = await reads.pop(entry_id)
            except LedgerRecoveryError as e:
                known_lac = max(known_lac, _lac_ahead(reads))
                if e.entry_id == entry_id and entry_id <= known_lac and not e.data_loss:
                    raise _restated(e, metadata, known_lac) from None
                raise
            if found is None:
                known_lac = max(known_lac, _lac_ahead(reads))
                if entry_id <= known_lac:  # never close below an entry known to be acknowledged
                    raise LedgerRecoveryError(
                        f"ledger {ledger_id} entry {entry_id}: explicit negatives say the entry does not exist,"
                        f" but a later entry carries LAC {known_lac}, so it was acknowledged: DATA LOSS on bookies"
                        " that did not know they lost data. The ledger is left OPEN/IN_RECOVERY, never closed"
                        " short.", ledger_id=ledger_id, entry_id=entry_id, data_loss=True)
                break
            payload, length, lac = found
            known_lac = max(known_lac, lac)
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
            _retrieve(fut)
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
