"""Metrics: the one seam to prometheus_client, with BookKeeper's metric names.

Every layer may record; only bk.server exports (the HTTP admin server's
/metrics). Recording must cost the add path almost nothing, so a metric here is
a plain Python object updated without a lock, and prometheus_client is used
only at scrape time (`collect()` builds its metric families):

- `Counter.inc(n)`: an int add. BookKeeper's counters carry no `_total` suffix
  (`bookie_WRITE_BYTES`), so they are exported untyped under their exact names:
  existing BookKeeper/Pulsar dashboards and alerts keep working, and PromQL's
  rate() treats them as counters.
- `OpStat`: BookKeeper's OpStatsLogger (success and failure of an operation
  with its latency in milliseconds), label `success="true"|"false"`, in one of
  two shapes (`set_latency_shape`, the setting prometheus_latency_shape):
  "summary" (default, BookKeeper's Prometheus provider): `<name>{quantile="0.5"}`
  ... `{quantile="1.0"}`, `<name>_count`, `<name>_sum`; "histogram":
  `<name>_bucket{le=...}`, `_count`, `_sum`. `record_many(n, v)` counts n events
  of one value: the add path records once per completion batch.
- `ValueStat`: the same for values (group sizes, bytes), no success label.

Summary quantiles are computed, not guessed from coarse buckets: `_Sketch` keeps
log-spaced buckets of ratio GAMMA (1.02) per window, so every quantile it reports
is within 1% (relative) of a value actually recorded at that rank; at most about
1,300 buckets whatever the traffic. Quantiles cover the current window and the one
before it (windows of ROLLOVER_S = 60 s, BookKeeper's default latency rollover,
turned at scrape time), so they describe the last 60-120 s; `_count` and `_sum`
are totals since start, as BookKeeper's are.
- `Gauge`: a function read at scrape time (write cache size, queue lengths).

Updates come from the loop, the journal writer and the flush thread; each metric
has one writing thread where it matters, and a racing scrape may see a batch half
counted, never a wrong total. Metrics are process-wide, as prometheus_client's
registry is (an in-process test cluster shares them).

`set_enabled(False)` (the `metrics_enabled` setting) turns every recording call
into a no-op: the benchmark of the cost of metrics compares the two.
"""
from __future__ import annotations

import math
import time
from bisect import bisect_left
from typing import Callable, Iterable

# latency buckets in milliseconds (upper bounds; +Inf is added)
LATENCY_BUCKETS_MS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0,
                      1000.0, 2500.0, 5000.0, 10000.0)
# counts (records per journal group, ledgers per audit)
COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
# sizes in bytes
BYTES_BUCKETS = (1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20,
                 256 << 20, 1 << 30)

QUANTILES = (0.5, 0.75, 0.95, 0.99, 0.999, 0.9999, 1.0)  # BookKeeper's, labelled "0.5" ... "1.0"
GAMMA = 1.02  # sketch bucket ratio: relative error <= (GAMMA - 1) / (GAMMA + 1) < 1%
_LOG_GAMMA = math.log(GAMMA)
ROLLOVER_S = 60.0
SHAPES = ("summary", "histogram")

_REGISTRY: dict[str, "_Metric"] = {}
_ALIASES: dict[str, "_Metric"] = {}  # a second export name for a metric (same measurement)
_enabled = True


class _Metric:
    __slots__ = ("name", "help")
    kind = ""

    def __init__(self, name: str, help: str):
        if name in _REGISTRY:
            raise ValueError(f"metric {name} is defined twice")
        self.name = name
        self.help = help
        _REGISTRY[name] = self


class Counter(_Metric):
    __slots__ = ("value",)
    kind = "counter"

    def __init__(self, name: str, help: str):
        super().__init__(name, help)
        self.value = 0

    def inc(self, n: int = 1) -> None:
        self.value += n


class _Histogram:
    """Bucket counts of one label set: counts[i] counts values <= bounds[i] (the last, +Inf)."""
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def add(self, n: int, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += n * value

    def samples(self) -> tuple[list, float]:
        """(cumulative [(le, count)], sum) as prometheus_client's HistogramMetricFamily wants."""
        running, out = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out, self.total

    @property
    def count(self) -> int:
        return sum(self.counts)


class _Sketch:
    """Counts of one label set in log-spaced buckets (bucket k holds (GAMMA^(k-1), GAMMA^k]),
    per window; quantiles over the current and the previous window, count and sum since start."""
    __slots__ = ("cur", "prev", "started", "count", "total")

    def __init__(self, bounds: tuple = ()):  # bounds unused: the signature of _Histogram
        self.cur: dict[int, int] = {}
        self.prev: dict[int, int] = {}
        self.started = time.monotonic()
        self.count = 0
        self.total = 0.0

    def add(self, n: int, value: float) -> None:
        self.count += n
        self.total += n * value
        k = math.ceil(math.log(value) / _LOG_GAMMA) if value > 0 else _ZERO
        cur = self.cur
        cur[k] = cur.get(k, 0) + n

    def quantiles(self, now: float | None = None) -> list[tuple[str, float]]:
        """[(label, value)] for QUANTILES; NaN when the two windows saw nothing."""
        now = time.monotonic() if now is None else now
        if now - self.started >= ROLLOVER_S:  # a racing add may land in the window being turned
            self.prev, self.cur, self.started = self.cur, {}, now
        merged = dict(self.prev)
        for k, c in list(self.cur.items()):
            merged[k] = merged.get(k, 0) + c
        keys = sorted(merged)
        n = sum(merged.values())
        out = []
        for q in QUANTILES:
            if n == 0:
                out.append((repr(q), float("nan")))
                continue
            rank, seen = max(1, math.ceil(q * n - 1e-9)), 0  # the rank-th smallest value (1-based)
            for k in keys:
                seen += merged[k]
                if seen >= rank:
                    break
            out.append((repr(q), 0.0 if k == _ZERO else 2 * GAMMA ** k / (GAMMA + 1)))
        return out


_ZERO = -(1 << 30)  # the bucket of values <= 0


class OpStat(_Metric):
    """BookKeeper's OpStatsLogger: latency in ms of successful and failed operations."""
    __slots__ = ("ok", "failed", "bounds")
    kind = "opstat"

    def __init__(self, name: str, help: str, buckets: tuple = LATENCY_BUCKETS_MS):
        super().__init__(name, help)
        self.bounds = buckets
        self.ok = _SHAPE(buckets)
        self.failed = _SHAPE(buckets)

    def success(self, latency_ms: float) -> None:
        self.ok.add(1, latency_ms)

    def failure(self, latency_ms: float) -> None:
        self.failed.add(1, latency_ms)

    def record_many(self, n: int, latency_ms: float, ok: bool = True) -> None:
        (self.ok if ok else self.failed).add(n, latency_ms)


class ValueStat(_Metric):
    """A histogram of values (sizes, counts): BookKeeper's OpStatsLogger used for values."""
    __slots__ = ("hist", "bounds")
    kind = "value"

    def __init__(self, name: str, help: str, buckets: tuple):
        super().__init__(name, help)
        self.bounds = buckets
        self.hist = _SHAPE(buckets)

    def record(self, value: float) -> None:
        self.hist.add(1, value)


class Gauge(_Metric):
    """A value read at scrape time from `fn()` (set by whoever owns the state; None = absent)."""
    __slots__ = ("fn",)
    kind = "gauge"

    def __init__(self, name: str, help: str):
        super().__init__(name, help)
        self.fn: Callable[[], float] | None = None

    def set_function(self, fn: Callable[[], float] | None) -> None:
        self.fn = fn


# The no-op twins set_enabled(False) switches to (same slots, so __class__ can change).
class _NullCounter(Counter):
    __slots__ = ()

    def inc(self, n: int = 1) -> None:
        pass


class _NullOpStat(OpStat):
    __slots__ = ()

    def success(self, latency_ms: float) -> None:
        pass

    def failure(self, latency_ms: float) -> None:
        pass

    def record_many(self, n: int, latency_ms: float, ok: bool = True) -> None:
        pass


class _NullValueStat(ValueStat):
    __slots__ = ()

    def record(self, value: float) -> None:
        pass


_NULL = {Counter: _NullCounter, OpStat: _NullOpStat, ValueStat: _NullValueStat}
_REAL = {v: k for k, v in _NULL.items()}


def set_enabled(enabled: bool) -> None:
    """Turn recording on or off for every metric (the values recorded so far stay)."""
    global _enabled
    _enabled = bool(enabled)
    table = _REAL if _enabled else _NULL
    for m in _REGISTRY.values():
        m.__class__ = table.get(type(m), type(m))


def enabled() -> bool:
    return _enabled


_SHAPE = _Sketch  # what OpStat and ValueStat record into: _Sketch (summary) or _Histogram


def set_latency_shape(shape: str) -> None:
    """"summary" (BookKeeper's) or "histogram" for every OpStat and ValueStat; a change
    starts their figures afresh (bk sets it once, at start)."""
    global _SHAPE
    if shape not in SHAPES:
        raise ValueError(f"latency shape must be one of {SHAPES}, got {shape!r}")
    new = _Sketch if shape == "summary" else _Histogram
    if new is _SHAPE:
        return
    _SHAPE = new
    for m in _REGISTRY.values():
        if m.kind == "opstat":
            m.ok, m.failed = new(m.bounds), new(m.bounds)
        elif m.kind == "value":
            m.hist = new(m.bounds)


def latency_shape() -> str:
    return "summary" if _SHAPE is _Sketch else "histogram"


def alias(name: str, metric: _Metric) -> None:
    """Export `metric` under `name` as well (BookKeeper has two names for one measurement)."""
    if name in _REGISTRY or name in _ALIASES:
        raise ValueError(f"metric {name} is defined twice")
    _ALIASES[name] = metric


def metrics() -> Iterable[_Metric]:
    return list(_REGISTRY.values())


def get(name: str) -> _Metric:
    return _REGISTRY[name]


def collect(extra_labels: dict | None = None):
    """prometheus_client metric families for every metric (a Collector's collect())."""
    from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

    labels = dict(extra_labels or {})
    names, values = list(labels), list(labels.values())
    for name, m in [*_REGISTRY.items(), *_ALIASES.items()]:
        if m.kind == "counter":
            fam = Metric(name, m.help, "unknown")
            fam.add_sample(name, labels, m.value)
            yield fam
        elif m.kind == "gauge":
            if m.fn is None:
                continue
            try:
                value = float(m.fn())
            except Exception:  # noqa: BLE001 - a broken gauge must not break the whole page
                continue
            fam = GaugeMetricFamily(name, m.help, labels=names)
            fam.add_metric(values, value)
            yield fam
        elif m.kind in ("opstat", "value"):
            parts = ((("true", m.ok), ("false", m.failed)) if m.kind == "opstat" else ((None, m.hist),))
            if isinstance(parts[0][1], _Sketch):
                fam = Metric(name, m.help, "summary")
                for flag, sketch in parts:
                    lab = labels if flag is None else {**labels, "success": flag}
                    for q, v in sketch.quantiles():
                        fam.add_sample(name, {**lab, "quantile": q}, v)
                    fam.add_sample(name + "_count", lab, sketch.count)
                    fam.add_sample(name + "_sum", lab, sketch.total)
            else:
                fam = HistogramMetricFamily(name, m.help, labels=names + (["success"] if m.kind == "opstat" else []))
                for flag, hist in parts:
                    buckets, total = hist.samples()
                    fam.add_metric(values + ([flag] if flag else []), buckets, total)
            yield fam


def exposition(extra_labels: dict | None = None) -> tuple[bytes, str]:
    """The Prometheus text page and its content type."""
    from prometheus_client import exposition as pe

    # generate_latest writes the 0.0.4 text format, whatever the library's newest type is
    content_type = getattr(pe, "CONTENT_TYPE_PLAIN_0_0_4", pe.CONTENT_TYPE_LATEST)

    class _Collector:
        def collect(self):
            return collect(extra_labels)

    return pe.generate_latest(_Collector()), content_type


# ---------------------------------------------------------------- BookKeeper's metrics
# server (bookkeeper_server_*): a request's time from its arrival to its answer. bk
# processes a request on arrival (no queue in between), so ADD_ENTRY is the same
# measurement as ADD_ENTRY_REQUEST: it is exported under both names (BookKeeper's
# dashboards use both).
ADD_ENTRY_REQUEST = OpStat("bookkeeper_server_ADD_ENTRY_REQUEST", "ADD_ENTRY request latency (ms)")
READ_ENTRY_REQUEST = OpStat("bookkeeper_server_READ_ENTRY_REQUEST", "READ_ENTRY request latency (ms)")
BATCH_READ_ENTRY_REQUEST = OpStat("bookkeeper_server_BATCH_READ_ENTRY_REQUEST",
                                  "BATCH_READ_ENTRY request latency (ms)")
alias("bookkeeper_server_ADD_ENTRY", ADD_ENTRY_REQUEST)
alias("bookkeeper_server_READ_ENTRY", READ_ENTRY_REQUEST)
WRITE_BYTES = Counter("bookie_WRITE_BYTES", "entry bytes added (acknowledged adds)")
READ_BYTES = Counter("bookie_READ_BYTES", "entry bytes read")
SERVER_STATUS = Gauge("bookie_SERVER_STATUS", "1 writable, 0 read-only")

# journal (bookie_journal_*): recorded once per group by the writer thread
JOURNAL_ADD_ENTRY = OpStat("bookie_journal_JOURNAL_ADD_ENTRY",
                           "journal add latency (ms): per group, the wait of its oldest record to its fsync's end,"
                           " counted for every record of the group (an upper bound)")
JOURNAL_SYNC = OpStat("bookie_journal_JOURNAL_SYNC", "journal write + fsync latency of a group (ms)")
JOURNAL_FORCE_WRITE_BATCH_ENTRIES = ValueStat("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES",
                                              "records per fsynced journal group", COUNT_BUCKETS)
JOURNAL_FORCE_WRITE_BATCH_BYTES = ValueStat("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_BYTES",
                                            "bytes per fsynced journal group", BYTES_BUCKETS)
JOURNAL_WRITE_BYTES = Counter("bookie_journal_JOURNAL_WRITE_BYTES", "bytes written to the journal")
JOURNAL_QUEUE_SIZE = Gauge("bookie_journal_JOURNAL_QUEUE_SIZE", "records waiting for the journal writer")

# ledger storage (bookie_*: BookKeeper's DbLedgerStorage names)
FLUSH = OpStat("bookie_flush", "checkpoint latency: write cache -> entry log -> index (ms)")
FLUSH_SIZE = ValueStat("bookie_flush_size", "bytes written by one checkpoint", BYTES_BUCKETS)
WRITE_CACHE_SIZE = Gauge("bookie_write_cache_size", "bytes in the write cache (both halves)")
READ_CACHE_SIZE = Gauge("bookie_read_cache_size", "bytes in the read cache")
LEDGERS_COUNT = Gauge("bookie_ledgers_count", "ledgers stored on this bookie")
THROTTLED_WRITE_REQUESTS = Counter("bookie_throttled_write_requests", "adds that waited for write cache room")
REJECTED_WRITE_REQUESTS = Counter("bookie_rejected_write_requests",
                                  "adds refused with ETOOMANYREQUESTS (write cache full)")
LEDGER_WRITABLE_DIRS = Gauge("bookie_ledger_writable_dirs", "ledger directories below the disk usage threshold")
# disk faults (docs/DISK-FAULTS.md)
STORAGE_ERRORS = Counter("bookie_storage_errors", "failed journal/entry-log writes, fsyncs, index commits and reads")
STORAGE_FAILED = Gauge("bookie_storage_failed", "1 once an fsync, write or commit failed: read-only until restart")
READ_ENTRY_CORRUPTED = Counter("bookie_read_entry_corrupted",
                               "reads answered EIO because the stored record failed its checks")
GC_DAMAGED_ENTRY_LOGS = Gauge("bookie_gc_damaged_entry_logs",
                              "entry logs whose records could not be read to their end: GC keeps them "
                              "until the index places nothing in them")
# garbage collection (bookie_gc_*: BookKeeper's GarbageCollectorStats), fed once per GC pass
GC_MINOR_COMPACTION_COUNT = Counter("bookie_gc_MINOR_COMPACTION_COUNT", "minor compactions run")
GC_MAJOR_COMPACTION_COUNT = Counter("bookie_gc_MAJOR_COMPACTION_COUNT", "major compactions run")
GC_RECLAIMED_DELETION_SPACE_BYTES = Counter("bookie_gc_RECLAIMED_DELETION_SPACE_BYTES",
                                            "bytes reclaimed by deleting entry logs with no live ledger")
GC_RECLAIMED_COMPACTION_SPACE_BYTES = Counter("bookie_gc_RECLAIMED_COMPACTION_SPACE_BYTES",
                                              "bytes reclaimed by compacting entry logs (deleted minus rewritten)")
GC_DELETED_LEDGER_COUNT = Counter("bookie_gc_DELETED_LEDGER_COUNT", "ledgers deleted by garbage collection")
GC_THREAD_RUNTIME = OpStat("bookie_gc_THREAD_RUNTIME", "GC pass time (ms); success=false: the pass had errors")
GC_ACTIVE_ENTRY_LOG_COUNT = Gauge("bookie_gc_ACTIVE_ENTRY_LOG_COUNT", "entry logs GC tracks (closed, not yet deleted)")
GC_ACTIVE_ENTRY_LOG_SPACE_BYTES = Gauge("bookie_gc_ACTIVE_ENTRY_LOG_SPACE_BYTES",
                                        "live bytes in the entry logs GC tracks, as of the last pass")
alias("bookie_gc_ACTIVE_LEDGER_COUNT", LEDGERS_COUNT)


def record_gc_pass(out: dict, active_logs: int, active_log_bytes: int) -> None:
    """One GC pass's result (bk.bookie.gc's `out`) into BookKeeper's GC metrics."""
    if out.get("compaction") == "minor":
        GC_MINOR_COMPACTION_COUNT.inc()
    elif out.get("compaction") == "major":
        GC_MAJOR_COMPACTION_COUNT.inc()
    by_compaction = out.get("bytes_freed_by_compaction", 0)
    GC_RECLAIMED_COMPACTION_SPACE_BYTES.inc(by_compaction)
    GC_RECLAIMED_DELETION_SPACE_BYTES.inc(max(0, out["bytes_freed"] - by_compaction))
    GC_DELETED_LEDGER_COUNT.inc(len(out["ledgers_deleted"]))
    GC_THREAD_RUNTIME.record_many(1, out["duration_ms"], ok=not out["errors"])
    GC_ACTIVE_ENTRY_LOG_COUNT.set_function(lambda: active_logs)
    GC_ACTIVE_ENTRY_LOG_SPACE_BYTES.set_function(lambda: active_log_bytes)

# AutoRecovery (auditor_*, replication_worker_*, election_*)
ELECTION_ATTEMPTS = Counter("election_attempts", "auditor elections won by this process")
AUDITOR_NUM_UNDER_REPLICATED_LEDGERS = ValueStat("auditor_NUM_UNDER_REPLICATED_LEDGERS",
                                                 "ledgers marked under-replicated per audit", COUNT_BUCKETS)
AUDITOR_AUDIT_BOOKIES_TIME = OpStat("auditor_AUDIT_BOOKIES_TIME", "time to audit lost bookies (ms)")
AUDITOR_NUM_DELAYED_BOOKIE_AUDITS_CANCELLED = Counter("auditor_NUM_DELAYED_BOOKIE_AUDITS_DELAYES_CANCELLED",
                                                      "delayed audits cancelled (BookKeeper's spelling)")
AUDITOR_NUM_LEDGERS_MARKED = Counter("auditor_NUM_LEDGERS_MARKED", "ledgers marked under-replicated (bk)")
REREPLICATE = OpStat("replication_worker_rereplicate", "re-replication of one ledger (ms)")
NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED = Counter("replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED",
                                                 "ledgers (fully or partly) re-replicated")
REPLICATION_NUM_BYTES_WRITTEN = Counter("replication_worker_NUM_BYTES_WRITTEN", "bytes copied by re-replication")
REPLICATION_EXCEPTIONS = Counter("replication_worker_exceptions", "re-replications that failed")
# the Auditor's placement policy check (bk.replication.placement): as of the last check
AUDITOR_PLACEMENT_POLICY_CHECK_TIME = OpStat("auditor_PLACEMENT_POLICY_CHECK_TIME",
                                             "time of one placement policy check of every closed ledger (ms)")
AUDITOR_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY = Gauge(
    "auditor_NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY", "closed ledgers with a segment that FAILs the policy")
AUDITOR_NUM_LEDGERS_SOFTLY_ADHERING_TO_PLACEMENT_POLICY = Gauge(
    "auditor_NUM_LEDGERS_SOFTLY_ADHERING_TO_PLACEMENT_POLICY", "closed ledgers with a segment that only MEETS_SOFT")
NUM_NOT_ADHERING_PLACEMENT_LEDGERS_REPLICATED = Counter(
    "replication_worker_NUM_NOT_ADHERING_PLACEMENT_LEDGERS_REPLICATED",
    "ledgers whose segments were moved to bookies that adhere to the placement policy")
