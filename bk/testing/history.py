"""History recorder and checker for REPLICATION.md's correctness invariants.

A scenario records every add it invokes and how it ended, plus ledger-level
events (the writer closed at its LAC, a client recovered the ledger), then
hands the final metadata and what fresh readers read to `check_ledger`:

    h = History()
    for i in range(100):
        try:
            await h.add(lh, b"payload %d" % i)      # records ok / failed / unknown
        except BKError:
            break
    ...                                            # fence, recover, kill bookies
    result = check_ledger(h, lh.ledger_id, metadata, [reader1_map, reader2_map])
    result.assert_ok()
    assert_closed(metadata)                        # invariant 5 is the scenario's to assert

Outcomes of an add (`Outcome`):
- OK: acknowledged with an entry id. It must survive (invariants 1 and 2).
- FAILED: refused by the client before it could reach a bookie. Its payload
  must never be readable.
- UNKNOWN: anything else that went wrong (EFENCED, EUA, timeouts, connection
  loss, cancellation): the entry may or may not have reached the bookies, so
  it may or may not be in the closed ledger. An add still PENDING when the
  check runs (never resolved) counts as unknown.

`History.add(lh, payload)` returns the entry id that `await lh.add_entry(payload)`
returned (OK) and re-raises any exception after classifying it:
1. the exception says so itself (bk.client's contract): `outcome_unknown` True
   -> UNKNOWN, at the exception's `entry_id` (the client gives each in-flight
   add its own error, carrying that add's id); False ("never sent") -> FAILED;
2. otherwise by type, conservatively: LedgerClosedError, ValueError, TypeError
   (client-side refusals: closed handle, bad argument) -> FAILED; anything
   else (EFENCED, EUA, timeouts, cancellation, ...) -> UNKNOWN with no id.
A FAILED add whose payload shows up is reported (invariant 3): either the
client sent what it said it never sent, or the classification is wrong for
that client (`failed_types=`). Callers recording by hand pass an id to
`unknown(op, error, entry_id=...)` only when they know it; the wrapper never
guesses one from an exception without `outcome_unknown` (a client may fail
every later add with the first add's exception).

The checker's rule for an entry e that a reader returned and that no OK add
claims (invariant 3, "every entry read is a payload the writer sent for that id"):
  e is explained by an UNKNOWN/PENDING add u of the same ledger iff
  (a) u's payload equals the bytes read;
  (b) u has no recorded id, or its recorded id is e;
  (c) with check_order (default): ids follow invocation order, so e lies
      strictly between the highest id acknowledged to an add invoked before u
      and the lowest id acknowledged to an add invoked after u. (`add` invokes
      and calls `lh.add_entry` in one step, so this holds when the client
      assigns the id before add_entry first suspends, as BookKeeper does;
      pass check_order=False for a client that does not.)
  (d) each unknown add explains at most one entry (no duplicated entries).
  Entries are matched in id order; an add with a recorded id is preferred,
  then the earliest-invoked candidate. An entry that nothing explains is a
  violation: invented, a failed add's payload, or a duplicate.
OK adds are checked directly: the bytes at their id must be their payload
(invariant 1), and with check_order their ids must increase in invocation
order (invariant 3). Invariant 2 compares the closed lastEntryId with the acked
ids and recorded closes; invariant 4 checks the segments and that no read is
above lastEntryId (closed) or the given `lac` (open); invariant 5 (liveness) is
`assert_closed(metadata)`, asserted by the scenario.

Thread-safe: scenario threads may record concurrently (one lock).
"""
from __future__ import annotations

import enum
import itertools
import threading
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from bk.errors import LedgerClosedError
from bk.meta.ledger_metadata import LedgerState

INVARIANTS = {1: "no acknowledged entry lost", 2: "no truncation", 3: "agreement",
              4: "valid segments and read bounds", 5: "liveness"}
DEFAULT_FAILED_TYPES: tuple[type[BaseException], ...] = (LedgerClosedError, ValueError, TypeError)


class Outcome(enum.Enum):
    PENDING = "pending"
    OK = "ok"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass
class AddOp:
    """One invoked add. `op_id` increases with invocation order across the history."""

    op_id: int
    ledger_id: int
    payload: bytes
    outcome: Outcome = Outcome.PENDING
    entry_id: int | None = None  # OK: the acknowledged id; UNKNOWN: an id the caller knows, if any
    error: str | None = None

    def __repr__(self) -> str:
        at = "" if self.entry_id is None else f" entry {self.entry_id}"
        why = f" ({self.error})" if self.error else ""
        return f"add#{self.op_id}[{self.outcome.value}{at}, {len(self.payload)} bytes{why}]"


@dataclass(frozen=True)
class LedgerEvent:
    """`kind` is "writer_closed" (last_entry_id = the writer's LAC) or "recovered"."""

    kind: str
    ledger_id: int
    last_entry_id: int
    client: str | None = None


@dataclass(frozen=True)
class Violation:
    invariant: int
    ledger_id: int
    entry_id: int | None
    message: str

    def __str__(self) -> str:
        where = f"ledger {self.ledger_id}" + ("" if self.entry_id is None else f", entry {self.entry_id}")
        return f"invariant {self.invariant} ({INVARIANTS[self.invariant]}): {where}: {self.message}"


@dataclass
class CheckResult:
    ledger_id: int
    violations: list[Violation] = field(default_factory=list)
    summary: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def of(self, invariant: int) -> list[Violation]:
        return [v for v in self.violations if v.invariant == invariant]

    def assert_ok(self) -> None:
        if self.violations:
            lines = "\n  ".join(str(v) for v in self.violations)
            raise AssertionError(f"ledger {self.ledger_id}: {len(self.violations)} violation(s)"
                                 f" [{self.summary}]:\n  {lines}")

    def _add(self, invariant: int, entry_id: int | None, message: str) -> None:
        self.violations.append(Violation(invariant, self.ledger_id, entry_id, message))


class History:
    """What a scenario's writer(s) did, in invocation order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._ops: dict[int, AddOp] = {}
        self._events: list[LedgerEvent] = []

    # -- recording adds
    def invoke(self, ledger_id: int, payload) -> int:
        """Record an add about to be submitted; returns its op id."""
        payload = _as_bytes(payload, "payload")
        with self._lock:
            op = next(self._ids)
            self._ops[op] = AddOp(op, int(ledger_id), payload)
        return op

    def _resolve(self, op: int, outcome: Outcome, entry_id, error) -> None:
        if entry_id is not None and (not isinstance(entry_id, int) or isinstance(entry_id, bool) or entry_id < 0):
            raise ValueError(f"entry id must be an int >= 0, got {entry_id!r}")
        with self._lock:
            rec = self._ops.get(op)
            if rec is None:
                raise KeyError(f"no add was invoked with op id {op}")
            if rec.outcome is not Outcome.PENDING:
                raise ValueError(f"{rec!r} already has an outcome, cannot record {outcome.value}")
            rec.outcome, rec.entry_id = outcome, entry_id
            rec.error = None if error is None else (error if isinstance(error, str) else _describe(error))

    def ok(self, op: int, entry_id: int) -> None:
        """The add was acknowledged as `entry_id`."""
        if entry_id is None:
            raise ValueError("an acknowledged add needs its entry id")
        self._resolve(op, Outcome.OK, entry_id, None)

    def fail(self, op: int, error) -> None:
        """The add certainly never reached a bookie (refused by the client)."""
        self._resolve(op, Outcome.FAILED, None, error)

    def unknown(self, op: int, error, entry_id: int | None = None) -> None:
        """The add may or may not have been stored; `entry_id` only if the caller knows it."""
        self._resolve(op, Outcome.UNKNOWN, entry_id, error)

    async def add(self, lh, payload, *, ledger_id: int | None = None,
                  failed_types: tuple[type[BaseException], ...] = DEFAULT_FAILED_TYPES) -> int:
        """`await lh.add_entry(payload)`, recorded; returns the entry id, re-raises errors.

        The handle's `ledger_id` attribute names the ledger unless given.
        `add_entry` must return the entry id (an int, or an object with an
        `entry_id`); anything else is recorded as unknown and raises TypeError.
        """
        lid = lh.ledger_id if ledger_id is None else ledger_id
        op = self.invoke(lid, payload)
        try:
            result = await lh.add_entry(payload)
        except BaseException as e:  # cancellation too: the add may be in flight
            said = getattr(e, "outcome_unknown", None)
            hint = getattr(e, "entry_id", None)
            if said is True:
                self.unknown(op, e, hint if isinstance(hint, int) and hint >= 0 else None)
            elif said is False or (said is None and isinstance(e, failed_types)):
                self.fail(op, e)
            else:
                self.unknown(op, e)
            raise
        entry_id = result if isinstance(result, int) else getattr(result, "entry_id", None)
        if not isinstance(entry_id, int) or isinstance(entry_id, bool) or entry_id < 0:
            self.unknown(op, f"add_entry returned {result!r}, not an entry id")
            raise TypeError(f"add_entry returned {result!r}; History.add needs the entry id")
        self.ok(op, entry_id)
        return entry_id

    async def close(self, lh, *, ledger_id: int | None = None) -> None:
        """`await lh.close()`; on success records writer_closed at `lh.last_add_confirmed`.

        A close that fails (e.g. another client closed the ledger first) records nothing."""
        await lh.close()
        self.writer_closed(lh.ledger_id if ledger_id is None else ledger_id, lh.last_add_confirmed)

    # -- ledger events
    def writer_closed(self, ledger_id: int, lac: int) -> None:
        """The writer's own close succeeded with lastEntryId = its LAC."""
        with self._lock:
            self._events.append(LedgerEvent("writer_closed", int(ledger_id), int(lac)))

    def recovered(self, ledger_id: int, last_entry_id: int, client: str | None = None) -> None:
        """A client opened the ledger with recovery and saw it closed at `last_entry_id`."""
        with self._lock:
            self._events.append(LedgerEvent("recovered", int(ledger_id), int(last_entry_id), client))

    # -- queries
    def ops(self, ledger_id: int | None = None) -> list[AddOp]:
        with self._lock:
            return [op for op in self._ops.values() if ledger_id is None or op.ledger_id == ledger_id]

    def events(self, ledger_id: int | None = None) -> list[LedgerEvent]:
        with self._lock:
            return [ev for ev in self._events if ledger_id is None or ev.ledger_id == ledger_id]

    def acknowledged(self, ledger_id: int) -> dict[int, bytes]:
        """entry id -> payload of every OK add of the ledger."""
        return {op.entry_id: op.payload for op in self.ops(ledger_id) if op.outcome is Outcome.OK}

    def summary(self, ledger_id: int) -> str:
        counts = {o: 0 for o in Outcome}
        for op in self.ops(ledger_id):
            counts[op.outcome] += 1
        return ", ".join(f"{n} {o.value}" for o, n in counts.items())


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _as_bytes(value, what: str) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    data = getattr(value, "data", None)  # a client LedgerEntry
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes-like, got {type(value).__name__}")


def entries_to_map(entries: Iterable) -> dict[int, bytes]:
    """{entry_id: bytes} from a client's LedgerEntry list (objects with entry_id and data)."""
    return {e.entry_id: _as_bytes(e, f"entry {e.entry_id}") for e in entries}


def _is_closed(metadata) -> bool:
    state = metadata.state
    return state == LedgerState.CLOSED or getattr(state, "name", state) == "CLOSED"


def assert_closed(metadata, ledger_id: int | None = None) -> None:
    """Invariant 5 (liveness): the scenario's recovery must have ended with the ledger CLOSED."""
    if not _is_closed(metadata):
        state = getattr(metadata.state, "name", metadata.state)
        name = "" if ledger_id is None else f" {ledger_id}"
        raise AssertionError(f"invariant 5 ({INVARIANTS[5]}): ledger{name} is {state}, expected CLOSED")


# ------------------------------------------------------------------ the checker
def check_ledger(history: History, ledger_id: int, metadata, read_entries, *, lac: int | None = None,
                 require_complete: bool = True, check_order: bool = True,
                 check_length: bool = False, may_lose: Iterable[int] = ()) -> CheckResult:
    """Check invariants 1-4 of one ledger after a scenario.

    metadata: the final LedgerMetadata (or any object with state, last_entry_id,
        length, segments, ensemble_size, write_quorum_size, ack_quorum_size).
    read_entries: {entry_id: bytes} from one fresh reader, or a sequence of such
        mappings from several readers (values may be client LedgerEntry objects).
    lac: for a ledger that is not closed, the LAC the readers read up to; reads
        and acknowledged entries above it are then out of scope (open ledger
        readers never read past the LAC). Without it, every acknowledged entry
        must be readable.
    require_complete: for a closed ledger every id 0..lastEntryId must be read
        by every reader (a hole is a disagreement with the metadata).
    check_length: compare the closed `length` with the sum of payload sizes.
    may_lose: entry ids the scenario proved may be gone for real (BP-46: journal
        off and at least AQ bookies of the entry's write set crashed). Such an
        entry that no reader read is no violation of invariant 1 nor a hole in
        invariant 3; one that is read must still carry its payload, and the
        ledger must still not be closed below it (invariant 2 stays strict).
    """
    ledger_id = int(ledger_id)
    readers = _normalise_readers(read_entries)
    result = CheckResult(ledger_id, summary=history.summary(ledger_id))
    ops = sorted(history.ops(ledger_id), key=lambda op: op.op_id)
    acked = [op for op in ops if op.outcome is Outcome.OK]
    closed = _is_closed(metadata)
    last = metadata.last_entry_id if closed else lac
    lost = {int(e) for e in may_lose} - set().union(*readers)

    _check_acknowledged(result, acked, readers, closed, last, lost)
    _check_truncation(result, history, acked, metadata, closed)
    _check_agreement(result, readers, closed, last, require_complete, lost)
    _check_provenance(result, ops, acked, readers, check_order)
    _check_segments_and_bounds(result, metadata, readers, last)
    if check_length and closed and all(e in readers[0] for e in range(last + 1)):
        total = sum(len(readers[0][e]) for e in range(last + 1))
        if total != metadata.length:
            result._add(2, None, f"closed length {metadata.length} != {total} bytes of entries 0..{last}")
    return result


def _normalise_readers(read_entries) -> list[dict[int, bytes]]:
    maps = [read_entries] if isinstance(read_entries, Mapping) else list(read_entries)
    if not maps:
        raise ValueError("check_ledger needs what at least one reader read (an empty mapping is fine)")
    out = []
    for i, m in enumerate(maps):
        if not isinstance(m, Mapping):
            raise TypeError(f"reader {i}: expected a mapping entry_id -> bytes, got {type(m).__name__}")
        out.append({int(e): _as_bytes(v, f"reader {i} entry {e}") for e, v in m.items()})
    return out


def _check_acknowledged(result: CheckResult, acked: list[AddOp], readers, closed: bool, last,
                        lost: set = frozenset()) -> None:
    """Invariant 1: every acknowledged entry is read, by every reader, with its original bytes
    (entries in `lost`, which no reader read and the scenario excused, excepted)."""
    claimed: dict[int, AddOp] = {}
    for op in acked:
        e = op.entry_id
        if e in lost:
            claimed.setdefault(e, op)
            continue
        if e in claimed:
            result._add(1, e, f"{claimed[e]!r} and {op!r} were both acknowledged as entry {e}")
        claimed.setdefault(e, op)
        if last is not None and e > last:
            if closed:
                result._add(1, e, f"{op!r} is beyond the closed lastEntryId {last}: lost")
            continue  # open ledger: beyond the LAC the readers could see
        for i, reader in enumerate(readers):
            if e not in reader:
                result._add(1, e, f"{op!r} was acknowledged but reader {i} could not read it")
            elif reader[e] != op.payload:
                result._add(1, e, f"{op!r} was acknowledged but reader {i} read other bytes"
                                  f" ({len(reader[e])} bytes)")


def _check_truncation(result: CheckResult, history: History, acked: list[AddOp], metadata, closed: bool) -> None:
    """Invariant 2: lastEntryId >= every acknowledged id; a writer's own close is at its LAC.

    Recoverers must all report the final lastEntryId (agreement, invariant 3)."""
    max_acked = max((op.entry_id for op in acked), default=-1)
    events = history.events(result.ledger_id)
    if closed and metadata.last_entry_id < max_acked:
        above = sorted(op.entry_id for op in acked if op.entry_id > metadata.last_entry_id)
        result._add(2, max_acked, f"closed at lastEntryId {metadata.last_entry_id} but entries {above}"
                                  f" were acknowledged to the writer")
    for ev in events:
        if ev.kind == "writer_closed":
            if not closed:
                state = getattr(metadata.state, "name", metadata.state)
                result._add(2, None, f"the writer closed at LAC {ev.last_entry_id} but the metadata is {state}")
            elif ev.last_entry_id != metadata.last_entry_id:
                result._add(2, None, f"the writer closed at LAC {ev.last_entry_id} but lastEntryId is"
                                     f" {metadata.last_entry_id}")
        elif ev.kind == "recovered":
            who = f"recoverer {ev.client}" if ev.client else "a recoverer"
            if ev.last_entry_id < max_acked:
                result._add(2, max_acked, f"{who} closed at {ev.last_entry_id} below acknowledged {max_acked}")
            if closed and ev.last_entry_id != metadata.last_entry_id:
                result._add(3, None, f"{who} saw lastEntryId {ev.last_entry_id}, the metadata says"
                                     f" {metadata.last_entry_id}")


def _check_agreement(result: CheckResult, readers, closed: bool, last, require_complete: bool,
                     lost: set = frozenset()) -> None:
    """Invariant 3, first half: every reader reads identical bytes for 0..lastEntryId."""
    ids = set().union(*readers)
    if closed and require_complete:
        ids |= set(range(last + 1)) - lost
    for e in sorted(ids):
        if last is not None and not 0 <= e <= last:
            continue  # out of bounds: invariant 4's business
        values = [reader.get(e) for reader in readers]
        missing = [i for i, v in enumerate(values) if v is None]
        present = {v for v in values if v is not None}
        if missing and (present or closed and require_complete):
            result._add(3, e, f"readers {missing} could not read it" +
                        (f" while others did" if present else f" although lastEntryId is {last}"))
        if len(present) > 1:
            result._add(3, e, f"readers disagree: {len(present)} different values"
                              f" ({', '.join(str(len(v)) + ' bytes' for v in present)})")


def _order_windows(ops: list[AddOp]) -> dict[int, tuple[int, float]]:
    """op_id -> (highest id acked to an earlier add, lowest id acked to a later add)."""
    windows, low = {}, -1
    for op in ops:
        windows[op.op_id] = [low, float("inf")]
        if op.outcome is Outcome.OK:
            low = max(low, op.entry_id)
    high = float("inf")
    for op in reversed(ops):
        windows[op.op_id][1] = high
        if op.outcome is Outcome.OK:
            high = min(high, op.entry_id)
    return {k: (lo, hi) for k, (lo, hi) in windows.items()}


def _check_provenance(result: CheckResult, ops: list[AddOp], acked: list[AddOp], readers,
                      check_order: bool) -> None:
    """Invariant 3, second half: every entry read is a payload the writer sent for that id."""
    claimed = {op.entry_id for op in acked}
    if check_order:
        for a, b in zip(acked, acked[1:]):
            if b.entry_id <= a.entry_id:
                result._add(3, b.entry_id, f"ids do not follow invocation order: {a!r} was invoked before {b!r}")
    windows = _order_windows(ops)
    maybe = [op for op in ops if op.outcome in (Outcome.UNKNOWN, Outcome.PENDING)]
    used: dict[int, int] = {}  # op id -> entry id it explains
    seen = sorted({(e, v) for reader in readers for e, v in reader.items() if e not in claimed})
    for e, value in seen:
        candidates = [op for op in maybe if op.payload == value and op.op_id not in used
                      and op.entry_id in (None, e)
                      and (not check_order or windows[op.op_id][0] < e < windows[op.op_id][1])]
        if candidates:
            best = min(candidates, key=lambda op: (op.entry_id != e, op.op_id))
            used[best.op_id] = e
            continue
        result._add(3, e, _why_unexplained(e, value, ops, used, windows, check_order))


def _why_unexplained(e: int, value: bytes, ops: list[AddOp], used: dict, windows, check_order: bool) -> str:
    same = [op for op in ops if op.payload == value]
    if not same:
        return f"read {len(value)} bytes that no add of this ledger ever sent (invented entry)"
    reasons = []
    for op in same:
        if op.outcome is Outcome.FAILED:
            reasons.append(f"{op!r} failed before reaching a bookie")
        elif op.outcome is Outcome.OK:
            reasons.append(f"duplicate of {op!r}")
        elif op.op_id in used:
            reasons.append(f"{op!r} already explains entry {used[op.op_id]}")
        elif op.entry_id not in (None, e):
            reasons.append(f"{op!r} was recorded at entry {op.entry_id}")
        elif check_order:
            lo, hi = windows[op.op_id]
            reasons.append(f"{op!r} must lie between entries {lo} and {hi} (invocation order)")
    return "payload not sent for this id: " + "; ".join(reasons)


def _check_segments_and_bounds(result: CheckResult, metadata, readers, last) -> None:
    """Invariant 4: first-entry keys strictly increase from 0; E distinct bookies per
    segment; no reader returned an id above lastEntryId (closed) or the LAC (open)."""
    e_size = metadata.ensemble_size
    if not e_size >= metadata.write_quorum_size >= metadata.ack_quorum_size >= 1:
        result._add(4, None, f"need E {e_size} >= WQ {metadata.write_quorum_size} >= AQ"
                             f" {metadata.ack_quorum_size} >= 1")
    segments = list(metadata.segments)
    if not segments:
        result._add(4, None, "no segments")
    elif segments[0][0] != 0:
        result._add(4, segments[0][0], f"the first segment starts at entry {segments[0][0]}, not 0")
    for (prev, _), (first, _) in zip(segments, segments[1:]):
        if first <= prev:
            result._add(4, first, f"segment keys do not strictly increase: {prev} then {first}")
    for first, bookies in segments:
        bookies = tuple(bookies)
        if len(bookies) != e_size or len(set(bookies)) != len(bookies):
            result._add(4, first, f"segment at {first} has bookies {list(bookies)}, need {e_size} distinct")
    for i, reader in enumerate(readers):
        for e in sorted(reader):
            if e < 0 or (last is not None and e > last):
                bound = "below 0" if e < 0 else f"above {'lastEntryId' if _is_closed(metadata) else 'LAC'} {last}"
                result._add(4, e, f"reader {i} returned an entry {bound}")


__all__ = [
    "AddOp", "CheckResult", "DEFAULT_FAILED_TYPES", "History", "INVARIANTS", "LedgerEvent", "Outcome", "Violation",
    "assert_closed", "check_ledger", "entries_to_map",
]
