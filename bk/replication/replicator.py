"""Re-replication of ledger segments: copy a lost bookie's share of a segment to a target bookie,
then compare-and-set the metadata (REPLICATION.md, "Bookie recovery", steps 1-5).

A lost bookie B at ensemble index i of segment [first, last] held exactly the
entries e with `(i - e) mod E < WQ` (B is in their write set). Each of them is
read from a replica of its write set, its digest verified, and the stored bytes - entry
header, digest and payload, unchanged - are written to the target with
FLAG_RECOVERY_ADD and the ledger's master key, so fenced and closed ledgers
accept it. A window of entries is in flight (read, then write); an optional
rate limit bounds the bytes per second.

Sources are tried in order: the replicas not known to be lost, then the other
lost ones, then B itself. "Lost" often means "lacks some entries" (the auditor
marks a bookie a checker found holes on, and with AQ < WQ every bookie of a
segment may have holes while each entry still has a copy somewhere); excluding
such bookies left entries with no source at all (chaos seed 89). An entry a
bookie lacks is answered NoSuchEntry and the next source is tried; a dead
bookie fails fast or times out, and is only asked when every better one failed.

Only once the target acknowledged every entry is the metadata changed: B is
replaced by the target in that segment (LedgerMetadata.with_segment_replaced),
by a CAS loop that re-decides on every conflict - B already replaced by someone
else is fine (nothing to do), the target already in the ensemble or a segment
that disappeared is an error. The segment must have an end: a closed ledger,
or any segment but the last of an open ledger (its boundaries never move).
The last segment of a ledger that is not closed belongs to its writer; it is
first given a grace period (the writer normally replaces B itself with an
ensemble change) and then fenced and closed by opening the ledger with
recovery (`close_open_ledger`).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from bk.errors import (
    BKError, DigestMismatchError, LedgerRecoveryError, NoSuchLedgerMetadataError, ReplicationError, error_for_code,
)
from bk.meta.ledger_metadata import LedgerMetadata
from bk.proto import DigestManager, DigestType, StatusCode, master_key
from bk.formats.wire import ADD_RECOVERY_HEADER, FRAME_HEAD, PACKET_HEADER_BYTES

log = logging.getLogger(__name__)

EOK = int(StatusCode.EOK)
RETRYABLE = (int(StatusCode.ETOOMANYREQUESTS),)
WRITE_ATTEMPTS = 4
WRITE_RETRY_S = 0.2


# ---------------------------------------------------------------------- entry arithmetic
def segment_bounds(md: LedgerMetadata, index: int) -> tuple[int, int | None]:
    """(first, last) entry ids of segment `index`; last is None when the segment has no end yet
    (the last segment of a ledger that is not closed). last < first: an empty segment."""
    first = md.segments[index][0]
    if index + 1 < len(md.segments):
        return first, md.segments[index + 1][0] - 1
    return first, (md.last_entry_id if md.is_closed else None)


def bookie_entries(first: int, last: int, ensemble_size: int, write_quorum_size: int,
                   bookie_index: int) -> range | list[int]:
    """Entry ids in [first, last] whose write set includes ensemble index `bookie_index`."""
    if last < first:
        return []
    if ensemble_size == write_quorum_size:
        return range(first, last + 1)
    return [e for e in range(first, last + 1) if (bookie_index - e) % ensemble_size < write_quorum_size]


def share_ends(first: int, last: int, ensemble_size: int, write_quorum_size: int,
               bookie_index: int) -> tuple[int, ...]:
    """The first and last entry of a bookie's share of [first, last] (one id, or none)."""
    if last < first:
        return ()
    mine = lambda e: (bookie_index - e) % ensemble_size < write_quorum_size  # noqa: E731
    low = next((e for e in range(first, min(last, first + ensemble_size - 1) + 1) if mine(e)), None)
    if low is None:
        return ()
    high = next(e for e in range(last, max(first, last - ensemble_size + 1) - 1, -1) if mine(e))
    return (low,) if low == high else (low, high)


def write_set(md: LedgerMetadata, ensemble: Sequence[str], entry_id: int) -> list[str]:
    size = md.ensemble_size
    return [ensemble[(entry_id + i) % size] for i in range(md.write_quorum_size)]


def ledger_digest(ledger_id: int, md: LedgerMetadata) -> tuple[DigestManager, bytes]:
    """The digest manager and master key of a ledger, from the password its metadata stores."""
    if md.password is None:
        raise ReplicationError(f"ledger {ledger_id}: its metadata stores no password, so its entries cannot"
                               " be written to another bookie (metadata written by an old client?)")
    dtype = DigestType(int(md.digest_type)) if md.digest_type is not None else DigestType.CRC32C
    return DigestManager(ledger_id, dtype, md.password), master_key(md.password)


# ---------------------------------------------------------------------- rate limit
class RateLimiter:
    """Bytes per second over the life of the limiter (a token bucket with one second of burst)."""

    def __init__(self, rate_bytes_per_s: int):
        if rate_bytes_per_s <= 0:
            raise ValueError("rate_bytes_per_s must be > 0")
        self.rate_bytes_per_s = rate_bytes_per_s
        self._start = time.monotonic()
        self._spent_bytes = 0

    def spend(self, nbytes: int) -> None:
        self._spent_bytes += nbytes

    def delay_s(self) -> float:
        """How long to wait before spending more."""
        allowed = (time.monotonic() - self._start + 1.0) * self.rate_bytes_per_s
        return max(0.0, (self._spent_bytes - allowed) / self.rate_bytes_per_s)


# ---------------------------------------------------------------------- copying entries
@dataclass
class CopyStats:
    entries: int = 0
    bytes: int = 0


class EntryCopy:
    """Copies a list of entries to one target with `window` of them in flight.

    Per entry: read from each replica in turn until one returns an EOK whose
    digest, ledger id and entry id verify; then send those bytes to the target
    as a recovery add (retrying ETOOMANYREQUESTS a few times). The first entry
    that cannot be read or written fails the whole copy."""

    def __init__(self, pool, digest: DigestManager, key: bytes, entries: Sequence[int],
                 replicas_for: Callable[[int], list[str]], target: str, window: int,
                 limiter: RateLimiter | None, on_bytes: Callable[[int], None] | None, store=None):
        self.pool = pool
        self.digest = digest
        self.ledger_id = digest.ledger_id
        self.key = key
        self.entries = entries
        self.replicas_for = replicas_for
        self.target = target
        # store(entry_id, stored_bytes, answered): a recovery add on the target that calls
        # answered(response, err) once; the default goes over the wire, a bookie repairing
        # itself adds locally (bk.replication.integrity)
        self.store = store or self._send_to_target
        self.target_client = pool.get(target) if store is None else None
        self.window = max(1, window)
        self.limiter = limiter
        self.on_bytes = on_bytes
        self.stats = CopyStats()
        self._loop = asyncio.get_running_loop()
        self.future = self._loop.create_future()
        self._next = 0
        self._in_flight = 0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> asyncio.Future:
        if not self.entries:
            self.future.set_result(self.stats)
        else:
            self._fill()
        return self.future

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self.future.done():
            self.future.cancel()

    def _fill(self) -> None:
        self._timer = None
        entries = self.entries
        while self._in_flight < self.window and self._next < len(entries) and not self.future.done():
            if self.limiter is not None:
                wait_s = self.limiter.delay_s()
                if wait_s > 0:
                    if self._timer is None:
                        self._timer = self._loop.call_later(wait_s, self._fill)
                    return
            entry_id = entries[self._next]
            self._next += 1
            self._in_flight += 1
            self._read(entry_id, self.replicas_for(entry_id), 0, [])

    def _fail(self, err: BKError) -> None:
        if not self.future.done():
            self.future.set_exception(err)

    # -- read
    def _read(self, entry_id: int, replicas: list[str], at: int, answers: list[str]) -> None:
        if self.future.done():
            return
        if at >= len(replicas):
            detail = "; ".join(answers) or "no replica in its write set"
            self._fail(ReplicationError(f"ledger {self.ledger_id} entry {entry_id}: no replica could be read"
                                        f" ({detail})"))
            return
        bookie = replicas[at]

        def answered(response, err) -> None:
            if err is None and response.rc == EOK:
                try:
                    self.digest.verify_entry(entry_id, response.body)
                except DigestMismatchError as e:
                    answers.append(f"{bookie}: {e}")
                else:
                    self._write(entry_id, response.body, 1)
                    return
            else:
                answers.append(f"{bookie}: {err if err is not None else error_for_code(response.rc).name}")
            self._read(entry_id, replicas, at + 1, answers)

        try:
            self.pool.get(bookie).send_read(self.ledger_id, entry_id, answered)
        except BKError as e:
            answered(None, e)

    # -- write
    def _send_to_target(self, entry_id: int, body: bytes, answered) -> None:
        """The default `store`: a recovery ADD to the target bookie over the wire."""
        frame = b"".join((FRAME_HEAD.pack(PACKET_HEADER_BYTES + len(self.key) + len(body), ADD_RECOVERY_HEADER), self.key,
                          body))
        self.target_client.send_add(frame, self.ledger_id, entry_id, answered)

    def _write(self, entry_id: int, body: bytes, attempt: int) -> None:
        if self.future.done():
            return

        def answered(response, err) -> None:
            if err is None and response.rc == EOK:
                self._written(len(body))
                return
            rc = None if err is not None else response.rc
            if attempt < WRITE_ATTEMPTS and (rc in RETRYABLE or err is not None):
                self._loop.call_later(WRITE_RETRY_S * attempt, self._write, entry_id, body, attempt + 1)
                return
            why = err if err is not None else error_for_code(rc).name
            self._fail(ReplicationError(f"ledger {self.ledger_id} entry {entry_id}: target bookie {self.target}"
                                        f" did not store it ({why})"))

        try:
            self.store(entry_id, body, answered)
        except BKError as e:
            answered(None, e)

    def _written(self, nbytes: int) -> None:
        self._in_flight -= 1
        self.stats.entries += 1
        self.stats.bytes += nbytes
        if self.limiter is not None:
            self.limiter.spend(nbytes)
        if self.on_bytes is not None:
            try:
                self.on_bytes(nbytes)
            except Exception:  # a progress display must not break the copy
                log.exception("progress callback failed")
        if self.future.done():
            return
        if self.stats.entries == len(self.entries):
            self.future.set_result(self.stats)
        else:
            self._fill()


# ---------------------------------------------------------------------- ledgers
@dataclass
class SegmentResult:
    first_entry_id: int
    lost_bookie: str
    target: str
    entries: int
    bytes: int
    replaced: bool  # False: someone else had replaced the bookie meanwhile


@dataclass
class LedgerOutcome:
    ledger_id: int
    segments: list[SegmentResult] = field(default_factory=list)
    fenced: bool = False  # this run closed an open ledger by recovery
    deleted: bool = False  # the ledger was deleted meanwhile
    skipped_open: bool = False  # an open ledger left alone (skip_open)
    left: list[tuple[int, str]] = field(default_factory=list)  # (segment first entry, lost bookie) not done
    errors: list[tuple[int, str, str]] = field(default_factory=list)  # (first entry, bookie, why) copies that failed

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.segments)

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.segments)

    @property
    def fully_replicated(self) -> bool:
        return not self.left and not self.skipped_open


TargetChooser = Callable[[LedgerMetadata, int, str], "str | None"]


class LedgerReplicator:
    """Re-replicates the segments of one ledger that name lost bookies (uses a started BookKeeper)."""

    def __init__(self, bk, *, window_entries: int = 100, rate_bytes_per_s: int = 0):
        self.bk = bk
        self.window_entries = max(1, int(window_entries))
        self.limiter = RateLimiter(rate_bytes_per_s) if rate_bytes_per_s > 0 else None

    async def close_open_ledger(self, ledger_id: int, lost: Iterable[str], grace_s: float) -> LedgerMetadata:
        """An open ledger whose last segment names a lost bookie: wait up to `grace_s` for its writer
        to replace the bookie or close the ledger, then fence and close it (open with recovery)."""
        return (await self._close_open_ledger(ledger_id, lost, grace_s))[0]

    async def _close_open_ledger(self, ledger_id: int, lost: Iterable[str],
                                 grace_s: float) -> tuple[LedgerMetadata, bool]:
        """(metadata, True if this call fenced and closed the ledger)."""
        lost = set(lost)
        lm = self.bk.ledger_manager

        def settled(md: LedgerMetadata) -> bool:
            return md.is_closed or not lost & set(md.last_segment[1])

        md, _ = await lm.read_ledger_metadata(ledger_id)
        if settled(md):
            return md, False
        if grace_s > 0:
            changed = asyncio.Event()
            watch = await lm.watch_ledger_metadata(ledger_id, lambda m, v: changed.set())
            try:
                deadline = asyncio.get_running_loop().time() + grace_s
                while not settled(md):
                    remaining = deadline - asyncio.get_running_loop().time()
                    if remaining <= 0:
                        break
                    changed.clear()
                    # asyncio.timeout, not wait_for: on Python 3.11, wait_for returns normally when
                    # its task is cancelled just as the event is set, and the cancellation is lost
                    # (chaos seed 107897: the worker's task slept on, and its stop() waited for ever)
                    try:
                        async with asyncio.timeout(remaining):
                            await changed.wait()
                    except TimeoutError:
                        pass
                    md, _ = await lm.read_ledger_metadata(ledger_id)
            finally:
                watch.cancel()
        if settled(md):
            return md, False
        log.info("ledger %d: still open with lost bookie(s) %s in its last segment; fencing and closing it",
                 ledger_id, sorted(lost & set(md.last_segment[1])))
        if md.password is None:
            raise ReplicationError(f"ledger {ledger_id}: no password in its metadata, cannot recover it")
        try:
            handle = await self.bk.open_ledger(ledger_id, md.password, recovery=True)
        except LedgerRecoveryError as e:
            raise ReplicationError(f"ledger {ledger_id}: could not fence and close it: {e}") from e
        return handle.metadata, True

    async def replicate_segment(self, ledger_id: int, md: LedgerMetadata, index: int, lost_bookie: str,
                                target: str, lost: Iterable[str] = (),
                                on_bytes: Callable[[int], None] | None = None) -> SegmentResult:
        """Copy `lost_bookie`'s share of segment `index` to `target`, then CAS the replacement."""
        first, last = segment_bounds(md, index)
        if last is None:
            raise ReplicationError(f"ledger {ledger_id}: segment at entry {first} is the open end of the ledger;"
                                   " fence and close the ledger first")
        ensemble = md.segments[index][1]
        if lost_bookie not in ensemble:
            raise ReplicationError(f"ledger {ledger_id}: bookie {lost_bookie} is not in the segment at {first}")
        if target in ensemble:
            raise ReplicationError(f"ledger {ledger_id}: target {target} is already in the segment at {first}"
                                   f" ({list(ensemble)})")
        lost = set(lost)
        digest, key = ledger_digest(ledger_id, md)
        entries = bookie_entries(first, last, md.ensemble_size, md.write_quorum_size, ensemble.index(lost_bookie))

        def replicas_for(entry_id: int) -> list[str]:
            # sorted() is stable: within each rank the write set's order is kept
            return sorted(write_set(md, ensemble, entry_id),
                          key=lambda b: 2 if b == lost_bookie else 1 if b in lost else 0)

        op = EntryCopy(self.bk.pool, digest, key, entries, replicas_for, target, self.window_entries,
                        self.limiter, on_bytes)
        try:
            stats = await op.start()
        finally:
            op.cancel()
        replaced = await self._swap(ledger_id, first, lost_bookie, target)
        log.info("ledger %d: segment at %d: %d entries (%d bytes) copied from the replicas of %s to %s%s",
                 ledger_id, first, stats.entries, stats.bytes, lost_bookie, target,
                 "" if replaced else " (the bookie had been replaced meanwhile)")
        return SegmentResult(first, lost_bookie, target, stats.entries, stats.bytes, replaced)

    async def _swap(self, ledger_id: int, first: int, lost_bookie: str, target: str) -> bool:
        swapped = []

        def update(current: LedgerMetadata):
            firsts = [f for f, _ in current.segments]
            if first not in firsts:
                raise ReplicationError(f"ledger {ledger_id}: no segment starts at entry {first} any more")
            index = firsts.index(first)
            ensemble = current.segments[index][1]
            if lost_bookie not in ensemble:
                return None  # replaced by someone else meanwhile
            if target in ensemble:
                raise ReplicationError(f"ledger {ledger_id}: target {target} joined the segment at {first}"
                                       " meanwhile")
            if index == len(current.segments) - 1 and not current.is_closed:
                raise ReplicationError(f"ledger {ledger_id}: the segment at {first} is the open end of the"
                                       " ledger; its writer owns it")
            swapped.append(True)
            return current.with_segment_replaced(first, tuple(target if b == lost_bookie else b for b in ensemble))

        await self.bk.ledger_manager.update_ledger_metadata(ledger_id, update)
        return bool(swapped)

    async def replicate_ledger(self, ledger_id: int, lost: Iterable[str], choose_target: TargetChooser, *,
                               open_grace_s: float = 0.0, skip_open: bool = False,
                               on_bytes: Callable[[int], None] | None = None,
                               shares: set[tuple[int, str]] | None = None) -> LedgerOutcome:
        """Replace every lost bookie in every segment of the ledger, one segment and bookie at a time.

        `choose_target(metadata, segment_index, lost_bookie)` names the target, or None to leave that
        one (it is reported in `left`). `shares`, when given, limits the work to those (segment first
        entry, bookie) pairs: a bookie that lacks entries of one segment keeps the segments it holds
        whole. A share whose copy fails (an entry no replica can give, a refusing target) is
        recorded in `errors` and stays in `left`; the other shares are still copied. A ledger
        deleted meanwhile counts as done."""
        lost = set(lost)

        def wanted(first: int, bookie: str) -> bool:
            return bookie in lost and (shares is None or (first, bookie) in shares)

        outcome = LedgerOutcome(ledger_id)
        try:
            md, _ = await self.bk.ledger_manager.read_ledger_metadata(ledger_id)
            if not md.is_closed and any(wanted(md.last_segment[0], b) for b in md.last_segment[1]):
                if skip_open:
                    outcome.skipped_open = True
                    return outcome
                md, outcome.fenced = await self._close_open_ledger(ledger_id, lost, open_grace_s)
            done: set[tuple[int, str]] = set()
            while True:
                todo = [(i, b) for i, (first, ensemble) in enumerate(md.segments) for b in ensemble
                        if wanted(first, b) and (first, b) not in done and segment_bounds(md, i)[1] is not None]
                if not todo:
                    break
                index, bookie = todo[0]
                first = md.segments[index][0]
                done.add((first, bookie))
                target = choose_target(md, index, bookie)
                if target is None:
                    continue
                try:
                    outcome.segments.append(await self.replicate_segment(ledger_id, md, index, bookie, target,
                                                                         lost, on_bytes))
                except NoSuchLedgerMetadataError:
                    raise
                except BKError as e:
                    # As BookKeeper's ReplicationWorker goes on to the next fragment: a share that
                    # cannot be copied now (an entry no replica can give, a refusing target) must
                    # not keep the ledger's other shares under-replicated. It stays in `left`.
                    log.warning("ledger %d: segment at %d: copying the share of %s failed: %s", ledger_id, first,
                                bookie, e)
                    outcome.errors.append((first, bookie, str(e)))
                md, _ = await self.bk.ledger_manager.read_ledger_metadata(ledger_id)
            outcome.left = [(first, b) for first, ensemble in md.segments for b in ensemble if wanted(first, b)]
        except NoSuchLedgerMetadataError:
            outcome.deleted = True
            outcome.left = []
        return outcome
